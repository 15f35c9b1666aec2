//! JUnit XML of a gate run, through quick-junit: one `<testsuite>` per scenario, one
//! `<testcase>` per check with its time, a `<failure>` with the message and the locked-vs-now
//! diff, `<skipped>` with the reason.
//!
//! The output is valid against Jenkins' JUnit schema (the xunit plugin's `junit-10.xsd`,
//! `tests/fixtures/jenkins/junit-10.xsd`): every `<testsuite>` has `name`, `tests`,
//! `failures` and `errors`, times have at most three decimals, and the one attribute
//! quick-junit always writes that the schema does not allow (`skipped` on `<testsuites>`; it
//! stays on each `<testsuite>`, where it is allowed) is dropped from the serialized XML.

use crate::commands::gate::outcome::{CheckOutcome, Status};
use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
use quick_xml::events::{BytesStart, Event};
use std::time::Duration;

/// Attributes of `<testsuites>` that Jenkins' schema allows.
const TESTSUITES_ATTRIBUTES: [&[u8]; 5] = [b"name", b"time", b"tests", b"failures", b"errors"];

fn duration(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds).unwrap_or_default()
}

fn test_case(s: &str, c: &CheckOutcome) -> TestCase {
    let status = match c.status {
        Status::Pass => TestCaseStatus::success(),
        Status::Skipped => {
            let mut st = TestCaseStatus::skipped();
            st.set_message(c.message.as_str());
            st
        }
        Status::Fail => {
            let mut st = TestCaseStatus::non_success(NonSuccessKind::Failure);
            st.set_message(c.message.as_str())
                .set_type(c.check.as_str())
                .set_description(format!("{}\n{}", c.message, c.diff).trim_end());
            st
        }
    };
    let mut case = TestCase::new(c.check.as_str(), status);
    case.set_classname(format!("hpfsdp.gate.{s}"))
        .set_time(duration(c.time_s));
    case
}

/// The JUnit report of `checks` (in their order; scenarios in first-seen order).
pub fn report(checks: &[CheckOutcome]) -> Report {
    let mut scenarios: Vec<&str> = Vec::new();
    for c in checks {
        if !scenarios.contains(&c.scenario.as_str()) {
            scenarios.push(&c.scenario);
        }
    }
    let mut report = Report::new("hpfsdp gate");
    let mut total = 0.0;
    for s in scenarios {
        let mut suite = TestSuite::new(s);
        let cases: Vec<&CheckOutcome> = checks.iter().filter(|c| c.scenario == s).collect();
        let time: f64 = cases.iter().map(|c| c.time_s).sum();
        total += time;
        suite.add_test_cases(cases.iter().map(|c| test_case(s, c)));
        suite.set_time(duration(time));
        report.add_test_suite(suite);
    }
    report.set_time(duration(total));
    report
}

/// The JUnit document of `checks`, valid against Jenkins' JUnit schema.
pub fn junit_xml(checks: &[CheckOutcome]) -> anyhow::Result<String> {
    let xml = report(checks)
        .to_string()
        .map_err(|e| anyhow::anyhow!("serializing the JUnit report: {e}"))?;
    jenkins_compatible(&xml)
}

