//! Simulates every held-in measured run and puts predicted figures beside measured ones.

use super::host_rows::HostRow;
use super::measured::{EXP_B_MEASURED_DIFF, Figure, MeasuredRun, measured_runs};
use crate::error::SimError;
use crate::host_cost::{HostCosts, HostTotals};
use crate::profile::HardwareProfile;
use crate::result::SimResult;
use crate::scenario_run::{RunOptions, ScenarioPlans, simulate_strategy};
use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Category, Payload};
use hpfsdp_program::strategy::avg_division;
use std::collections::BTreeMap;
use std::path::Path;

/// The label of experiment B, whose two runs give the step-time difference
/// ([`Comparison::exp_b_predicted_diff`]).
pub const EXP_B: &str = "B";

/// One figure of one run: measured and predicted.
#[derive(Debug, Clone, PartialEq)]
pub struct FigureRow {
    /// Experiment label.
    pub experiment: &'static str,
    /// Run label.
    pub run: &'static str,
    /// The figure.
    pub figure: Figure,
    /// Measured value.
    pub measured: f64,
    /// Predicted value.
    pub predicted: f64,
}

impl FigureRow {
    /// `predicted / measured - 1`, or `None` when the measured value is zero.
    pub fn relative_error(&self) -> Option<f64> {
        (self.measured != 0.0).then(|| self.predicted / self.measured - 1.0)
    }
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Hardware profile used.
    pub profile: String,
    /// Every figure of every run, in run order.
    pub rows: Vec<FigureRow>,
    /// Predicted experiment-B step-time difference of HyperParallel-FSDP vs FSDP2.
    pub exp_b_predicted_diff: f64,
    /// Measured experiment-B difference (-29.7%).
    pub exp_b_measured_diff: f64,
    /// The host model's figures of every compared run, in run order.
    pub host: Vec<HostRow>,
}

impl Comparison {
    /// The row of (`run`, `figure`), when present.
    pub fn row(&self, run: &str, figure: Figure) -> Option<&FigureRow> {
        self.rows
            .iter()
            .find(|r| r.run == run && r.figure == figure)
    }
}

/// The predicted value of every figure from one simulated run.
pub fn predicted_figures(
    result: &SimResult,
    rank0: &hpfsdp_program::step::StepProgram,
    profile: &HardwareProfile,
    validation_mode: bool,
) -> BTreeMap<Figure, f64> {
    let b = &result.breakdown;
    let mut out = BTreeMap::new();
    out.insert(Figure::StepTimeS, result.step_time_s());
    out.insert(Figure::ExposedCommS, b.exposed_comm_ns as f64 * 1e-9);
    out.insert(Figure::OverlapRate, b.overlap_rate);
    out.insert(Figure::CopyS, b.copy_ns as f64 * 1e-9);
    out.insert(
        Figure::PostReductionDivisionS,
        post_reduction_division_span_s(result, rank0)
            .unwrap_or_else(|| post_reduction_division_s(rank0, profile)),
    );
    let (mut ag, mut rs, mut ag_bytes, mut rs_bytes, mut collectives) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    for op in &rank0.ops {
        if let Payload::Collective(c) = &op.payload {
            collectives += 1;
            match c.kind {
                CollectiveKind::AllGather => {
                    ag += 1;
                    ag_bytes += c.input_bytes;
                }
                CollectiveKind::ReduceScatter => {
                    rs += 1;
                    rs_bytes += c.output_bytes;
                }
                _ => {}
            }
        }
    }
    let mut kernels = 0u64;
    for op in &rank0.ops {
        match &op.payload {
            Payload::Compute(w) => kernels += u64::from(w.kernels),
            Payload::Copy(w) => kernels += u64::from(w.kernels),
            _ => {}
        }
    }
    out.insert(Figure::DeviceKernels, kernels as f64);
    out.insert(Figure::Collectives, collectives as f64);
    out.insert(Figure::AllGathers, ag as f64);
    out.insert(Figure::ReduceScatters, rs as f64);
    out.insert(Figure::AllGatherBytes, ag_bytes as f64);
    out.insert(Figure::ReduceScatterBytes, rs_bytes as f64);
    // Host self time in collective APIs: the collective launch class of the host model
    // (validation mode's extra events are charged to the ops that cause them, not to the
    // collective calls).
    let host = HostCosts::of(profile, validation_mode);
    out.insert(
        Figure::HostCollectiveS,
        collectives as f64 * host.collective_launch_us * 1e-6,
    );
    out.insert(
        Figure::ValidationCpuEvents,
        HostTotals::of(rank0.ops.iter()).validation_events as f64,
    );
    out.insert(Figure::PeakAllocatedBytes, result.peak_memory_bytes as f64);
    let launches = crate::result::LaunchCounts::of(rank0);
    out.insert(Figure::DeviceKernels, launches.device_kernels as f64);
    out.insert(Figure::Collectives, launches.collectives as f64);
    out.insert(
        Figure::WeightedBandwidth,
        weighted_fsdp_bandwidth(result, rank0),
    );
    out
}

