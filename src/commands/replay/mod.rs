//! `hpfsdp replay`: run a scenario's step programs for real on a collective backend and put
//! the measured timeline beside the simulator's prediction of the same programs.
//!
//! The prediction is the simulator's for the same (possibly scaled-down, see [`scale`])
//! scenario on the backend's hardware profile (`cpu-mpi` for inproc and mpi unless
//! `--hardware`; the scenario's own profile for hccl and nccl). Every rank walks its own
//! program (the one the simulator timed) with compute and copy ops lasting their predicted
//! durations (`--compute busy`) or doing real f32 GEMMs and copies (`--compute real`).

mod report;
mod scale;

use super::limits;

use anyhow::{Context, Result, bail};
use hpfsdp_backends::replay::{
    ComputeMode, FaultBoard, FaultInjection, ReplayError, ReplayOptions, ReplayRank,
    buffer_bytes_estimate, check_injection, dependency_violations, measured_timeline, run_rank,
};
use hpfsdp_backends::select::{BackendKind, ensure_built, run_on_backend};
use hpfsdp_plan::scenario::{FSDP_STRATEGIES, Scenario};
use hpfsdp_program::step::{StepProgram, Timeline};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::scenario_run::{
    RunOptions, ScenarioPlans, hardware_dir_for, prepare, run_prepared,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Measured steps by default: enough for a median and a spread.
pub const DEFAULT_STEPS: usize = 5;
/// Warm-up steps by default: the first steps pay for first-touch allocations, communicator
/// set-up and cold caches.
pub const DEFAULT_WARMUP: usize = 2;

/// Options of `hpfsdp replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Scenario file (TOML).
    pub scenario: PathBuf,
    /// Collective backend: inproc (threads), mpi, hccl or nccl (one rank per process).
    #[arg(long, value_parser = crate::parse_backend)]
    pub backend: BackendKind,
    /// FSDP strategy whose programs are replayed (default: the scenario's).
    #[arg(long, value_name = "S")]
    pub strategy: Option<String>,
    /// Shrink the mesh to N ranks (dp_shard shrinks first; tp, cp, ep kept); 1 to 4096, at
    /// most the scenario's ranks, and at most 64 on --backend inproc.
    #[arg(long, value_name = "N", value_parser = limits::count_in(1, limits::REPLAY_MAX_RANKS))]
    pub ranks: Option<usize>,
    /// Truncate the model to L decoder layers (1 to the model's layers).
    #[arg(long, value_name = "L", value_parser = limits::count_in(1, limits::REPLAY_MAX_LAYERS))]
    pub layers: Option<usize>,
    /// Measured steps, 1 to 1000 (the median one is shown; their spread is reported).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_STEPS,
          value_parser = limits::count_in(1, limits::REPLAY_MAX_STEPS))]
    pub steps: usize,
    /// Unmeasured warm-up steps before them, 0 to 1000 (allocators, communicators, caches
    /// and clocks settle: the first step of a run is never a warm step).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WARMUP,
          value_parser = limits::count_in(0, limits::REPLAY_MAX_WARMUP))]
    pub warmup: usize,
    /// Output directory (default reports/replay/<scenario>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// A collective not complete after T seconds is a fault (hung or dead peer).
    #[arg(long = "timeout-s", default_value_t = 60.0, value_name = "T")]
    pub timeout_s: f64,
    /// busy: compute and copy ops spin for their predicted time; real: f32 GEMMs and copies.
    #[arg(long, default_value = "busy", value_parser = crate::parse_compute)]
    pub compute: ComputeMode,
    /// Hardware profile of the prediction (default cpu-mpi for inproc/mpi, the scenario's
    /// for hccl/nccl).
    #[arg(long)]
    pub hardware: Option<String>,
    /// Test hook: RANK:OP:KIND with KIND panic, error, hang or mismatch.
    #[arg(long = "inject-fault", hide = true, value_parser = crate::parse_fault)]
    pub inject_fault: Option<FaultInjection>,
    #[command(flatten)]
    pub lint: crate::commands::lint_gate::LintArgs,
}

