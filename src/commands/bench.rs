//! `hpfsdp bench`: how fast the simulator simulates. Each case runs in a process of its own
//! ([`super::bench_process`]), so its CPU seconds and peak memory are its own; the table puts
//! CPU seconds (user + system, all threads) beside wall time and peak RSS, then the exp-d
//! Muon / AdamW ratios and the exponent of time against ranks. Ratios, not assertions.

use super::bench_process::{CaseRun, run_in_child};
use crate::table::Table;
use anyhow::{Context, Result, bail};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::bench_case::{
    BenchCase, CaseFigures, SuiteFigures, exp_d_cases, muon_scaling_file, suite_figures,
    synthetic_cases,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The real scenario the benchmark simulates (768 ranks) and scales to ~100,000 ranks.
const EXP_D: &str = "scenarios/paper/exp-d.toml";

/// exp-d's 768-rank supernode replicated 1,302 times with Muon (~1M ranks): a default case
/// when the file exists.
pub const EXP_D_1M: &str = "scenarios/bench/exp-d-1m-muon.toml";

/// Options of `hpfsdp bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Hardware profile name (scenarios/hardware/<name>.toml or a built-in copy).
    #[arg(long, default_value = "ascend-910c-a3")]
    pub hardware: String,
    /// Print the cases as JSON (each case's process figures and report, and the ratios)
    /// instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also time this scenario file (its own strategy and optimizer); repeatable.
    #[arg(long = "scenario", value_name = "PATH")]
    pub scenarios: Vec<PathBuf>,
    /// Time only the --scenario files, not the standard cases.
    #[arg(long)]
    pub only_scenarios: bool,
    /// Leave out the ~1M-rank exp-d case (scenarios/bench/exp-d-1m-muon.toml).
    #[arg(long)]
    pub skip_1m: bool,
}

/// The cases `args` asks for, in order: synthetic, exp-d, the 1M-rank job, then --scenario.
fn cases(args: &BenchArgs) -> Result<Vec<BenchCase>> {
    let mut cases = Vec::new();
    if !args.only_scenarios {
        if !Path::new(EXP_D).is_file() {
            bail!("{EXP_D} not found: run `hpfsdp bench` from the repository root");
        }
        cases.extend(synthetic_cases());
        cases.extend(exp_d_cases(Path::new(EXP_D)));
        if !args.skip_1m && Path::new(EXP_D_1M).is_file() {
            cases.push(muon_scaling_file(Path::new(EXP_D_1M)));
        }
    }
    for path in &args.scenarios {
        if !path.is_file() {
            bail!("--scenario {}: no such file", path.display());
        }
        cases.push(BenchCase::scenario_file(path));
    }
    if cases.is_empty() {
        bail!("--only-scenarios without --scenario: nothing to time");
    }
    Ok(cases)
}

/// Runs the benchmark: every case in its own process, then the table (or JSON).
pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    crate::commands::preflight::check_hardware_flag(&args.hardware)?;
    HardwareProfile::load_named(&args.hardware, "scenarios/hardware")
        .with_context(|| format!("loading hardware profile '{}'", args.hardware))?;
    let cases = cases(args)?;
    let bar = crate::commands::progress::bar(cases.len(), "cases");
    let mut runs = Vec::with_capacity(cases.len());
    for case in &cases {
        bar.set_message(case.name().to_string());
        runs.push(run_in_child(&args.hardware, case)?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let figures = suite_figures(&runs.iter().map(figures_of).collect::<Vec<_>>());
    if args.json {
        let value = json(&args.hardware, &runs, &figures);
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", table(&runs).render());
        print!("{}", summary(&figures));
    }
    Ok(ExitCode::SUCCESS)
}

/// The hidden `bench-case` subcommand: runs one case (JSON, as [`run_in_child`] passes it)
/// in this process and prints its report as JSON.
pub fn run_case(hardware: &str, case_json: &str) -> Result<ExitCode> {
    let case: BenchCase = serde_json::from_str(case_json).context("reading --case")?;
    let profile = HardwareProfile::load_named(hardware, "scenarios/hardware")
        .with_context(|| format!("loading hardware profile '{hardware}'"))?;
    let report = case
        .run(&profile)
        .with_context(|| format!("bench case '{}'", case.name()))?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(ExitCode::SUCCESS)
}

/// What the ratios and fits read from a run: the process's own figures.
fn figures_of(run: &CaseRun) -> CaseFigures {
    CaseFigures {
        role: run.case.role(),
        ranks: run.report.world_size,
        wall_s: run.wall_s,
        cpu_s: run.cpu_s,
        peak_rss_bytes: run.max_rss_bytes,
    }
}

/// One row per case: the process's wall, CPU and peak RSS, then what it simulated.
fn table(runs: &[CaseRun]) -> Table {
    let mut t = Table::new(&[
        "case",
        "fold",
        "ranks",
        "simulated",
        "events",
        "wall s",
        "CPU s",
        "max RSS MB",
        "plan s",
        "programs s",
        "simulate s",
        "step s",
    ]);
    for r in runs {
        let p = &r.report;
        t.row(vec![
            p.name.clone(),
            if p.folded { "on" } else { "off" }.to_string(),
            p.world_size.to_string(),
            p.simulated_ranks.to_string(),
            p.events.to_string(),
            format!("{:.2}", r.wall_s),
            format!("{:.2}", r.cpu_s),
            format!("{:.0}", r.max_rss_bytes as f64 / 1e6),
            format!("{:.2}", p.plan_s),
            format!("{:.2}", p.prepare_s),
            format!("{:.3}", p.simulate_s),
            format!("{:.3}", p.step_time_s),
        ]);
    }
    t
}

/// The ratio and scaling lines under the table.
fn summary(f: &SuiteFigures) -> String {
    let mut out = String::new();
    if let Some((wall, cpu, rss)) = f.muon_over_adamw {
        out += &format!("exp-d Muon / AdamW: CPU {cpu:.2}x, wall {wall:.2}x, max RSS {rss:.2}x\n");
    }
    if let (Some(cpu), Some(wall)) = (f.cpu_scaling_exponent, f.scaling_exponent) {
        out += &format!(
            "scaling with Muon (exp-d and its replicated copies): CPU ~ ranks^{cpu:.2}, wall ~ \
             ranks^{wall:.2}\n"
        );
    }
    out
}

/// `{hardware, cases: [{name, process: {wall_s, cpu_s, max_rss_bytes}, report}], ratios}`.
fn json(hardware: &str, runs: &[CaseRun], f: &SuiteFigures) -> serde_json::Value {
    let cases: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            serde_json::json!({
                "name": r.case.name(),
                "case": r.case,
                "process": {
                    "wall_s": r.wall_s,
                    "cpu_s": r.cpu_s,
                    "max_rss_bytes": r.max_rss_bytes,
                },
                "report": r.report,
            })
        })
        .collect();
    let ratio = f
        .muon_over_adamw
        .map(|(wall, cpu, rss)| serde_json::json!({ "wall": wall, "cpu": cpu, "max_rss": rss }));
    serde_json::json!({
        "hardware": hardware,
        "cases": cases,
        "muon_over_adamw": ratio,
        "scaling_exponent": f.scaling_exponent,
        "cpu_scaling_exponent": f.cpu_scaling_exponent,
    })
}
