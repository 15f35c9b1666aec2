//! The residual constants the joint fit adjusts, their bounds and where each bound comes from,
//! in ONE table ([`FIT_PARAMS`]); reading and writing a constant of a profile by its dotted key.
//!
//! Every bound is tied to a direct measurement of `shared/calibration/README.md` where one
//! exists (the source text says which and how it was derived); the others are marked
//! ASSUMPTION. A constant that the fit leaves at a bound is flagged in the fit's output: the
//! measurements then want a value the bound's measurement rules out, which points at a
//! modelling gap rather than at a constant to move.

use super::compare::Comparison;
use super::measured::Figure;
use crate::profile::HardwareProfile;

/// Where a constant's upper bound comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MaxFrom {
    /// [`FitParam::max`] as written.
    Fixed,
    /// A measured step time over the launches the MODEL issues (device kernels plus
    /// collectives of rank 0's simulated program of the measured run labelled `run`): the
    /// bound says a serial host cannot spend more than the whole measured step on the
    /// launches the model charges it for, so it must count the model's launches, not the
    /// measured ones (the model's per-launch constant stands for however many real launches
    /// each modelled one represents). [`FitParam::max`] is the value with the measured
    /// launch counts, used when the run is not in the comparison.
    ModelLaunches {
        /// Label of the measured run ([`super::MeasuredRun::label`]).
        run: &'static str,
        /// Its measured step time, seconds.
        step_s: f64,
    },
}

/// One fitted constant: its profile key, its allowed range and the source of that range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitParam {
    /// Dotted profile key (`calibration.copy_efficiency`, `tiers.intra_machine.efficiency`).
    pub key: &'static str,
    /// Lowest allowed value (> 0: the fit works on the logarithm).
    pub min: f64,
    /// Highest allowed value.
    pub max: f64,
    /// Where `min` and `max` come from (measurement and arithmetic, or ASSUMPTION).
    pub bound_source: &'static str,
    /// How `max` follows the model ([`resolve_bounds`]).
    pub max_from: MaxFrom,
    /// The bounds a leave-one-out fold uses when it leaves out an experiment whose
    /// measurements these bounds come from ([`FitParam::without`]); `None` when no bound
    /// comes from a measurement.
    pub blind: Option<BlindBounds>,
}

/// Bounds that use no measurement of the listed experiments: a leave-one-out fold that leaves
/// one of them out must not constrain the fit with that experiment's figures through a bound
/// either, or the held-out prediction is not held out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlindBounds {
    /// Labels of the experiments (`B`, `A mbs2`) whose measurements the normal bounds use.
    pub experiments: &'static [&'static str],
    /// Lowest allowed value without them (ASSUMPTION, stated in `source`).
    pub min: f64,
    /// Highest allowed value without them.
    pub max: f64,
    /// Where these wider bounds come from.
    pub source: &'static str,
}

impl FitParam {
    /// This constant as a fold that leaves out experiment `left_out` may use it: unchanged
    /// when its bounds use none of that experiment's measurements, otherwise with its
    /// [`BlindBounds`] (and an upper bound that no longer follows the model's launches of a
    /// left-out run).
    pub fn without(&self, left_out: &str) -> FitParam {
        match self.blind {
            Some(b) if b.experiments.contains(&left_out) => FitParam {
                min: b.min,
                max: b.max,
                bound_source: b.source,
                max_from: MaxFrom::Fixed,
                ..*self
            },
            _ => *self,
        }
    }

    /// This constant with its upper bound resolved against `c` (the comparison of the
    /// starting profile): a [`MaxFrom::ModelLaunches`] bound becomes the measured step over
    /// the modelled launches of its run; a fixed one is returned as it is.
    pub fn resolved(&self, c: &Comparison) -> FitParam {
        let MaxFrom::ModelLaunches { run, step_s } = self.max_from else {
            return *self;
        };
        let launches = [Figure::DeviceKernels, Figure::Collectives]
            .iter()
            .map(|f| c.row(run, *f).map(|r| r.predicted))
            .sum::<Option<f64>>();
        match launches {
            Some(n) if n > 0.0 && (step_s * 1e6 / n) > self.min => FitParam {
                max: step_s * 1e6 / n,
                ..*self
            },
            _ => *self,
        }
    }
}

/// Every constant of `params` with its bounds resolved against `c` ([`FitParam::resolved`]).
pub fn resolve_bounds(params: &[FitParam], c: &Comparison) -> Vec<FitParam> {
    params.iter().map(|p| p.resolved(c)).collect()
}