/// The programs and prediction of the scenario a replay runs.
struct Prepared {
    scenario: Scenario,
    notes: Vec<String>,
    strategy: String,
    profile: HardwareProfile,
    programs: Vec<StepProgram>,
    predicted: Timeline,
}

/// Loads, scales and predicts the replayed scenario; `Err(code)` inside when the lint gate
/// refused its plan (the lint errors are printed).
fn prepare_replay(args: &ReplayArgs) -> Result<Result<Prepared, ExitCode>> {
    if let Some(h) = &args.hardware {
        crate::commands::preflight::check_hardware_flag(h)?;
    }
    let scenario = Scenario::load(&args.scenario)?;
    let mut scaled = scale::scale(scenario, args.ranks, args.layers)?;
    let hardware = args.hardware.clone().unwrap_or_else(|| {
        args.backend
            .default_hardware(&scaled.scenario.file.hardware)
    });
    let profile = HardwareProfile::load_named(&hardware, hardware_dir_for(&args.scenario))
        .with_context(|| format!("loading hardware profile '{hardware}'"))?;
    if profile.name != scaled.scenario.file.hardware {
        scale::place_on_profile(&mut scaled.scenario, &profile, &mut scaled.notes)?;
    }
    let strategy = args
        .strategy
        .clone()
        .unwrap_or_else(|| scaled.scenario.file.fsdp.strategy.clone());
    if !FSDP_STRATEGIES.contains(&strategy.as_str()) {
        bail!(
            "--strategy {strategy}: unknown strategy; choose one of {}",
            FSDP_STRATEGIES.join(", ")
        );
    }
    let plans = ScenarioPlans::new(scaled.scenario.clone());
    if let Some(code) = crate::commands::lint_gate::refuse_lint_errors(
        &plans.scenario,
        &plans.sharding,
        args.lint.allow_lint_errors,
        "replay",
        true,
    ) {
        return Ok(Err(code));
    }
    let prepared = prepare(&plans, &strategy, None, false)?;
    let options = RunOptions {
        fold: false,
        validation_mode: false,
        record_timeline: true,
        optimizer: None,
        all_ranks: true,
    };
    let run = run_prepared(&prepared, &profile, &options)?;
    let predicted = run
        .result
        .timeline
        .context("the simulator recorded no timeline")?;
    let programs = prepared
        .workload
        .units
        .into_iter()
        .map(|u| u.program)
        .collect();
    Ok(Ok(Prepared {
        scenario: scaled.scenario,
        notes: scaled.notes,
        strategy,
        profile,
        programs,
        predicted,
    }))
}

/// Refuses a replay whose buffers would not fit in this machine's available memory (the
/// ranks of this process: all of them for inproc, one otherwise).
fn check_memory(backend: BackendKind, ranks: &[ReplayRank]) -> Result<()> {
    let need: u64 = if backend.ranks_are_threads() {
        ranks.iter().map(buffer_bytes_estimate).sum()
    } else {
        ranks.iter().map(buffer_bytes_estimate).max().unwrap_or(0)
    };
    let Some(available) = available_memory_bytes() else {
        return Ok(());
    };
    if need > available {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        bail!(
            "replaying needs about {:.1} GiB of communication buffers in this process but only {:.1} GiB of memory is available; scale down with --ranks N or --layers L, or replay on a multi-process backend",
            gib(need),
            gib(available)
        );
    }
    Ok(())
}

