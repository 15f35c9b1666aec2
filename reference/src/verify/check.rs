//! One named check of a verification report ([`super::report`], [`super::muon_report`]).

use serde::Serialize;

/// One named check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Outcome.
    pub passed: bool,
    /// Whether the overall verdict depends on it (advisory checks are reported only).
    pub gating: bool,
    /// Details.
    pub detail: String,
}