/// The constants of the joint fit. The GEMM ceiling (the shape model's large-square-GEMM
/// efficiency, see `crate::compute_cost`) cannot be below the measured whole-step MFU.
pub const FIT_PARAMS: [FitParam; 7] = [
    FitParam {
        key: "calibration.gemm_ceiling",
        min: 0.19,
        max: 1.0,
        bound_source: "min: measured MFU of exp B HyperParallel-FSDP (50.14 ktok/s, i.e. model FLOPs \
            over 2.614 s x 376 TFLOPS = 19.3%): the kernels did at least that much work in the \
            measured step; max: the device's BF16 peak",
        max_from: MaxFrom::Fixed,
        blind: Some(BlindBounds {
            experiments: &["B"],
            min: 0.05,
            max: 1.0,
            source: "without exp B: ASSUMPTION min 0.05 (no eager GEMM stack runs large GEMMs below \
                5% of peak); max: the device's BF16 peak",
        }),
    },
    FitParam {
        key: "calibration.hbm_efficiency",
        min: 0.3,
        max: 1.0,
        bound_source: "ASSUMPTION min: half the msModeling A3 default 0.6 (no held-in figure \
            isolates memory-bound kernels); max: the nominal 1.6 TB/s",
        max_from: MaxFrom::Fixed,
        blind: None,
    },
    FitParam {
        key: "calibration.copy_efficiency",
        min: 0.1,
        max: 1.0,
        bound_source: "ASSUMPTION min: a streaming copy below 10% of HBM bandwidth would be \
            launch-bound; max: the nominal 1.6 TB/s",
        max_from: MaxFrom::Fixed,
        blind: None,
    },
    FitParam {
        key: "calibration.host_launch_us_per_kernel",
        min: 1.0,
        max: 90.4,
        bound_source: "max: exp A micro batch 2 production, 6.070 s over the MODEL's rank-0 \
            launches of that run (device kernels + collectives of the simulated program; a \
            serial host cannot spend more than the whole measured step on the launches the \
            model charges; 90.4 us with the measured 57,560 + 9,554); ASSUMPTION min: 1 us, \
            the fastest eager launch path",
        max_from: MaxFrom::ModelLaunches {
            run: "production mode",
            step_s: 6.070,
        },
        blind: Some(BlindBounds {
            experiments: &["A mbs2"],
            min: 1.0,
            max: 1000.0,
            source: "without exp A: ASSUMPTION 1 us (the fastest eager launch path) to 1 ms \
                (no eager stack spends a millisecond of host time per kernel)",
        }),
    },
    FitParam {
        key: "calibration.host_launch_us_per_collective",
        min: 54.6,
        max: 94.7,
        bound_source: "measured host self time in collective APIs per measured call, exp B: \
            FSDP2 9.5 ms / (125 + 49) = 54.6 us, HyperParallel-FSDP 153.2 ms / (1,087 + 531) \
            = 94.7 us",
        max_from: MaxFrom::Fixed,
        blind: Some(BlindBounds {
            experiments: &["B"],
            min: 1.0,
            max: 1000.0,
            source: "without exp B: ASSUMPTION 1 us to 1 ms per collective call",
        }),
    },
    FitParam {
        key: "calibration.validation_us_per_cpu_event",
        min: 7.34,
        max: 263.3,
        bound_source: "exp A micro batch 2, the measured +23,713 extra CPU operator events: \
            min 174 ms overhead / 23,713 = 7.34 us (every event on the critical path: a \
            host-bound step shows all of it, a device-bound one less, so the true cost is at \
            least this); max 6.244 s / 23,713 = 263.3 us (the events cannot take longer than \
            the whole validation step)",
        max_from: MaxFrom::Fixed,
        blind: Some(BlindBounds {
            experiments: &["A mbs2"],
            min: 0.1,
            max: 1000.0,
            source: "without exp A: ASSUMPTION 0.1 us to 1 ms per extra CPU operator event",
        }),
    },
    FitParam {
        key: "tiers.intra_machine.efficiency",
        min: 0.2609,
        max: 1.0,
        bound_source: "min: 51.13 / 196 GB/s, FSDP2's measured non-aligned all-gather \
            bandwidth over the nominal UB bandwidth (no intra-machine collective was measured \
            slower); max: the nominal 196 GB/s. Cross-check, not a bound: the aligned groups \
            measured 101.96 (FSDP2) and 125.22 GB/s (HyperParallel), 0.520 and 0.639 of nominal",
        max_from: MaxFrom::Fixed,
        blind: Some(BlindBounds {
            experiments: &["B"],
            min: 0.05,
            max: 1.0,
            source: "without exp B: ASSUMPTION min 0.05 of the nominal UB bandwidth; max: the \
                nominal 196 GB/s",
        }),
    },
];

