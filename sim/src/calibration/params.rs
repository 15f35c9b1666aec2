//! The residual constants a joint fit adjusts, their bounds and where each bound comes from,
//! the constants measured directly on one run, and the public ranges of constants the fit
//! leaves alone. All of them are data: a runs file's `[[fit]]`, `[[measured_constant]]` and
//! `[[sourced_range]]` entries ([`super::runs_file`]); this module holds their types and what
//! a fit and a leave-one-out fold do with them.
//!
//! Every bound is tied to a direct measurement where one exists: of the measured runs
//! themselves or a public measurement of the same software path (the source text names the
//! address, hardware, versions and the arithmetic); the others are marked ASSUMPTION. A
//! constant that the fit leaves at a bound is flagged in the fit's output: the measurements
//! then want a value the bound's measurement rules out, which points at a modelling gap
//! rather than at a constant to move.

use super::error::CalibrationError;
use super::holdout::Holdout;
use super::prior::Prior;
use crate::profile::HardwareProfile;

pub use super::profile_keys::{KEYS, get, set};

/// Where a constant's upper bound comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum MaxFrom {
    /// [`FitParam::max`] as written.
    Fixed,
    /// The tighter of [`FitParam::max`] (a ceiling from public measurements) and a measured
    /// step time over the launches the MODEL issues (device kernels plus collectives of rank
    /// 0's simulated program of the measured run labelled `run`): a serial host cannot spend
    /// more than the whole measured step on the launches the model charges it for, so that
    /// bound counts the model's launches, not the measured ones (the model's per-launch
    /// constant stands for however many real launches each modelled one represents).
    /// [`FitParam::max`] alone applies when the run is not in the comparison.
    ModelLaunches {
        /// Label of the measured run ([`super::MeasuredRun::label`]).
        run: String,
        /// Its measured step time, seconds.
        step_s: f64,
    },
}

/// One fitted constant: its profile key, its allowed range and the source of that range.
#[derive(Debug, Clone, PartialEq)]
pub struct FitParam {
    /// Dotted profile key (`calibration.copy_efficiency`, `tiers.intra_machine.efficiency`).
    pub key: String,
    /// Lowest allowed value (> 0: the fit works on the logarithm).
    pub min: f64,
    /// Highest allowed value.
    pub max: f64,
    /// Where `min` and `max` come from (measurement and arithmetic, or ASSUMPTION).
    pub bound_source: String,
    /// How `max` follows the model ([`super::fit::resolve_bounds`]).
    pub max_from: MaxFrom,
    /// The bounds a leave-one-out fold uses when it leaves out an experiment or run whose
    /// measurements these bounds come from ([`FitParam::without`]); `None` when no bound
    /// comes from a measured run.
    pub blind: Option<BlindBounds>,
    /// The constant's prior (centre, log width, public source): the MAP fit's pull toward
    /// what is known without the held-in measurements ([`super::prior`]).
    pub prior: Prior,
}

/// Bounds that use no measurement of the listed experiments: a leave-one-out fold that leaves
/// one of them (or one of the listed runs) out must not constrain the fit with those figures
/// through a bound either, or the held-out prediction is not held out.
#[derive(Debug, Clone, PartialEq)]
pub struct BlindBounds {
    /// Labels of the experiments (`B`, `A mbs2`) whose measurements the normal bounds use.
    pub experiments: Vec<String>,
    /// The runs of those experiments ([`super::MeasuredRun::label`]) the normal bounds take
    /// their values from; empty: the experiments as a whole (or several runs together), so
    /// leaving out any of their runs blinds them.
    pub runs: Vec<String>,
    /// Lowest allowed value without them (ASSUMPTION, stated in `source`).
    pub min: f64,
    /// Highest allowed value without them.
    pub max: f64,
    /// Where these wider bounds come from.
    pub source: String,
}

impl FitParam {
    /// This constant as a fold that leaves out `left_out` (an experiment or one of its runs)
    /// may use it: unchanged when its bounds use none of those measurements, otherwise with
    /// its [`BlindBounds`] (and an upper bound that no longer follows the model's launches of
    /// a left-out run).
    pub fn without(&self, left_out: &Holdout) -> FitParam {
        match &self.blind {
            Some(b) if b.experiments.iter().any(|e| left_out.touches(e, &b.runs)) => FitParam {
                min: b.min,
                max: b.max,
                bound_source: b.source.clone(),
                max_from: MaxFrom::Fixed,
                ..self.clone()
            },
            _ => self.clone(),
        }
    }
}

/// A profile constant the fit does not adjust (no held-in figure isolates it) but whose
/// value public measurements confine: its range and where that comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcedRange {
    /// Dotted profile key.
    pub key: String,
    /// Lowest plausible value.
    pub min: f64,
    /// Highest plausible value.
    pub max: f64,
    /// The measurements (address, hardware, versions) and the arithmetic.
    pub source: String,
}

/// The constants of `profile` that lie outside their `ranges`, with their values (a
/// constant the profile does not have is skipped: `get` names every key it knows).
pub fn outside_sourced_ranges<'a>(
    ranges: &'a [SourcedRange],
    profile: &HardwareProfile,
) -> Vec<(&'a SourcedRange, f64)> {
    ranges
        .iter()
        .filter_map(|r| get(profile, &r.key).map(|v| (r, v)))
        .filter(|(r, v)| !(r.min..=r.max).contains(v))
        .collect()
}

