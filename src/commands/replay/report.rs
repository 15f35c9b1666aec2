//! Turning a replay's measured and predicted timelines into the report, the summary table
//! and the `--json` document.

use super::args::ReplayArgs;
use super::predict::Prepared;
use crate::commands::device_profile::ProfileChoice;
use crate::table::Table;
use anyhow::{Context, Result};
use hpfsdp_backends::replay::MeasuredSteps;
use hpfsdp_program::step::{StepProgram, Timeline};
use hpfsdp_reports::replay::{CompareRow, ReplayOpRow, ReplayReport, StepFigures};
use hpfsdp_reports::write_replay_report;
use hpfsdp_sim::metrics::breakdown;
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

/// Step time and exposed communication of a timeline, on its critical rank (latest end,
/// lowest rank on ties), as `simulate` reports them.
fn figures(programs: &[StepProgram], timeline: &Timeline) -> StepFigures {
    let step_ns = timeline.end_ns();
    let critical = programs
        .iter()
        .filter_map(|p| {
            let t = timeline.rank(p.rank)?;
            let end = t.spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
            Some((end, std::cmp::Reverse(p.rank), p, t))
        })
        .max_by_key(|(end, rank, _, _)| (*end, *rank));
    let Some((_, _, program, t)) = critical else {
        return StepFigures::default();
    };
    let b = breakdown(program, &t.spans, step_ns, 0);
    StepFigures {
        step_ns,
        exposed_comm_ns: b.exposed_comm_ns,
        exposed_by_category_ns: b
            .by_category
            .iter()
            .filter(|c| c.exposed_comm_ns > 0)
            .map(|c| (c.category.name().to_string(), c.exposed_comm_ns))
            .collect(),
    }
}

/// Builds the report of a replay.
pub fn build(args: &ReplayArgs, prep: &Prepared, measured: &MeasuredSteps) -> ReplayReport {
    ReplayReport {
        scenario: prep.scenario.file.name.clone(),
        backend: args.backend.name().to_string(),
        hardware: prep.profile.name.clone(),
        strategy: prep.strategy.clone(),
        world_size: prep.programs.len(),
        compute: args.compute.name().to_string(),
        scaling: prep.notes.clone(),
        warmup: args.warmup,
        measured_steps_ns: measured.step_ns.clone(),
        shown_step: measured.shown_step,
        predicted: figures(&prep.programs, &prep.predicted),
        measured: figures(&prep.programs, &measured.timeline),
        rows: ReplayReport::rows_of(&prep.programs, &measured.timeline, &prep.predicted),
    }
}

/// The `--json` document.
#[derive(Serialize)]
struct JsonOut<'a> {
    scenario: &'a str,
    backend: &'a str,
    hardware: &'a str,
    strategy: &'a str,
    ranks: usize,
    compute: &'a str,
    hardware_reason: &'a str,
    compute_on: &'a str,
    scaling: &'a [String],
    warmup: usize,
    measured_steps_ns: &'a [u64],
    step_spread: Spread,
    predicted: &'a StepFigures,
    measured: &'a StepFigures,
    by_category: Vec<CompareRow>,
    by_collective_kind: Vec<CompareRow>,
    worst_ops: Vec<&'a ReplayOpRow>,
    ops: usize,
    dependency_violations: usize,
    out_dir: String,
}

/// The spread of the measured step times.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Fastest measured step, ms.
    pub min_ms: f64,
    /// Median measured step (the lower median for an even count), ms.
    pub median_ms: f64,
    /// Slowest measured step, ms.
    pub max_ms: f64,
    /// `(max - min) / median`, percent.
    pub spread_pct: f64,
}

/// The spread of `steps_ns` (all zero when there is none).
pub fn spread(steps_ns: &[u64]) -> Spread {
    let mut v: Vec<u64> = steps_ns.to_vec();
    v.sort_unstable();
    let at = |i: usize| v.get(i).copied().unwrap_or(0) as f64 * 1e-6;
    let (min, median, max) = (
        at(0),
        at(v.len().saturating_sub(1) / 2),
        at(v.len().saturating_sub(1)),
    );
    Spread {
        min_ms: min,
        median_ms: median,
        max_ms: max,
        spread_pct: if median > 0.0 {
            100.0 * (max - min) / median
        } else {
            0.0
        },
    }
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 * 1e-6)
}

fn ratio(m: u64, p: u64) -> String {
    if p == 0 {
        "-".into()
    } else {
        format!("{:.2}", m as f64 / p as f64)
    }
}

fn summary_table(r: &ReplayReport) -> String {
    let mut t = Table::new(&["", "predicted ms", "measured ms", "measured/predicted"]);
    t.row(vec![
        "step time".into(),
        ms(r.predicted.step_ns),
        ms(r.measured.step_ns),
        ratio(r.measured.step_ns, r.predicted.step_ns),
    ]);
    t.row(vec![
        "exposed communication".into(),
        ms(r.predicted.exposed_comm_ns),
        ms(r.measured.exposed_comm_ns),
        ratio(r.measured.exposed_comm_ns, r.predicted.exposed_comm_ns),
    ]);
    for (label, rows) in [
        ("category", r.by_category()),
        ("collective", r.by_collective_kind()),
    ] {
        for c in rows {
            t.row(vec![
                format!("{label} {} (per rank)", c.name),
                ms(c.predicted_ns),
                ms(c.measured_ns),
                ratio(c.measured_ns, c.predicted_ns),
            ]);
        }
    }
    t.render()
}

/// Writes the files and prints the summary (table or JSON).
pub fn emit(
    args: &ReplayArgs,
    report: &ReplayReport,
    choice: &ProfileChoice,
    compute_on: &str,
    violations: usize,
) -> Result<ExitCode> {
    let dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("out/replay").join(&report.scenario));
    let written = write_replay_report(&dir, report)
        .with_context(|| format!("writing the replay report into {}", dir.display()))?;
    if args.json {
        let out = JsonOut {
            scenario: &report.scenario,
            backend: &report.backend,
            hardware: &report.hardware,
            strategy: &report.strategy,
            ranks: report.world_size,
            compute: &report.compute,
            hardware_reason: &choice.reason,
            compute_on,
            scaling: &report.scaling,
            warmup: report.warmup,
            measured_steps_ns: &report.measured_steps_ns,
            step_spread: spread(&report.measured_steps_ns),
            predicted: &report.predicted,
            measured: &report.measured,
            by_category: report.by_category(),
            by_collective_kind: report.by_collective_kind(),
            worst_ops: report.worst(5),
            ops: report.rows.len(),
            dependency_violations: violations,
            out_dir: dir.display().to_string(),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "replay of {} ({}) on {}: {} ranks, compute {}, prediction on {}",
        report.scenario,
        report.strategy,
        report.backend,
        report.world_size,
        report.compute,
        report.hardware
    );
    println!("prediction on {}: {}", report.hardware, choice.reason);
    println!("compute ran as: {compute_on}");
    for note in &report.scaling {
        println!("scaled: {note}");
    }
    let steps: Vec<String> = report.measured_steps_ns.iter().map(|&n| ms(n)).collect();
    let sp = spread(&report.measured_steps_ns);
    println!(
        "measured step times (ms) after {} warm-up step(s): {} (median {:.3} shown; min {:.3}, max {:.3}, spread {:.1}%)",
        report.warmup,
        steps.join(", "),
        sp.median_ms,
        sp.min_ms,
        sp.max_ms,
        sp.spread_pct
    );
    print!("{}", summary_table(report));
    if violations > 0 {
        println!("warning: {violations} measured op(s) started before a dependency ended");
    }
    for p in written {
        println!("wrote {}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}
