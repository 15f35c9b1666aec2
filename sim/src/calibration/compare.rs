//! Simulates every measured run of a set of runs files and puts predicted figures beside
//! measured ones.

use super::difference::{Difference, DifferenceRow};
pub use super::division_time::{post_reduction_division_s, post_reduction_division_span_s};
use super::error::CalibrationError;
use super::figure::Figure;
use super::gates::FigureRule;
use super::host_rows::HostRow;
use super::measured::MeasuredRun;
use super::params::{FitParam, MeasuredConstant, SourcedRange};
use super::rank0_facts::Rank0Facts;
use super::runs_file::RunsFile;
use crate::engine::SimOptions;
use crate::error::SimError;
use crate::host_cost::HostCosts;
use crate::profile::HardwareProfile;
use crate::result::SimResult;
use crate::scenario_run::{PreparedRun, RunOptions, ScenarioPlans, prepare};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Category, Payload};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One figure of one run: measured and predicted.
#[derive(Debug, Clone, PartialEq)]
pub struct FigureRow {
    /// Experiment label.
    pub experiment: String,
    /// Run label.
    pub run: String,
    /// The figure.
    pub figure: Figure,
    /// Measured value.
    pub measured: f64,
    /// Predicted value (NaN when the simulator does not predict it).
    pub predicted: f64,
    /// How it is fitted and checked (the figure's default rule with the runs file's
    /// overrides).
    pub rule: FigureRule,
    /// Where the measured value comes from.
    pub source: String,
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
    /// Every step-time difference of the runs files, predicted (NaN unless both of its runs
    /// were compared).
    pub differences: Vec<DifferenceRow>,
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

/// The predicted value of every figure from one simulated run ([`Rank0Facts`] read from
/// `rank0` once; a calibration set keeps them per prepared workload instead).
pub fn predicted_figures(
    result: &SimResult,
    rank0: &hpfsdp_program::step::StepProgram,
    profile: &HardwareProfile,
    validation_mode: bool,
) -> BTreeMap<Figure, f64> {
    Rank0Facts::of(rank0).predicted_figures(result, rank0, profile, validation_mode)
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

/// The measured runs of one or more runs files with their scenarios loaded and their
/// programs generated once (programs do not depend on the profile, so the fit re-simulates
/// the same prepared workloads hundreds of times with trial constants), together with what
/// the figures read from each rank-0 program ([`Rank0Facts`], also profile-independent).
pub struct CalibrationSet {
    files: Vec<RunsFile>,
    /// Every run with the index of its prepared workload.
    runs: Vec<(MeasuredRun, usize)>,
    prepared: Vec<PreparedRun>,
    /// Per prepared workload: the facts of its rank-0 program.
    facts: Vec<Rank0Facts>,
    differences: Vec<Difference>,
    fit: Vec<FitParam>,
    measured_constants: Vec<MeasuredConstant>,
    sourced_ranges: Vec<SourcedRange>,
    simulations: AtomicUsize,
    observer: Option<SimulationObserver>,
}

/// What a prepared workload is shared by: scenario file, strategy, optimizer.
type PreparedKey = (PathBuf, String, Option<String>);

/// Called after every simulated run with the number simulated so far (a progress bar).
pub type SimulationObserver = Box<dyn Fn(usize) + Send + Sync>;

impl std::fmt::Debug for CalibrationSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CalibrationSet")
            .field("files", &self.files)
            .field("runs", &self.runs.len())
            .field("simulations", &self.simulations())
            .finish_non_exhaustive()
    }
}

