//! The joint fit: a few residual constants (the runs files' `[[fit]]` entries,
//! [`super::params::FitParam`]) fitted together on the log residuals of every fitted figure
//! (weight > 0 in its rule, [`super::gates::FIGURE_RULES`]) of every selected measured run, as a **maximum a posteriori** fit: each constant's prior
//! ([`super::prior::Prior`], public sources only) adds one residual
//! `(ln v - ln centre) / log_width`, so constants the figures pin follow the figures and the
//! others stay at their priors instead of drifting in an underdetermined fit.
//!
//! Each evaluation re-simulates the selected runs with trial constants; the bounded solver
//! ([`super::lm`]) works on the logarithm of each constant (so efficiencies and microseconds
//! move by relative steps) with forward finite differences. The calibration's cost is not
//! convex (from the profile alone the fit stopped at cost 0.65 on one start and 0.25 on
//! another that differed only in `hbm_efficiency`; with too few modelled kernels it settled
//! in a device-bound minimum with the GEMM ceiling at 1.0 and the kernel launch cost at its
//! floor), so it starts from a fixed list and keeps the lowest final cost; every start's
//! outcome is reported ([`StartOutcome`]). [`Starts::WithProfile`] (the full fit,
//! [`START_LABELS`]): the profile's values, the log-midpoint of every bound, a **host-bound**
//! start (the profile's values with the unmodelled host work at 90% of its upper bound) and
//! the priors. [`Starts::Blind`] (leave-one-out, [`BLIND_START_LABELS`]): the priors, the
//! log-midpoints and the host-bound start built on the priors: a fold never reads the
//! profile's values of the fitted constants, because the shipped profile IS the joint fit
//! over every experiment, the left-out one included.
//!
//! Upper bounds that mean "no more host time than the measured step" count the MODEL's
//! launches ([`super::params::MaxFrom::ModelLaunches`]). A constant that ends on a bound is
//! flagged: the measurements then want a value its bound's measurement rules out. Per
//! constant the fit also reports how much of its prior variance the data removed
//! ([`super::prior::data_shares`]): identified by the data, or still its prior.

use super::compare::{CalibrationSet, Comparison, FigureRow};
use super::error::CalibrationError;
use super::figure::Figure;
use super::gates::Tolerance;
use super::lm::{LmOptions, LmOutcome, jacobian, minimise};
use super::measured::MeasuredRun;
use super::params::{FitParam, MaxFrom, get, prior_cost, prior_residuals, set};
use super::prior::{IDENTIFIED_DATA_SHARE, data_shares};
use crate::profile::HardwareProfile;

/// Residual given to a fitted figure the simulation could not predict (NaN or <= 0): as
/// bad as a factor of e^5, so the fit steers away from it without overflowing.
const UNPREDICTED_RESIDUAL: f64 = 5.0;

/// Which bound a fitted constant ended on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtBound {
    /// The lower bound.
    Lower,
    /// The upper bound.
    Upper,
}

/// One constant after the fit.
#[derive(Debug, Clone, PartialEq)]
pub struct FittedParam {
    /// The constant, its bounds and its prior.
    pub param: FitParam,
    /// Its value at the first start (the profile's value in the full fit, its prior centre
    /// clipped into the bounds in a blind fit).
    pub start: f64,
    /// Its fitted value.
    pub value: f64,
    /// The bound it ended on, if any (flag it: see the module documentation).
    pub at_bound: Option<AtBound>,
    /// No fitted figure of the selected runs depends on it (a zero column of the data
    /// Jacobian at the fitted point): its value is its prior's.
    pub unidentified: bool,
    /// Fraction of its prior variance the selected figures removed, in [0, 1]
    /// ([`super::prior::data_shares`]): near 1 the data set it, near 0 the prior does.
    pub data_share: f64,
    /// Its prior residual at the fitted value, in sigmas (`(ln v - ln centre) / width`).
    pub prior_sigmas: f64,
}

impl FittedParam {
    /// True when the data removed at least [`IDENTIFIED_DATA_SHARE`] of its prior variance.
    pub fn identified(&self) -> bool {
        self.data_share >= IDENTIFIED_DATA_SHARE
    }
}

/// Which start points a fit uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starts {
    /// The full fit: the profile's values first, then the blind starts ([`START_LABELS`]).
    WithProfile,
    /// Leave-one-out: never the profile's values of the fitted constants
    /// ([`BLIND_START_LABELS`]).
    Blind,
}

