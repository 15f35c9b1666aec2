//! The gate's Markdown summary (for a pull-request comment) and its terminal table.

use crate::commands::gate::checks::{CheckOutcome, Status};
use crate::commands::gate::evaluate::Evaluated;
use crate::commands::gate::lock::Lock;
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
            "Step time vs the lock (a step more than {max_regression_pct}% slower fails), tokens/s and peak memory per rank, per strategy."
        ),
        table: Table {
            headers: [
                "scenario",
                "strategy",
                "step time",
                "lock",
                "change",
                "tokens/s",
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
        for (label, run) in &e.runs {
            let Ok(f) = run else {
                rows.push(vec![e.name.clone(), label.clone(), "not simulated".into()]);
                continue;
            };
            let locked = lock
                .scenario
                .get(&e.name)
                .and_then(|l| l.strategy.get(&f.strategy))
                .map(|l| l.step_time_s);
            rows.push(vec![
                e.name.clone(),
                f.strategy.clone(),
                format!("{:.4} s", f.step_time_s),
                locked.map_or("-".into(), |l| format!("{l:.4} s")),
                locked.map_or("new".into(), |l| {
                    format!("{:+.2}%", (f.step_time_s / l - 1.0) * 100.0)
                }),
                f.tokens_per_s.map_or("-".into(), |t| format!("{t:.0}")),
                hpfsdp_reports::units::bytes(f.peak_memory_bytes),
                hpfsdp_reports::units::bytes(f.hbm_capacity_bytes),
            ]);
        }
    }
    rows
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
