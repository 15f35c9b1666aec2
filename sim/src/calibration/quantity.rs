//! Numbers with units as a runs file writes them: a measured value (`3.720`, `"305.6 ms"`,
//! `"78.27 GiB"`, `"51.035 GB"`) and a tolerance (`"10%"`, `"5 pp"`).
//!
//! A decimal unit scales by shifting the exponent of the written number, never by a
//! multiplication (`"51.035 GB"` parses as the literal `51.035e9`), so a value written with a
//! unit is bit-for-bit the value written without one; a binary unit (`KiB`, `MiB`, `GiB`,
//! `TiB`) multiplies by a power of two, which is exact too.

use super::gates::Tolerance;

/// The units a value may carry, with their decimal exponent or binary factor.
const DECIMAL_UNITS: [(&str, i32); 10] = [
    ("s", 0),
    ("ms", -3),
    ("us", -6),
    ("ns", -9),
    ("B", 0),
    ("kB", 3),
    ("KB", 3),
    ("MB", 6),
    ("GB", 9),
    ("TB", 12),
];

/// Binary size units and their power of two.
const BINARY_UNITS: [(&str, i32); 4] = [("KiB", 10), ("MiB", 20), ("GiB", 30), ("TiB", 40)];

/// Parses a value written as a string: a number, optionally followed by one of the units of
/// [`UNITS_HELP`]; bandwidth units (`GB/s`) scale like their size. Returns the value in the
/// figure's base unit (seconds, bytes, bytes per second) or why it cannot.
pub fn parse_value(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(t.len());
    let (number, unit) = (t[..split].trim().replace('_', ""), t[split..].trim());
    let unit = unit.strip_suffix("/s").unwrap_or(unit);
    let bad = || format!("'{text}' is not a number with an optional unit ({UNITS_HELP})");
    let plain: f64 = number.parse().map_err(|_| bad())?;
    let value = if unit.is_empty() {
        plain
    } else if let Some((_, exp)) = DECIMAL_UNITS.iter().find(|(u, _)| *u == unit) {
        shifted(&number, *exp).ok_or_else(bad)?
    } else if let Some((_, pow)) = BINARY_UNITS.iter().find(|(u, _)| *u == unit) {
        plain * 2f64.powi(*pow)
    } else {
        return Err(format!("unknown unit '{unit}' in '{text}' ({UNITS_HELP})"));
    };
    if value.is_finite() {
        Ok(value)
    } else {
        Err(bad())
    }
}

/// The units [`parse_value`] accepts, for error messages and documentation.
pub const UNITS_HELP: &str =
    "s, ms, us, ns; B, kB, MB, GB, TB, KiB, MiB, GiB, TiB; any size unit followed by /s";

/// `number` times `10^exp`, parsed as the literal with its exponent shifted (exact to the
/// written digits).
fn shifted(number: &str, exp: i32) -> Option<f64> {
    let (mantissa, e) = match number.find(['e', 'E']) {
        Some(i) => (&number[..i], number[i + 1..].parse::<i32>().ok()?),
        None => (number, 0),
    };
    format!("{mantissa}e{}", e + exp).parse().ok()
}

/// Parses a tolerance: `"10%"` (relative: `|predicted / measured - 1| <= 0.10`) or `"5 pp"`
/// (absolute, for fractions such as an overlap rate: `|predicted - measured| <= 0.05`).
pub fn parse_tolerance(text: &str) -> Result<Tolerance, String> {
    let t = text.trim();
    let (number, relative) = if let Some(n) = t.strip_suffix('%') {
        (n.trim(), true)
    } else if let Some(n) = t.strip_suffix("pp") {
        (n.trim(), false)
    } else {
        return Err(format!(
            "tolerance '{text}' needs a unit: \"10%\" (relative) or \"5 pp\" (percentage points, \
             for fractions)"
        ));
    };
    let limit = shifted(number, -2)
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or_else(|| format!("tolerance '{text}': '{number}' is not a positive number"))?;
    Ok(if relative {
        Tolerance::Relative(limit)
    } else {
        Tolerance::AbsoluteFraction(limit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_gives_exactly_the_literal_without_it() {
        assert_eq!(parse_value("51.035 GB"), Ok(51.035e9));
        assert_eq!(parse_value("305.6 ms"), Ok(0.3056));
        assert_eq!(parse_value("3.720"), Ok(3.720));
        assert_eq!(parse_value("3.720 s"), Ok(3.720));
        assert_eq!(parse_value("0.92 us"), Ok(0.92e-6));
        assert_eq!(parse_value("56.78 GB/s"), Ok(56.78e9));
        assert_eq!(parse_value("7.67e0 GB"), Ok(7.670e9));
        assert_eq!(
            parse_value("36.649 GiB"),
            Ok(36.649 * 1024.0 * 1024.0 * 1024.0)
        );
        assert_eq!(parse_value("57_560"), Ok(57_560.0));
    }

    #[test]
    fn bad_values_and_units_are_named() {
        assert!(parse_value("fast").unwrap_err().contains("'fast'"));
        let e = parse_value("3 parsecs").unwrap_err();
        assert!(e.contains("unknown unit 'parsecs'"), "{e}");
        assert!(parse_value("").is_err());
    }

    #[test]
    fn tolerances_parse_to_the_literal_fraction() {
        assert_eq!(parse_tolerance("10%"), Ok(Tolerance::Relative(0.10)));
        assert_eq!(parse_tolerance("2.5 %"), Ok(Tolerance::Relative(0.025)));
        assert_eq!(
            parse_tolerance("5 pp"),
            Ok(Tolerance::AbsoluteFraction(0.05))
        );
        assert!(parse_tolerance("0.1").unwrap_err().contains("needs a unit"));
        assert!(parse_tolerance("-5%").is_err());
    }
}