/// Device time of rank 0's post-reduction divisions (the kernels
/// [`avg_division::is_collective_stream_division`] selects), seconds: each op's cost on the
/// device ([`crate::cost::compute_work_s`]), summed, whatever it overlaps with.
pub fn post_reduction_division_s(
    rank0: &hpfsdp_program::step::StepProgram,
    profile: &HardwareProfile,
) -> f64 {
    rank0
        .ops
        .iter()
        .filter(|op| avg_division::is_collective_stream_division(op))
        .filter_map(|op| match &op.payload {
            Payload::Compute(w) => {
                Some(crate::cost::compute_work_s(w, &rank0.kernel_mixes, profile))
            }
            _ => None,
        })
        .sum()
}

/// Device time of rank 0's post-reduction divisions as a profiler sees it: the sum of their
/// simulated spans (start to end on their stream, so a division that waited for cores
/// behind the compute stream counts its wait, as the kernel's measured duration does),
/// seconds; `None` without a timeline of rank 0.
pub fn post_reduction_division_span_s(
    result: &SimResult,
    rank0: &hpfsdp_program::step::StepProgram,
) -> Option<f64> {
    let t = result.timeline.as_ref().and_then(|t| t.rank(0))?;
    let ns: u64 = t
        .spans
        .iter()
        .filter(|s| {
            rank0
                .op(s.op)
                .is_some_and(avg_division::is_collective_stream_division)
        })
        .map(|s| s.end_ns.saturating_sub(s.start_ns))
        .sum();
    Some(ns as f64 * 1e-9)
}

/// Bytes of rank 0's FSDP collectives (the larger of send and receive buffer) over the sum of
/// their transfer times (from the moment all peers arrived to the end), bytes per second; 0
/// without a timeline.
pub fn weighted_fsdp_bandwidth(
    result: &SimResult,
    rank0: &hpfsdp_program::step::StepProgram,
) -> f64 {
    let Some(t) = result.timeline.as_ref().and_then(|t| t.rank(0)) else {
        return 0.0;
    };
    let (mut bytes, mut ns) = (0u64, 0u64);
    for s in &t.spans {
        let Some(op) = rank0.op(s.op) else { continue };
        let fsdp = matches!(
            op.category,
            Category::FsdpAg | Category::FsdpRs | Category::FsdpAr
        );
        if let (true, Payload::Collective(c)) = (fsdp, &op.payload) {
            let start = s.transfer_start_ns.unwrap_or(s.start_ns);
            bytes += c.input_bytes.max(c.output_bytes);
            ns += s.end_ns.saturating_sub(start);
        }
    }
    if ns == 0 {
        0.0
    } else {
        bytes as f64 / (ns as f64 * 1e-9)
    }
}

/// Loaded scenarios of the measured runs, shared across evaluations (the fit simulates the
/// same scenarios hundreds of times).
#[derive(Debug, Clone)]
pub struct CalibrationSet {
    runs: Vec<(MeasuredRun, usize)>,
    plans: Vec<ScenarioPlans>,
}

