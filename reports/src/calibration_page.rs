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
    /// The page as one self-contained HTML document (inline SVG chart after the banner).
    pub fn to_html(&self) -> String {
        let r = &self.report;
        let mut body = String::new();
        let _ = writeln!(body, "<h1>{}</h1>", escape(&r.title));
        if !r.subtitle.is_empty() {
            let _ = writeln!(body, "<p class=\"sub\">{}</p>", escape(&r.subtitle));
        }
        if let Some(Verdict { passed, text }) = &r.verdict {
            let (class, word) = if *passed {
                ("pass", "PASS")
            } else {
                ("fail", "FAIL")
            };
            let _ = writeln!(
                body,
                "<div class=\"verdict {class}\">{word}: {}</div>",
                escape(text)
            );
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
        assert!(p.to_html().contains("verdict pass"));
    }
}
