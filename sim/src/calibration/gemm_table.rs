//! GEMM efficiency table from measured GEMM timings, so a user calibrates the compute curve
//! from their own device.
//!
//! Input: CSV with columns exactly `m,n,k,dtype,time_us` (one GEMM `m x k` times `k x n` per
//! row, its measured time). Output: the profile's GEMM table, CSV with columns exactly
//! `m,n,k,dtype,efficiency,source`, where `efficiency = 2 m n k / time / bf16 peak` of the
//! profile's device, written to six significant digits ([`efficiency_text`]: a launch-bound
//! 64^3 GEMM at 2.6e-5 of peak stays non-zero, so every command loads the table back), and
//! `source` names the measurement and keeps its time (`measured:<file>:<line> (<time_us>
//! us)`). The profile points at it with `[compute] gemm_table = "<name>.gemm.csv"`.

use super::error::CalibrationError;
use crate::profile::HardwareProfile;

/// The columns of a measured GEMM table, in order.
pub const GEMM_INPUT_COLUMNS: [&str; 5] = ["m", "n", "k", "dtype", "time_us"];
/// The columns of the profile's GEMM table, in order.
pub const GEMM_TABLE_COLUMNS: [&str; 6] = ["m", "n", "k", "dtype", "efficiency", "source"];

/// One GEMM timing.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmRow {
    /// 1-based line in the file.
    pub line: usize,
    /// Rows of the left operand.
    pub m: u64,
    /// Columns of the right operand.
    pub n: u64,
    /// Inner dimension.
    pub k: u64,
    /// Element type as written (`bf16`).
    pub dtype: String,
    /// Measured time, microseconds.
    pub time_us: f64,
}

impl GemmRow {
    /// `2 m n k / time / peak`: the fraction of the device's BF16 peak this GEMM reached.
    pub fn efficiency(&self, profile: &HardwareProfile) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
            / (self.time_us * 1e-6)
            / profile.device.bf16_flops_per_s
    }
}

/// True when the header is a measured GEMM table's.
pub fn is_gemm_header(header: &[&str]) -> bool {
    header == GEMM_INPUT_COLUMNS
}

/// Parses a measured GEMM table; errors name file, line and column. A GEMM faster than the
/// profile's peak is refused (wrong unit or wrong peak).
pub fn parse_gemm_table(
    text: &str,
    file: &str,
    profile: &HardwareProfile,
) -> Result<Vec<GemmRow>, CalibrationError> {
    let bad = |line: usize, column: &str, message: String| CalibrationError::Table {
        file: file.to_string(),
        line,
        column: column.to_string(),
        message,
    };
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
    let (hline, header) = lines
        .next()
        .ok_or_else(|| bad(0, "-", "empty table: expected a header line".into()))?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    if !is_gemm_header(&cols) {
        return Err(bad(
            hline,
            "-",
            format!(
                "header is '{header}'; a GEMM table needs exactly '{}'",
                GEMM_INPUT_COLUMNS.join(",")
            ),
        ));
    }
    let mut rows = Vec::new();
    for (line, l) in lines {
        let cells: Vec<&str> = l.split(',').map(str::trim).collect();
        if cells.len() != GEMM_INPUT_COLUMNS.len() {
            return Err(bad(line, "-", format!("{} cells, expected 5", cells.len())));
        }
        let dim = |i: usize| -> Result<u64, CalibrationError> {
            cells[i].parse().ok().filter(|v| *v > 0).ok_or_else(|| {
                bad(
                    line,
                    GEMM_INPUT_COLUMNS[i],
                    format!("'{}' is not a positive integer", cells[i]),
                )
            })
        };
        let (m, n, k) = (dim(0)?, dim(1)?, dim(2)?);
        if cells[3].is_empty() {
            return Err(bad(line, "dtype", "empty dtype; write e.g. bf16".into()));
        }
        let time_us: f64 = cells[4]
            .parse()
            .ok()
            .filter(|t: &f64| t.is_finite() && *t > 0.0)
            .ok_or_else(|| {
                bad(
                    line,
                    "time_us",
                    format!("'{}' is not a positive time in microseconds", cells[4]),
                )
            })?;
        let row = GemmRow {
            line,
            m,
            n,
            k,
            dtype: cells[3].to_string(),
            time_us,
        };
        let eff = row.efficiency(profile);
        if eff > 1.0 {
            return Err(bad(
                line,
                "time_us",
                format!(
                    "{m}x{n}x{k} in {time_us} us is {:.0}% of profile '{}' BF16 peak {:.3e} \
                     FLOP/s: check that the time is in microseconds and the device peak",
                    eff * 100.0,
                    profile.name,
                    profile.device.bf16_flops_per_s
                ),
            ));
        }
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(bad(0, "-", "the table has a header but no rows".into()));
    }
    Ok(rows)
}

/// The profile's GEMM table (CSV text, columns [`GEMM_TABLE_COLUMNS`]), rows sorted by
/// `(dtype, m, n, k)` so the output is deterministic whatever the input order.
pub fn gemm_table_csv(rows: &[GemmRow], profile: &HardwareProfile, file: &str) -> String {
    let mut sorted: Vec<&GemmRow> = rows.iter().collect();
    sorted.sort_by(|a, b| (&a.dtype, a.m, a.n, a.k).cmp(&(&b.dtype, b.m, b.n, b.k)));
    let mut out = GEMM_TABLE_COLUMNS.join(",");
    out.push('\n');
    for r in sorted {
        out.push_str(&format!(
            "{},{},{},{},{},measured:{}:{} ({} us)\n",
            r.m,
            r.n,
            r.k,
            r.dtype,
            efficiency_text(r.efficiency(profile)),
            file.replace(',', "_"),
            r.line,
            r.time_us
        ));
    }
    out
}

/// An efficiency in (0, 1] as the GEMM table writes it: plain decimal with six significant
/// digits (at least four decimals), so no measured point rounds to zero and every value
/// reads back within 5e-7 of itself.
pub fn efficiency_text(v: f64) -> String {
    let decimals = if v > 0.0 && v.is_finite() {
        (5 - v.log10().floor() as i64).max(4) as usize
    } else {
        4
    };
    format!("{v:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efficiencies_keep_six_significant_digits_and_never_round_to_zero() {
        assert_eq!(efficiency_text(0.5), "0.500000");
        assert_eq!(efficiency_text(0.7991190219690155), "0.799119");
        assert_eq!(efficiency_text(2.6055210480527125e-5), "0.0000260552");
        assert_eq!(efficiency_text(1.0), "1.00000");
        for v in [1e-9, 3.3e-7, 0.0123456789, 0.99999] {
            let back: f64 = efficiency_text(v).parse().unwrap();
            assert!(back > 0.0 && (back / v - 1.0).abs() < 5e-6, "{v} -> {back}");
        }
    }
}
