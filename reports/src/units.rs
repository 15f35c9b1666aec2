//! Human-readable, deterministic number formatting for HTML tables and chart labels.
//!
//! **Unit convention** (the same in the CLI and every HTML report): sizes use binary prefixes,
//! `1 KiB = 1024 B`, `1 MiB = 2^20 B`, `1 GiB = 2^30 B` ([`bytes`]); times are printed in the
//! unit named in the column or row label; bandwidths (link and bus figures, quoted by hardware
//! data sheets and nccl-tests in decimal units) stay `GB/s = 10^9 B/s`. [`SIZE_UNITS_NOTE`] is
//! the sentence each report prints so a reader knows which is which.
//!
//! Every formatter uses a fixed precision (Rust's float formatting is exact and
//! platform-independent), and prints `–` for missing or non-finite values instead of `NaN`.

/// The sentence stating the size convention, printed under every report that shows sizes.
pub const SIZE_UNITS_NOTE: &str =
    "Sizes use binary prefixes: 1 KiB = 1024 B, 1 MiB = 2^20 B, 1 GiB = 2^30 B.";

/// Bytes per GiB (`2^30`).
pub const BYTES_PER_GIB: f64 = 1_073_741_824.0;

/// Placeholder printed for a missing or non-finite value.
pub const MISSING: &str = "–";

/// Seconds as milliseconds with three decimals (`12.345`).
pub fn ms(seconds: f64) -> String {
    finite(seconds * 1e3).map_or_else(|| MISSING.to_string(), |v| format!("{v:.3}"))
}

/// A fraction as a percentage with one decimal (`87.5%`).
pub fn percent(fraction: f64) -> String {
    finite(fraction * 100.0).map_or_else(|| MISSING.to_string(), |v| format!("{v:.1}%"))
}

/// An optional fraction as a percentage, `–` when absent.
pub fn opt_percent(fraction: Option<f64>) -> String {
    fraction.map_or_else(|| MISSING.to_string(), percent)
}

/// A rate with thousands grouping and no decimals (`1,234,567`), `–` when absent.
pub fn opt_rate(value: Option<f64>) -> String {
    match value.and_then(finite) {
        Some(v) if v.abs() < 1e18 => group_thousands(v.round() as i64),
        Some(v) => format!("{v:.3e}"),
        None => MISSING.to_string(),
    }
}

/// A byte count with a binary unit and two decimals (`1.50 GiB`); exact below 1 KiB.
pub fn bytes(value: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if value < 1024 {
        return format!("{value} B");
    }
    let mut scaled = value as f64 / 1024.0;
    let mut unit = 0;
    while scaled >= 1024.0 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    format!("{scaled:.2} {}", UNITS[unit])
}

/// An integer count with thousands grouping (`12,345`).
pub fn count(value: u64) -> String {
    group_thousands_str(&value.to_string())
}

/// `Some(v)` when `v` is finite.
pub fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

fn group_thousands(v: i64) -> String {
    let digits = v.unsigned_abs().to_string();
    let grouped = group_thousands_str(&digits);
    if v < 0 {
        format!("-{grouped}")
    } else {
        grouped
    }
}

fn group_thousands_str(digits: &str) -> String {
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(ms(0.0123456), "12.346");
        assert_eq!(ms(f64::NAN), MISSING);
        assert_eq!(percent(0.875), "87.5%");
        assert_eq!(opt_rate(Some(1234567.4)), "1,234,567");
        assert_eq!(opt_rate(Some(-1234.0)), "-1,234");
        assert_eq!(opt_rate(None), MISSING);
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 29), "1.50 GiB");
        assert_eq!(bytes(u64::MAX), "16.00 EiB");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(999), "999");
    }
}