impl CalibrationSet {
    /// Loads the scenarios of every measured run from the repository at `root`.
    pub fn load(root: &Path) -> Result<Self, SimError> {
        let mut plans: Vec<ScenarioPlans> = Vec::new();
        let mut paths: Vec<&str> = Vec::new();
        let mut runs = Vec::new();
        for run in measured_runs() {
            let idx = match paths.iter().position(|p| *p == run.scenario) {
                Some(i) => i,
                None => {
                    let path = root.join(run.scenario);
                    let scenario = Scenario::load(&path).map_err(|e| {
                        SimError::Workload(format!("calibration scenario {}: {e}", path.display()))
                    })?;
                    plans.push(ScenarioPlans::new(scenario));
                    paths.push(run.scenario);
                    plans.len() - 1
                }
            };
            runs.push((run, idx));
        }
        Ok(Self { runs, plans })
    }

    /// The measured runs of the set, in order.
    pub fn runs(&self) -> impl Iterator<Item = &MeasuredRun> {
        self.runs.iter().map(|(r, _)| r)
    }

    /// The experiment labels of the set, in first-seen order (`B`, `A mbs2`).
    pub fn experiments(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for (r, _) in &self.runs {
            if !out.contains(&r.experiment) {
                out.push(r.experiment);
            }
        }
        out
    }

    /// Simulates every run with `profile` and compares.
    pub fn compare(&self, profile: &HardwareProfile) -> Result<Comparison, SimError> {
        self.compare_where(profile, |_| true)
    }

    /// Simulates the runs `keep` selects with `profile` and compares only those (the fit
    /// and the leave-one-out folds simulate subsets). The experiment-B difference is NaN
    /// unless both experiment-B runs are selected; the validation-mode overhead is left out
    /// unless its production twin is selected too.
    pub fn compare_where(
        &self,
        profile: &HardwareProfile,
        keep: impl Fn(&MeasuredRun) -> bool,
    ) -> Result<Comparison, SimError> {
        let mut rows = Vec::new();
        let mut host = Vec::new();
        let mut step: BTreeMap<(&str, &str, bool), f64> = BTreeMap::new();
        for (run, idx) in self.runs.iter().filter(|(r, _)| keep(r)) {
            let options = RunOptions {
                validation_mode: run.validation_mode,
                ..RunOptions::default()
            };
            let sim = simulate_strategy(&self.plans[*idx], run.strategy, profile, &options)?;
            let predicted = predicted_figures(
                &sim.result,
                &sim.rank0_program,
                profile,
                run.validation_mode,
            );
            host.push(HostRow::of(
                (run.experiment, run.label),
                &sim.result,
                &sim.rank0_program,
                HostCosts::of(profile, run.validation_mode),
            ));
            step.insert(
                (run.experiment, run.strategy, run.validation_mode),
                sim.result.step_time_s(),
            );
            for m in &run.figures {
                rows.push(FigureRow {
                    experiment: run.experiment,
                    run: run.label,
                    figure: m.figure,
                    measured: m.value,
                    predicted: predicted.get(&m.figure).copied().unwrap_or(f64::NAN),
                });
            }
        }
        // Validation-mode overhead: this run's step minus its production twin's.
        for row in rows
            .iter_mut()
            .filter(|r| r.figure == Figure::ValidationOverheadS)
        {
            let run = self
                .runs
                .iter()
                .map(|(r, _)| r)
                .find(|r| r.label == row.run);
            row.predicted = run
                .and_then(|r| {
                    let v = step.get(&(r.experiment, r.strategy, true))?;
                    let p = step.get(&(r.experiment, r.strategy, false))?;
                    Some(v - p)
                })
                .unwrap_or(f64::NAN);
        }
        // A figure that needs a run `keep` leaves out is not compared: its measured value
        // embeds that run's measurement (the overhead is the validation step minus the
        // production step), so a fit without the twin must not see it either.
        rows.retain(|r| !(r.figure == Figure::ValidationOverheadS && r.predicted.is_nan()));
        let hp = step
            .get(&(EXP_B, "hyperparallel", false))
            .copied()
            .unwrap_or(f64::NAN);
        let f2 = step
            .get(&(EXP_B, "fsdp2", false))
            .copied()
            .unwrap_or(f64::NAN);
        Ok(Comparison {
            profile: profile.name.clone(),
            rows,
            exp_b_predicted_diff: hp / f2 - 1.0,
            exp_b_measured_diff: EXP_B_MEASURED_DIFF,
            host,
        })
    }
}
