//! The joint fit: a few residual constants ([`super::params::FIT_PARAMS`]) fitted together
//! by bounded least squares on the log residuals of every fitted figure
//! ([`super::gates::FIGURE_RULES`]) of every selected measured run.
//!
//! Each evaluation re-simulates the selected runs with trial constants; the solver
//! ([`super::lm`]) works on the logarithm of each constant (so efficiencies and microseconds
//! move by relative steps) with forward finite differences. It starts twice, from the
//! profile's values and from the log-midpoint of every bound, and keeps the lower cost: the
//! calibration's cost is not convex (from the profile alone the fit stopped at cost 0.65 on
//! one start and 0.25 on another that differed only in `hbm_efficiency`). A constant that ends on a bound is
//! flagged: the measurements then want a value its bound's measurement rules out.

use super::compare::{CalibrationSet, Comparison, FigureRow};
use super::error::CalibrationError;
use super::gates::rule_of;
use super::lm::{LmOptions, minimise_multistart};
use super::measured::MeasuredRun;
use super::params::{FitParam, get, set};
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
    /// The constant and its bounds.
    pub param: FitParam,
    /// Its value in the starting profile.
    pub start: f64,
    /// Its fitted value.
    pub value: f64,
    /// The bound it ended on, if any (flag it: see the module documentation).
    pub at_bound: Option<AtBound>,
    /// No fitted figure of the selected runs depends on it, so the fit kept its start value.
    pub unidentified: bool,
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
    /// Half the sum of squared weighted log residuals before the fit.
    pub cost_start: f64,
    /// The same after the fit.
    pub cost: f64,
    /// Solver iterations.
    pub iterations: usize,
    /// Simulations of the selected run set.
    pub evaluations: usize,
}

/// True when the row enters the least squares: a fitted figure with a non-zero measurement
/// (a measured zero has no log residual; it is checked by its tolerance instead).
pub fn is_fitted_row(row: &FigureRow) -> bool {
    rule_of(row.figure).fit_weight > 0.0 && row.measured != 0.0
}

/// The weighted log residual of a fitted row: `weight * ln(predicted / measured)`.
pub fn log_residual(row: &FigureRow) -> f64 {
    let w = rule_of(row.figure).fit_weight;
    if row.predicted.is_finite() && row.predicted > 0.0 {
        w * (row.predicted / row.measured).ln()
    } else {
        w * UNPREDICTED_RESIDUAL
    }
}

/// The residual vector of a comparison (fitted rows in row order).
pub fn residuals(c: &Comparison) -> Vec<f64> {
    c.rows
        .iter()
        .filter(|r| is_fitted_row(r))
        .map(log_residual)
        .collect()
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
        set(&mut p, param.key, from_log(param, *z));
    }
    p
}

/// The value of `param` at log value `z`, clamped to its bounds: the fit works on logs, and
/// `exp(ln(min))` can land one ulp below `min` (54.599999999999994 for 54.6).
fn from_log(param: &FitParam, z: f64) -> f64 {
    z.exp().clamp(param.min, param.max)
}

/// Fits `params` jointly on the runs of `set` that `keep` selects, starting from `start`'s
/// values and from the middle of the bounds (the lower cost wins). Deterministic. Errors name an unknown key or the simulation that failed.
pub fn fit_joint(
    set: &CalibrationSet,
    start: &HardwareProfile,
    params: &[FitParam],
    keep: impl Fn(&MeasuredRun) -> bool + Copy,
    options: &LmOptions,
) -> Result<FitOutcome, CalibrationError> {
    let mut x0 = Vec::with_capacity(params.len());
    for p in params {
        let v = get(start, p.key).ok_or_else(|| CalibrationError::UnknownKey {
            key: p.key.to_string(),
        })?;
        x0.push(v.max(f64::MIN_POSITIVE).ln());
    }
    let lo: Vec<f64> = params.iter().map(|p| p.min.ln()).collect();
    let hi: Vec<f64> = params.iter().map(|p| p.max.ln()).collect();
    // The profile's values, then the log-midpoint of every bound.
    let mid: Vec<f64> = lo.iter().zip(&hi).map(|(l, h)| 0.5 * (l + h)).collect();
    let starts = [x0.clone(), mid];
    let out = minimise_multistart(&starts, &lo, &hi, options, |z| {
        let c = set.compare_where(&with_values(start, params, z), keep)?;
        Ok::<_, CalibrationError>(residuals(&c))
    })?;
    let profile = with_values(start, params, &out.x);
    let comparison = set.compare_where(&profile, keep)?;
    let fitted = params
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
                param: *p,
                start: x0[j].exp(),
                value: from_log(p, out.x[j]),
                at_bound,
                unidentified: out.unidentified[j],
            }
        })
        .collect();
    Ok(FitOutcome {
        profile,
        comparison,
        params: fitted,
        cost_start: out.cost_start,
        cost: out.cost,
        iterations: out.iterations,
        evaluations: out.evaluations + 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A constant fitted onto its bound reports a value inside the bound, not one ulp outside
    /// (the full joint fit in CI stopped `host_launch_us_per_collective` at 54.599999999999994
    /// with a lower bound of 54.6).
    #[test]
    fn a_value_at_a_bound_stays_inside_it() {
        let param = FitParam {
            key: "calibration.host_launch_us_per_collective",
            min: 54.6,
            max: 94.7,
            bound_source: "test",
            max_from: crate::calibration::params::MaxFrom::Fixed,
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
