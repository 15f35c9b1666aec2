//! The residual constants the joint fit adjusts, their bounds and where each bound comes from,
//! in ONE table ([`FIT_PARAMS`]); reading and writing a constant of a profile by its dotted key.
//!
//! Every bound is tied to a direct measurement where one exists: of the measured runs
//! themselves (`shared/calibration/README.md`) or a public measurement of the same software
//! path (the source text names the address, hardware, versions and the arithmetic); the
//! others are marked ASSUMPTION. A constant that the fit leaves at a bound is flagged in the
//! fit's output: the measurements then want a value the bound's measurement rules out, which
//! points at a modelling gap rather than at a constant to move. Host constants the fit does
//! not adjust but public measurements confine are in [`SOURCED_RANGES`].

use super::compare::Comparison;
use super::measured::Figure;
use crate::profile::HardwareProfile;

/// Where a constant's upper bound comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// the modelled launches of its run when that is tighter than [`FitParam::max`] (and
    /// above the minimum); a fixed one is returned as it is.
    pub fn resolved(&self, c: &Comparison) -> FitParam {
        let MaxFrom::ModelLaunches { run, step_s } = self.max_from else {
            return *self;
        };
        let launches = [Figure::DeviceKernels, Figure::Collectives]
            .iter()
            .map(|f| c.row(run, *f).map(|r| r.predicted))
            .sum::<Option<f64>>();
        match launches.map(|n| step_s * 1e6 / n) {
            Some(per_launch) if per_launch > self.min && per_launch < self.max => FitParam {
                max: per_launch,
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

/// The unmodelled host work per kernel that stands for none on the fit's log scale,
/// microseconds (the fit works on logarithms, so its lower bound must be positive).
pub const UNMODELLED_HOST_FLOOR_US: f64 = 0.1;

/// Floor of the host time one eager kernel launch takes on torch_npu, microseconds: a
/// precompiled kernel launched straight from C through torch_npu's task queue on Ascend
/// 910B2 (8.599 us per enqueue; github.com/triton-lang/triton-ascend/issues/1675). Every eager
/// launch goes through that queue and adds ATen dispatch and aclnn tiling on top.
pub const KERNEL_LAUNCH_FLOOR_US: f64 = 8.6;

/// Ceiling of the mean host time of one eager op's dispatch and launch on an A3 host,
/// microseconds: 130.1 us per `(x.npu() + y.npu()).cpu()` loop (two uploads, an add, a
/// blocking read-back; Ascend910_9362, torch_npu 2.8.0, CANN 8.5.0, 100 iterations in 13.0
/// ms; github.com/hw-native-sys/pypto/issues/1919) over its four eager ops.
pub const KERNEL_LAUNCH_CEILING_US: f64 = 130.1 / 4.0;

/// A profile constant the fit does not adjust (no held-in figure isolates it) but whose
/// value public measurements confine: its range and where that comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourcedRange {
    /// Dotted profile key.
    pub key: &'static str,
    /// Lowest plausible value.
    pub min: f64,
    /// Highest plausible value.
    pub max: f64,
    /// The measurements (address, hardware, versions) and the arithmetic.
    pub source: &'static str,
}

/// Public ranges of the host constants the fit leaves alone ([`outside_sourced_ranges`]).
pub const SOURCED_RANGES: [SourcedRange; 1] = [SourcedRange {
    key: "calibration.host_d2h_sync_us",
    min: KERNEL_LAUNCH_FLOOR_US,
    max: 130.1,
    source: "min 8.6 us: a blocking read-back enqueues at least one copy task through \
        torch_npu's task queue, and one launch through it costs 8.599 us on Ascend 910B2 \
        (github.com/triton-lang/triton-ascend/issues/1675); max 130.1 us: a whole \
        `(x.npu() + y.npu()).cpu()` loop, its blocking read-back included, on an A3 die \
        (Ascend910_9362, torch_npu 2.8.0, CANN 8.5.0, 128x128 fp32, 100 iterations in 13.0 ms; \
        github.com/hw-native-sys/pypto/issues/1919). Older and slower for comparison: \
        aclrtSynchronizeStream ~230 us, aclrtSynchronizeDevice ~390 us in PaddlePaddle's NPU \
        path on Ascend 910 (2021; github.com/PaddlePaddle/Paddle/pull/32196)",
}];

/// The constants of `profile` that lie outside their [`SOURCED_RANGES`], with their values
/// (a constant the profile does not have is skipped: `get` names every key it knows).
pub fn outside_sourced_ranges(profile: &HardwareProfile) -> Vec<(SourcedRange, f64)> {
    SOURCED_RANGES
        .iter()
        .filter_map(|r| get(profile, r.key).map(|v| (*r, v)))
        .filter(|(r, v)| !(r.min..=r.max).contains(v))
        .collect()
}

/// The constants of the joint fit. The GEMM ceiling (the shape model's large-square-GEMM
/// efficiency, see `crate::compute_cost`) cannot be below the measured whole-step MFU.
pub const FIT_PARAMS: [FitParam; 8] = [
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
        min: KERNEL_LAUNCH_FLOOR_US,
        max: KERNEL_LAUNCH_CEILING_US,
        bound_source: "PUBLIC MEASUREMENTS of torch_npu's eager launch path (task queue on, its \
            default): min 8.6 us, the host enqueue time of a precompiled kernel launched straight \
            from C through the task queue, no Python and no ATen dispatch (Ascend 910B2, 8.599 \
            us per launch over 5,000 launches timed before the final synchronize; eager \
            torch.add 12.142 us; github.com/triton-lang/triton-ascend/issues/1675); max 32.5 us, \
            a quarter of 130.1 us, the host loop time of `(x.npu() + y.npu()).cpu()` on an A3 \
            die (Ascend910_9362, torch_npu 2.8.0, CANN 8.5.0, 128x128 fp32, 100 iterations in \
            13.0 ms; github.com/hw-native-sys/pypto/issues/1919): two uploads, an add and a \
            blocking read-back fit in it, so an eager op's dispatch and launch take at most that \
            on average. Host time a measured step wants beyond this goes to \
            calibration.host_unmodelled_us_per_kernel",
        max_from: MaxFrom::Fixed,
        blind: None,
    },
    FitParam {
        key: "calibration.host_unmodelled_us_per_kernel",
        min: UNMODELLED_HOST_FLOOR_US,
        max: 1000.0,
        bound_source: "RESIDUAL, not a measurement of its own: host work per kernel no modelled op \
            accounts for. min: ASSUMPTION none (0.1 us stands for zero on the fit's log \
            scale); max: exp A micro batch 2's measured 6.070 s over the MODEL's rank-0 \
            launches (device kernels + collectives of the simulated program, ~110 us; 90.4 us \
            with the measured 57,560 + 9,554): a serial host cannot spend more than the whole \
            measured step. A fit above the floor says a measured step is host-bound beyond \
            the launches the model charges at their public cost",
        max_from: MaxFrom::ModelLaunches {
            run: "production mode",
            step_s: 6.070,
        },
        blind: Some(BlindBounds {
            experiments: &["A mbs2"],
            min: UNMODELLED_HOST_FLOOR_US,
            max: 1.0,
            source: "without exp A: ASSUMPTION at most 1 us (no other held-in figure is \
                host-bound, so nothing shows host work beyond the modelled launches)",
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
            the whole validation step). Cross-check, not a bound: one eager torch.add costs \
            its host 12.1 us on Ascend 910B2 (github.com/triton-lang/triton-ascend/issues/1675)",
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
        "calibration.host_unmodelled_us_per_kernel" => c.host_unmodelled_us_per_kernel,
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
        "calibration.host_unmodelled_us_per_kernel" => &mut c.host_unmodelled_us_per_kernel,
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

    /// Every bound says where it comes from: a measured run, a public measurement (its
    /// address) or an ASSUMPTION; the host ones name their public measurements and the
    /// numbers they use.
    #[test]
    fn every_bound_names_its_source() {
        let sourced = |text: &str| {
            ["ASSUMPTION", "measured", "exp A", "exp B", "github.com/"]
                .iter()
                .any(|w| text.contains(w))
        };
        for p in FIT_PARAMS {
            assert!(sourced(p.bound_source), "{}: {}", p.key, p.bound_source);
            if let Some(b) = p.blind {
                assert!(sourced(b.source), "{} blind: {}", p.key, b.source);
            }
        }
        let launch = fit_param("calibration.host_launch_us_per_kernel").unwrap();
        for needle in [
            "triton-ascend/issues/1675",
            "pypto/issues/1919",
            "8.6 us",
            "32.5 us",
            "torch_npu 2.8.0, CANN 8.5.0",
        ] {
            assert!(launch.bound_source.contains(needle), "missing {needle}");
        }
        // What a host-bound step wants beyond the launch goes to the named residual, whose
        // ceiling is the measured exp-A step over the model's launches.
        let residual = fit_param("calibration.host_unmodelled_us_per_kernel").unwrap();
        for needle in ["RESIDUAL", "6.070 s", "MODEL's rank-0"] {
            assert!(residual.bound_source.contains(needle), "missing {needle}");
        }
        assert!(matches!(residual.max_from, MaxFrom::ModelLaunches { .. }));
        assert_eq!(
            (launch.min, launch.max),
            (KERNEL_LAUNCH_FLOOR_US, KERNEL_LAUNCH_CEILING_US)
        );
        for r in SOURCED_RANGES {
            assert!(r.min > 0.0 && r.min < r.max, "{}: bad range", r.key);
            assert!(r.source.matches("github.com/").count() >= 2, "{}", r.key);
        }
    }

    /// Leave-one-out blinds exactly the bounds that use the left-out experiment's
    /// measurements: the launch cost's model-launch bound (exp A) falls back to its public
    /// range, the collective and GEMM bounds (exp B) to their ASSUMPTIONs, and leaving out
    /// an experiment a bound does not use changes nothing.
    #[test]
    fn leave_one_out_blinds_the_bounds_of_the_left_out_experiment_only() {
        let launch = *fit_param("calibration.host_launch_us_per_kernel").unwrap();
        let blind = launch.without("A mbs2");
        assert_eq!(
            (blind.min, blind.max, blind.max_from),
            (
                KERNEL_LAUNCH_FLOOR_US,
                KERNEL_LAUNCH_CEILING_US,
                MaxFrom::Fixed
            )
        );
        assert!(
            !blind.bound_source.contains("6.070"),
            "{}",
            blind.bound_source
        );
        assert_eq!(launch.without("B"), launch);
        let coll = *fit_param("calibration.host_launch_us_per_collective").unwrap();
        assert_eq!(
            (coll.without("B").min, coll.without("B").max),
            (1.0, 1000.0)
        );
        assert_eq!(coll.without("A mbs2"), coll);
        for p in FIT_PARAMS {
            match p.blind {
                Some(b) => {
                    for e in b.experiments {
                        let w = p.without(e);
                        assert_eq!((w.min, w.max, w.bound_source), (b.min, b.max, b.source));
                        assert_eq!(w.max_from, MaxFrom::Fixed);
                    }
                }
                None => assert_eq!(p.without("B"), p),
            }
            assert_eq!(p.without("no such experiment"), p);
        }
    }

    /// The shipped A3 profile's host constants lie in their public ranges; one outside is
    /// reported with its value.
    #[test]
    fn a_host_constant_outside_its_public_range_is_reported() {
        let mut profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        assert_eq!(outside_sourced_ranges(&profile), vec![]);
        assert!(set(&mut profile, "calibration.host_d2h_sync_us", 500.0));
        let out = outside_sourced_ranges(&profile);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0.key, "calibration.host_d2h_sync_us");
        assert_eq!(out[0].1, 500.0);
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
