//! `hpfsdp gate`: the CI gate over scenario files. Per scenario: plan digest and lint, the
//! verification of its tiny twin, and the predicted throughput (tokens/s; step time when a
//! scenario has no tokens), peak memory and bytes per tier of every listed strategy, checked
//! against a lock file (`hpfsdp.lock`) whose figures are validated when it is read.
//!
//! Exit status: 0 when every check passes, 1 when one fails, 2 on bad input (a scenario,
//! profile, twin or lock that cannot be read).

pub mod checks;
pub mod digest;
pub mod evaluate;
pub mod junit;
pub mod lock;
pub mod lock_check;
pub mod lock_file;
pub mod outcome;
pub mod summary;

use anyhow::{Context, Result, bail};
use checks::{GateOptions, compare, lock_entry};
use lock::Lock;
use outcome::CheckOutcome;
use std::path::PathBuf;
use std::process::ExitCode;

/// Command-line arguments of `gate`.
#[derive(clap::Args)]
pub struct GateArgs {
    /// Scenario files, or directories whose `*.toml` files are scenarios.
    #[arg(required = true, value_name = "SCENARIO_OR_DIR")]
    pub inputs: Vec<PathBuf>,
    /// The lock file holding the accepted digests and figures.
    #[arg(long, default_value = "hpfsdp.lock")]
    pub lock: PathBuf,
    /// Accept the current digests and figures and write them to the lock (lint, verification
    /// and memory checks still apply).
    #[arg(long)]
    pub update: bool,
    /// Write JUnit XML (one testcase per scenario and check) to FILE.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Write a Markdown summary (for a pull-request comment) to FILE.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Largest accepted regression vs the lock, percent: of throughput (tokens/s), or of
    /// step time for a scenario without tokens.
    #[arg(long, default_value_t = 2.0, value_name = "N")]
    pub max_regression_pct: f64,
    /// Print the outcome as JSON (every check with its status, message, diff and time)
    /// instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs the gate.
pub fn run(args: &GateArgs) -> Result<ExitCode> {
    if !args.max_regression_pct.is_finite() || args.max_regression_pct < 0.0 {
        bail!(
            "--max-regression-pct {}: give a percentage of at least 0 (e.g. 2)",
            args.max_regression_pct
        );
    }
    let mut lock = if args.lock.exists() {
        lock_file::load(&args.lock)?
    } else if args.update {
        Lock::default()
    } else {
        bail!(
            "lock file {} does not exist; create it with `hpfsdp gate <scenarios> --lock {} --update` and commit it",
            args.lock.display(),
            args.lock.display()
        );
    };
    let files = evaluate::expand_inputs(&args.inputs)?;
    let evals = evaluate::evaluate_all(&files)?;
    let options = GateOptions {
        max_regression_pct: args.max_regression_pct,
        update: args.update,
    };
    let checks: Vec<CheckOutcome> = evals
        .iter()
        .flat_map(|e| compare(e, lock.scenario.get(&e.name), options))
        .collect();
    let report = summary::report(
        &evals,
        &checks,
        &lock,
        &args.lock.display().to_string(),
        args.max_regression_pct,
    );
    let (failed, _) = summary::counts(&checks);
    if let Some(path) = &args.junit {
        write(path, &junit::junit_xml(&checks)?)?;
    }
    if let Some(path) = &args.markdown {
        write(path, &report.to_markdown())?;
    }
    if args.update {
        lock.tool_version = env!("CARGO_PKG_VERSION").to_string();
        for e in &evals {
            lock.scenario.insert(e.name.clone(), lock_entry(e));
        }
        lock_file::save(&lock, &args.lock)?;
    }
    if args.json {
        println!(
            "{}",
            summary::json(&evals, &checks, args.update.then_some(&args.lock))?
        );
    } else {
        print_outcome(&checks, evals.len());
        if args.update {
            println!("wrote {}", args.lock.display());
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_outcome(checks: &[CheckOutcome], scenarios: usize) {
    print!("{}", summary::terminal(checks));
    let (failed, total) = summary::counts(checks);
    if failed == 0 {
        println!("gate: all {total} checks passed ({scenarios} scenario(s))");
    } else {
        println!("gate: {failed} of {total} checks FAILED");
        for c in checks.iter().filter(|c| c.status == outcome::Status::Fail) {
            println!("  {} {}: {}", c.scenario, c.check, c.message);
            for line in c.diff.lines() {
                println!("      {line}");
            }
        }
    }
}

fn write(path: &PathBuf, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
