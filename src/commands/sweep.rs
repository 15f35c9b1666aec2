//! `hpfsdp sweep`: simulate a scenario over the cartesian product of `--vary KEY=V1,V2,...`
//! (any dotted scenario key), in parallel, and write `sweep.csv` and `sweep.html` with the
//! Pareto front of tokens/s vs peak memory and the best feasible point.
//!
//! Each point is simulated on its own hardware profile (`--vary hardware=a,b` loads each one).
//! A point whose scenario or profile does not load or whose plan has lint errors is reported
//! as invalid with the error instead of aborting the sweep. Points are evaluated on a rayon pool of `--jobs`
//! threads and collected in point order, so the files are identical for any `--jobs`.

use crate::commands::scenario_figures::{RunFigures, plan_check, simulate_job};
use crate::commands::sweep_mpi::MpiSpread;
use anyhow::{Context, Result, bail};
use hpfsdp_plan::input_file::read_text;
use hpfsdp_plan::limits;
use hpfsdp_plan::overrides::{self, Override};
use hpfsdp_plan::scenario::{FSDP_STRATEGIES, Scenario};
use hpfsdp_reports::sweep::{SweepReport, SweepRow, sweep_csv};
use hpfsdp_reports::sweep_page::sweep_html;
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::scenario_run::{ScenarioPlans, SimJob, hardware_dir_for};
use indicatif::ProgressBar;
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Command-line arguments of `sweep`.
#[derive(clap::Args)]
pub struct SweepArgs {
    /// Scenario file (TOML).
    pub scenario: PathBuf,
    /// A key and its values, e.g. `mesh.dp_shard=8,16,32` (repeatable; the product of all is
    /// swept, the first key varying slowest).
    #[arg(long = "vary", value_name = "KEY=V1,V2,...", required = true)]
    pub vary: Vec<String>,
    /// Strategy to simulate at each point (repeatable; default: the scenario's strategy, its
    /// baselines and its optimizer baselines).
    #[arg(long = "strategy", value_name = "S")]
    pub strategies: Vec<String>,
    /// Where to write sweep.csv and sweep.html (default under the ignored `out/` folder).
    #[arg(long, value_name = "DIR", default_value = "out/sweep")]
    pub out: PathBuf,
    /// Print the rows as JSON instead of the table (the files are written all the same).
    #[arg(long)]
    pub json: bool,
    /// Points simulated at once (default: one per core; per process under `--under-mpi`).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Spread the points over the ranks of an `mpirun` job (point i on rank i mod N; rank 0
    /// writes the outputs, identical to a one-process sweep). Build with `--features mpi`.
    #[arg(long)]
    pub under_mpi: bool,
}

/// One point of the product: an override per varied key.
type Point = Vec<Override>;