/// A profile constant measured directly on one held-in experiment (not fitted): a
/// leave-one-out fold that leaves that experiment (or the run it comes from) out must not use
/// it either, so it uses `blind_value` instead ([`blind_profile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredConstant {
    /// Dotted profile key.
    pub key: String,
    /// Label of the experiment it was measured on (`B`, `A mbs2`).
    pub experiment: String,
    /// The runs of that experiment it was measured on; empty: the experiment as a whole.
    pub runs: Vec<String>,
    /// Its value in a fold without that experiment.
    pub blind_value: f64,
    /// Where the blind value comes from (public source or ASSUMPTION).
    pub blind_source: String,
}

/// `profile` as a fold without `left_out` (an experiment or one of its runs) may use it:
/// every entry of `constants` measured on what is left out at its blind value; returns the
/// entries it replaced. Errors name a key this module cannot write.
pub fn blind_profile(
    profile: &HardwareProfile,
    constants: &[MeasuredConstant],
    left_out: &Holdout,
) -> Result<(HardwareProfile, Vec<MeasuredConstant>), CalibrationError> {
    let mut p = profile.clone();
    let mut replaced = Vec::new();
    for m in constants
        .iter()
        .filter(|m| left_out.touches(&m.experiment, &m.runs))
    {
        if !set(&mut p, &m.key, m.blind_value) {
            return Err(CalibrationError::UnknownKey { key: m.key.clone() });
        }
        replaced.push(m.clone());
    }
    Ok((p, replaced))
}

/// The prior residuals of log values `z` of `params`, in parameter order.
pub fn prior_residuals(params: &[FitParam], z: &[f64]) -> Vec<f64> {
    params
        .iter()
        .zip(z)
        .map(|(p, z)| p.prior.residual(*z))
        .collect()
}

/// Half the sum of squared prior residuals of log values `z`.
pub fn prior_cost(params: &[FitParam], z: &[f64]) -> f64 {
    0.5 * prior_residuals(params, z)
        .iter()
        .map(|r| r * r)
        .sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(blind: Option<BlindBounds>) -> FitParam {
        FitParam {
            key: "calibration.copy_efficiency".into(),
            min: 0.2,
            max: 1.0,
            bound_source: "test".into(),
            max_from: MaxFrom::ModelLaunches {
                run: "r1".into(),
                step_s: 1.0,
            },
            blind,
            prior: Prior {
                centre: 0.5,
                log_width: 0.4,
                source: "test".into(),
            },
        }
    }

    /// A fold blinds the bounds of what it leaves out only: the whole experiment, or the run
    /// the bounds come from; a sibling run or another experiment changes nothing.
    #[test]
    fn a_fold_blinds_only_bounds_taken_from_what_it_leaves_out() {
        let blind = BlindBounds {
            experiments: vec!["E".into()],
            runs: vec!["r1".into()],
            min: 0.05,
            max: 1.0,
            source: "ASSUMPTION blind".into(),
        };
        let p = param(Some(blind.clone()));
        for left_out in [Holdout::whole("E"), Holdout::run("E", "r1")] {
            let w = p.without(&left_out);
            assert_eq!(
                (w.min, w.max, w.bound_source.as_str()),
                (0.05, 1.0, "ASSUMPTION blind")
            );
            assert_eq!(w.max_from, MaxFrom::Fixed);
        }
        assert_eq!(p.without(&Holdout::run("E", "r2")), p);
        assert_eq!(p.without(&Holdout::whole("F")), p);
        assert_eq!(param(None).without(&Holdout::whole("E")), param(None));
    }

    #[test]
    fn a_constant_outside_its_range_and_a_blinded_constant_are_reported() {
        let mut profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        let ranges = [SourcedRange {
            key: "calibration.host_d2h_sync_us".into(),
            min: 8.6,
            max: 130.1,
            source: "test".into(),
        }];
        assert!(outside_sourced_ranges(&ranges, &profile).is_empty());
        assert!(set(&mut profile, "calibration.host_d2h_sync_us", 500.0));
        let out = outside_sourced_ranges(&ranges, &profile);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1, 500.0);
        let constants = [MeasuredConstant {
            key: "calibration.unaligned_bandwidth_factor".into(),
            experiment: "E".into(),
            runs: vec!["r1".into()],
            blind_value: 1.0,
            blind_source: "ASSUMPTION".into(),
        }];
        let (p, replaced) = blind_profile(&profile, &constants, &Holdout::run("E", "r1")).unwrap();
        assert_eq!(get(&p, "calibration.unaligned_bandwidth_factor"), Some(1.0));
        assert_eq!(replaced.len(), 1);
        let (p, replaced) = blind_profile(&profile, &constants, &Holdout::run("E", "r2")).unwrap();
        assert_eq!(
            get(&p, "calibration.unaligned_bandwidth_factor"),
            get(&profile, "calibration.unaligned_bandwidth_factor")
        );
        assert!(replaced.is_empty());
    }
}
