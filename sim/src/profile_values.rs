//! What a hardware profile's values must be ([`positive`], [`non_negative`], [`fraction`]) and
//! the error that names a bad one ([`ProfileError`]): shared by the profile, its `[compute]`
//! section ([`crate::compute_spec`]) and its GEMM table ([`crate::gemm_table`]).

use thiserror::Error;

/// A profile file that cannot be read, parsed or validated; names the file, line and key.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{file}{}: {key}: {message}", hpfsdp_plan::error::line_suffix(*line))]
pub struct ProfileError {
    /// The profile file (or `<builtin NAME>`).
    pub file: String,
    /// 1-based line of the offending key (0 when unknown).
    pub line: usize,
    /// Dotted key path (`tiers.intra_machine.bandwidth_bytes_per_s`), or `-` for the file.
    pub key: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Checks a profile value is a positive finite number; `(key, message)` otherwise.
pub(crate) fn positive(key: &str, v: f64) -> Result<(), (String, String)> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err((key.into(), format!("must be a positive number, got {v}")))
    }
}

/// Checks a profile value is zero or a positive finite number.
pub(crate) fn non_negative(key: &str, v: f64) -> Result<(), (String, String)> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err((key.into(), format!("must be zero or positive, got {v}")))
    }
}

/// Checks a profile value is a fraction in (0, 1].
pub(crate) fn fraction(key: &str, v: f64) -> Result<(), (String, String)> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err((key.into(), format!("must be in (0, 1], got {v}")))
    }
}