/// Runs the sweep.
pub fn run(args: &SweepArgs) -> Result<ExitCode> {
    let text = read_text(&args.scenario, &limits::SCENARIO_FILE)?;
    let base = Scenario::from_str_at(&text, &args.scenario)?;
    let mut axes = Vec::new();
    for v in &args.vary {
        let (key, values) = overrides::parse_vary(v).with_context(|| format!("--vary {v}"))?;
        if axes.iter().any(|(k, _): &(String, _)| *k == key) {
            bail!("--vary {key} is given twice; list all its values in one --vary");
        }
        check_key(&text, &args.scenario, &key, &values[0])
            .with_context(|| format!("--vary {v}"))?;
        axes.push((key, values));
    }
    check_point_count(&axes)?;
    for s in &args.strategies {
        if !FSDP_STRATEGIES.contains(&s.as_str()) {
            bail!(
                "--strategy {s}: unknown strategy; choose one of {}",
                FSDP_STRATEGIES.join(", ")
            );
        }
    }
    if let Some(jobs) = args.jobs {
        limits::SWEEP_JOBS
            .check_flag("--jobs", jobs as u64)
            .map_err(|e| anyhow::anyhow!("{e}; leave it out for one per core"))?;
    }
    let profile =
        HardwareProfile::load_named(&base.file.hardware, hardware_dir_for(&args.scenario))
            .with_context(|| format!("loading hardware profile '{}'", base.file.hardware))?;
    let points = product(&axes);
    let jobs: Vec<SimJob> = if args.strategies.is_empty() {
        ScenarioPlans::new(base.clone()).listed_runs()
    } else {
        args.strategies
            .iter()
            .map(|s| SimJob {
                strategy: s.clone(),
                optimizer: None,
            })
            .collect()
    };
    let spread = if args.under_mpi {
        Some(MpiSpread::join()?)
    } else {
        None
    };
    let lead = spread.as_ref().is_none_or(|s| s.rank() == 0);
    let mine: Vec<usize> = (0..points.len())
        .filter(|&i| spread.as_ref().is_none_or(|s| s.owns(i)))
        .collect();
    let bar = if lead {
        crate::commands::progress::bar(mine.len() * jobs.len(), "simulations")
    } else {
        ProgressBar::hidden()
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.jobs.unwrap_or(0))
        .build()
        .context("starting the worker threads")?;
    let rows: Vec<SweepRow> = pool.install(|| {
        mine.par_iter()
            .flat_map_iter(|&i| {
                evaluate_point(&text, &args.scenario, i, &points[i], &jobs, &profile, &bar)
            })
            .collect()
    });
    bar.finish_and_clear();
    let rows = match &spread {
        Some(s) => s.gather(&rows)?,
        None => rows,
    };
    if !lead {
        return Ok(ExitCode::SUCCESS);
    }
    let report = SweepReport {
        scenario: base.file.name.clone(),
        hardware: hardware_label(&profile.name, &rows),
        keys: axes.iter().map(|(k, _)| k.clone()).collect(),
        rows: mark_front(rows),
    };
    let files = write_outputs(&args.out, &report)?;
    if args.json {
        let value = serde_json::json!({ "report": report, "files": files });
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        for f in &files {
            println!("wrote {f}");
        }
        print_summary(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// Rejects a key the scenario format does not have (a typo would otherwise make every point
/// invalid) or whose path crosses a value: `key` set to `first` alone must not fail with an
/// unknown field.
fn check_key(text: &str, path: &Path, key: &str, first: &toml::Value) -> Result<()> {
    let o = [Override {
        key: key.to_string(),
        value: first.clone(),
    }];
    let changed = overrides::apply_to_text(text, &path.display().to_string(), &o)?;
    match Scenario::from_str_at(&changed, path) {
        Err(e) if e.to_string().contains("unknown field") => bail!(
            "'{key}' is not a scenario key: {}",
            strip_location(&e.to_string())
        ),
        _ => Ok(()),
    }
}

/// The cartesian product of the axes, the first axis varying slowest.
/// Refuses a sweep of more points than [`limits::SWEEP_POINTS`] before any is built.
fn check_point_count(axes: &[(String, Vec<toml::Value>)]) -> Result<()> {
    let points = axes
        .iter()
        .try_fold(1u64, |acc, (_, v)| acc.checked_mul(v.len() as u64));
    let counts: Vec<String> = axes
        .iter()
        .map(|(k, v)| format!("{k} {}", v.len()))
        .collect();
    limits::SWEEP_POINTS
        .check_flag("--vary points", points.unwrap_or(u64::MAX))
        .map(|_| ())
        .map_err(|e| {
            anyhow::anyhow!(
                "{e}: {} values; sweep fewer values per key or split the sweep",
                counts.join(" x ")
            )
        })
}

fn product(axes: &[(String, Vec<toml::Value>)]) -> Vec<Point> {
    let mut points: Vec<Point> = vec![Vec::new()];
    for (key, values) in axes {
        points = points
            .into_iter()
            .flat_map(|p| {
                values.iter().map(move |v| {
                    let mut q = p.clone();
                    q.push(Override {
                        key: key.clone(),
                        value: v.clone(),
                    });
                    q
                })
            })
            .collect();
    }
    points
}

/// The profile names the rows were simulated on: the base's, or every distinct one when
/// `hardware` is varied.
fn hardware_label(base: &str, rows: &[SweepRow]) -> String {
    let mut names: Vec<&str> = rows.iter().filter_map(|r| r.hardware.as_deref()).collect();
    names.sort_unstable();
    names.dedup();
    match names.as_slice() {
        [] => base.to_string(),
        names => names.join(", "),
    }
}

/// The rows of one point: one per job, or one `invalid` row when the point's scenario does
/// not load or its plan has lint errors.
fn evaluate_point(
    text: &str,
    path: &Path,
    index: usize,
    point: &Point,
    jobs: &[SimJob],
    profile: &HardwareProfile,
    bar: &ProgressBar,
) -> Vec<SweepRow> {
    let values: Vec<String> = point
        .iter()
        .map(|o| overrides::value_label(&o.value))
        .collect();
    let invalid = |message: String| {
        bar.inc(jobs.len() as u64);
        vec![SweepRow {
            point: index,
            values: values.clone(),
            status: "invalid".into(),
            message: one_line(&message),
            ..SweepRow::default()
        }]
    };
    let scenario = match overrides::apply_to_text(text, &path.display().to_string(), point) {
        Ok(t) => Scenario::from_str_at(&t, path),
        Err(e) => return invalid(e.to_string()),
    };
    let scenario = match scenario {
        Ok(s) => s,
        Err(e) => return invalid(strip_location(&e.to_string())),
    };
    // The point's own profile when it names another (`--vary hardware=...`).
    let own;
    let profile = if scenario.file.hardware == profile.name {
        profile
    } else {
        match HardwareProfile::load_named(&scenario.file.hardware, hardware_dir_for(path)) {
            Ok(p) => {
                own = p;
                &own
            }
            Err(e) => {
                return invalid(format!(
                    "hardware profile '{}': {e}",
                    scenario.file.hardware
                ));
            }
        }
    };
    let plans = ScenarioPlans::new(scenario);
    let lint = plan_check(&plans);
    if !lint.errors.is_empty() {
        return invalid(lint.errors.join("; "));
    }
    jobs.iter()
        .map(|job| {
            let row = match simulate_job(&plans, job, profile) {
                Ok(f) => SweepRow {
                    hardware: Some(profile.name.clone()),
                    ..figures_row(index, &values, &f)
                },
                Err(e) => SweepRow {
                    point: index,
                    values: values.clone(),
                    strategy: job.strategy.clone(),
                    status: "error".into(),
                    message: format!("{e:#}"),
                    ..SweepRow::default()
                },
            };
            bar.inc(1);
            row
        })
        .collect()
}

/// `text` on one line (lint messages put their fix on a second, indented line).
fn one_line(text: &str) -> String {
    text.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

/// A scenario error points at a line of the rewritten document, which the user never saw:
/// keep the message (it names the key) and drop the `file:line:` prefix.
fn strip_location(message: &str) -> String {
    match message.split_once(": ") {
        Some((loc, rest))
            if loc
                .rsplit(':')
                .next()
                .is_some_and(|l| l.parse::<usize>().is_ok()) =>
        {
            rest.to_string()
        }
        _ => message.to_string(),
    }
}

fn figures_row(index: usize, values: &[String], f: &RunFigures) -> SweepRow {
    SweepRow {
        point: index,
        values: values.to_vec(),
        strategy: f.strategy.clone(),
        status: if f.memory_fits { "ok" } else { "over-memory" }.into(),
        step_time_s: Some(f.step_time_s),
        tokens_per_s: f.tokens_per_s,
        peak_memory_bytes: Some(f.peak_memory_bytes),
        hbm_capacity_bytes: Some(f.hbm_capacity_bytes),
        ..SweepRow::default()
    }
}

/// Marks the Pareto front of tokens/s (higher is better) vs peak memory (lower is better)
/// among feasible rows, and the best feasible row (most tokens/s; ties: less memory, then
/// the earlier row).
fn mark_front(mut rows: Vec<SweepRow>) -> Vec<SweepRow> {
    let feasible: Vec<(usize, f64, u64)> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.status == "ok")
        .filter_map(|(i, r)| Some((i, r.tokens_per_s?, r.peak_memory_bytes?)))
        .collect();
    for &(i, t, m) in &feasible {
        let dominated = feasible
            .iter()
            .any(|&(j, u, n)| j != i && u >= t && n <= m && (u > t || n < m));
        rows[i].pareto = !dominated;
    }
    let best = feasible
        .iter()
        .min_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)).then(a.0.cmp(&b.0)));
    if let Some(&(i, _, _)) = best {
        rows[i].best = true;
    }
    rows
}

