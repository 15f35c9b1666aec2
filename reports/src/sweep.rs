//! The sweep report: one row per (point, strategy) of `hpfsdp sweep`, as CSV and as an HTML
//! page with the Pareto front of tokens/s vs peak memory (a plotters chart,
//! [`crate::sweep_chart`]) and the best feasible point highlighted. Pure functions of their
//! input: the same rows give byte-identical files.

use crate::page::{self, escape};
use serde::Serialize;
use std::fmt::Write as _;

/// One simulated (or rejected) point of a sweep with one strategy.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SweepRow {
    /// Index of the point in the cartesian product (first `--vary` key varies slowest).
    pub point: usize,
    /// The value of each varied key at this point, in key order.
    pub values: Vec<String>,
    /// Strategy name (empty for a point rejected before any strategy ran).
    pub strategy: String,
    /// `ok`, `over-memory`, `invalid` (scenario or lint error) or `error` (simulation failed).
    pub status: String,
    /// Predicted step time, seconds.
    pub step_time_s: Option<f64>,
    /// Tokens per second of the whole job.
    pub tokens_per_s: Option<f64>,
    /// Highest peak memory over ranks, bytes.
    pub peak_memory_bytes: Option<u64>,
    /// Device HBM capacity, bytes.
    pub hbm_capacity_bytes: Option<u64>,
    /// The hardware profile the point was simulated on (absent when it was not simulated).
    pub hardware: Option<String>,
    /// On the Pareto front of tokens/s (higher) vs peak memory (lower) among feasible rows.
    pub pareto: bool,
    /// The best feasible row (highest tokens/s; ties: lower memory, then earlier).
    pub best: bool,
    /// Why the point is invalid or failed (the lint or the scenario error), else empty.
    pub message: String,
}

/// The whole sweep.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SweepReport {
    /// Scenario name.
    pub scenario: String,
    /// Hardware profile name (every profile simulated on, comma-separated, when varied).
    pub hardware: String,
    /// The varied keys, in `--vary` order.
    pub keys: Vec<String>,
    /// Rows by point, then strategy.
    pub rows: Vec<SweepRow>,
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

/// `sweep.csv`: `point`, one column per key, `strategy`, `status`, `step_time_s`,
/// `tokens_per_s`, `peak_memory_bytes`, `hbm_capacity_bytes`, `hardware_profile` (the profile
/// the row was simulated on), `pareto`, `best`, `message`.
pub fn sweep_csv(report: &SweepReport) -> String {
    let mut header = vec!["point".to_string()];
    header.extend(report.keys.iter().cloned());
    header.extend(
        [
            "strategy",
            "status",
            "step_time_s",
            "tokens_per_s",
            "peak_memory_bytes",
            "hbm_capacity_bytes",
            "hardware_profile",
            "pareto",
            "best",
            "message",
        ]
        .map(String::from),
    );
    let rows = report.rows.iter().map(|r| {
        let mut cells = vec![r.point.to_string()];
        cells.extend(r.values.iter().cloned());
        cells.extend([
            r.strategy.clone(),
            r.status.clone(),
            opt(r.step_time_s),
            opt(r.tokens_per_s),
            opt(r.peak_memory_bytes),
            opt(r.hbm_capacity_bytes),
            r.hardware.clone().unwrap_or_default(),
            r.pareto.to_string(),
            r.best.to_string(),
            r.message.clone(),
        ]);
        cells
    });
    crate::csv::write_records(std::iter::once(header).chain(rows))
}

