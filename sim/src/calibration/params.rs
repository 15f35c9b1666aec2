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
use super::error::CalibrationError;
use super::holdout::Holdout;
use super::measured::Figure;
use super::prior::Prior;
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
    /// The bounds a leave-one-out fold uses when it leaves out an experiment or run whose
    /// measurements these bounds come from ([`FitParam::without`]); `None` when no bound
    /// comes from a measurement.
    pub blind: Option<BlindBounds>,
    /// The constant's prior (centre, log width, public source): the MAP fit's pull toward
    /// what is known without the held-in measurements ([`super::prior`]).
    pub prior: Prior,
}

/// Bounds that use no measurement of the listed experiments: a leave-one-out fold that leaves
/// one of them (or one of the listed runs) out must not constrain the fit with those figures
/// through a bound either, or the held-out prediction is not held out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlindBounds {
    /// Labels of the experiments (`B`, `A mbs2`) whose measurements the normal bounds use.
    pub experiments: &'static [&'static str],
    /// The runs of those experiments ([`super::MeasuredRun::label`]) the normal bounds take
    /// their values from; empty: the experiments as a whole (or several runs together), so
    /// leaving out any of their runs blinds them.
    pub runs: &'static [&'static str],
    /// Lowest allowed value without them (ASSUMPTION, stated in `source`).
    pub min: f64,
    /// Highest allowed value without them.
    pub max: f64,
    /// Where these wider bounds come from.
    pub source: &'static str,
}