fn write_outputs(dir: &Path, report: &SweepReport) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut files = Vec::new();
    for (name, body) in [
        ("sweep.csv", sweep_csv(report)),
        ("sweep.html", sweep_html(report)),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        files.push(path.display().to_string());
    }
    Ok(files)
}

fn print_summary(report: &SweepReport) {
    let mut header: Vec<&str> = vec!["point"];
    header.extend(report.keys.iter().map(String::as_str));
    header.extend([
        "strategy",
        "status",
        "step time",
        "tokens/s",
        "peak memory",
        "note",
    ]);
    let mut t = crate::table::Table::new(&header);
    for r in &report.rows {
        let mut cells = vec![r.point.to_string()];
        cells.extend(r.values.iter().cloned());
        let note = match (r.best, r.pareto) {
            (true, _) => "best".to_string(),
            (false, true) => "pareto".to_string(),
            _ => r.message.clone(),
        };
        cells.extend([
            r.strategy.clone(),
            r.status.clone(),
            r.step_time_s.map_or("-".into(), |s| format!("{s:.4} s")),
            r.tokens_per_s.map_or("-".into(), |x| format!("{x:.0}")),
            r.peak_memory_bytes
                .map_or("-".into(), hpfsdp_reports::units::bytes),
            note,
        ]);
        t.row(cells);
    }
    print!("{}", t.render());
    let invalid = report.rows.iter().filter(|r| r.status == "invalid").count();
    match report.rows.iter().find(|r| r.best) {
        Some(b) => println!(
            "best feasible point: {} with {} ({:.0} tokens/s); {invalid} invalid point(s)",
            report
                .keys
                .iter()
                .zip(&b.values)
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            b.strategy,
            b.tokens_per_s.unwrap_or(0.0)
        ),
        None => println!("no feasible point; {invalid} invalid point(s)"),
    }
}
