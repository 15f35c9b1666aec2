//! Every figure row checked against its tolerance (its rule: [`super::gates::FIGURE_RULES`]
//! with the runs file's overrides), and the overall verdict: passed only when every gating
//! row passes (and every step-time difference is within tolerance when both of its runs were
//! compared). A report's banner is green only when this says so.

use super::compare::{Comparison, FigureRow};
use super::difference::DifferenceRow;
use super::fit::is_fitted_row;
use super::gates::Tolerance;

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
    /// Every step-time difference with its prediction (its error in percentage points is
    /// `None` unless both of its runs were compared).
    pub differences: Vec<DifferenceRow>,
    /// Every gating row passed and every compared difference is in tolerance.
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
            let rule = row.rule;
            CheckedRow {
                row: row.clone(),
                fitted: fitted && is_fitted_row(row),
                tolerance: rule.tolerance,
                gating: rule.gating,
                passed: rule.tolerance.passes(row.measured, row.predicted),
            }
        })
        .collect();
    let diff_ok = c.differences.iter().all(DifferenceRow::passed);
    let passed = diff_ok && rows.iter().all(|r| !r.gating || r.passed);
    Checked {
        rows,
        differences: c.differences.clone(),
        passed,
    }
}
