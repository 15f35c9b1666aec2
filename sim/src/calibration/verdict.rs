//! Every figure row checked against its tolerance ([`super::gates::FIGURE_RULES`]), and the
//! overall verdict: passed only when every gating row passes (and the experiment-B difference
//! is within tolerance when both experiment-B runs were compared). A report's banner is green
//! only when this says so.

use super::compare::{Comparison, FigureRow};
use super::fit::is_fitted_row;
use super::gates::{EXP_B_DIFF_TOLERANCE_PP, Tolerance, rule_of};

/// One row with its rule applied.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedRow {
    /// The figure row.
    pub row: FigureRow,
    /// It entered the least squares (shown as "fitted"); otherwise "predicted".
    pub fitted: bool,
    /// Its tolerance.
    pub tolerance: Tolerance,
    /// It decides the verdict.
    pub gating: bool,
    /// Within tolerance.
    pub passed: bool,
}

/// The checked comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// Every row, in comparison order.
    pub rows: Vec<CheckedRow>,
    /// Experiment-B difference error in percentage points, when both runs were compared.
    pub exp_b_diff_error_pp: Option<f64>,
    /// Every gating row passed and the experiment-B difference (when present) is in tolerance.
    pub passed: bool,
}

impl Checked {
    /// The gating rows that failed.
    pub fn failures(&self) -> impl Iterator<Item = &CheckedRow> {
        self.rows.iter().filter(|r| r.gating && !r.passed)
    }
}

/// Applies the figure rules to a comparison. `fitted` says whether the rows came out of a fit
/// (only then is a row marked "fitted").
pub fn check(c: &Comparison, fitted: bool) -> Checked {
    let rows: Vec<CheckedRow> = c
        .rows
        .iter()
        .map(|row| {
            let rule = rule_of(row.figure);
            CheckedRow {
                row: row.clone(),
                fitted: fitted && is_fitted_row(row),
                tolerance: rule.tolerance,
                gating: rule.gating,
                passed: rule.tolerance.passes(row.measured, row.predicted),
            }
        })
        .collect();
    let diff = (c.exp_b_predicted_diff - c.exp_b_measured_diff) * 100.0;
    let exp_b_diff_error_pp = diff.is_finite().then_some(diff);
    let diff_ok = exp_b_diff_error_pp.is_none_or(|d| d.abs() <= EXP_B_DIFF_TOLERANCE_PP);
    let passed = diff_ok && rows.iter().all(|r| !r.gating || r.passed);
    Checked {
        rows,
        exp_b_diff_error_pp,
        passed,
    }
}
