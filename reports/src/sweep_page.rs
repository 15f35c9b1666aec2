//! `sweep.html`: the page of a [`SweepReport`] with the Pareto front of tokens/s vs peak
//! memory (a plotters chart, [`crate::sweep_chart`]) and the best feasible point highlighted.

use crate::page::{self, escape};
use crate::sweep::{SweepReport, SweepRow};
use std::fmt::Write as _;

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
fn point_label(keys: &[String], r: &SweepRow) -> String {
    keys.iter()
        .zip(&r.values)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::tests::two_point_report;

    #[test]
    fn html_carries_every_row_and_marks_the_best() {
        let report = two_point_report();
        let html = sweep_html(&report);
        assert!(html.contains("best feasible point: mesh.dp_shard=0 with fsdp2"));
        assert!(html.contains("0 (best)"));
        assert_eq!(html, sweep_html(&report));
    }
}