/// Labels of the full fit's starts, in the order they run.
pub const START_LABELS: [&str; 4] = ["profile", "mid-bounds", "host-bound", "priors"];

/// Labels of a blind fit's starts (leave-one-out), in the order they run.
pub const BLIND_START_LABELS: [&str; 3] = ["priors", "mid-bounds", "host-bound"];

/// Fraction of its upper bound [`HOST_BOUND_START_KEY`] starts at in the host-bound start.
pub const HOST_BOUND_START_FRACTION: f64 = 0.9;

/// The constant the host-bound start raises: the unmodelled host work per kernel (the launch
/// cost itself is confined to its public range, so a host-bound step can only come from it).
pub const HOST_BOUND_START_KEY: &str = "calibration.host_unmodelled_us_per_kernel";

/// Where one start of the fit began and ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StartOutcome {
    /// Which start ([`START_LABELS`] or [`BLIND_START_LABELS`]).
    pub label: &'static str,
    /// Constant values it started from, in the fit's parameter order.
    pub start: Vec<f64>,
    /// Constant values it ended at.
    pub end: Vec<f64>,
    /// Half the sum of squared residuals (data and prior) at its start.
    pub cost_start: f64,
    /// The same at its end.
    pub cost: f64,
    /// Solver iterations it ran.
    pub iterations: usize,
}

/// The outcome of a joint fit.
#[derive(Debug, Clone)]
pub struct FitOutcome {
    /// The profile with the fitted constants.
    pub profile: HardwareProfile,
    /// Every figure of the selected runs with the fitted profile.
    pub comparison: Comparison,
    /// The fitted constants.
    pub params: Vec<FittedParam>,
    /// Half the sum of squared residuals (data and prior) at the first start.
    pub cost_start: f64,
    /// The same after the fit: [`FitOutcome::data_cost`] plus [`FitOutcome::prior_cost`].
    pub cost: f64,
    /// The data part of `cost`: half the sum of squared figure residuals.
    pub data_cost: f64,
    /// The prior part of `cost`: half the sum of squared prior residuals.
    pub prior_cost: f64,
    /// Solver iterations.
    pub iterations: usize,
    /// Simulations of the selected run set.
    pub evaluations: usize,
    /// Which start list ran.
    pub start_set: Starts,
    /// Every start's outcome, in label order (the kept one has the lowest cost, the earliest
    /// on a tie).
    pub starts: Vec<StartOutcome>,
}

/// True when the row enters the least squares: a fitted figure with a non-zero measurement
/// (a measured zero has no log residual; it is checked by its tolerance instead).
pub fn is_fitted_row(row: &FigureRow) -> bool {
    row.rule.fit_weight > 0.0 && row.measured != 0.0
}

/// The weighted log residual of a fitted row: `weight * ln(predicted / measured)`.
pub fn log_residual(row: &FigureRow) -> f64 {
    let w = row.rule.fit_weight;
    if row.predicted.is_finite() && row.predicted > 0.0 {
        w * (row.predicted / row.measured).ln()
    } else {
        w * UNPREDICTED_RESIDUAL
    }
}

/// The log width of a row's a-priori tolerance: `ln(1 + limit)` for a relative tolerance,
/// `ln(1 + limit / measured)` for one in percentage points (an overlap rate). The fit
/// measures every residual in these units, so a figure exactly at its tolerance weighs the
/// same whatever its kind: a step time known to 10% pulls harder than a one-step profiler
/// figure known to 25% (least squares with the tolerance as the standard deviation).
pub fn tolerance_log_width(row: &FigureRow) -> f64 {
    match row.rule.tolerance {
        Tolerance::Relative(limit) => (1.0 + limit).ln(),
        Tolerance::AbsoluteFraction(limit) => (1.0 + limit / row.measured.abs()).ln(),
    }
}

/// A fitted row's residual in tolerance units: [`log_residual`] over
/// [`tolerance_log_width`].
pub fn scaled_residual(row: &FigureRow) -> f64 {
    log_residual(row) / tolerance_log_width(row)
}

/// The residual vector of a comparison: the fitted rows in row order, in tolerance units,
/// then every step-time difference whose two runs were compared, its error over its
/// tolerance ([`super::difference`]). A difference (the paper's headline figure) is known
/// better than either step time (device-speed errors cancel in it), so the fit weighs it by
/// its own, tighter tolerance instead of only through the two step times.
pub fn residuals(c: &Comparison) -> Vec<f64> {
    let mut r: Vec<f64> = c
        .rows
        .iter()
        .filter(|r| is_fitted_row(r))
        .map(scaled_residual)
        .collect();
    r.extend(c.differences.iter().filter_map(|d| d.residual()));
    r
}

