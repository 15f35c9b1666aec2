//! The sweep report: one row per (point, strategy) of `hpfsdp sweep`, as CSV and as an HTML
//! page with the Pareto front of tokens/s vs peak memory (inline SVG) and the best feasible
//! point highlighted. Pure functions of their input: the same rows give byte-identical files.

use crate::page::{self, escape};
use std::fmt::Write as _;

/// One simulated (or rejected) point of a sweep with one strategy.
#[derive(Debug, Clone, Default, PartialEq)]
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
    /// On the Pareto front of tokens/s (higher) vs peak memory (lower) among feasible rows.
    pub pareto: bool,
    /// The best feasible row (highest tokens/s; ties: lower memory, then earlier).
    pub best: bool,
    /// Why the point is invalid or failed (the lint or the scenario error), else empty.
    pub message: String,
}

/// The whole sweep.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepReport {
    /// Scenario name.
    pub scenario: String,
    /// Hardware profile name.
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
/// `tokens_per_s`, `peak_memory_bytes`, `hbm_capacity_bytes`, `pareto`, `best`, `message`.
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
    body.push_str(&pareto_svg(report));
    body.push_str("<figcaption>Each dot is a point and strategy; grey: over the device memory; the red line joins the Pareto front (no other feasible point is both faster and smaller); the ringed dot is the best feasible point.</figcaption></figure>\n");
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

fn point_label(keys: &[String], r: &SweepRow) -> String {
    keys.iter()
        .zip(&r.values)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The scatter of tokens/s (y) vs peak memory (x) with the Pareto front, as inline SVG.
fn pareto_svg(report: &SweepReport) -> String {
    let (w, h, left, bottom, top, right) = (720.0, 420.0, 80.0, 50.0, 20.0, 44.0);
    let pts: Vec<(&SweepRow, f64, f64)> = report
        .rows
        .iter()
        .filter_map(|r| Some((r, r.peak_memory_bytes? as f64, r.tokens_per_s?)))
        .collect();
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    );
    if pts.is_empty() {
        svg.push_str("<text x=\"20\" y=\"40\">no simulated point</text>\n</svg>");
        return svg;
    }
    let max_x = pts.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.05;
    let max_y = pts.iter().map(|p| p.2).fold(0.0, f64::max).max(1e-9) * 1.05;
    let sx = |x: f64| left + x / max_x * (w - left - right);
    let sy = |y: f64| h - bottom - y / max_y * (h - bottom - top);
    let _ = writeln!(
        svg,
        "<line x1=\"{left}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#444\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{0}\" stroke=\"#444\"/>",
        h - bottom,
        w - right
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}</text>",
            sx(f * max_x),
            h - bottom + 16.0,
            // Binary units chosen per tick, so small and large sweeps both read.
            crate::units::bytes((f * max_x) as u64),
            left - 6.0,
            sy(f * max_y) + 4.0,
            f * max_y
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">peak memory per rank</text><text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1})\">tokens/s</text>",
        (left + w - right) / 2.0,
        h - 12.0,
        (top + h - bottom) / 2.0,
        (top + h - bottom) / 2.0
    );
    let mut front: Vec<(f64, f64)> = pts
        .iter()
        .filter(|p| p.0.pareto)
        .map(|p| (p.1, p.2))
        .collect();
    front.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    if front.len() > 1 {
        let path: Vec<String> = front
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"#e15759\" stroke-width=\"2\"/>",
            path.join(" ")
        );
    }
    for (r, x, y) in &pts {
        let fill = if r.status != "ok" {
            "#bbbbbb"
        } else if r.pareto {
            "#e15759"
        } else {
            "#4e79a7"
        };
        let _ = writeln!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{fill}\"><title>{}</title></circle>",
            sx(*x),
            sy(*y),
            escape(&format!(
                "point {} {} {}: {y:.0} tokens/s, {}",
                r.point,
                point_label(&report.keys, r),
                r.strategy,
                crate::units::bytes(*x as u64)
            ))
        );
        if r.best {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"9\" fill=\"none\" stroke=\"#222\" stroke-width=\"2\"/>",
                sx(*x),
                sy(*y)
            );
        }
    }
    svg.push_str("</svg>");
    svg
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
