//! What one check of the gate concludes: its [`Status`] and the [`CheckOutcome`] the summary,
//! the JUnit report and the exit status are made of.

use serde::Serialize;

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// The check passed.
    Pass,
    /// The check failed.
    Fail,
    /// The check does not apply (the message says why).
    Skipped,
}

/// One check of one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckOutcome {
    /// Scenario name.
    pub scenario: String,
    /// Check name (`lint`, `verify`, `plan-digest`, `throughput/<strategy>`, ...).
    pub check: String,
    /// Outcome.
    pub status: Status,
    /// One line: what was found.
    pub message: String,
    /// Locked vs now, line by line (empty when there is nothing to compare).
    pub diff: String,
    /// Wall time of the work behind the check, seconds (0 for checks derived from another's
    /// work: the memory and optimizer checks read the throughput check's simulation).
    pub time_s: f64,
}