/// The entry of [`FIT_PARAMS`] with this key.
pub fn fit_param(key: &str) -> Option<&'static FitParam> {
    FIT_PARAMS.iter().find(|p| p.key == key)
}

/// Reads a constant of a profile by its dotted key; `None` for a key this module does not
/// know (the error path of every caller names the key).
pub fn get(profile: &HardwareProfile, key: &str) -> Option<f64> {
    let c = &profile.calibration;
    let t = &profile.tiers;
    Some(match key {
        "calibration.gemm_ceiling" => c.gemm_ceiling,
        "calibration.hbm_efficiency" => c.hbm_efficiency,
        "calibration.copy_efficiency" => c.copy_efficiency,
        "calibration.device_launch_us_per_kernel" => c.device_launch_us_per_kernel,
        "calibration.collective_base_latency_us" => c.collective_base_latency_us,
        "calibration.host_launch_us_per_kernel" => c.host_launch_us_per_kernel,
        "calibration.host_launch_us_per_collective" => c.host_launch_us_per_collective,
        "calibration.host_d2h_sync_us" => c.host_d2h_sync_us,
        "calibration.validation_us_per_cpu_event" => c.validation_us_per_cpu_event,
        "calibration.unaligned_bandwidth_factor" => c.unaligned_bandwidth_factor,
        "tiers.intra_machine.efficiency" => t.intra_machine.efficiency,
        "tiers.intra_machine.latency_us" => t.intra_machine.latency_us,
        "tiers.intra_supernode.efficiency" => t.intra_supernode.efficiency,
        "tiers.intra_supernode.latency_us" => t.intra_supernode.latency_us,
        "tiers.inter_supernode.efficiency" => t.inter_supernode.efficiency,
        "tiers.inter_supernode.latency_us" => t.inter_supernode.latency_us,
        _ => return None,
    })
}

/// Writes a constant of a profile by its dotted key; false for an unknown key.
pub fn set(profile: &mut HardwareProfile, key: &str, value: f64) -> bool {
    let c = &mut profile.calibration;
    let t = &mut profile.tiers;
    let slot = match key {
        "calibration.gemm_ceiling" => &mut c.gemm_ceiling,
        "calibration.hbm_efficiency" => &mut c.hbm_efficiency,
        "calibration.copy_efficiency" => &mut c.copy_efficiency,
        "calibration.device_launch_us_per_kernel" => &mut c.device_launch_us_per_kernel,
        "calibration.collective_base_latency_us" => &mut c.collective_base_latency_us,
        "calibration.host_launch_us_per_kernel" => &mut c.host_launch_us_per_kernel,
        "calibration.host_launch_us_per_collective" => &mut c.host_launch_us_per_collective,
        "calibration.host_d2h_sync_us" => &mut c.host_d2h_sync_us,
        "calibration.validation_us_per_cpu_event" => &mut c.validation_us_per_cpu_event,
        "calibration.unaligned_bandwidth_factor" => &mut c.unaligned_bandwidth_factor,
        "tiers.intra_machine.efficiency" => &mut t.intra_machine.efficiency,
        "tiers.intra_machine.latency_us" => &mut t.intra_machine.latency_us,
        "tiers.intra_supernode.efficiency" => &mut t.intra_supernode.efficiency,
        "tiers.intra_supernode.latency_us" => &mut t.intra_supernode.latency_us,
        "tiers.inter_supernode.efficiency" => &mut t.inter_supernode.efficiency,
        "tiers.inter_supernode.latency_us" => &mut t.inter_supernode.latency_us,
        _ => return false,
    };
    *slot = value;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fit_param_has_a_readable_key_and_a_positive_range() {
        let profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        for p in FIT_PARAMS {
            assert!(get(&profile, p.key).is_some(), "unknown key {}", p.key);
            assert!(p.min > 0.0 && p.min < p.max, "{}: bad range", p.key);
            assert!(!p.bound_source.is_empty());
        }
    }

    #[test]
    fn set_then_get_round_trips_and_unknown_keys_are_refused() {
        let mut profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        assert!(set(&mut profile, "tiers.intra_machine.efficiency", 0.42));
        assert_eq!(get(&profile, "tiers.intra_machine.efficiency"), Some(0.42));
        assert!(!set(&mut profile, "calibration.no_such_key", 1.0));
        assert_eq!(get(&profile, "calibration.no_such_key"), None);
    }
}
