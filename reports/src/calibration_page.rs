//! The calibration report page (`hpfsdp calibrate`): a verdict banner, the predicted-vs-measured
//! chart and the report's tables (fitted constants, every figure's residual, leave-one-out,
//! fits of measured tables). The banner is green only when the caller's verdict passed, and
//! the caller passes only when every gating row is within tolerance.

use crate::calibration_chart::{ErrorBar, predicted_vs_measured_svg};
use crate::page::{self, escape};
use crate::table::{Section, TableReport, Verdict};
use std::fmt::Write as _;

/// Everything the calibration page shows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CalibrationPage {
    /// Title, subtitle, verdict and the tables.
    pub report: TableReport,
    /// One bar per figure row for the predicted-vs-measured chart.
    pub bars: Vec<ErrorBar>,
}

impl CalibrationPage {
    /// The verdict banner. A failed verdict is red. A passed one is green only when every row
    /// of the chart is within its tolerance; when informational (non-gating) rows are out, it
    /// is amber and names them, so "PASS" never sits above a row outside tolerance unsaid.
    fn banner(&self, v: &Verdict) -> String {
        let out: Vec<&str> = self
            .bars
            .iter()
            .filter(|b| !b.passed)
            .map(|b| b.label.as_str())
            .collect();
        if !v.passed || out.is_empty() {
            return v.to_html();
        }
        format!(
            "<div class=\"verdict warn\">PASS on every gating figure: {}; but {} \
             informational row{} outside tolerance: {}</div>\n",
            escape(&v.text),
            out.len(),
            if out.len() == 1 { " is" } else { "s are" },
            escape(&out.join(", "))
        )
    }

    /// The page as one self-contained HTML document (inline SVG chart after the banner).
    pub fn to_html(&self) -> String {
        let r = &self.report;
        let mut body = String::new();
        let _ = writeln!(body, "<h1>{}</h1>", escape(&r.title));
        if !r.subtitle.is_empty() {
            let _ = writeln!(body, "<p class=\"sub\">{}</p>", escape(&r.subtitle));
        }
        if let Some(v) = &r.verdict {
            body.push_str(&self.banner(v));
        }
        let _ = writeln!(body, "<h2>Predicted vs measured</h2>");
        match predicted_vs_measured_svg("Relative error per figure", &self.bars) {
            Ok(svg) => {
                let _ = writeln!(body, "<div class=\"chart\">{svg}</div>");
            }
            Err(e) => {
                let _ = writeln!(body, "<p>{}</p>", escape(&e.to_string()));
            }
        }
        for Section {
            heading,
            text,
            table,
        } in &r.sections
        {
            let _ = writeln!(body, "<h2>{}</h2>", escape(heading));
            if !text.is_empty() {
                let _ = writeln!(body, "<p>{}</p>", escape(text));
            }
            body.push_str(&page::table(&table.headers, &table.rows));
        }
        page::page(&r.title, &body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_banner_follows_the_verdict_and_the_chart_is_inline() {
        let mut p = CalibrationPage {
            report: TableReport {
                title: "c".into(),
                verdict: Some(Verdict {
                    passed: false,
                    text: "one row out".into(),
                }),
                ..TableReport::default()
            },
            bars: vec![ErrorBar {
                label: "x".into(),
                relative_error: 0.5,
                tolerance: Some(0.1),
                passed: false,
            }],
        };
        let html = p.to_html();
        assert!(html.contains("verdict fail") && !html.contains("verdict pass"));
        assert!(html.contains("<svg"));
        p.report.verdict.as_mut().unwrap().passed = true;
        let html = p.to_html();
        assert!(
            html.contains("verdict warn") && !html.contains("verdict pass"),
            "a passing verdict over an out-of-tolerance row must not be plain PASS"
        );
        assert!(html.contains("1 informational row is outside tolerance: x"));
        p.bars[0].passed = true;
        assert!(p.to_html().contains("verdict pass"));
    }
}