/// `xml` with the `<testsuites>` attributes Jenkins' schema does not allow removed.
fn jenkins_compatible(xml: &str) -> anyhow::Result<String> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut writer = quick_xml::Writer::new(Vec::new());
    loop {
        let event = reader
            .read_event()
            .map_err(|e| anyhow::anyhow!("re-reading the JUnit report: {e}"))?;
        let event = match event {
            Event::Eof => break,
            Event::Start(tag) if tag.name().as_ref() == b"testsuites" => {
                let mut kept = BytesStart::new("testsuites");
                for a in tag.attributes().flatten() {
                    if TESTSUITES_ATTRIBUTES.contains(&a.key.as_ref()) {
                        kept.push_attribute(a);
                    }
                }
                Event::Start(kept)
            }
            other => other,
        };
        writer
            .write_event(event)
            .map_err(|e| anyhow::anyhow!("writing the JUnit report: {e}"))?;
    }
    String::from_utf8(writer.into_inner()).map_err(|e| anyhow::anyhow!("JUnit report: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn check(scenario: &str, name: &str, status: Status, time_s: f64) -> CheckOutcome {
        CheckOutcome {
            scenario: scenario.into(),
            check: name.into(),
            status,
            message: "step time <1.0 s> & \"more\"".into(),
            diff: "- a\n+ b".into(),
            time_s,
        }
    }

    /// What Jenkins' JUnit schema says of one element: allowed and required attributes,
    /// allowed children.
    #[derive(Debug, Default)]
    struct ElementRule {
        attributes: Vec<String>,
        required: Vec<String>,
        children: Vec<String>,
        time_typed: bool,
    }

    /// The element rules of the schema file, read from the XSD itself.
    fn schema_rules() -> BTreeMap<String, ElementRule> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/jenkins/junit-10.xsd"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap();
        let mut rules = BTreeMap::new();
        for el in doc
            .root_element()
            .children()
            .filter(|n| n.tag_name().name() == "element" && n.attribute("name").is_some())
        {
            let mut rule = ElementRule::default();
            for d in el.descendants() {
                match d.tag_name().name() {
                    "attribute" => {
                        let name = d.attribute("name").unwrap().to_string();
                        if d.attribute("use") == Some("required") {
                            rule.required.push(name.clone());
                        }
                        if name == "time" && d.attribute("type") == Some("SUREFIRE_TIME") {
                            rule.time_typed = true;
                        }
                        rule.attributes.push(name);
                    }
                    "element" if d.attribute("ref").is_some() => {
                        rule.children.push(d.attribute("ref").unwrap().to_string())
                    }
                    _ => {}
                }
            }
            rules.insert(el.attribute("name").unwrap().to_string(), rule);
        }
        rules
    }

    /// `SUREFIRE_TIME`: `(([0-9]{0,3},)*[0-9]{3}|[0-9]{0,3})*(\.[0-9]{0,3})?`, which for text
    /// without commas is digits and at most three decimals.
    fn surefire_time(t: &str) -> bool {
        let (int, frac) = t.split_once('.').unwrap_or((t, ""));
        int.chars().all(|c| c.is_ascii_digit())
            && frac.len() <= 3
            && frac.chars().all(|c| c.is_ascii_digit())
    }

    /// Checks `xml` against the schema's rules; returns every violation.
    fn violations(xml: &str) -> Vec<String> {
        let rules = schema_rules();
        let doc = roxmltree::Document::parse(xml).unwrap();
        let mut out = Vec::new();
        if doc.root_element().tag_name().name() != "testsuites" {
            out.push("root is not <testsuites>".into());
        }
        for n in doc.descendants().filter(|n| n.is_element()) {
            let name = n.tag_name().name();
            let Some(rule) = rules.get(name) else {
                out.push(format!("<{name}> is not in the schema"));
                continue;
            };
            for a in n.attributes() {
                if !rule.attributes.iter().any(|x| x == a.name()) {
                    out.push(format!("<{name}> may not have '{}'", a.name()));
                }
                if a.name() == "time" && rule.time_typed && !surefire_time(a.value()) {
                    out.push(format!(
                        "<{name} time=\"{}\"> is not SUREFIRE_TIME",
                        a.value()
                    ));
                }
            }
            for r in &rule.required {
                if n.attribute(r.as_str()).is_none() {
                    out.push(format!("<{name}> lacks required '{r}'"));
                }
            }
            for child in n.children().filter(|c| c.is_element()) {
                if !rule.children.iter().any(|c| c == child.tag_name().name()) {
                    out.push(format!(
                        "<{name}> may not contain <{}>",
                        child.tag_name().name()
                    ));
                }
            }
        }
        out
    }

    #[test]
    fn valid_against_jenkins_junit_schema_with_times() {
        let xml = junit_xml(&[
            check("a", "lint", Status::Pass, 0.25),
            check("a", "throughput/fsdp2", Status::Fail, 1.5),
            check("b", "verify", Status::Skipped, 0.0),
        ])
        .unwrap();
        assert_eq!(violations(&xml), Vec::<String>::new(), "{xml}");
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let root = doc.root_element();
        assert_eq!(root.attribute("tests"), Some("3"));
        assert_eq!(root.attribute("failures"), Some("1"));
        assert_eq!(root.attribute("time"), Some("1.750"));
        let suites: Vec<_> = root
            .children()
            .filter(|n| n.has_tag_name("testsuite"))
            .collect();
        assert_eq!(suites.len(), 2);
        assert_eq!(suites[0].attribute("errors"), Some("0"));
        assert_eq!(suites[0].attribute("time"), Some("1.750"));
        assert_eq!(suites[1].attribute("skipped"), Some("1"));
        let failure = doc
            .descendants()
            .find(|n| n.has_tag_name("failure"))
            .unwrap();
        assert_eq!(
            failure.attribute("message"),
            Some("step time <1.0 s> & \"more\"")
        );
        assert!(failure.text().unwrap().ends_with("- a\n+ b"), "{xml}");
        let case = doc
            .descendants()
            .find(|n| n.has_tag_name("testcase"))
            .unwrap();
        assert_eq!(case.attribute("classname"), Some("hpfsdp.gate.a"));
        assert_eq!(case.attribute("time"), Some("0.250"));
    }

    #[test]
    fn the_schema_check_rejects_what_jenkins_rejects() {
        let bad = "<testsuites skipped=\"1\"><testsuite name=\"a\" tests=\"1\" failures=\"0\"><testcase name=\"x\" time=\"0.12345\"/></testsuite></testsuites>";
        let v = violations(bad);
        assert!(
            v.contains(&"<testsuites> may not have 'skipped'".to_string()),
            "{v:?}"
        );
        assert!(
            v.contains(&"<testsuite> lacks required 'errors'".to_string()),
            "{v:?}"
        );
        assert_eq!(
            v.len(),
            2,
            "testcase time is a plain string in the schema: {v:?}"
        );
    }
}
