//! The `hpfsdp` command line: plan, simulate, calibrate, verify, muon, bench, replay,
//! collbench, gate, sweep and export for HyperParallel-FSDP training plans.

mod commands;
mod heap;
mod table;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Check a HyperParallel-FSDP training plan before it reaches the hardware.
#[derive(Parser)]
#[command(
    name = "hpfsdp",
    version,
    // Only the commands that exist (the package description also names planned ones).
    about = "Predict, prove, replay and gate HyperParallel-FSDP training plans on two-tier supernode clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Derive and lint the sharding, FSDP/HSDP and Muon plans of a scenario and print them.
    Plan {
        /// Scenario file (TOML).
        scenario: PathBuf,
        /// Print the whole plan as JSON.
        #[arg(long)]
        json: bool,
        /// Explain why a parameter got its role and placement (full FQN).
        #[arg(long, value_name = "PARAM")]
        explain: Option<String>,
        /// List every parameter instead of folding repeated layers.
        #[arg(long)]
        all: bool,
    },
    /// Predict one training step of the scenario's strategy and its baselines: step time,
    /// tokens/s, MFU, exposed communication per category, overlap, traffic per tier, peak memory.
    Simulate {
        /// Scenario file (TOML).
        scenario: PathBuf,
        /// Strategy to simulate (repeatable; default: the scenario's strategy and baselines).
        #[arg(long = "strategy", value_name = "S")]
        strategies: Vec<String>,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
        /// Write report.html, summary.csv, timeline.csv and trace.json into DIR.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Hardware profile overriding the scenario's `hardware`: a name
        /// (scenarios/hardware/<name>.toml or built in) or the path of a profile file
        /// (`my-h200-fitted.toml`, as `calibrate --write-profile` writes).
        #[arg(long)]
        hardware: Option<String>,
        /// Simulate every rank separately instead of folding symmetric ranks (slow).
        #[arg(long)]
        no_fold: bool,
        /// Charge validation-mode dispatch costs on every launch.
        #[arg(long)]
        validation_mode: bool,
        /// Optimizer part of every simulated step: `hyperparallel` (layout-driven distributed
        /// Muon; the default of `muon+adamw` scenarios), a Muon baseline (naive, moonlight,
        /// dmuon, matrixfsdp, flexshard) or `adamw`. Default: the scenario's optimizer, plus its
        /// `[optimizer] baselines` on the scenario's strategy.
        #[arg(long, value_name = "NAME")]
        optimizer: Option<String>,
        /// Also print each strategy's rank-0 device time by step phase and kernel class (the
        /// sum a profiler's kernel table gives, before streams overlap), to hold the model
        /// against a measured step class by class.
        #[arg(long)]
        kernel_classes: bool,
        #[command(flatten)]
        lint: commands::lint_gate::LintArgs,
    },
    /// Compare the hardware profile's predictions with measured runs (runs files: --runs, or
    /// every file of scenarios/runs/ measured on the profile; the paper's experiments B and A
    /// micro batch 2 for ascend-910c-a3), optionally fit the constants they name jointly
    /// (--fit) and refit without each experiment and run (--loo), or fit the profile's curves
    /// from measured tables (--from), and write the calibration report. Exit status 1 when a
    /// gating figure leaves its tolerance; 0 with "nothing compared" when no runs exist for
    /// the profile and neither --fit nor --loo was asked.
    Calibrate {
        /// Hardware profile: a name (scenarios/hardware/<name>.toml or built in) or the path of
        /// a profile file of your own (my-cluster.toml).
        #[arg(long, default_value = "ascend-910c-a3")]
        hardware: String,
        /// Runs file to compare with (repeatable; files are combined): measured runs with their
        /// figures, sources and tolerances, and the constants a fit may move
        /// (scenarios/runs/*.toml show the format). Default: every runs file of scenarios/runs/
        /// whose `hardware` is the profile's name.
        #[arg(long = "runs", value_name = "FILE")]
        runs: Vec<PathBuf>,
        /// Compare --runs files measured on another profile (refused otherwise).
        #[arg(long)]
        any_hardware: bool,
        /// Fit the residual constants jointly (bounded least squares on log residuals of every
        /// fitted figure), print the fit, every residual and the constants at a bound.
        #[arg(long)]
        fit: bool,
        /// Leave-one-out (implies --fit): refit without each experiment, then without each run
        /// of a two-run experiment, and report the error on what was left out.
        #[arg(long)]
        loo: bool,
        /// Measured table to fit the profile's curves from (repeatable): a collective table
        /// (`hpfsdp collbench` / nccl-tests columns) or a GEMM table (m,n,k,dtype,time_us).
        #[arg(long = "from", value_name = "TABLE.csv")]
        from: Vec<PathBuf>,
        /// Write the profile with the fitted values to FILE (a new file; the shipped profiles
        /// are never edited).
        #[arg(long, value_name = "FILE")]
        write_profile: Option<PathBuf>,
        /// Where to write report.html, comparison.csv and comparison.md.
        #[arg(long, default_value = "out/calibration")]
        out: PathBuf,
        /// Print the outcome as JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Prove a plan on tiny models: one training step (forward, backward and the scenario's
    /// optimizer, AdamW or Muon + AdamW) in production mode, in validation mode and on a single
    /// device, compared per parameter. Exit status 1
    /// when a gating check fails (with --mutate: when validation mode misses the mutation).
    Verify {
        /// Scenario file (TOML), e.g. scenarios/verify/dense-fsdp4.toml.
        scenario: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Write verify.html, params.csv and checks.csv into DIR.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Inject a wrong placement into this module's output contract or this parameter's
        /// placement, and check that validation mode catches it, naming the module.
        #[arg(long, value_name = "MODULE_OR_PARAM")]
        mutate: Option<String>,
        /// Also measure validation vs production step time and dispatch events at micro
        /// batch 1 and 2.
        #[arg(long)]
        bench_modes: bool,
        /// Backend of the distributed runs: `inproc` (threads) or `mpi` (one rank per process:
        /// `mpirun -np <world> hpfsdp verify ... --backend mpi`, build with `--features mpi`).
        #[arg(long, value_enum, default_value = "inproc")]
        backend: commands::verify::VerifyBackend,
        /// With `--backend mpi`: bound on every collective wait, seconds; on expiry the rank
        /// reports the call, group and missing ranks and ends the job.
        #[arg(long, default_value_t = 300.0, value_name = "SECONDS")]
        timeout_s: f64,
    },
    /// Layout-driven distributed Muon on a scenario: momentum memory and Newton-Schulz work per
    /// rank, deduplicated vs naive, and Newton-Schulz accuracy per preset.
    Muon {
        /// Scenario file (TOML).
        scenario: PathBuf,
        /// Print the per-rank figures as JSON.
        #[arg(long)]
        json: bool,
        /// Also measure each preset's Newton-Schulz accuracy against an exact SVD.
        #[arg(long)]
        accuracy: bool,
        #[command(flatten)]
        lint: commands::lint_gate::LintArgs,
    },
    /// Time the simulator, each case in a process of its own: CPU seconds (user + system),
    /// wall time and peak RSS of a synthetic 48-layer step on 768 and 1,024 ranks, exp-d (768
    /// ranks) with AdamW and with distributed Muon, exp-d replicated to ~3k, ~100k (and ~1M)
    /// ranks, and any --scenario file.
    Bench(commands::bench::BenchArgs),
    /// One `bench` case in this process (how `bench` runs each case on its own).
    #[command(hide = true)]
    BenchCase {
        /// Hardware profile name.
        #[arg(long)]
        hardware: String,
        /// The case, as JSON.
        #[arg(long)]
        case: String,
    },
    /// Run a scenario's step programs for real on a collective backend (every rank walks its
    /// own program with real buffers; compute as calibrated busy work or real GEMMs) and
    /// compare the measured timeline with the simulator's prediction. Writes replay.csv,
    /// trace.json and report.html.
    Replay(commands::replay::ReplayArgs),
    /// The nccl-tests / hccl_test sweep on a backend: time and check each collective over a
    /// range of sizes; CSV columns collective,size,count,type,redop,root,time_us,algbw,busbw,
    /// #wrong,tier,ranks. Exit status 1 when a result is wrong.
    Collbench(commands::collbench::CollbenchArgs),
    /// CI gate over scenario files: plan digest and lint, verification of each scenario's tiny
    /// twin, predicted step time, tokens/s, peak memory and bytes per tier per strategy,
    /// checked against a lock file. Exit status 0 all pass, 1 a check failed, 2 bad input.
    Gate(commands::gate::GateArgs),
    /// Simulate a scenario over the cartesian product of `--vary KEY=V1,V2,...` (any dotted
    /// scenario key) in parallel; write sweep.csv and sweep.html with the Pareto front of
    /// tokens/s vs peak memory. Invalid points are reported with their lint.
    Sweep(commands::sweep::SweepArgs),
    /// Write the scenario's step programs as Chakra execution traces (one `<name>.<rank>.et`
    /// per rank, length-delimited protobuf, plus `<name>.comm_groups.json`) for ASTRA-sim and
    /// other Chakra consumers.
    Export(commands::export::ExportArgs),
}

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan {
            scenario,
            json,
            explain,
            all,
        } => commands::plan::run(&scenario, json, explain.as_deref(), all),
        Command::Simulate {
            scenario,
            strategies,
            json,
            out,
            hardware,
            no_fold,
            validation_mode,
            optimizer,
            kernel_classes,
            lint,
        } => commands::simulate::run(&commands::simulate::SimulateArgs {
            scenario,
            strategies,
            json,
            out,
            hardware,
            no_fold,
            validation_mode,
            optimizer,
            allow_lint_errors: lint.allow_lint_errors,
            kernel_classes,
        }),
        Command::Calibrate {
            hardware,
            runs,
            any_hardware,
            fit,
            loo,
            from,
            write_profile,
            out,
            json,
        } => commands::calibrate::run(&commands::calibrate::CalibrateArgs {
            hardware,
            runs,
            any_hardware,
            fit: fit || loo,
            loo,
            from,
            write_profile,
            out,
            json,
        }),
        Command::Verify {
            scenario,
            json,
            out,
            mutate,
            bench_modes,
            backend,
            timeout_s,
        } => commands::verify::run(&commands::verify::VerifyArgs {
            scenario,
            json,
            out,
            mutate,
            bench_modes,
            backend,
            timeout_s,
        }),
        Command::Muon {
            scenario,
            json,
            accuracy,
            lint,
        } => commands::muon::run(&scenario, json, accuracy, lint.allow_lint_errors),
        Command::Bench(args) => commands::bench::run(&args),
        Command::BenchCase { hardware, case } => commands::bench::run_case(&hardware, &case),
        Command::Replay(args) => commands::replay::run(&args),
        Command::Collbench(args) => commands::collbench::run(&args),
        Command::Gate(args) => commands::gate::run(&args),
        Command::Sweep(args) => commands::sweep::run(&args),
        Command::Export(args) => commands::export::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Lets a closed pipe end the process quietly (`hpfsdp simulate ... | head`), as command-line
/// tools do, instead of panicking in `println!`: Rust ignores SIGPIPE by default.
fn restore_default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called once at start-up before any thread exists; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
