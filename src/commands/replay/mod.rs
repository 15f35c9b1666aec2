//! `hpfsdp replay`: run a scenario's step programs for real on a collective backend and put
//! the measured timeline beside the simulator's prediction of the same programs.
//!
//! The prediction is the simulator's for the same (possibly scaled-down, see [`scale`])
//! scenario on the profile of the hardware the replay runs on ([`device_profile`]): `cpu-mpi`
//! for inproc and mpi, the device's own profile for hccl and nccl (from the device name the
//! runtime reports; an unknown device is refused), or `--hardware`. The report says which
//! profile and why.
//!
//! Every rank walks its own program (the one the simulator timed). On inproc and mpi, compute
//! and copy ops run on the rank's host thread: a spin of their predicted duration
//! (`--compute busy`) or f32 GEMMs and copies (`--compute real`). On nccl (and hccl where ACL
//! allows) every op runs on the device, launched as a framework launches it: collectives on
//! device-resident buffers, compute as a spin kernel of the predicted duration (`busy`) or
//! cuBLAS GEMMs of the op's shapes and device copies of its bytes (`real`), each program
//! stream on a device stream of its own. `--warmup` steps (default 2) run first, then
//! `--steps` (default 5) are measured; the median is shown with the spread of all.

mod args;
mod predict;
mod report;
mod scale;

pub use args::ReplayArgs;

use super::{device_profile, limits};
use predict::Prepared;

use anyhow::{Result, bail};
use hpfsdp_backends::replay::{
    ComputeMode, FaultBoard, ReplayError, ReplayOptions, ReplayRank, buffer_bytes_estimate,
    check_injection, dependency_violations, measured_timeline, run_rank,
};
use hpfsdp_backends::select::{BackendKind, ensure_built, is_device, run_on_backend};
use std::process::ExitCode;
use std::time::Duration;

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
    check_threads(args, ranks.len())?;
    let ops: u64 = ranks.iter().map(|r| r.program.ops.len() as u64).sum();
    let span_bytes = std::mem::size_of::<hpfsdp_program::step::OpSpan>() as u64;
    let bytes = (args.steps as u64)
        .saturating_mul(ops)
        .saturating_mul(span_bytes);
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

/// Refuses more in-process ranks than [`limits::INPROC_MAX_RANKS`] (before predicting).
fn check_threads(args: &ReplayArgs, n: usize) -> Result<()> {
    if args.backend.ranks_are_threads() && n as u64 > limits::INPROC_MAX_RANKS {
        bail!(
            "the scenario has {n} ranks but --backend inproc runs at most {} as threads; pass --ranks N with N <= {} or replay on a multi-process backend",
            limits::INPROC_MAX_RANKS,
            limits::INPROC_MAX_RANKS
        );
    }
    Ok(())
}

/// `MemAvailable` of `/proc/meminfo`, when readable (Linux).
pub(crate) fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs the command.
pub fn run(args: &ReplayArgs) -> Result<ExitCode> {
    ensure_built(args.backend)?;
    limits::check_timeout_s(args.timeout_s)?;
    if let Some(dir) = &args.out {
        crate::commands::preflight::ensure_writable_dir(dir, "--out")?;
    }
    if let Some(h) = &args.hardware {
        crate::commands::preflight::check_hardware_flag(h)?;
    }
    let (scaled, strategy) = predict::load_scaled(args)?;
    check_threads(args, scaled.scenario.world_size())?;
    if is_device(args.backend) {
        return run_device(args, scaled, &strategy);
    }
    let choice = device_profile::choose(args.hardware.as_deref(), args.backend, None)?;
    let prep = match predict::predict(args, scaled, &strategy, choice)? {
        Ok(prep) => prep,
        Err(code) => return Ok(code),
    };
    let ranks = predict::replay_ranks(&prep)?;
    let options = replay_options(args);
    check_injection(&ranks, &options)?;
    check_counts(args, &ranks)?;
    check_memory(args.backend, &ranks)?;
    note_long_step(args, &prep);
    let n = ranks.len();
    let board = FaultBoard::new();
    let results = run_on_backend(args.backend, n, options.timeout, |comm| {
        check_world(args, comm.world_size(), n)?;
        run_rank(comm, &ranks[comm.rank()], &options, &board)
    })?;
    let faults = board.faults();
    if !faults.is_empty() {
        return Err(ReplayError::from_faults(faults).into());
    }
    let Some(first) = results.into_iter().next() else {
        bail!("the backend ran no rank");
    };
    let compute = match args.compute {
        ComputeMode::Busy => "host spin of each op's predicted time",
        ComputeMode::Real => "host f32 GEMMs and memory copies",
    };
    match first? {
        Some(all) => finish(args, &prep, &all, compute),
        // Not rank 0 of a multi-process backend: rank 0 reports.
        None => Ok(ExitCode::SUCCESS),
    }
}

