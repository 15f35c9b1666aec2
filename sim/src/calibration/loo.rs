//! Leave-one-out: refit without each experiment in turn and predict the one left out, so a
//! pass means the constants carry over to a setup they were not fitted on (not a tautology:
//! the left-out figures never enter the fit that predicts them).
//!
//! A second, finer set of folds leaves out one measured run at a time
//! ([`leave_one_run_out`]): fitted on the other run of the same experiment and on the other
//! experiments, does the model predict, say, PyTorch FSDP2 from HyperParallel-FSDP's run on
//! the same machine and model? That is the question `simulate` answers for a plan change,
//! so it is checked the same way.
//!
//! Nothing of the left-out experiment may reach a fold by another path either: bounds that
//! come from its measurements are replaced by blind ones ([`FitParam::without`]), and the
//! fold starts from the priors ([`Starts::Blind`]), never from the profile's values of the
//! fitted constants, which are the joint fit over every experiment, the left-out one
//! included. A fold's result therefore does not change when those values change. A run fold
//! blinds every bound and measured constant taken from that run, or from its experiment as
//! a whole ([`Holdout::touches`]).

use super::compare::{CalibrationSet, Comparison};
use super::error::CalibrationError;
use super::fit::{FitOutcome, Starts, fit_joint_with};
use super::holdout::Holdout;
use super::lm::LmOptions;
use super::params::{FitParam, MeasuredConstant, blind_profile};
use super::verdict::{Checked, check};
use crate::profile::HardwareProfile;

/// One fold: the fit without `left_out` and its prediction of `left_out`.
#[derive(Debug, Clone)]
pub struct Fold {
    /// What was left out: an experiment (`B`) or one of its runs (`B / PyTorch FSDP2`).
    pub left_out: Holdout,
    /// The fit on the other experiments.
    pub fit: FitOutcome,
    /// The left-out experiment's figures predicted with that fit, checked against tolerance.
    pub held_out: Checked,
    /// Profile constants measured on the left-out experiment that this fold replaced by
    /// their blind values (the runs files' `[[measured_constant]]` entries).
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
    experiment_holdouts(set)
        .into_iter()
        .map(|left_out| fold(set, start, params, options, left_out))
        .collect()
}

/// The holdouts of [`leave_one_out`]: every experiment of `set`, in order.
pub fn experiment_holdouts(set: &CalibrationSet) -> Vec<Holdout> {
    set.experiments().into_iter().map(Holdout::whole).collect()
}

/// The holdouts of [`leave_one_run_out`]: every run of an experiment with more than one
/// run, in order.
pub fn run_holdouts(set: &CalibrationSet) -> Vec<Holdout> {
    let runs: Vec<_> = set.runs().collect();
    runs.iter()
        .filter(|r| runs.iter().filter(|o| o.experiment == r.experiment).count() > 1)
        .map(|r| Holdout::run(r.experiment.clone(), r.label.clone()))
        .collect()
}

/// Runs one fold per measured run of `set` whose experiment has more than one run (for a
/// single-run experiment the fold is [`leave_one_out`]'s), in the set's order: fitted on
/// every other run, the left-out run predicted.
pub fn leave_one_run_out(
    set: &CalibrationSet,
    start: &HardwareProfile,
    params: &[FitParam],
    options: &LmOptions,
) -> Result<Vec<Fold>, CalibrationError> {
    run_holdouts(set)
        .into_iter()
        .map(|left_out| fold(set, start, params, options, left_out))
        .collect()
}

/// One fold: the blind fit without `left_out` and its prediction of `left_out`.
pub fn fold(
    set: &CalibrationSet,
    start: &HardwareProfile,
    params: &[FitParam],
    options: &LmOptions,
    left_out: Holdout,
) -> Result<Fold, CalibrationError> {
    // Bounds that come from the left-out experiment's measurements are replaced by their
    // blind ASSUMPTION bounds: the fold must not see that experiment at all.
    let blind: Vec<FitParam> = params.iter().map(|p| p.without(&left_out)).collect();
    // Constants measured directly on what is left out take their blind values.
    let (start, blinded) = blind_profile(start, set.measured_constants(), &left_out)?;
    let fit = fit_joint_with(
        set,
        &start,
        &blind,
        |r| !left_out.covers(r),
        options,
        Starts::Blind,
    )?;
    let mut predicted = held_out_figures(set.compare(&fit.profile)?, &left_out);
    for row in &mut predicted.rows {
        if let Some(t) = row.rule.loo_tolerance {
            row.rule.tolerance = t;
        }
    }
    Ok(Fold {
        left_out,
        fit,
        held_out: check(&predicted, false),
        blinded,
    })
}

/// The figures of `all` (every run simulated with a fold's constants) that `left_out`
/// covers. Every run is simulated so that a figure of a left-out run that also needs a run
/// the fit kept (the validation-mode overhead of a left-out validation run) is predicted;
/// a step-time difference counts when the fold leaves out one of its runs (or their
/// experiment).
fn held_out_figures(mut all: Comparison, left_out: &Holdout) -> Comparison {
    all.rows
        .retain(|r| left_out.covers_row(&r.experiment, &r.run));
    all.host
        .retain(|h| left_out.covers_row(&h.experiment, &h.run));
    for d in &mut all.differences {
        let e = &d.difference.experiment;
        if !(left_out.covers_row(e, &d.difference.run)
            || left_out.covers_row(e, &d.difference.baseline))
        {
            d.predicted = f64::NAN;
        }
    }
    all
}
