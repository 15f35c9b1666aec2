//! `hpfsdp simulate`: predict one training step of a scenario's strategy and its baselines.

use crate::commands::calibrate_runs::is_profile_path;
use crate::commands::lint_gate::refuse_lint_errors;
use crate::commands::sim_summary::{StrategySummary, summarize, to_report_run};
use crate::commands::{preflight, sanity};
use crate::table::Table;
use anyhow::{Context, Result, bail};
use hpfsdp_plan::scenario::{FSDP_STRATEGIES, MUON_BASELINES, Scenario};
use hpfsdp_reports::model::{self as rm, SimReport};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::kernel_classes::{ClassRow, device_time_by_class};
use hpfsdp_sim::scenario_run::{
    RunOptions, ScenarioPlans, SimJob, StrategyRun, hardware_dir_for, simulate_strategy,
};
use hpfsdp_sim::whatif_costs::{WhatIfCost, whatif_costs};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// Options of `hpfsdp simulate`.
pub struct SimulateArgs {
    /// Scenario file.
    pub scenario: PathBuf,
    /// Strategies to simulate; empty = the scenario's strategy and its baselines.
    pub strategies: Vec<String>,
    /// Print JSON instead of the table.
    pub json: bool,
    /// Write report.html, summary.csv, timeline.csv and trace.json here.
    pub out: Option<PathBuf>,
    /// Hardware profile name overriding the scenario's `hardware`.
    pub hardware: Option<String>,
    /// Simulate every rank separately (slow; for checking the folding).
    pub no_fold: bool,
    /// Charge validation-mode dispatch costs.
    pub validation_mode: bool,
    /// Optimizer strategy for the optimizer part of every simulated program (default: the
    /// scenario's optimizer, plus its `[optimizer] baselines` on the scenario's strategy).
    pub optimizer: Option<String>,
    /// Go on although the sharding plan has lint errors (what-if study).
    pub allow_lint_errors: bool,
    /// Print rank 0's device time by phase and kernel class per strategy (`--kernel-classes`).
    pub kernel_classes: bool,
}

/// The `--json` document.
#[derive(Serialize)]
struct JsonOut<'a> {
    scenario: &'a str,
    hardware: &'a str,
    world_size: usize,
    results: &'a [StrategySummary],
    /// What-if cost rows of the first strategy (absent without `[whatif]` faults).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    whatif: &'a [WhatIfCost],
    /// Per strategy, rank 0's device time by phase and kernel class (only with
    /// `--kernel-classes`).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    kernel_classes: &'a [StrategyClasses],
}

/// One strategy's rank-0 device time by phase and kernel class.
#[derive(Serialize)]
struct StrategyClasses {
    strategy: String,
    optimizer: String,
    rows: Vec<ClassRow>,
}