/// The replay options the flags give.
fn replay_options(args: &ReplayArgs) -> ReplayOptions {
    ReplayOptions {
        steps: args.steps,
        warmup: args.warmup,
        compute: args.compute,
        timeout: Duration::from_secs_f64(args.timeout_s),
        fault: args.inject_fault,
    }
}

/// Refuses a backend whose world is not the scenario's.
fn check_world(args: &ReplayArgs, world: usize, n: usize) -> Result<(), ReplayError> {
    if world == n {
        return Ok(());
    }
    Err(ReplayError::Setup(format!(
        "the {} backend has {world} ranks but the scenario has {n}; launch {n} processes or pass --ranks {world}",
        args.backend
    )))
}

/// Warns when the predicted step is long enough that the replay takes a while.
fn note_long_step(args: &ReplayArgs, prep: &Prepared) {
    let predicted_s = prep.predicted.end_ns() as f64 * 1e-9;
    if predicted_s > 10.0 {
        eprintln!(
            "note: the predicted step takes {predicted_s:.1} s on {}; the replay runs {} steps of about that long (scale down with --layers L or --ranks N)",
            prep.profile.name,
            args.warmup + args.steps
        );
    }
}

/// The measured timeline beside the prediction: report files and summary (rank 0).
fn finish(
    args: &ReplayArgs,
    prep: &Prepared,
    all: &[hpfsdp_backends::replay::RankMeasurement],
    compute: &str,
) -> Result<ExitCode> {
    let producer = format!(
        "hpfsdp-backends {} / {}",
        hpfsdp_backends::BACKENDS_VERSION,
        args.backend
    );
    let measured = measured_timeline(all, &producer);
    let violations = dependency_violations(&prep.programs, &measured.timeline);
    let report = report::build(args, prep, &measured);
    report::emit(args, &report, &prep.choice, compute, violations.len())
}

/// What one process of a device replay ends with.
#[cfg(any(feature = "nccl", feature = "hccl"))]
enum DeviceOutcome {
    /// The lint gate refused the plan.
    Refused(ExitCode),
    /// The replay ran; rank 0 has the measurements.
    Done {
        prep: Box<Prepared>,
        all: Option<Vec<hpfsdp_backends::replay::RankMeasurement>>,
        compute: String,
    },
}

/// A replay on an accelerator backend: the device's name picks the profile, then every op
/// runs on the device ([`hpfsdp_backends::replay::device`]).
#[cfg(any(feature = "nccl", feature = "hccl"))]
fn run_device(args: &ReplayArgs, scaled: scale::Scaled, strategy: &str) -> Result<ExitCode> {
    use hpfsdp_backends::replay::device::run_device_rank;
    use hpfsdp_backends::select::run_on_device_backend;
    let board = FaultBoard::new();
    let outcome = run_on_device_backend(args.backend, |comm| -> Result<DeviceOutcome> {
        let device = comm.device_name().map_err(|e| e.to_string());
        let choice = device_profile::choose(args.hardware.as_deref(), args.backend, Some(device))?;
        let prep = match predict::predict(args, scaled, strategy, choice)? {
            Ok(prep) => prep,
            Err(code) => return Ok(DeviceOutcome::Refused(code)),
        };
        let ranks = predict::replay_ranks(&prep)?;
        let options = replay_options(args);
        check_injection(&ranks, &options)?;
        check_counts(args, &ranks)?;
        check_world(args, comm.world_size(), ranks.len())?;
        note_long_step(args, &prep);
        let r = run_device_rank(comm, &ranks[comm.rank()], &options, &board)?;
        Ok(DeviceOutcome::Done {
            prep: Box::new(prep),
            all: r.measurements,
            compute: r.compute,
        })
    })?;
    match outcome? {
        DeviceOutcome::Refused(code) => Ok(code),
        DeviceOutcome::Done {
            prep,
            all: Some(all),
            compute,
        } => finish(args, &prep, &all, &compute),
        DeviceOutcome::Done { all: None, .. } => Ok(ExitCode::SUCCESS),
    }
}

/// Without an accelerator backend compiled in, `ensure_built` has already refused.
#[cfg(not(any(feature = "nccl", feature = "hccl")))]
fn run_device(args: &ReplayArgs, _: scale::Scaled, _: &str) -> Result<ExitCode> {
    ensure_built(args.backend)?;
    bail!("--backend {} is not an accelerator backend", args.backend)
}
