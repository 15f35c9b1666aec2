//! Leave-one-out: refit without each experiment in turn and predict the one left out, so a
//! pass means the constants carry over to a setup they were not fitted on (not a tautology:
//! the left-out figures never enter the fit that predicts them).
//!
//! Nothing of the left-out experiment may reach a fold by another path either: bounds that
//! come from its measurements are replaced by blind ones ([`FitParam::without`]), and the
//! fold starts from the priors ([`Starts::Blind`]), never from the profile's values of the
//! fitted constants, which are the joint fit over every experiment, the left-out one
//! included. A fold's result therefore does not change when those values change.

use super::compare::CalibrationSet;
use super::error::CalibrationError;
use super::fit::{FitOutcome, Starts, fit_joint_with};
use super::lm::LmOptions;
use super::params::{FitParam, MeasuredConstant, blind_profile};
use super::verdict::{Checked, check};
use crate::profile::HardwareProfile;

/// One fold: the fit without `left_out` and its prediction of `left_out`.
#[derive(Debug, Clone)]
pub struct Fold {
    /// The experiment left out (`B`, `A mbs2`).
    pub left_out: &'static str,
    /// The fit on the other experiments.
    pub fit: FitOutcome,
    /// The left-out experiment's figures predicted with that fit, checked against tolerance.
    pub held_out: Checked,
    /// Profile constants measured on the left-out experiment that this fold replaced by
    /// their blind values ([`super::params::MEASURED_CONSTANTS`]).
    pub blinded: Vec<MeasuredConstant>,
}

impl Fold {
    /// Root mean square of `ln(predicted / measured)` over the left-out experiment's fitted
    /// figures (the same figures the full fit uses); NaN when it has none.
    pub fn rms_log_error(&self) -> f64 {
        let logs: Vec<f64> = self
            .held_out
            .rows
            .iter()
            .filter(|r| super::fit::is_fitted_row(&r.row))
            .map(|r| super::fit::log_residual(&r.row))
            .collect();
        if logs.is_empty() {
            return f64::NAN;
        }
        (logs.iter().map(|v| v * v).sum::<f64>() / logs.len() as f64).sqrt()
    }
}

/// Runs one fold per experiment of `set`, in the set's order: a blind MAP fit
/// ([`Starts::Blind`]) on the other experiments, then the left-out one predicted with it.
/// `start` supplies only the constants the fit does not adjust, those measured on the
/// left-out experiment replaced by their blind values ([`blind_profile`]).
pub fn leave_one_out(
    set: &CalibrationSet,
    start: &HardwareProfile,
    params: &[FitParam],
    options: &LmOptions,
) -> Result<Vec<Fold>, CalibrationError> {
    let mut folds = Vec::new();
    for left_out in set.experiments() {
        // Bounds that come from the left-out experiment's measurements are replaced by
        // their blind ASSUMPTION bounds: the fold must not see that experiment at all.
        let blind: Vec<FitParam> = params.iter().map(|p| p.without(left_out)).collect();
        // Constants measured directly on the left-out experiment take their blind values.
        let (start, blinded) = blind_profile(start, left_out)?;
        let fit = fit_joint_with(
            set,
            &start,
            &blind,
            |r| r.experiment != left_out,
            options,
            Starts::Blind,
        )?;
        let predicted = set.compare_where(&fit.profile, |r| r.experiment == left_out)?;
        folds.push(Fold {
            left_out,
            fit,
            held_out: check(&predicted, false),
            blinded,
        });
    }
    Ok(folds)
}