/// Runs the command.
pub fn run(args: &SimulateArgs) -> Result<ExitCode> {
    check_flags(args)?;
    let scenario = Scenario::load(&args.scenario)?;
    let hardware = args
        .hardware
        .clone()
        .unwrap_or_else(|| scenario.file.hardware.clone());
    let profile = if args.hardware.is_some() && is_profile_path(&hardware) {
        HardwareProfile::load(Path::new(&hardware))
            .with_context(|| format!("--hardware {hardware}: loading the profile file"))?
    } else {
        HardwareProfile::load_named(&hardware, hardware_dir_for(&args.scenario))
            .with_context(|| format!("loading hardware profile '{hardware}'"))?
    };
    if args.hardware.is_some() {
        preflight::check_profile_topology(&profile, &scenario)?;
    }
    let plans = ScenarioPlans::new(scenario);
    if let Some(code) = refuse_lint_errors(
        &plans.scenario,
        &plans.sharding,
        args.allow_lint_errors,
        "simulate",
        true,
    ) {
        return Ok(code);
    }
    let jobs: Vec<SimJob> = match (args.strategies.is_empty(), &args.optimizer) {
        (true, None) => plans.listed_runs(),
        (true, Some(_)) => jobs_for(&plans.listed_strategies(), &args.optimizer),
        (false, _) => jobs_for(&args.strategies, &args.optimizer),
    };
    let options = RunOptions {
        fold: !args.no_fold,
        validation_mode: args.validation_mode,
        record_timeline: true,
        optimizer: None,
        all_ranks: false,
    };
    let runs = simulate_all(&plans, &jobs, &profile, &options)?;
    let summaries: Vec<StrategySummary> = runs.iter().map(summarize).collect();
    for s in &summaries {
        sanity::check_summary(s)?;
    }
    let whatif = whatif_rows(&plans, &jobs, &profile, &options)?;
    let classes: Vec<StrategyClasses> = if args.kernel_classes {
        runs.iter()
            .map(|r| StrategyClasses {
                strategy: r.strategy.clone(),
                optimizer: r.optimizer.clone(),
                rows: device_time_by_class(&r.rank0_program, &profile),
            })
            .collect()
    } else {
        Vec::new()
    };
    let name = plans.scenario.file.name.clone();
    if args.json {
        let out = JsonOut {
            scenario: &name,
            hardware: &profile.name,
            world_size: summaries.first().map_or(0, |s| s.world_size),
            results: &summaries,
            whatif: &whatif,
            kernel_classes: &classes,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", render_table(&plans, &profile, &summaries));
        print!("{}", render_whatif(&whatif));
        print!("{}", render_classes(&classes));
    }
    if let Some(dir) = &args.out {
        let report = SimReport {
            scenario: name,
            description: plans.scenario.file.description.clone(),
            hardware: profile.name.clone(),
            world_size: summaries.first().map_or(0, |s| s.world_size),
            runs: summaries
                .iter()
                .zip(&runs)
                .map(|(s, r)| to_report_run(s, r))
                .collect(),
            device_memory_bytes: Some(profile.device.hbm_capacity_bytes),
            whatif: whatif.iter().map(report_row).collect(),
        };
        let written = hpfsdp_reports::write_sim_report(dir, &report)
            .with_context(|| format!("writing the report into {}", dir.display()))?;
        if !args.json {
            for p in written {
                println!("wrote {}", p.display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Checks the flags before any work: strategy and optimizer names (blaming the flag), the
/// `--hardware` name and a writable `--out` directory.
fn check_flags(args: &SimulateArgs) -> Result<()> {
    for s in &args.strategies {
        if !FSDP_STRATEGIES.contains(&s.as_str()) {
            bail!(
                "--strategy {s}: unknown strategy; choose one of {}",
                FSDP_STRATEGIES.join(", ")
            );
        }
    }
    if let Some(o) = &args.optimizer {
        let known: Vec<&str> = OPTIMIZER_FLAG_NAMES
            .iter()
            .chain(MUON_BASELINES)
            .copied()
            .collect();
        if !known.contains(&o.as_str()) {
            bail!(
                "--optimizer {o}: unknown optimizer; choose one of {}",
                known.join(", ")
            );
        }
    }
    if let Some(h) = args.hardware.as_deref().filter(|h| !is_profile_path(h)) {
        preflight::check_hardware_flag(h)?;
    }
    if let Some(dir) = &args.out {
        preflight::ensure_writable_dir(dir, "--out")?;
    }
    Ok(())
}

/// `--optimizer` names besides the Muon baselines.
const OPTIMIZER_FLAG_NAMES: &[&str] = &["hyperparallel", "adamw"];
/// The what-if cost rows of the first job's strategy (empty without `[whatif]` faults).
fn whatif_rows(
    plans: &ScenarioPlans,
    jobs: &[SimJob],
    profile: &HardwareProfile,
    options: &RunOptions,
) -> Result<Vec<WhatIfCost>> {
    let Some(job) = jobs.first() else {
        return Ok(Vec::new());
    };
    let options = RunOptions {
        optimizer: job.optimizer.clone(),
        ..options.clone()
    };
    whatif_costs(plans, &job.strategy, profile, &options)
        .with_context(|| format!("costing the [whatif] faults on strategy '{}'", job.strategy))
}

/// The `--kernel-classes` tables for the terminal (empty text without them).
fn render_classes(classes: &[StrategyClasses]) -> String {
    let mut out = String::new();
    for c in classes {
        out.push_str(&format!(
            "\nrank 0 device time by phase and kernel class, {} + {} (kernels costed one by one, before streams overlap):\n",
            c.strategy, c.optimizer
        ));
        let mut t = Table::new(&["phase", "class", "launches", "device (ms)"]);
        for r in &c.rows {
            t.row(vec![
                r.phase.to_string(),
                r.class.to_string(),
                r.launches.to_string(),
                format!("{:.2}", r.device_s * 1e3),
            ]);
        }
        let total: f64 = c.rows.iter().map(|r| r.device_s).sum();
        let launches: u64 = c.rows.iter().map(|r| r.launches).sum();
        t.row(vec![
            "total".into(),
            String::new(),
            launches.to_string(),
            format!("{:.2}", total * 1e3),
        ]);
        out.push_str(&t.render());
    }
    out
}

/// The what-if cost table for the terminal (empty text without rows).
fn render_whatif(rows: &[WhatIfCost]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut t = Table::new(&["what-if", "step", "delta (ms)", "delta", "critical rank"]);
    for r in rows {
        t.row(vec![
            r.fault.clone(),
            format!("{:.3} ms", r.step_time_s * 1e3),
            format!("{:+.3}", r.delta_s * 1e3),
            format!("{:+.2}%", r.delta_pct),
            r.critical_rank.to_string(),
        ]);
    }
    format!(
        "\nWhat-if faults (each alone against the baseline, then all):\n{}",
        t.render()
    )
}

/// A what-if row in the report model.
fn report_row(r: &WhatIfCost) -> rm::WhatIfCostRow {
    rm::WhatIfCostRow {
        fault: r.fault.clone(),
        step_time_s: r.step_time_s,
        delta_s: r.delta_s,
        delta_pct: r.delta_pct,
        critical_rank: r.critical_rank,
    }
}

/// Every strategy in `strategies` with the same optimizer choice.
fn jobs_for(strategies: &[String], optimizer: &Option<String>) -> Vec<SimJob> {
    strategies
        .iter()
        .map(|s| SimJob {
            strategy: s.clone(),
            optimizer: optimizer.clone(),
        })
        .collect()
}

/// Simulates each job in turn (its optimizer replacing `options.optimizer`), with a spinner on
/// stderr (hidden when stderr is not a terminal).
pub fn simulate_all(
    plans: &ScenarioPlans,
    jobs: &[SimJob],
    profile: &HardwareProfile,
    options: &RunOptions,
) -> Result<Vec<StrategyRun>> {
    let bar = ProgressBar::new(jobs.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{pos}/{len}] simulating {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut runs = Vec::with_capacity(jobs.len());
    for job in jobs {
        let label = match &job.optimizer {
            Some(o) => format!("{} with optimizer {o}", job.strategy),
            None => job.strategy.clone(),
        };
        bar.set_message(label.clone());
        let job_options = RunOptions {
            optimizer: job.optimizer.clone(),
            ..options.clone()
        };
        let run = simulate_strategy(plans, &job.strategy, profile, &job_options)
            .with_context(|| format!("simulating strategy '{label}'"))?;
        runs.push(run);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(runs)
}

/// A size in the reports' convention (binary prefixes, `1.50 GiB`), so the terminal and the
/// HTML report print the same text for the same value.
fn gb(bytes: u64) -> String {
    hpfsdp_reports::units::bytes(bytes)
}

fn ms(s: f64) -> String {
    format!("{:.1} ms", s * 1e3)
}

/// A table cell from a run's optimizer figures (`-` without optimizer ops).
fn opt_cell(r: &StrategySummary, f: impl Fn(&rm::OptimizerFigures) -> String) -> String {
    r.optimizer_figures.as_ref().map_or("-".into(), f)
}

/// The terminal table: one column per strategy.
fn render_table(
    plans: &ScenarioPlans,
    profile: &HardwareProfile,
    runs: &[StrategySummary],
) -> String {
    let sc = &plans.scenario;
    let mut out = format!(
        "scenario {} on {} ({} ranks; {} micro-batch(es) of {} x {} tokens per rank)\n\n",
        sc.file.name,
        profile.name,
        runs.first().map_or(0, |r| r.world_size),
        sc.grad_accum_steps,
        sc.file.train.micro_batch,
        sc.file.train.seq_len,
    );
    let mut header = vec!["figure"];
    header.extend(runs.iter().map(|r| r.strategy.as_str()));
    let mut t = Table::new(&header);
    let mut row = |name: &str, f: &dyn Fn(&StrategySummary) -> String| {
        let mut cells = vec![name.to_string()];
        cells.extend(runs.iter().map(f));
        t.row(cells);
    };
    row("optimizer", &|r| r.optimizer.clone());
    row("step time", &|r| format!("{:.3} s", r.step_time_s));
    if let Some(base) = runs.first() {
        row("vs first", &|r| {
            format!("{:+.1}%", (r.step_time_s / base.step_time_s - 1.0) * 100.0)
        });
    }
    row("tokens/s", &|r| {
        r.tokens_per_s.map_or("-".into(), |x| format!("{:.0}", x))
    });
    row("MFU", &|r| {
        r.mfu.map_or("-".into(), |x| format!("{:.1}%", x * 100.0))
    });
    row("compute", &|r| ms(r.compute_s));
    row("copy", &|r| ms(r.copy_s));
    row("communication", &|r| ms(r.comm_s));
    row("exposed comm", &|r| ms(r.exposed_comm_total_s));
    let mut cats: Vec<&String> = runs.iter().flat_map(|r| r.exposed_comm_s.keys()).collect();
    cats.sort();
    cats.dedup();
    for c in cats {
        row(&format!("  exposed {c}"), &|r| {
            r.exposed_comm_s.get(c).map_or("-".into(), |x| ms(*x))
        });
    }
    row("idle", &|r| ms(r.idle_s));
    row("host busy", &|r| ms(r.host_s));
    row("overlap rate", &|r| {
        format!("{:.2}%", r.overlap_rate * 100.0)
    });
    row("optimizer range", &|r| opt_cell(r, |o| ms(o.range_s)));
    row("  optimizer busy", &|r| opt_cell(r, |o| ms(o.busy_s)));
    row("  optimizer comm", &|r| opt_cell(r, |o| ms(o.comm_s)));
    row("  optimizer exposed", &|r| {
        opt_cell(r, |o| ms(o.exposed_comm_s))
    });
    let mut opt_tiers: Vec<&String> = runs
        .iter()
        .filter_map(|r| r.optimizer_figures.as_ref())
        .flat_map(|o| o.tier_bytes.keys())
        .collect();
    opt_tiers.sort();
    opt_tiers.dedup();
    for k in opt_tiers {
        row(&format!("  optimizer {k}"), &|r| {
            opt_cell(r, |o| o.tier_bytes.get(k).map_or("-".into(), |b| gb(*b)))
        });
    }
    let mut kinds: Vec<&String> = runs.iter().flat_map(|r| r.collectives.keys()).collect();
    kinds.sort();
    kinds.dedup();
    for k in kinds {
        row(&format!("{k} (count, bytes)"), &|r| {
            r.collectives.get(k).map_or("-".into(), |c| {
                format!("{} / {}", c.count, gb(c.output_bytes))
            })
        });
    }
    let mut tiers: Vec<&String> = runs.iter().flat_map(|r| r.tier_bytes.keys()).collect();
    tiers.sort();
    tiers.dedup();
    for k in tiers {
        row(&format!("{k} traffic"), &|r| {
            r.tier_bytes.get(k).map_or("-".into(), |c| gb(c.bytes))
        });
    }
    let capacity = gb(profile.device.hbm_capacity_bytes);
    row(&format!("peak memory (device {capacity})"), &|r| {
        format!(
            "{}{}",
            gb(r.peak_memory_bytes),
            if r.memory_fits { "" } else { " (DOES NOT FIT)" }
        )
    });
    row("peak memory min/mean", &|r| {
        format!(
            "{} / {}",
            gb(r.memory_spread.min_bytes),
            gb(r.memory_spread.mean_bytes)
        )
    });
    row("peak memory spread", &|r| {
        gb(r.memory_spread.spread_bytes())
    });
    row("simulated ranks", &|r| {
        format!("{} of {}", r.simulated_ranks, r.world_size)
    });
    out.push_str(&t.render());
    out.push_str(
        "\nPer-rank figures are the critical rank's (the one that finishes last); bytes are receive-buffer bytes per step.\nOptimizer range: first to last optimizer op on that rank; peak memory min/mean/spread are over every rank.\n",
    );
    out.push_str(hpfsdp_reports::units::SIZE_UNITS_NOTE);
    out.push('\n');
    out
}