/// Half the sum of squared residuals of a comparison.
pub fn cost(c: &Comparison) -> f64 {
    0.5 * residuals(c).iter().map(|r| r * r).sum::<f64>()
}

fn with_values(
    start: &HardwareProfile,
    params: &[FitParam],
    log_values: &[f64],
) -> HardwareProfile {
    let mut p = start.clone();
    for (param, z) in params.iter().zip(log_values) {
        set(&mut p, &param.key, from_log(param, *z));
    }
    p
}

/// The value of `param` at log value `z`, clamped to its bounds: the fit works on logs, and
/// `exp(ln(min))` can land one ulp below `min` (54.599999999999994 for 54.6).
fn from_log(param: &FitParam, z: f64) -> f64 {
    z.exp().clamp(param.min, param.max)
}

/// `start` with every fitted constant at its prior centre (clipped into its bounds): the
/// base a blind fit builds on, so nothing of it depends on the profile's fitted values.
fn with_priors(start: &HardwareProfile, params: &[FitParam]) -> HardwareProfile {
    let mut p = start.clone();
    for param in params {
        set(
            &mut p,
            &param.key,
            param.prior.centre.clamp(param.min, param.max),
        );
    }
    p
}

/// `base` with the host-bound constant at [`HOST_BOUND_START_FRACTION`] of its upper bound
/// (unchanged when that constant is not fitted).
fn host_bound(params: &[FitParam], base: &[f64], lo: &[f64]) -> Vec<f64> {
    let mut host = base.to_vec();
    for (j, p) in params.iter().enumerate() {
        if p.key == HOST_BOUND_START_KEY {
            host[j] = (HOST_BOUND_START_FRACTION * p.max).ln().max(lo[j]);
        }
    }
    host
}

/// The labelled log start points of a fit ([`START_LABELS`] or [`BLIND_START_LABELS`]):
/// `x0` is the profile's values (full fit only), `prior` the prior centres clipped into the
/// bounds.
fn start_points(
    starts: Starts,
    params: &[FitParam],
    (x0, prior): (&[f64], &[f64]),
    (lo, hi): (&[f64], &[f64]),
) -> Vec<(&'static str, Vec<f64>)> {
    let mid: Vec<f64> = lo.iter().zip(hi).map(|(l, h)| 0.5 * (l + h)).collect();
    match starts {
        Starts::WithProfile => START_LABELS
            .into_iter()
            .zip([x0.to_vec(), mid, host_bound(params, x0, lo), prior.to_vec()])
            .collect(),
        Starts::Blind => BLIND_START_LABELS
            .into_iter()
            .zip([prior.to_vec(), mid, host_bound(params, prior, lo)])
            .collect(),
    }
}

/// `params` with their upper bounds resolved against the starting profile's comparison of
/// every run, when any bound follows the model ([`MaxFrom::ModelLaunches`]).
fn resolved(
    set: &CalibrationSet,
    start: &HardwareProfile,
    params: &[FitParam],
) -> Result<Vec<FitParam>, CalibrationError> {
    if params
        .iter()
        .any(|p| matches!(p.max_from, MaxFrom::ModelLaunches { .. }))
    {
        Ok(resolve_bounds(params, &set.compare(start)?))
    } else {
        Ok(params.to_vec())
    }
}

/// The fitted constants at the solver's outcome with their bound flags and what the data
/// identify (`shares`, `zero_columns` from the data Jacobian at the fitted point).
fn fitted_params(
    params: &[FitParam],
    first_start: &[f64],
    out: &LmOutcome,
    (lo, hi): (&[f64], &[f64]),
    (shares, zero_columns): (&[f64], &[bool]),
) -> Vec<FittedParam> {
    params
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let at_bound = if out.x[j] - lo[j] <= 1e-9 {
                Some(AtBound::Lower)
            } else if hi[j] - out.x[j] <= 1e-9 {
                Some(AtBound::Upper)
            } else {
                None
            };
            FittedParam {
                param: p.clone(),
                start: first_start[j].exp(),
                value: from_log(p, out.x[j]),
                at_bound,
                unidentified: zero_columns[j],
                data_share: shares[j],
                prior_sigmas: p.prior.residual(out.x[j]),
            }
        })
        .collect()
}

