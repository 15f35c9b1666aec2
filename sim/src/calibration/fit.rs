//! Fitting the calibrated constants of a profile to the held-in measurements.
//!
//! Each fitted constant is paired with the one measured figure it physically determines
//! ([`FIT_TARGETS`]): copy efficiency with FSDP2's copy-in/copy-out time, host cost per
//! collective with HyperParallel's host time in collective APIs, compute efficiency with
//! HyperParallel's step time, intra-machine bandwidth efficiency with FSDP2's step time (its
//! exposed communication is the larger; the weighted-bandwidth figures are the cross-check), and validation dispatch cost with experiment A's
//! validation-mode overhead. The fit solves each pairing by bisection in log space with the
//! other constants held, and sweeps all pairs until nothing moves (Gauss-Seidel), so the
//! result is deterministic and every constant can be traced to one figure. Counts, payloads,
//! memory and every other figure are derived and reported, never fitted.

use super::compare::{CalibrationSet, Comparison};
use super::measured::Figure;
use crate::error::SimError;
use crate::profile::HardwareProfile;

/// A fitted constant: where it lives in the profile and its allowed range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitParam {
    /// Dotted profile key (`calibration.gemm_ceiling`).
    pub key: &'static str,
    /// Lowest allowed value.
    pub min: f64,
    /// Highest allowed value.
    pub max: f64,
}

/// What a constant is fitted to: one figure of one measured run, or experiment A's
/// validation-mode overhead (validation minus production step time).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FitFigure {
    /// A figure of the run with this label.
    Run(&'static str, Figure),
    /// Experiment A's validation-mode overhead, seconds.
    ValidationOverhead,
}

/// A constant and the figure it is fitted to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitTarget {
    /// The constant.
    pub param: FitParam,
    /// The figure.
    pub figure: FitFigure,
}

const fn target(key: &'static str, min: f64, max: f64, figure: FitFigure) -> FitTarget {
    FitTarget {
        param: FitParam { key, min, max },
        figure,
    }
}

/// The pairings the A3 fit solves, in sweep order.
pub const FIT_TARGETS: [FitTarget; 5] = [
    target(
        "calibration.copy_efficiency",
        0.05,
        1.0,
        FitFigure::Run("PyTorch FSDP2", Figure::CopyS),
    ),
    target(
        "calibration.host_launch_us_per_collective",
        0.5,
        500.0,
        FitFigure::Run("HyperParallel-FSDP", Figure::HostCollectiveS),
    ),
    target(
        "calibration.gemm_ceiling",
        0.05,
        1.0,
        FitFigure::Run("HyperParallel-FSDP", Figure::StepTimeS),
    ),
    target(
        "tiers.intra_machine.efficiency",
        0.1,
        1.0,
        FitFigure::Run("PyTorch FSDP2", Figure::StepTimeS),
    ),
    target(
        "calibration.validation_dispatch_us_per_op",
        0.01,
        1000.0,
        FitFigure::ValidationOverhead,
    ),
];

/// The constants the fit adjusts.
pub fn fit_params() -> Vec<FitParam> {
    FIT_TARGETS.iter().map(|t| t.param).collect()
}

/// (predicted, measured) of a fit figure in a comparison.
pub fn figure_values(c: &Comparison, figure: FitFigure) -> Option<(f64, f64)> {
    match figure {
        FitFigure::Run(run, f) => c.row(run, f).map(|r| (r.predicted, r.measured)),
        FitFigure::ValidationOverhead => {
            let p = c.row("production mode", Figure::StepTimeS)?;
            let v = c.row("validation mode", Figure::StepTimeS)?;
            Some((v.predicted - p.predicted, v.measured - p.measured))
        }
    }
}

/// Reads a fitted constant from a profile.
pub fn get(profile: &HardwareProfile, key: &str) -> Option<f64> {
    let c = &profile.calibration;
    Some(match key {
        "calibration.gemm_ceiling" => c.gemm_ceiling,
        "calibration.copy_efficiency" => c.copy_efficiency,
        "calibration.device_launch_us_per_kernel" => c.device_launch_us_per_kernel,
        "calibration.collective_base_latency_us" => c.collective_base_latency_us,
        "calibration.host_launch_us_per_kernel" => c.host_launch_us_per_kernel,
        "calibration.host_launch_us_per_collective" => c.host_launch_us_per_collective,
        "calibration.validation_dispatch_us_per_op" => c.validation_dispatch_us_per_op,
        "tiers.intra_machine.efficiency" => profile.tiers.intra_machine.efficiency,
        _ => return None,
    })
}