/// `sweep.html`: the best feasible point, the Pareto chart, then every row (the best one
/// marked) with its step time, memory and lint.
pub fn sweep_html(report: &SweepReport) -> String {
    let mut body = String::new();
    let title = format!("sweep of {}", report.scenario);
    let _ = writeln!(body, "<h1>{}</h1>", escape(&title));
    let points = report
        .rows
        .iter()
        .map(|r| r.point)
        .max()
        .map_or(0, |p| p + 1);
    let _ = writeln!(
        body,
        "<p class=\"sub\">{} point(s) over {} on {}; {} row(s), {} invalid</p>",
        points,
        escape(&report.keys.join(", ")),
        escape(&report.hardware),
        report.rows.len(),
        report.rows.iter().filter(|r| r.status == "invalid").count()
    );
    match report.rows.iter().find(|r| r.best) {
        Some(b) => {
            let _ = writeln!(
                body,
                "<div class=\"verdict pass\">best feasible point: {} with {}: {:.0} tokens/s, step {:.4} s, peak {}</div>",
                escape(&point_label(&report.keys, b)),
                escape(&b.strategy),
                b.tokens_per_s.unwrap_or(0.0),
                b.step_time_s.unwrap_or(0.0),
                crate::units::bytes(b.peak_memory_bytes.unwrap_or(0))
            );
        }
        None => body.push_str("<div class=\"verdict fail\">no feasible point: every point is invalid, failed or over the device memory</div>\n"),
    }
    body.push_str("<h2>Tokens/s vs peak memory</h2>\n<figure>");
    match crate::sweep_chart::pareto_svg(report) {
        Ok(svg) => body.push_str(&svg),
        Err(e) => {
            let _ = write!(body, "<p>{}</p>", escape(&e.to_string()));
        }
    }
    body.push_str("<figcaption>Each dot is a point and strategy, labelled with its point number (with its values on the Pareto front); blue: feasible; grey: over the device memory; the red line joins the Pareto front (no other feasible point is both faster and smaller); the ringed dot is the best feasible point; the dashed red line is the device capacity.</figcaption></figure>\n");
    body.push_str("<h2>Points</h2>\n");
    let mut headers = vec!["point".to_string()];
    headers.extend(report.keys.iter().cloned());
    headers.extend(
        [
            "strategy",
            "status",
            "step time",
            "tokens/s",
            "peak memory",
            "pareto",
            "message",
        ]
        .map(String::from),
    );
    let rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|r| {
            let mut cells = vec![if r.best {
                format!("{} (best)", r.point)
            } else {
                r.point.to_string()
            }];
            cells.extend(r.values.iter().cloned());
            cells.extend([
                r.strategy.clone(),
                r.status.clone(),
                r.step_time_s
                    .map_or("-".into(), |s| format!("{:.2} ms", s * 1e3)),
                r.tokens_per_s.map_or("-".into(), |t| format!("{t:.0}")),
                r.peak_memory_bytes.map_or("-".into(), crate::units::bytes),
                if r.pareto { "yes" } else { "" }.into(),
                r.message.clone(),
            ]);
            cells
        })
        .collect();
    body.push_str(&page::table(&headers, &rows));
    page::page(&title, &body)
}

/// `key=value` of every varied key of `r`, space-separated.
pub(crate) fn point_label(keys: &[String], r: &SweepRow) -> String {
    keys.iter()
        .zip(&r.values)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_and_html_carry_every_row_and_mark_the_best() {
        let row = |point, tps: Option<f64>, best, status: &str| SweepRow {
            point,
            values: vec![point.to_string()],
            strategy: "fsdp2".into(),
            status: status.into(),
            step_time_s: tps.map(|_| 1.0),
            tokens_per_s: tps,
            peak_memory_bytes: tps.map(|_| 10_000_000_000),
            hbm_capacity_bytes: Some(64_000_000_000),
            hardware: tps.map(|_| "hw".to_string()),
            pareto: best,
            best,
            message: if status == "invalid" {
                "error[indivisible-shard]: x".into()
            } else {
                String::new()
            },
        };
        let report = SweepReport {
            scenario: "demo".into(),
            hardware: "hw".into(),
            keys: vec!["mesh.dp_shard".into()],
            rows: vec![
                row(0, Some(100.0), true, "ok"),
                row(1, None, false, "invalid"),
            ],
        };
        let csv = sweep_csv(&report);
        assert!(csv.starts_with("point,mesh.dp_shard,strategy,status,"));
        assert_eq!(csv.lines().count(), 3);
        assert!(csv.contains("error[indivisible-shard]: x"));
        let html = sweep_html(&report);
        assert!(html.contains("best feasible point: mesh.dp_shard=0 with fsdp2"));
        assert!(html.contains("0 (best)"));
        assert_eq!(html, sweep_html(&report));
    }
}