/// Fits `params` jointly on the runs of `set` that `keep` selects, from every start of
/// [`START_LABELS`] (the profile's values first): [`fit_joint_with`] with
/// [`Starts::WithProfile`].
pub fn fit_joint(
    set: &CalibrationSet,
    start: &HardwareProfile,
    params: &[FitParam],
    keep: impl Fn(&MeasuredRun) -> bool + Copy + Sync,
    options: &LmOptions,
) -> Result<FitOutcome, CalibrationError> {
    fit_joint_with(set, start, params, keep, options, Starts::WithProfile)
}

/// Fits `params` jointly (MAP: figure residuals plus prior residuals) on the runs of `set`
/// that `keep` selects, from every start of `starts` (the lowest final cost wins, the
/// earliest on a tie). Upper bounds that follow the model are resolved first
/// ([`super::params::FitParam::resolved`]), against `start` in the full fit and against
/// `start` with the fitted constants at their priors in a blind one, so a blind fit's result
/// does not depend on the profile's values of the fitted constants. Then the data Jacobian
/// at the fitted point gives each constant's data share. Deterministic. Errors name an
/// unknown key or the simulation that failed.
pub fn fit_joint_with(
    set: &CalibrationSet,
    start: &HardwareProfile,
    params: &[FitParam],
    keep: impl Fn(&MeasuredRun) -> bool + Copy + Sync,
    options: &LmOptions,
    starts: Starts,
) -> Result<FitOutcome, CalibrationError> {
    let base = match starts {
        Starts::WithProfile => start.clone(),
        Starts::Blind => with_priors(start, params),
    };
    let params = resolved(set, &base, params)?;
    let params = params.as_slice();
    let mut x0 = Vec::with_capacity(params.len());
    for p in params {
        let v = get(&base, &p.key)
            .ok_or_else(|| CalibrationError::UnknownKey { key: p.key.clone() })?;
        x0.push(v.max(f64::MIN_POSITIVE).ln());
    }
    let lo: Vec<f64> = params.iter().map(|p| p.min.ln()).collect();
    let hi: Vec<f64> = params.iter().map(|p| p.max.ln()).collect();
    let prior: Vec<f64> = params
        .iter()
        .map(|p| p.prior.centre.clamp(p.min, p.max).ln())
        .collect();
    let data = |z: &[f64]| {
        let c = set.compare_where(&with_values(&base, params, z), keep)?;
        Ok::<_, CalibrationError>(residuals(&c))
    };
    let f = |z: &[f64]| {
        let mut r = data(z)?;
        r.extend(prior_residuals(params, z));
        Ok::<_, CalibrationError>(r)
    };
    let values =
        |z: &[f64]| -> Vec<f64> { params.iter().zip(z).map(|(p, z)| from_log(p, *z)).collect() };
    let points = start_points(starts, params, (&x0, &prior), (&lo, &hi));
    let mut outcomes = Vec::new();
    let mut best: Option<LmOutcome> = None;
    let (mut iterations, mut evaluations) = (0, 0);
    for (label, z0) in &points {
        let out = minimise(z0, &lo, &hi, options, f)?;
        iterations += out.iterations;
        evaluations += out.evaluations;
        outcomes.push(StartOutcome {
            label,
            start: values(z0),
            end: values(&out.x),
            cost_start: out.cost_start,
            cost: out.cost,
            iterations: out.iterations,
        });
        if best.as_ref().is_none_or(|b| out.cost < b.cost) {
            best = Some(out);
        }
    }
    let out = best.expect("every start list is non-empty");
    let profile = with_values(&base, params, &out.x);
    let comparison = set.compare_where(&profile, keep)?;
    let r_data = residuals(&comparison);
    let jac = jacobian(&out.x, &r_data, &hi, options.fd_step, &data)?;
    let widths: Vec<f64> = params.iter().map(|p| p.prior.log_width).collect();
    let shares = data_shares(&jac, &widths);
    let zero_columns: Vec<bool> = (0..params.len())
        .map(|j| jac.iter().all(|row| row[j] == 0.0))
        .collect();
    let data_cost = cost(&comparison);
    Ok(FitOutcome {
        params: fitted_params(
            params,
            &points[0].1,
            &out,
            (&lo, &hi),
            (&shares, &zero_columns),
        ),
        profile,
        comparison,
        cost_start: outcomes[0].cost_start,
        cost: out.cost,
        data_cost,
        prior_cost: prior_cost(params, &out.x),
        iterations,
        evaluations: evaluations + 2 + params.len(),
        start_set: starts,
        starts: outcomes,
    })
}