/// Refuses run-dependent counts beyond their limits ([`limits`]): more ranks than the
/// in-process backend runs as threads, or a span log (steps x ops x ranks) above its cap.
fn check_counts(args: &ReplayArgs, ranks: &[ReplayRank]) -> Result<()> {
    let n = ranks.len() as u64;
    if args.backend.ranks_are_threads() && n > limits::INPROC_MAX_RANKS {
        bail!(
            "the scenario has {n} ranks but --backend inproc runs at most {} as threads; pass --ranks N with N <= {} or replay on a multi-process backend",
            limits::INPROC_MAX_RANKS,
            limits::INPROC_MAX_RANKS
        );
    }
    let ops: u64 = ranks.iter().map(|r| r.program.ops.len() as u64).sum();
    let span_bytes = std::mem::size_of::<hpfsdp_program::step::OpSpan>() as u64;
    let bytes = (args.steps as u64).saturating_mul(ops).saturating_mul(span_bytes);
    if bytes > limits::REPLAY_MAX_SPAN_BYTES {
        let most = limits::REPLAY_MAX_SPAN_BYTES / ops.max(1).saturating_mul(span_bytes);
        bail!(
            "--steps {}: {ops} ops over the ranks give {:.1} GiB of measured spans (limit {} GiB); use --steps {} or fewer, or scale down with --layers L or --ranks N",
            args.steps,
            bytes as f64 / (1u64 << 30) as f64,
            limits::REPLAY_MAX_SPAN_BYTES >> 30,
            most.max(1)
        );
    }
    Ok(())
}

/// `MemAvailable` of `/proc/meminfo`, when readable (Linux).
fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs the command.
pub fn run(args: &ReplayArgs) -> Result<ExitCode> {
    ensure_built(args.backend)?;
    if !(args.timeout_s.is_finite() && args.timeout_s > 0.0) {
        bail!(
            "--timeout-s {}: give a positive number of seconds",
            args.timeout_s
        );
    }
    if let Some(dir) = &args.out {
        crate::commands::preflight::ensure_writable_dir(dir, "--out")?;
    }
    let prep = match prepare_replay(args)? {
        Ok(prep) => prep,
        Err(code) => return Ok(code),
    };
    let ranks: Vec<ReplayRank> = prep
        .programs
        .iter()
        .map(|p| {
            let t = prep
                .predicted
                .rank(p.rank)
                .with_context(|| format!("the prediction has no rank {}", p.rank))?;
            Ok(ReplayRank::from_prediction(p.clone(), t)?)
        })
        .collect::<Result<_>>()?;
    let options = ReplayOptions {
        steps: args.steps,
        warmup: args.warmup,
        compute: args.compute,
        timeout: Duration::from_secs_f64(args.timeout_s),
        fault: args.inject_fault,
    };
    check_injection(&ranks, &options)?;
    check_counts(args, &ranks)?;
    check_memory(args.backend, &ranks)?;
    let predicted_s = prep.predicted.end_ns() as f64 * 1e-9;
    if predicted_s > 10.0 {
        eprintln!(
            "note: the predicted step takes {predicted_s:.1} s on {}; the replay runs {} steps of about that long (scale down with --layers L or --ranks N)",
            prep.profile.name,
            args.warmup + args.steps
        );
    }
    let n = ranks.len();
    let board = FaultBoard::new();
    let results = run_on_backend(args.backend, n, options.timeout, |comm| {
        if comm.world_size() != n {
            return Err(ReplayError::Setup(format!(
                "the {} backend has {} ranks but the scenario has {n}; launch {n} processes or pass --ranks {}",
                args.backend,
                comm.world_size(),
                comm.world_size()
            )));
        }
        run_rank(comm, &ranks[comm.rank()], &options, &board)
    })?;
    let faults = board.faults();
    if !faults.is_empty() {
        return Err(ReplayError::from_faults(faults).into());
    }
    let Some(first) = results.into_iter().next() else {
        bail!("the backend ran no rank");
    };
    let Some(all) = first? else {
        // Not rank 0 of a multi-process backend: rank 0 reports.
        return Ok(ExitCode::SUCCESS);
    };
    let producer = format!(
        "hpfsdp-backends {} / {}",
        hpfsdp_backends::BACKENDS_VERSION,
        args.backend
    );
    let measured = measured_timeline(&all, &producer);
    let violations = dependency_violations(&prep.programs, &measured.timeline);
    let report = report::build(args, &prep, &measured);
    report::emit(args, &report, violations.len())
}