/// Writes a fitted constant into a profile; false for an unknown key.
pub fn set_param(profile: &mut HardwareProfile, key: &str, value: f64) -> bool {
    let c = &mut profile.calibration;
    let slot = match key {
        "calibration.gemm_ceiling" => &mut c.gemm_ceiling,
        "calibration.copy_efficiency" => &mut c.copy_efficiency,
        "calibration.device_launch_us_per_kernel" => &mut c.device_launch_us_per_kernel,
        "calibration.collective_base_latency_us" => &mut c.collective_base_latency_us,
        "calibration.host_launch_us_per_kernel" => &mut c.host_launch_us_per_kernel,
        "calibration.host_launch_us_per_collective" => &mut c.host_launch_us_per_collective,
        "calibration.validation_dispatch_us_per_op" => &mut c.validation_dispatch_us_per_op,
        "tiers.intra_machine.efficiency" => &mut profile.tiers.intra_machine.efficiency,
        _ => return false,
    };
    *slot = value;
    true
}

/// The objective of a comparison (lower is better): the sum over [`FIT_TARGETS`] of squared
/// relative errors. Reported before and after the fit.
pub fn objective(c: &Comparison) -> f64 {
    FIT_TARGETS
        .iter()
        .filter_map(|t| figure_values(c, t.figure))
        .map(|(p, m)| {
            let e = (p - m) / m;
            e * e
        })
        .sum()
}

/// The outcome of a fit.
#[derive(Debug, Clone)]
pub struct FitOutcome {
    /// The fitted profile.
    pub profile: HardwareProfile,
    /// Its comparison.
    pub comparison: Comparison,
    /// Objective before fitting.
    pub objective_before: f64,
    /// Objective after fitting.
    pub objective_after: f64,
    /// Simulations run.
    pub evaluations: usize,
}

/// Solves one target by bisection in log space: the value in `[min, max]` whose predicted
/// figure equals the measured one (the predicted figure is monotone in the constant); the
/// better end of the range when the measurement lies outside what the range can reach.
fn solve_one(
    set: &CalibrationSet,
    profile: &HardwareProfile,
    t: &FitTarget,
    evaluations: &mut usize,
) -> Result<f64, SimError> {
    let eval = |x: f64, evaluations: &mut usize| -> Result<f64, SimError> {
        let mut trial = profile.clone();
        set_param(&mut trial, t.param.key, x);
        *evaluations += 1;
        let c = set.compare(&trial)?;
        let (p, m) = figure_values(&c, t.figure).unwrap_or((f64::NAN, f64::NAN));
        Ok(p - m)
    };
    let (mut lo, mut hi) = (t.param.min.ln(), t.param.max.ln());
    let f_lo = eval(lo.exp(), evaluations)?;
    let f_hi = eval(hi.exp(), evaluations)?;
    if f_lo.is_nan() || f_hi.is_nan() {
        return Ok(get(profile, t.param.key).unwrap_or(t.param.min));
    }
    if f_lo.signum() == f_hi.signum() {
        return Ok(if f_lo.abs() <= f_hi.abs() {
            lo.exp()
        } else {
            hi.exp()
        });
    }
    let rising = f_hi > f_lo;
    for _ in 0..24 {
        let mid = 0.5 * (lo + hi);
        let f = eval(mid.exp(), evaluations)?;
        if (f > 0.0) == rising {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok((0.5 * (lo + hi)).exp())
}

/// Fits [`FIT_TARGETS`] of `start` on `set`, sweeping at most `max_sweeps` times.
pub fn fit(
    set: &CalibrationSet,
    start: &HardwareProfile,
    max_sweeps: usize,
) -> Result<FitOutcome, SimError> {
    let mut profile = start.clone();
    let before = objective(&set.compare(&profile)?);
    let mut evaluations = 1;
    for _ in 0..max_sweeps {
        let mut moved = 0.0f64;
        for t in &FIT_TARGETS {
            let old = get(&profile, t.param.key).unwrap_or(t.param.min);
            let new = solve_one(set, &profile, t, &mut evaluations)?;
            set_param(&mut profile, t.param.key, new);
            moved = moved.max((new / old - 1.0).abs());
        }
        if moved < 1e-3 {
            break;
        }
    }
    let comparison = set.compare(&profile)?;
    evaluations += 1;
    Ok(FitOutcome {
        objective_after: objective(&comparison),
        profile,
        comparison,
        objective_before: before,
        evaluations,
    })
}