/// Every constant of `params` with its bounds resolved against `c` ([`resolved_bound`]).
pub fn resolve_bounds(params: &[FitParam], c: &Comparison) -> Vec<FitParam> {
    params.iter().map(|p| resolved_bound(p, c)).collect()
}

/// `p` with its upper bound resolved against `c` (the comparison of the
/// starting profile): a [`MaxFrom::ModelLaunches`] bound becomes the measured step over
/// the modelled launches of its run when that is tighter than [`FitParam::max`] (and
/// above the minimum); a fixed one is returned as it is.
pub fn resolved_bound(p: &FitParam, c: &Comparison) -> FitParam {
    let MaxFrom::ModelLaunches { run, step_s } = &p.max_from else {
        return p.clone();
    };
    let launches = [Figure::DeviceKernels, Figure::Collectives]
        .iter()
        .map(|f| c.row(run, *f).map(|r| r.predicted))
        .sum::<Option<f64>>();
    match launches.map(|n| step_s * 1e6 / n) {
        Some(per_launch) if per_launch > p.min && per_launch < p.max => FitParam {
            max: per_launch,
            ..p.clone()
        },
        _ => p.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blind fit's starts never contain the profile's values: the priors first, then the
    /// bound midpoints and the host-bound start built on the priors; the full fit runs the
    /// profile first and the priors last.
    #[test]
    fn blind_starts_never_use_the_profiles_values() {
        let param = |key: &str, max: f64, centre: f64| FitParam {
            key: key.into(),
            min: 0.1,
            max,
            bound_source: "test".into(),
            max_from: MaxFrom::Fixed,
            blind: None,
            prior: crate::calibration::prior::Prior {
                centre,
                log_width: 0.5,
                source: "test".into(),
            },
        };
        let params = [
            param("calibration.gemm_ceiling", 1.0, 0.92),
            param(HOST_BOUND_START_KEY, 1000.0, 3.0),
        ];
        let lo: Vec<f64> = params.iter().map(|p| p.min.ln()).collect();
        let hi: Vec<f64> = params.iter().map(|p| p.max.ln()).collect();
        let x0 = [0.5f64.ln(), 42.0f64.ln()];
        let prior: Vec<f64> = params.iter().map(|p| p.prior.centre.ln()).collect();
        let blind = start_points(Starts::Blind, &params, (&x0, &prior), (&lo, &hi));
        let labels: Vec<&str> = blind.iter().map(|(l, _)| *l).collect();
        assert_eq!(labels, BLIND_START_LABELS);
        assert_eq!(blind[0].1, prior);
        for (_, z) in &blind {
            for (j, v) in z.iter().enumerate() {
                assert_ne!(*v, x0[j], "a blind start uses the profile's value");
            }
        }
        assert_eq!(blind[2].1[0], prior[0]);
        assert!((blind[2].1[1] - (HOST_BOUND_START_FRACTION * params[1].max).ln()).abs() < 1e-12);
        let full = start_points(Starts::WithProfile, &params, (&x0, &prior), (&lo, &hi));
        let labels: Vec<&str> = full.iter().map(|(l, _)| *l).collect();
        assert_eq!(labels, START_LABELS);
        assert_eq!(full[0].1, x0.to_vec());
        assert_eq!(full[3].1, prior);
    }

    /// A constant fitted onto its bound reports a value inside the bound, not one ulp outside
    /// (the full joint fit in CI stopped `host_launch_us_per_collective` at 54.599999999999994
    /// with a lower bound of 54.6).
    #[test]
    fn a_value_at_a_bound_stays_inside_it() {
        let param = FitParam {
            key: "calibration.host_launch_us_per_collective".into(),
            min: 54.6,
            max: 94.7,
            bound_source: "test".into(),
            max_from: crate::calibration::params::MaxFrom::Fixed,
            blind: None,
            prior: crate::calibration::prior::Prior {
                centre: 70.0,
                log_width: 1.0,
                source: "test".into(),
            },
        };
        assert!(
            54.6f64.ln().exp() < 54.6,
            "the float case this guards against"
        );
        assert_eq!(from_log(&param, 54.6f64.ln()), 54.6);
        let top = from_log(&param, 94.7f64.ln());
        assert!((54.6..=94.7).contains(&top), "{top}");
        assert_eq!(from_log(&param, 200.0f64.ln()), 94.7);
        assert_eq!(from_log(&param, 10.0f64.ln()), 54.6);
    }
}