impl FitParam {
    /// This constant as a fold that leaves out `left_out` (an experiment or one of its runs)
    /// may use it: unchanged when its bounds use none of those measurements, otherwise with
    /// its [`BlindBounds`] (and an upper bound that no longer follows the model's launches of
    /// a left-out run).
    pub fn without(&self, left_out: Holdout) -> FitParam {
        match self.blind {
            Some(b) if b.experiments.iter().any(|e| left_out.touches(e, b.runs)) => FitParam {
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

/// Host time of one whole eager op on torch_npu, microseconds: an eager `torch.add` on Ascend
/// 910B2 with the task queue on, 12.142 us (github.com/triton-lang/triton-ascend/issues/1675):
/// its ATen dispatch, aclnn tiling and enqueue. Since the host census charges every op's
/// framework dispatch as production CPU operator events (`hpfsdp_program::strategy::host_events`),
/// the kernel launch cost stands for the launch proper (aclnn submit and task-queue enqueue),
/// which cannot exceed the whole eager op: the upper bound of `host_launch_us_per_kernel`.
pub const EAGER_OP_HOST_US: f64 = 12.142;

/// Prior centre of the launch proper, microseconds: the geometric midpoint of its public
/// floor ([`KERNEL_LAUNCH_FLOOR_US`], a precompiled kernel through the task queue) and ceiling
/// ([`EAGER_OP_HOST_US`], a whole eager op), sqrt(8.6 x 12.142) = 10.22.
pub const KERNEL_LAUNCH_PRIOR_US: f64 = 10.22;

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

/// A profile constant measured directly on one held-in experiment (not fitted): a
/// leave-one-out fold that leaves that experiment (or the run it comes from) out must not use
/// it either, so it uses `blind_value` instead ([`blind_profile`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasuredConstant {
    /// Dotted profile key.
    pub key: &'static str,
    /// Label of the experiment it was measured on (`B`, `A mbs2`).
    pub experiment: &'static str,
    /// The runs of that experiment it was measured on; empty: the experiment as a whole.
    pub runs: &'static [&'static str],
    /// Its value in a fold without that experiment.
    pub blind_value: f64,
    /// Where the blind value comes from (public source or ASSUMPTION).
    pub blind_source: &'static str,
}

/// The profile constants measured directly on a held-in experiment.
pub const MEASURED_CONSTANTS: [MeasuredConstant; 1] = [MeasuredConstant {
    key: "calibration.unaligned_bandwidth_factor",
    experiment: "B",
    // The paper's alignment analysis is of FSDP2's own all-gathers.
    runs: &["PyTorch FSDP2"],
    blind_value: 1.0,
    blind_source: "without exp B's FSDP2 run: ASSUMPTION no penalty (1.0): the shipped 0.5015 \
        is that run's 51.13 / 101.96 GB/s, non-aligned vs aligned FSDP2 all-gathers. Public \
        Ascend documentation says a penalty exists (MindStudio 8.3 performance cases, 'Byte \
        Misalignment Between the Source and Destination Addresses': intra-node SDMA transfers \
        of buffers not 512-byte aligned lose bandwidth; its one case, a DeepSpeed ZeRO \
        all-gather at 0.1 GB/s, went from 350 to 50 ms once aligned) but gives no factor for \
        FSDP-sized buffers, so a fold without the measurement assumes none",
}];

/// `profile` as a fold without `left_out` (an experiment or one of its runs) may use it:
/// every [`MEASURED_CONSTANTS`] entry measured on what is left out at its blind value;
/// returns the entries it replaced. Errors name a key this module cannot write.
pub fn blind_profile(
    profile: &HardwareProfile,
    left_out: Holdout,
) -> Result<(HardwareProfile, Vec<MeasuredConstant>), CalibrationError> {
    let mut p = profile.clone();
    let mut replaced = Vec::new();
    for m in MEASURED_CONSTANTS
        .iter()
        .filter(|m| left_out.touches(m.experiment, m.runs))
    {
        if !set(&mut p, m.key, m.blind_value) {
            return Err(CalibrationError::UnknownKey {
                key: m.key.to_string(),
            });
        }
        replaced.push(*m);
    }
    Ok((p, replaced))
}

/// Public BF16 `torch.matmul` throughput of square GEMMs on one Ascend 910B2 (torch 2.5.1;
/// github.com/zzc0721/torch-performance-test-data/issues/109): `(n, TFLOPS)` for
/// `[n, n] x [n, n]`. The `calibration.gemm_ceiling` prior's centre is their geometric mean
/// efficiency over the shape model's `s(n)^3` (a test recomputes it).
pub const GEMM_CEILING_PUBLIC_POINTS: [(f64, f64); 4] = [
    (2048.0, 248.30),
    (4096.0, 315.36),
    (8192.0, 301.23),
    (10240.0, 300.94),
];

/// The BF16 peak those points are divided by, TFLOPS: a 910B2 or a 910C die
/// (backends-hardware.md 5.1, medium confidence), the A3 profile's `bf16_flops_per_s`.
pub const GEMM_CEILING_PUBLIC_PEAK_TFLOPS: f64 = 376.0;

/// The constants of the joint fit. The GEMM ceiling (the shape model's large-square-GEMM
/// efficiency, see `crate::compute_cost`) cannot be below the measured whole-step MFU. Each
/// carries a [`Prior`] from public sources or first principles only (never from the held-in
/// figures, which are the fit's data); edit a row to change a constant's bounds or prior.
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
            // min: HyperParallel-FSDP's measured MFU.
            runs: &["HyperParallel-FSDP"],
            min: 0.05,
            max: 1.0,
            source: "without exp B: ASSUMPTION min 0.05 (no eager GEMM stack runs large GEMMs below \
                5% of peak); max: the device's BF16 peak",
        }),
        prior: Prior {
            centre: 0.92,
            log_width: 0.2,
            source: "PUBLIC MEASUREMENT: torch.matmul BF16 square GEMMs on Ascend 910B2 (torch \
                2.5.1; github.com/zzc0721/torch-performance-test-data/issues/109) ran 248.30 / \
                315.36 / 301.23 / 300.94 TFLOPS at n = 2048 / 4096 / 8192 / 10240, i.e. 0.660 / \
                0.839 / 0.801 / 0.800 of the 376 TFLOPS BF16 peak of a 910B2 or 910C die \
                (backends-hardware.md 5.1); over the shape model's (n / (n + 256))^3 that is a \
                ceiling of 0.940 / 1.006 / 0.879 / 0.862, geometric mean 0.920 \
                (GEMM_CEILING_PUBLIC_POINTS). log width 0.2: their spread (0.07) and the \
                peak's uncertainty (~0.15; 320 TFLOPS is also quoted) combined, rounded up",
        },
    },
    FitParam {
        key: "calibration.hbm_efficiency",
        min: 0.3,
        max: 1.0,
        bound_source: "ASSUMPTION min: half the msModeling A3 default 0.6 (no held-in figure \
            isolates memory-bound kernels); max: the nominal 1.6 TB/s",
        max_from: MaxFrom::Fixed,
        blind: None,
        prior: Prior {
            centre: 0.6,
            log_width: 0.405,
            source: "PUBLIC DEFAULT: Huawei msModeling's A3 die profile (A3_752T_128G_DIE: \
                mem_eff 0.6, compute_eff 0.7; shared/reference/notes/simulators.md section 4), \
                the official roofline tool's fraction of HBM bandwidth for memory-bound \
                operators; log width ln 1.5 (ASSUMPTION: a tool default, not a measurement)",
        },
    },
    FitParam {
        key: "calibration.copy_efficiency",
        min: 0.1,
        max: 1.0,
        bound_source: "ASSUMPTION min: a streaming copy below 10% of HBM bandwidth would be \
            launch-bound; max: the nominal 1.6 TB/s",
        max_from: MaxFrom::Fixed,
        blind: None,
        prior: Prior {
            centre: 0.6,
            log_width: 0.405,
            source: "ASSUMPTION anchored on a public default: a streaming device copy is a \
                memory-bound kernel, so msModeling's A3 memory efficiency 0.6 \
                (shared/reference/notes/simulators.md section 4); no public copy-bandwidth \
                measurement of an Ascend die was found; log width ln 1.5",
        },
    },
    FitParam {
        key: "calibration.host_launch_us_per_kernel",
        min: KERNEL_LAUNCH_FLOOR_US,
        max: EAGER_OP_HOST_US,
        bound_source: "PUBLIC MEASUREMENTS of torch_npu's eager launch path (task queue on, its \
            default): min 8.6 us, the host enqueue time of a precompiled kernel launched straight \
            from C through the task queue, no Python and no ATen dispatch (Ascend 910B2, 8.599 \
            us per launch over 5,000 launches timed before the final synchronize; eager \
            torch.add 12.142 us; github.com/triton-lang/triton-ascend/issues/1675); max 12.142 \
            us, that whole eager op (ATen dispatch, aclnn tiling, enqueue): the host census \
            charges every op's framework dispatch as production CPU operator events, so the \
            launch proper cannot exceed the whole op. For scale, the whole-op ceiling on an A3 \
            host is 32.5 us, a quarter of 130.1 us, the host loop time of `(x.npu() + \
            y.npu()).cpu()` on an A3 die (Ascend910_9362, torch_npu 2.8.0, CANN 8.5.0, 128x128 \
            fp32, 100 iterations in 13.0 ms; github.com/hw-native-sys/pypto/issues/1919). Host \
            time a measured step wants beyond the launches and the census's events goes to \
            calibration.host_unmodelled_us_per_kernel",
        max_from: MaxFrom::Fixed,
        blind: None,
        prior: Prior {
            centre: KERNEL_LAUNCH_PRIOR_US,
            log_width: 0.172,
            source: "PUBLIC MEASUREMENTS: the launch proper lies between a precompiled kernel \
                enqueued from C through torch_npu's task queue (8.599 us) and a whole eager \
                torch.add (12.142 us, ATen dispatch included), both on Ascend 910B2 \
                (github.com/triton-lang/triton-ascend/issues/1675); centre their geometric \
                midpoint 10.22 us, log width ln(12.142 / 8.6) / 2 = 0.172 puts both at one sigma",
        },
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
            // max: the production run's step over its modelled launches.
            runs: &["production mode"],
            min: UNMODELLED_HOST_FLOOR_US,
            max: 1000.0,
            source: "without exp A: no measured step bounds it (ASSUMPTION: at most 1 ms of \
                host work per kernel); what is known without exp A is its prior",
        }),
        prior: Prior {
            centre: 3.0,
            log_width: 2.303,
            source: "ASSUMPTION (first principles, weak): host work per kernel beyond its own \
                dispatch and launch (Python model code between ops, autograd node bookkeeping, \
                module hooks) is a few microseconds: a few dozen CPython bytecodes at ~50 ns \
                each plus one autograd node (~1-2 us). A factor 10 at one sigma (log width ln \
                10): nothing public measures it on torch_npu. A complete host model leaves it \
                near its prior; a fit far above it marks host work the model does not issue",
        },
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
            // min from FSDP2, max from HyperParallel-FSDP: both runs.
            runs: &[],
            min: 1.0,
            max: 1000.0,
            source: "without exp B: ASSUMPTION 1 us to 1 ms per collective call",
        }),
        prior: Prior {
            centre: 25.8,
            log_width: 0.916,
            source: "ASSUMPTION from public launch costs: a collective through torch_npu's \
                ProcessGroupHCCL enqueues at least three tasks (the wait on the compute \
                stream's event, the HCCL kernel, the completion event), 3 x 8.6 us per enqueue \
                on Ascend 910B2 (github.com/triton-lang/triton-ascend/issues/1675) = 25.8 us. \
                Cross-check: a 128-B torch.distributed all_reduce on 8 x H100 completes in 19.2 \
                us end to end (github.com/ByteDance-Seed/Triton-distributed/issues/57). Log width \
                ln 2.5: HCCL's host-side task preparation is not measured publicly",
        },
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
            // the overhead is the difference of the two runs.
            runs: &[],
            min: 0.1,
            max: 1000.0,
            source: "without exp A: ASSUMPTION 0.1 us to 1 ms per extra CPU operator event",
        }),
        prior: Prior {
            centre: 12.1,
            log_width: 1.099,
            source: "PUBLIC MEASUREMENT, by analogy: an extra CPU operator event is an eager \
                ATen op on the host, and an eager torch.add costs its host 12.1 us on Ascend \
                910B2 (github.com/triton-lang/triton-ascend/issues/1675). Log width ln 3: \
                metadata-only ops take 1.5-4.6 us each in a public profile \
                (github.com/pytorch/pytorch/issues/147596: aten::empty_strided 1.5 us, \
                aten::unsqueeze 3.4 us, aten::narrow 4.6 us), and an op that also runs DTensor \
                sharding propagation costs more",
        },
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
            // min: FSDP2's non-aligned all-gather bandwidth.
            runs: &["PyTorch FSDP2"],
            min: 0.05,
            max: 1.0,
            source: "without exp B: ASSUMPTION min 0.05 of the nominal UB bandwidth; max: the \
                nominal 196 GB/s",
        }),
        prior: Prior {
            centre: 0.699,
            log_width: 0.405,
            source: "PUBLIC MEASUREMENT: NPU-to-NPU write bandwidth inside a CloudMatrix384 node, \
                137 of the 196 GB/s nominal per die = 0.699 (arXiv:2506.12708 Table 1; \
                backends-hardware.md 5.1; the profile's intra-supernode tier uses the same \
                table, 135 / 196). Log width ln 1.5: a collective adds algorithm steps and \
                AICPU expansion to raw writes (reads measured 167 GB/s = 0.852)",
        },
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
            "12.142",
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
            (KERNEL_LAUNCH_FLOOR_US, EAGER_OP_HOST_US)
        );
        assert!(
            (launch.prior.centre - (KERNEL_LAUNCH_FLOOR_US * EAGER_OP_HOST_US).sqrt()).abs() < 0.01
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
        let blind = launch.without(Holdout::whole("A mbs2"));
        assert_eq!(
            (blind.min, blind.max, blind.max_from),
            (KERNEL_LAUNCH_FLOOR_US, EAGER_OP_HOST_US, MaxFrom::Fixed)
        );
        assert!(
            !blind.bound_source.contains("6.070"),
            "{}",
            blind.bound_source
        );
        assert_eq!(launch.without(Holdout::whole("B")), launch);
        let coll = *fit_param("calibration.host_launch_us_per_collective").unwrap();
        assert_eq!(
            (
                coll.without(Holdout::whole("B")).min,
                coll.without(Holdout::whole("B")).max
            ),
            (1.0, 1000.0)
        );
        assert_eq!(coll.without(Holdout::whole("A mbs2")), coll);
        for p in FIT_PARAMS {
            match p.blind {
                Some(b) => {
                    for e in b.experiments {
                        let w = p.without(Holdout::whole(e));
                        assert_eq!((w.min, w.max, w.bound_source), (b.min, b.max, b.source));
                        assert_eq!(w.max_from, MaxFrom::Fixed);
                    }
                }
                None => assert_eq!(p.without(Holdout::whole("B")), p),
            }
            assert_eq!(p.without(Holdout::whole("no such experiment")), p);
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

    /// Every prior is positive, says where it comes from (a public source or an
    /// ASSUMPTION) and uses none of the held-in figures: they are the fit's data, and a prior
    /// built on them would count them twice and leak them into leave-one-out.
    #[test]
    fn every_prior_is_sourced_and_blind_to_the_held_in_figures() {
        for p in FIT_PARAMS {
            let prior = p.prior;
            assert!(prior.centre > 0.0 && prior.log_width > 0.0, "{}", p.key);
            assert!(
                ["PUBLIC", "ASSUMPTION"]
                    .iter()
                    .any(|w| prior.source.contains(w)),
                "{}: {}",
                p.key,
                prior.source
            );
            for held_in in [
                "exp A", "exp B", "6.070", "6.244", "2.614", "3.720", "23,713", "153.2", "9.5 ms",
                "451.1", "51.13",
            ] {
                assert!(
                    !prior.source.contains(held_in),
                    "{}: prior source mentions held-in figure {held_in}",
                    p.key
                );
            }
        }
    }

    /// The GEMM ceiling's prior centre is what its public points give through the shape
    /// model (default half-saturation 256, the A3 profile's): the geometric mean of
    /// `TFLOPS / peak / s(n)^3`.
    #[test]
    fn the_gemm_ceiling_prior_follows_its_public_points() {
        let shape = crate::compute_cost::ComputeSpec::default();
        let profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        assert_eq!(
            profile.compute.shape_factor(4096.0, 4096.0, 4096.0),
            shape.shape_factor(4096.0, 4096.0, 4096.0)
        );
        let logs: Vec<f64> = GEMM_CEILING_PUBLIC_POINTS
            .iter()
            .map(|(n, tflops)| {
                (tflops / GEMM_CEILING_PUBLIC_PEAK_TFLOPS / shape.shape_factor(*n, *n, *n)).ln()
            })
            .collect();
        let centre = (logs.iter().sum::<f64>() / logs.len() as f64).exp();
        let prior = fit_param("calibration.gemm_ceiling").unwrap().prior;
        assert!(
            (prior.centre - centre).abs() < 0.005,
            "{} vs {centre}",
            prior.centre
        );
    }

    /// A fold without exp B does not use the unaligned-buffer factor measured on exp B; a
    /// fold without exp A keeps it.
    #[test]
    fn a_constant_measured_on_the_left_out_experiment_is_blinded() {
        let profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        let key = "calibration.unaligned_bandwidth_factor";
        assert!(get(&profile, key).unwrap() < 0.9);
        let (without_b, replaced) = blind_profile(&profile, Holdout::whole("B")).unwrap();
        assert_eq!(get(&without_b, key), Some(1.0));
        assert_eq!(replaced.len(), 1);
        assert!(replaced[0].blind_source.contains("ASSUMPTION"));
        let (without_a, replaced) = blind_profile(&profile, Holdout::whole("A mbs2")).unwrap();
        assert_eq!(get(&without_a, key), get(&profile, key));
        assert!(replaced.is_empty());
    }

    /// A run fold blinds what that run measured and keeps what its sibling measured: leaving
    /// out HyperParallel-FSDP keeps FSDP2's unaligned-buffer factor and the bandwidth floor
    /// from FSDP2's all-gathers, but not the GEMM floor from HyperParallel-FSDP's MFU;
    /// leaving out FSDP2 does the reverse; a bound from both runs is blinded by either.
    #[test]
    fn a_run_fold_blinds_what_that_run_measured_only() {
        let profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        let key = "calibration.unaligned_bandwidth_factor";
        let hp = Holdout::run("B", "HyperParallel-FSDP");
        let fsdp2 = Holdout::run("B", "PyTorch FSDP2");
        let (without_hp, replaced) = blind_profile(&profile, hp).unwrap();
        assert_eq!(get(&without_hp, key), get(&profile, key));
        assert!(replaced.is_empty());
        let (without_fsdp2, replaced) = blind_profile(&profile, fsdp2).unwrap();
        assert_eq!(get(&without_fsdp2, key), Some(1.0));
        assert_eq!(replaced.len(), 1);
        let tier = *fit_param("tiers.intra_machine.efficiency").unwrap();
        let gemm = *fit_param("calibration.gemm_ceiling").unwrap();
        let coll = *fit_param("calibration.host_launch_us_per_collective").unwrap();
        assert_eq!(tier.without(hp), tier);
        assert_ne!(tier.without(fsdp2), tier);
        assert_ne!(gemm.without(hp), gemm);
        assert_eq!(gemm.without(fsdp2), gemm);
        assert_ne!(coll.without(hp), coll);
        assert_ne!(coll.without(fsdp2), coll);
        let host = *fit_param("calibration.host_unmodelled_us_per_kernel").unwrap();
        assert_ne!(
            host.without(Holdout::run("A mbs2", "production mode")),
            host
        );
        assert_eq!(
            host.without(Holdout::run("A mbs2", "validation mode")),
            host
        );
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
