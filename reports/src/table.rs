//! A generic titled report of tables with an optional pass/fail verdict, for commands other
//! than `simulate` (verify, calibration, gate), rendered as HTML, CSV or Markdown.

use crate::page::{self, escape};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// A report made of sections, each a paragraph and a table, with an optional verdict.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TableReport {
    /// Page title.
    pub title: String,
    /// One-line subtitle (what was checked, against what).
    pub subtitle: String,
    /// Overall pass/fail, shown as a banner under the title.
    pub verdict: Option<Verdict>,
    /// Sections in display order.
    pub sections: Vec<Section>,
}

/// The overall outcome of a check.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Verdict {
    /// True when the check passed.
    pub passed: bool,
    /// One-line explanation.
    pub text: String,
}

/// A heading, an explanatory paragraph and a table.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Section {
    /// Section heading.
    pub heading: String,
    /// Paragraph under the heading (may be empty).
    pub text: String,
    /// The section's table (may have no rows).
    pub table: Table,
}

/// A table of strings; rows may be shorter or longer than the header.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Table {
    /// Column headers.
    pub headers: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
}

impl Verdict {
    /// The verdict over named gating checks (`(name, passed)` pairs): passed with
    /// `pass_text` when every check passed, else failed with a text naming every failing
    /// check (`2 of 5 gating checks failed: a; b`), so a FAIL banner always says what failed.
    pub fn over_checks<'a, I>(pass_text: &str, gating: I) -> Verdict
    where
        I: IntoIterator<Item = (&'a str, bool)>,
    {
        let mut total = 0usize;
        let mut failed: Vec<&str> = Vec::new();
        for (name, passed) in gating {
            total += 1;
            if !passed {
                failed.push(name);
            }
        }
        if failed.is_empty() {
            return Verdict {
                passed: true,
                text: pass_text.to_string(),
            };
        }
        Verdict {
            passed: false,
            text: format!(
                "{} of {total} gating check{} failed: {}",
                failed.len(),
                if total == 1 { "" } else { "s" },
                failed.join("; ")
            ),
        }
    }

    /// The banner's HTML: a `div` classed `pass` or `fail` reading `PASS: text` or
    /// `FAIL: text` (escaped).
    pub fn to_html(&self) -> String {
        let (class, word) = if self.passed {
            ("pass", "PASS")
        } else {
            ("fail", "FAIL")
        };
        format!(
            "<div class=\"verdict {class}\">{word}: {}</div>\n",
            escape(&self.text)
        )
    }
}

impl TableReport {
    /// Renders the report as one self-contained HTML page (same style as the simulation
    /// report); all text is escaped.
    pub fn to_html(&self) -> String {
        let mut body = String::new();
        let _ = writeln!(body, "<h1>{}</h1>", escape(&self.title));
        if !self.subtitle.is_empty() {
            let _ = writeln!(body, "<p class=\"sub\">{}</p>", escape(&self.subtitle));
        }
        if let Some(v) = &self.verdict {
            body.push_str(&v.to_html());
        }
        for s in &self.sections {
            let _ = writeln!(body, "<h2>{}</h2>", escape(&s.heading));
            if !s.text.is_empty() {
                let _ = writeln!(body, "<p>{}</p>", escape(&s.text));
            }
            body.push_str(&page::table(&s.table.headers, &s.table.rows));
        }
        page::page(&self.title, &body)
    }

    /// Renders the report as Markdown: `#` title, subtitle, a bold verdict line, then one
    /// `##` section with its paragraph and table each.
    pub fn to_markdown(&self) -> String {
        let mut out = format!("# {}\n\n", one_line(&self.title));
        if !self.subtitle.is_empty() {
            let _ = write!(out, "{}\n\n", one_line(&self.subtitle));
        }
        if let Some(v) = &self.verdict {
            let word = if v.passed { "PASS" } else { "FAIL" };
            let _ = write!(out, "**{word}**: {}\n\n", one_line(&v.text));
        }
        for s in &self.sections {
            let _ = write!(out, "## {}\n\n", one_line(&s.heading));
            if !s.text.is_empty() {
                let _ = write!(out, "{}\n\n", one_line(&s.text));
            }
            out.push_str(&s.table.to_markdown());
            out.push('\n');
        }
        out
    }
}

impl Table {
    /// The table as CSV: the header row (when there are headers), then the rows as given.
    pub fn to_csv(&self) -> String {
        let header = (!self.headers.is_empty()).then(|| self.headers.clone());
        crate::csv::write_records(header.into_iter().chain(self.rows.iter().cloned()))
    }

    /// The table as a GitHub-flavoured Markdown table. Rows are padded to the widest row,
    /// `|` is escaped and line breaks become spaces; a table without headers gets empty ones.
    pub fn to_markdown(&self) -> String {
        let width = self
            .rows
            .iter()
            .map(Vec::len)
            .chain(std::iter::once(self.headers.len()))
            .max()
            .unwrap_or(0);
        if width == 0 {
            return String::new();
        }
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for k in 0..width {
                let cell = cells.get(k).map_or("", String::as_str);
                let _ = write!(s, " {} |", markdown_cell(cell));
            }
            s.push('\n');
            s
        };
        let mut out = line(&self.headers);
        out.push('|');
        out.push_str(&" --- |".repeat(width));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// Text on one line: line breaks replaced by spaces.
fn one_line(text: &str) -> String {
    text.replace("\r\n", " ").replace(['\n', '\r'], " ")
}

/// A Markdown table cell: one line, pipes escaped.
fn markdown_cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_verdict_names_every_failing_check() {
        let v = Verdict::over_checks(
            "all good",
            [("loss", true), ("trace <a>", false), ("digest", false)],
        );
        assert!(!v.passed);
        assert_eq!(v.text, "2 of 3 gating checks failed: trace <a>; digest");
        assert!(
            v.to_html()
                .contains("FAIL: 2 of 3 gating checks failed: trace &lt;a&gt;")
        );
        let ok = Verdict::over_checks("all good", [("loss", true)]);
        assert!(ok.passed && ok.text == "all good");
        assert!(ok.to_html().contains("verdict pass"));
    }

    #[test]
    fn markdown_pads_and_escapes() {
        let t = Table {
            headers: vec!["a".into(), "b".into()],
            rows: vec![vec!["x|y".into()], vec!["1".into(), "2".into(), "3".into()]],
        };
        assert_eq!(
            t.to_markdown(),
            "| a | b |  |\n| --- | --- | --- |\n| x\\|y |  |  |\n| 1 | 2 | 3 |\n"
        );
        assert_eq!(Table::default().to_markdown(), "");
    }
}