impl CalibrationSet {
    /// Reads the runs files at `paths` and loads their scenarios ([`CalibrationSet::new`]).
    pub fn load(paths: &[impl AsRef<Path>]) -> Result<Self, CalibrationError> {
        let files = paths
            .iter()
            .map(|p| RunsFile::load(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(files)
    }

    /// Joins runs files (their runs, differences, fit constants, measured constants and
    /// ranges, in file order) and prepares every run's programs. Errors name a run label or
    /// a fit key that two files both define, and a scenario or strategy that fails.
    pub fn new(files: Vec<RunsFile>) -> Result<Self, CalibrationError> {
        check_unique(&files)?;
        let mut set = Self {
            runs: Vec::new(),
            prepared: Vec::new(),
            facts: Vec::new(),
            differences: Vec::new(),
            fit: Vec::new(),
            measured_constants: Vec::new(),
            sourced_ranges: Vec::new(),
            simulations: AtomicUsize::new(0),
            observer: None,
            files: Vec::new(),
        };
        let mut plans: Vec<(PathBuf, ScenarioPlans)> = Vec::new();
        let mut keys: Vec<PreparedKey> = Vec::new();
        for file in &files {
            for run in &file.runs {
                let idx = set.prepared_index(run, &file.path, &mut plans, &mut keys)?;
                set.runs.push((run.clone(), idx));
            }
            set.differences.extend(file.differences.iter().cloned());
            set.fit.extend(file.fit.iter().cloned());
            set.measured_constants
                .extend(file.measured_constants.iter().cloned());
            set.sourced_ranges
                .extend(file.sourced_ranges.iter().cloned());
        }
        set.files = files;
        Ok(set)
    }

    /// The index of `run`'s prepared workload, loading its scenario (`plans`, by path) and
    /// preparing its programs (`keys`: scenario, strategy, optimizer) the first time they are
    /// needed.
    fn prepared_index(
        &mut self,
        run: &MeasuredRun,
        file: &Path,
        plans: &mut Vec<(PathBuf, ScenarioPlans)>,
        keys: &mut Vec<PreparedKey>,
    ) -> Result<usize, CalibrationError> {
        let key = (
            run.scenario.clone(),
            run.strategy.clone(),
            run.optimizer.clone(),
        );
        if let Some(i) = keys.iter().position(|k| *k == key) {
            return Ok(i);
        }
        let plan = match plans.iter().position(|(p, _)| *p == run.scenario) {
            Some(i) => i,
            None => {
                let scenario = Scenario::load(&run.scenario).map_err(|e| {
                    SimError::Workload(format!(
                        "calibration scenario {} (run '{}' of {}): {e}",
                        run.scenario.display(),
                        run.label,
                        file.display()
                    ))
                })?;
                plans.push((run.scenario.clone(), ScenarioPlans::new(scenario)));
                plans.len() - 1
            }
        };
        let fold = RunOptions::default().fold;
        let prepared = prepare(
            &plans[plan].1,
            &run.strategy,
            run.optimizer.as_deref(),
            fold,
        )
        .map_err(|e| {
            SimError::Workload(format!("run '{}' of {}: {e}", run.label, file.display()))
        })?;
        self.facts
            .push(Rank0Facts::of(&prepared.workload.units[0].program));
        self.prepared.push(prepared);
        keys.push(key);
        Ok(self.prepared.len() - 1)
    }

    /// The runs files of the set, in order.
    pub fn files(&self) -> &[RunsFile] {
        &self.files
    }

    /// The measured runs of the set, in order.
    pub fn runs(&self) -> impl Iterator<Item = &MeasuredRun> {
        self.runs.iter().map(|(r, _)| r)
    }

    /// The constants the runs files let a fit move, in file order.
    pub fn fit_params(&self) -> &[FitParam] {
        &self.fit
    }

    /// The fit constant with this key.
    pub fn fit_param(&self, key: &str) -> Option<&FitParam> {
        self.fit.iter().find(|p| p.key == key)
    }

    /// Profile constants measured on one of the runs.
    pub fn measured_constants(&self) -> &[MeasuredConstant] {
        &self.measured_constants
    }

    /// Constants no fit moves, with their public ranges.
    pub fn sourced_ranges(&self) -> &[SourcedRange] {
        &self.sourced_ranges
    }

    /// The step-time differences of the runs files.
    pub fn differences(&self) -> &[Difference] {
        &self.differences
    }

    /// How many runs have been simulated with this set so far (the fit's progress).
    pub fn simulations(&self) -> usize {
        self.simulations.load(Ordering::Relaxed)
    }

    /// Calls `observer` after every simulated run with [`CalibrationSet::simulations`].
    pub fn observe(&mut self, observer: SimulationObserver) {
        self.observer = Some(observer);
    }

    /// The experiment labels of the set, in first-seen order (`B`, `A mbs2`).
    pub fn experiments(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (r, _) in &self.runs {
            if !out.contains(&r.experiment.as_str()) {
                out.push(&r.experiment);
            }
        }
        out
    }

    /// Simulates every run with `profile` and compares.
    pub fn compare(&self, profile: &HardwareProfile) -> Result<Comparison, SimError> {
        self.compare_where(profile, |_| true)
    }

    /// Simulates the runs `keep` selects with `profile` and compares only those (the fit
    /// and the leave-one-out folds simulate subsets). A difference is NaN unless both of its
    /// runs are selected; the validation-mode overhead is left out unless its production
    /// twin is selected too.
    pub fn compare_where(
        &self,
        profile: &HardwareProfile,
        keep: impl Fn(&MeasuredRun) -> bool,
    ) -> Result<Comparison, SimError> {
        let kept: Vec<&(MeasuredRun, usize)> = self.runs.iter().filter(|(r, _)| keep(r)).collect();
        // The runs are independent: simulated in parallel, compared in order.
        let sims = kept
            .par_iter()
            .map(|(run, idx)| self.simulate(run, *idx, profile))
            .collect::<Result<Vec<_>, _>>()?;
        let (mut rows, mut host, mut steps) = (Vec::new(), Vec::new(), Vec::new());
        for ((run, idx), result) in kept.into_iter().zip(sims) {
            let (result, facts) = (&result, &self.facts[*idx]);
            let rank0 = &self.prepared[*idx].workload.units[0].program;
            let mut predicted =
                facts.predicted_figures(result, rank0, profile, run.validation_mode);
            add_resident_memory(&mut predicted, run);
            let costs = HostCosts::of(profile, run.validation_mode);
            host.push(HostRow::with_totals(
                (&run.experiment, &run.label),
                result,
                facts.host_totals,
                costs,
            ));
            steps.push((run, result.step_time_s()));
            rows.extend(run.figures.iter().map(|m| FigureRow {
                experiment: run.experiment.clone(),
                run: run.label.clone(),
                figure: m.figure,
                measured: m.value,
                predicted: predicted.get(&m.figure).copied().unwrap_or(f64::NAN),
                rule: m.rule,
                source: row_source(m, run, &predicted),
            }));
        }
        predict_validation_overheads(&mut rows, &steps);
        let differences = self
            .differences
            .iter()
            .map(|d| {
                let of = |label: &str| {
                    steps
                        .iter()
                        .find(|(r, _)| r.experiment == d.experiment && r.label == label)
                        .map(|(_, s)| *s)
                };
                let predicted = match (of(&d.run), of(&d.baseline)) {
                    (Some(a), Some(b)) => a / b - 1.0,
                    _ => f64::NAN,
                };
                DifferenceRow {
                    difference: d.clone(),
                    predicted,
                }
            })
            .collect();
        Ok(Comparison {
            profile: profile.name.clone(),
            rows,
            differences,
            host,
        })
    }
}

/// Predicts every validation-mode overhead row: its run's simulated step minus that of its
/// production twin (same experiment, strategy and optimizer) among the simulated `steps`. A
/// row whose twin was not simulated is dropped: its measured value embeds the twin's
/// measurement (the overhead is the validation step minus the production step), so a fit
/// without the twin must not see it either.
fn predict_validation_overheads(rows: &mut Vec<FigureRow>, steps: &[(&MeasuredRun, f64)]) {
    for row in rows
        .iter_mut()
        .filter(|r| r.figure == Figure::ValidationOverheadS)
    {
        let Some((run, v)) = steps
            .iter()
            .find(|(r, _)| r.experiment == row.experiment && r.label == row.run)
        else {
            continue;
        };
        let twin = steps.iter().find(|(p, _)| {
            !p.validation_mode
                && p.experiment == run.experiment
                && p.strategy == run.strategy
                && p.optimizer == run.optimizer
        });
        row.predicted = twin.map_or(f64::NAN, |(_, p)| v - p);
    }
    rows.retain(|r| !(r.figure == Figure::ValidationOverheadS && r.predicted.is_nan()));
}

impl CalibrationSet {
    /// Simulates one run (its prepared workload `idx`) with `profile` and counts it. Only
    /// what the figures read is kept ([`calibration_options`]).
    fn simulate(
        &self,
        run: &MeasuredRun,
        idx: usize,
        profile: &HardwareProfile,
    ) -> Result<SimResult, SimError> {
        let prepared = &self.prepared[idx];
        let options = calibration_options(prepared, run.validation_mode);
        let sim = crate::engine::simulate(&prepared.workload, profile, &options)?;
        let n = self.simulations.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(observe) = &self.observer {
            observe(n);
        }
        Ok(sim)
    }
}

/// The simulation switches of a calibration run: those of [`run_prepared`] with the default
/// [`RunOptions`] except that only the critical rank's breakdown, the timelines of rank 0 and
/// of the critical rank and no memory series are kept. The figures read the step time, the
/// critical rank's breakdown, the peak memory (kept for every rank) and rank 0's spans, so
/// they are the same; the per-rank breakdowns and series of every class are not built on
/// each of the fit's evaluations.
fn calibration_options(prepared: &PreparedRun, validation_mode: bool) -> SimOptions {
    SimOptions {
        validation_mode,
        record_timeline: true,
        record_memory_series: false,
        tokens_per_step: Some(prepared.tokens_per_step),
        model_flops_per_step: Some(prepared.model_flops_per_step),
        all_ranks: false,
    }
}

/// Refuses runs files that define the same run label or fit key twice (labels name runs in
/// differences, blind bounds and leave-one-out; a key can have one set of bounds).
fn check_unique(files: &[RunsFile]) -> Result<(), CalibrationError> {
    for (i, file) in files.iter().enumerate() {
        for earlier in &files[..i] {
            let clash = |what: &str, name: &str| CalibrationError::RunsFile {
                file: file.path.display().to_string(),
                line: 0,
                key: what.to_string(),
                message: format!(
                    "{what} '{name}' is also in {}; give each run a label of its own and each \
                     constant one [[fit]] entry over the files given together",
                    earlier.path.display()
                ),
            };
            if let Some(r) = file
                .runs
                .iter()
                .find(|r| earlier.runs.iter().any(|o| o.label == r.label))
            {
                return Err(clash("run.label", &r.label));
            }
            if let Some(f) = file
                .fit
                .iter()
                .find(|f| earlier.fit.iter().any(|o| o.key == f.key))
            {
                return Err(clash("fit.key", &f.key));
            }
        }
    }
    Ok(())
}

/// Adds a run's resident memory ([`MeasuredRun::resident`]) to its predicted peak memory
/// figures: the measurement includes memory the simulated step does not allocate.
fn add_resident_memory(predicted: &mut BTreeMap<Figure, f64>, run: &MeasuredRun) {
    let Some(resident) = &run.resident else {
        return;
    };
    for figure in [Figure::PeakAllocatedBytes, Figure::PeakReservedBytes] {
        if let Some(v) = predicted.get_mut(&figure) {
            *v += resident.bytes;
        }
    }
}

/// A figure row's source: the measured figure's, plus the resident memory added to the
/// prediction of a predicted peak-memory figure.
fn row_source(
    m: &super::measured::MeasuredFigure,
    run: &MeasuredRun,
    predicted: &BTreeMap<Figure, f64>,
) -> String {
    match (&run.resident, m.figure) {
        (Some(r), Figure::PeakAllocatedBytes | Figure::PeakReservedBytes)
            if predicted.contains_key(&m.figure) =>
        {
            format!(
                "{}; predicted = the simulated step + {:.2} GiB resident ({})",
                m.source,
                r.bytes / f64::from(1u32 << 30),
                r.source
            )
        }
        _ => m.source.clone(),
    }
}
