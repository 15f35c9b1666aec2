//! The measured figures the A3 profile is calibrated on (held-in experiments only).
//!
//! Source: `shared/calibration/README.md`, which quotes the HyperParallel-FSDP paper's
//! measurements on an Atlas 900 A3 SuperPoD (Ascend 910C dies, HCCL). Only experiment B and
//! the micro-batch-2 pair of experiment A are listed there; every other experiment is held
//! out and must never be entered here.

/// One measured figure of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasuredFigure {
    /// What was measured (a key of [`Figure`]).
    pub figure: Figure,
    /// The measured value in the figure's unit.
    pub value: f64,
}

/// The figures the comparison reports, with their units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Figure {
    /// Mean step time, seconds.
    StepTimeS,
    /// Exposed communication of one profiled step, seconds.
    ExposedCommS,
    /// Communication overlap rate, fraction.
    OverlapRate,
    /// FSDP2 copy-in + copy-out device time, seconds.
    CopyS,
    /// Device time of the divisions that follow the gradient reductions on the collective
    /// streams (torch_npu's `ReduceOp.AVG`, `hpfsdp_program::strategy::avg_division`), seconds.
    /// Measured for HyperParallel only ("per-parameter post-reduction division"): FSDP2's
    /// table entry is "none" for a per-parameter division, while its 49 per-unit divisions
    /// are a different granularity the table does not report, so the figure is not listed
    /// for FSDP2 (not applicable rather than zero).
    PostReductionDivisionS,
    /// All-gathers per step.
    AllGathers,
    /// Reduce-scatters per step.
    ReduceScatters,
    /// All-gather payload per step, bytes.
    AllGatherBytes,
    /// Reduce-scatter payload per step, bytes.
    ReduceScatterBytes,
    /// Host self time inside collective APIs, seconds.
    HostCollectiveS,
    /// Peak allocated device memory, bytes.
    PeakAllocatedBytes,
    /// Weighted bandwidth of the FSDP collectives: their bytes over their transfer time,
    /// bytes per second (the profiler's "weighted HCCS bandwidth").
    WeightedBandwidth,
    /// Device kernels per profiled step on rank 0, communication excluded.
    DeviceKernels,
    /// Collectives per profiled step on rank 0.
    Collectives,
    /// Validation-mode overhead: validation minus production mean step time of the same
    /// setup, seconds (derived from the two measured step times, never entered on its own).
    ValidationOverheadS,
    /// Extra CPU operator events per profiled step that validation mode adds (rank 0).
    ValidationCpuEvents,
}

impl Figure {
    /// Human-readable name with unit.
    pub fn label(self) -> &'static str {
        match self {
            Figure::StepTimeS => "step time (s)",
            Figure::ExposedCommS => "exposed communication (s)",
            Figure::OverlapRate => "communication overlap rate",
            Figure::CopyS => "copy-in/copy-out device time (s)",
            Figure::PostReductionDivisionS => "post-reduction division device time (s)",
            Figure::AllGathers => "all-gathers per step",
            Figure::ReduceScatters => "reduce-scatters per step",
            Figure::AllGatherBytes => "all-gather payload per step (GB)",
            Figure::ReduceScatterBytes => "reduce-scatter payload per step (GB)",
            Figure::HostCollectiveS => "host time in collective APIs (s)",
            Figure::PeakAllocatedBytes => "peak allocated memory (GB)",
            Figure::WeightedBandwidth => "weighted FSDP collective bandwidth (GB/s)",
            Figure::DeviceKernels => "device kernels per step (rank 0)",
            Figure::Collectives => "collectives per step (rank 0)",
            Figure::ValidationOverheadS => "validation-mode overhead (s)",
            Figure::ValidationCpuEvents => "extra CPU operator events per step (validation)",
        }
    }
}

/// A measured run: experiment, the scenario file that sets it up, how to simulate it, and
/// its figures.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredRun {
    /// Experiment label (`B`, `A mbs2`).
    pub experiment: &'static str,
    /// Scenario file, relative to the repository root.
    pub scenario: &'static str,
    /// Strategy simulated.
    pub strategy: &'static str,
    /// Run label as the paper names it (`PyTorch FSDP2`, `production`, ...).
    pub label: &'static str,
    /// Simulate with validation-mode dispatch costs.
    pub validation_mode: bool,
    /// The measured figures.
    pub figures: Vec<MeasuredFigure>,
}

fn f(figure: Figure, value: f64) -> MeasuredFigure {
    MeasuredFigure { figure, value }
}

/// All held-in measured runs.
pub fn measured_runs() -> Vec<MeasuredRun> {
    use Figure::*;
    vec![
        MeasuredRun {
            experiment: "B",
            scenario: "scenarios/paper/exp-b.toml",
            strategy: "fsdp2",
            label: "PyTorch FSDP2",
            validation_mode: false,
            figures: vec![
                f(StepTimeS, 3.720),
                f(ExposedCommS, 0.9167),
                f(OverlapRate, 0.7081),
                f(CopyS, 0.4511),
                f(AllGathers, 125.0),
                f(ReduceScatters, 49.0),
                f(AllGatherBytes, 7.670e9),
                f(ReduceScatterBytes, 3.817e9),
                f(HostCollectiveS, 0.0095),
                f(PeakAllocatedBytes, 51.035e9),
                f(WeightedBandwidth, 56.78e9),
            ],
        },
        MeasuredRun {
            experiment: "B",
            scenario: "scenarios/paper/exp-b.toml",
            strategy: "hyperparallel",
            label: "HyperParallel-FSDP",
            validation_mode: false,
            figures: vec![
                f(StepTimeS, 2.614),
                f(ExposedCommS, 0.2554),
                f(OverlapRate, 0.8532),
                f(CopyS, 0.0),
                f(PostReductionDivisionS, 0.0817),
                f(AllGathers, 1087.0),
                f(ReduceScatters, 531.0),
                f(AllGatherBytes, 7.670e9),
                f(ReduceScatterBytes, 3.817e9),
                f(HostCollectiveS, 0.1532),
                f(PeakAllocatedBytes, 50.005e9),
                f(WeightedBandwidth, 125.22e9),
            ],
        },
        MeasuredRun {
            experiment: "A mbs2",
            scenario: "scenarios/paper/exp-a-mbs2.toml",
            strategy: "hyperparallel",
            label: "production mode",
            validation_mode: false,
            figures: vec![
                f(StepTimeS, 6.070),
                f(PeakAllocatedBytes, 36.649 * 1024.0 * 1024.0 * 1024.0),
                f(DeviceKernels, 57_560.0),
                f(Collectives, 9_554.0),
            ],
        },
        MeasuredRun {
            experiment: "A mbs2",
            scenario: "scenarios/paper/exp-a-mbs2.toml",
            strategy: "hyperparallel",
            label: "validation mode",
            validation_mode: true,
            figures: vec![
                f(StepTimeS, 6.244),
                f(PeakAllocatedBytes, 36.649 * 1024.0 * 1024.0 * 1024.0),
                f(DeviceKernels, 57_560.0),
                f(Collectives, 9_554.0),
                f(ValidationOverheadS, 6.244 - 6.070),
                f(ValidationCpuEvents, 23_713.0),
            ],
        },
    ]
}

/// Experiment B's measured step-time difference of HyperParallel-FSDP against FSDP2 (-29.7%).
pub const EXP_B_MEASURED_DIFF: f64 = 2.614 / 3.720 - 1.0;
