//! JUnit XML of a gate run: one `<testsuite>` per scenario, one `<testcase>` per check, a
//! `<failure>` with the message and the locked-vs-now diff, `<skipped>` with the reason. CI
//! systems (GitHub Actions reporters, GitLab `artifacts:reports:junit`) show these per check.

use crate::commands::gate::checks::{CheckOutcome, Status};
use std::fmt::Write as _;

/// Escapes text for an XML attribute or text node.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            c if (c as u32) < 0x20 && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

/// Same as [`xml`] but keeps line breaks (element text).
fn xml_text(text: &str) -> String {
    xml(text).replace("&#10;", "\n")
}

/// The JUnit document of `checks` (in their order; scenarios in first-seen order).
pub fn junit_xml(checks: &[CheckOutcome]) -> String {
    let mut scenarios: Vec<&str> = Vec::new();
    for c in checks {
        if !scenarios.contains(&c.scenario.as_str()) {
            scenarios.push(&c.scenario);
        }
    }
    let count = |cs: &[&CheckOutcome], s: Status| cs.iter().filter(|c| c.status == s).count();
    let all: Vec<&CheckOutcome> = checks.iter().collect();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"hpfsdp gate\" tests=\"{}\" failures=\"{}\" skipped=\"{}\">",
        all.len(),
        count(&all, Status::Fail),
        count(&all, Status::Skipped)
    );
    for s in scenarios {
        let cs: Vec<&CheckOutcome> = checks.iter().filter(|c| c.scenario == s).collect();
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\">",
            xml(s),
            cs.len(),
            count(&cs, Status::Fail),
            count(&cs, Status::Skipped)
        );
        for c in cs {
            let _ = write!(
                out,
                "    <testcase classname=\"hpfsdp.gate.{}\" name=\"{}\"",
                xml(s),
                xml(&c.check)
            );
            match c.status {
                Status::Pass => out.push_str("/>\n"),
                Status::Skipped => {
                    let _ = write!(
                        out,
                        ">\n      <skipped message=\"{}\"/>\n    </testcase>\n",
                        xml(&c.message)
                    );
                }
                Status::Fail => {
                    let _ = write!(
                        out,
                        ">\n      <failure message=\"{}\" type=\"{}\">{}</failure>\n    </testcase>\n",
                        xml(&c.message),
                        xml(&c.check),
                        xml_text(format!("{}\n{}", c.message, c.diff).trim_end())
                    );
                }
            }
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(scenario: &str, name: &str, status: Status) -> CheckOutcome {
        CheckOutcome {
            scenario: scenario.into(),
            check: name.into(),
            status,
            message: "step time <1.0 s> & \"more\"".into(),
            diff: "- a\n+ b".into(),
        }
    }

    #[test]
    fn one_suite_per_scenario_with_escaped_failures() {
        let xml = junit_xml(&[
            check("a", "lint", Status::Pass),
            check("a", "step-time/fsdp2", Status::Fail),
            check("b", "verify", Status::Skipped),
        ]);
        assert!(xml.contains(
            "<testsuites name=\"hpfsdp gate\" tests=\"3\" failures=\"1\" skipped=\"1\">"
        ));
        assert!(xml.contains("<testsuite name=\"a\" tests=\"2\" failures=\"1\" skipped=\"0\">"));
        assert!(xml.contains("<testsuite name=\"b\" tests=\"1\" failures=\"0\" skipped=\"1\">"));
        assert!(xml.contains("message=\"step time &lt;1.0 s&gt; &amp; &quot;more&quot;\""));
        assert!(xml.contains("- a\n+ b</failure>"));
        assert_eq!(xml.matches("<testcase ").count(), 3);
    }
}
