//! The gate's Markdown summary (for a pull-request comment) and its terminal table.

use crate::commands::gate::evaluate::Evaluated;
use crate::commands::gate::lock::Lock;
use crate::commands::gate::outcome::{CheckOutcome, Status};
use hpfsdp_reports::table::{Section, Table, TableReport, Verdict};

fn status_word(s: Status) -> &'static str {
    match s {
        Status::Pass => "pass",
        Status::Fail => "FAIL",
        Status::Skipped => "skipped",
    }
}

/// Failed and total counts of `checks`.
pub fn counts(checks: &[CheckOutcome]) -> (usize, usize) {
    (
        checks.iter().filter(|c| c.status == Status::Fail).count(),
        checks.len(),
    )
}

/// The summary as a report: verdict, failures with their diffs, then the figures per scenario
/// and strategy beside the lock's.
pub fn report(
    evals: &[Evaluated],
    checks: &[CheckOutcome],
    lock: &Lock,
    lock_label: &str,
    max_regression_pct: f64,
) -> TableReport {
    let (failed, total) = counts(checks);
    let mut sections = Vec::new();
    let failures: Vec<Vec<String>> = checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| {
            vec![
                c.scenario.clone(),
                c.check.clone(),
                c.message.clone(),
                c.diff.replace('\n', "; "),
            ]
        })
        .collect();
    if !failures.is_empty() {
        sections.push(Section {
            heading: "Failed checks".into(),
            text: String::new(),
            table: Table {
                headers: ["scenario", "check", "message", "lock vs now"]
                    .map(String::from)
                    .into(),
                rows: failures,
            },
        });
    }
    sections.push(Section {
        heading: "Predicted figures".into(),
        text: format!(
            "Throughput vs the lock (more than {max_regression_pct}% fewer tokens/s fails; step time where a scenario has no tokens), tokens per step and peak memory per rank, per strategy."
        ),
        table: Table {
            headers: [
                "scenario",
                "strategy",
                "tokens/s",
                "lock",
                "change",
                "step time",
                "tokens per step",
                "peak memory",
                "HBM",
            ]
            .map(String::from)
            .into(),
            rows: figure_rows(evals, lock),
        },
    });
    sections.push(Section {
        heading: "Checks".into(),
        text: String::new(),
        table: Table {
            headers: ["scenario", "check", "result", "message"]
                .map(String::from)
                .into(),
            rows: checks
                .iter()
                .map(|c| {
                    vec![
                        c.scenario.clone(),
                        c.check.clone(),
                        status_word(c.status).into(),
                        c.message.clone(),
                    ]
                })
                .collect(),
        },
    });
    TableReport {
        title: "hpfsdp gate".into(),
        subtitle: format!(
            "{} scenario(s), {total} check(s) against {lock_label}",
            evals.len()
        ),
        verdict: Some(Verdict {
            passed: failed == 0,
            text: if failed == 0 {
                format!("all {total} checks passed")
            } else {
                format!("{failed} of {total} checks failed")
            },
        }),
        sections,
    }
}

fn figure_rows(evals: &[Evaluated], lock: &Lock) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for e in evals {
        for run in &e.runs {
            let Ok(f) = &run.figures else {
                rows.push(vec![
                    e.name.clone(),
                    run.label.clone(),
                    "not simulated".into(),
                ]);
                continue;
            };
            let locked = lock
                .scenario
                .get(&e.name)
                .and_then(|l| l.strategy.get(&f.strategy));
            let (now, before, unit) = match (f.tokens_per_s, locked.and_then(|l| l.tokens_per_s)) {
                (Some(n), Some(b)) => (n, Some(b), ""),
                (Some(n), None) if locked.is_none() => (n, None, ""),
                _ => (f.step_time_s, locked.map(|l| l.step_time_s), " s"),
            };
            let tokens = |t: Option<u64>| t.map_or("-".into(), |t| t.to_string());
            rows.push(vec![
                e.name.clone(),
                f.strategy.clone(),
                f.tokens_per_s.map_or("-".into(), |t| format!("{t:.0}")),
                before.map_or("-".into(), |b| {
                    format!("{}{unit}", crate::commands::gate::checks::sig(b))
                }),
                before.map_or("new".into(), |b| {
                    format!("{:+.2}%", (now / b - 1.0) * 100.0)
                }),
                format!("{:.4} s", f.step_time_s),
                match locked.and_then(Lock::tokens_per_step) {
                    Some(b) if Some(b) != f.tokens_per_step => {
                        format!("{b} -> {}", tokens(f.tokens_per_step))
                    }
                    _ => tokens(f.tokens_per_step),
                },
                hpfsdp_reports::units::bytes(f.peak_memory_bytes),
                hpfsdp_reports::units::bytes(f.hbm_capacity_bytes),
            ]);
        }
    }
    rows
}

/// The outcome as JSON: the verdict, every scenario with its figures per strategy, every
/// check (status, message, diff, time) and the lock written by `--update`, if any.
pub fn json(
    evals: &[Evaluated],
    checks: &[CheckOutcome],
    wrote_lock: Option<&std::path::PathBuf>,
) -> anyhow::Result<String> {
    let (failed, total) = counts(checks);
    let scenarios: Vec<serde_json::Value> = evals
        .iter()
        .map(|e| {
            let runs: Vec<serde_json::Value> = e
                .runs
                .iter()
                .map(|r| match &r.figures {
                    Ok(f) => {
                        serde_json::json!({"label": r.label, "figures": f, "time_s": r.seconds})
                    }
                    Err(err) => {
                        serde_json::json!({"label": r.label, "error": err, "time_s": r.seconds})
                    }
                })
                .collect();
            serde_json::json!({
                "name": e.name,
                "file": e.file,
                "hardware": e.hardware,
                "plan_digest": e.plan.digest,
                "verify_file": e.verify_file,
                "runs": runs,
            })
        })
        .collect();
    let value = serde_json::json!({
        "passed": failed == 0,
        "checks_failed": failed,
        "checks_total": total,
        "scenarios": scenarios,
        "checks": checks,
        "lock_written": wrote_lock.map(|p| p.display().to_string()),
    });
    Ok(serde_json::to_string_pretty(&value)?)
}

/// The terminal table: one line per check.
pub fn terminal(checks: &[CheckOutcome]) -> String {
    let mut t = crate::table::Table::new(&["scenario", "check", "result", "message"]);
    for c in checks {
        t.row(vec![
            c.scenario.clone(),
            c.check.clone(),
            status_word(c.status).into(),
            c.message.clone(),
        ]);
    }
    t.render()
}
