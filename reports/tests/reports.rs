//! End-to-end checks of every report writer on a small hand-made report.

mod common;

use hpfsdp_reports::{
    Section, Table, TableReport, Verdict, chrome_trace_json, sim_report_html, summary_csv,
    timeline_csv, write_sim_report,
};
use std::collections::BTreeMap;

/// Checks that every element opened is closed, in order (a rough well-formedness check).
fn assert_tags_balanced(doc: &str) {
    let mut stack: Vec<String> = Vec::new();
    let mut rest = doc;
    while let Some(lt) = rest.find('<') {
        rest = &rest[lt + 1..];
        let gt = rest.find('>').expect("unterminated tag");
        let tag = &rest[..gt];
        rest = &rest[gt + 1..];
        if tag.starts_with('!') || tag.starts_with('?') {
            continue;
        }
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        const VOID: [&str; 2] = ["meta", "br"];
        if tag.starts_with('/') {
            let open = stack.pop().unwrap_or_default();
            assert_eq!(open, name, "mismatched </{name}>");
        } else if !tag.ends_with('/') && !VOID.contains(&name.as_str()) {
            stack.push(name);
        }
    }
    assert!(stack.is_empty(), "unclosed tags: {stack:?}");
}

#[test]
fn html_is_self_contained_and_deterministic() {
    let report = common::sample();
    let html = sim_report_html(&report);
    assert_eq!(html, sim_report_html(&report), "two renders differ");
    assert!(html.starts_with("<!DOCTYPE html>"));
    // No external resources of any kind.
    for bad in ["<script", "<link", "src=", "href=", "@import", "url("] {
        assert!(!html.contains(bad), "found {bad}");
    }
    let without_ns = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    assert!(!without_ns.contains("http://") && !without_ns.contains("https://"));
    // 3 report-wide charts + one timeline per strategy.
    assert_eq!(html.matches("<svg").count(), 3 + report.runs.len());
    assert_eq!(html.matches("</svg>").count(), 3 + report.runs.len());
    assert!(!html.contains("<?xml"));
    // User strings are escaped, in tables and in SVG text.
    assert!(html.contains("fsdp2&lt;script&gt;"));
    assert!(!html.contains("fsdp2<script>"));
    assert!(html.contains("tiny &amp; test"));
    assert!(html.contains("&lt;compared&gt;"));
    // Summary content.
    assert!(html.contains("exposed fsdp-ag (ms)"));
    assert!(html.contains("intra-machine bytes"));
    assert!(html.contains("3.00 GiB"));
    assert!(
        html.contains("1 GiB = 2^30 B"),
        "the size convention is stated"
    );
    assert_tags_balanced(&html);
}

#[test]
fn summary_table_is_narrow_and_shows_fits() {
    let report = common::sample();
    let html = sim_report_html(&report);
    let summary = &html[html.find("<h2>Summary</h2>").expect("summary")..];
    let table = &summary[..summary.find("</table>").expect("table end")];
    let headers: Vec<&str> = table
        .split("<th>")
        .skip(1)
        .map(|h| &h[..h.find("</th>").expect("th end")])
        .collect();
    assert!(headers.len() <= 13, "summary has {} columns", headers.len());
    let fits = headers.iter().position(|h| *h == "fits").expect("fits");
    assert!(
        fits <= 5,
        "fits must be among the first columns: {headers:?}"
    );
    // Numeric cells never wrap between a value and its unit.
    assert!(table.contains("<td class=\"num\">3.00 GiB</td>"));
    assert!(html.contains("td.num{") && html.contains("white-space:nowrap"));
}

#[test]
fn memory_chart_draws_the_device_capacity() {
    let mut report = common::sample();
    let html = sim_report_html(&report);
    assert!(
        html.contains("capacity 4.00 GiB"),
        "capacity legend missing"
    );
    assert!(
        html.contains("stroke=\"#D62728\"") || html.contains("stroke=\"#d62728\""),
        "capacity line missing"
    );
    // Far above the series (3 GiB of 64 GiB): the axis follows the series, the title says
    // where the capacity is.
    report.device_memory_bytes = Some(64 << 30);
    let html = sim_report_html(&report);
    assert!(
        html.contains("capacity 64.00 GiB off scale: peak at 4.7% of it"),
        "off-scale capacity not stated"
    );
    assert!(!html.contains("stroke=\"#D62728\"") && !html.contains("stroke=\"#d62728\""));
    report.device_memory_bytes = None;
    let html = sim_report_html(&report);
    assert!(!html.contains("capacity 4.00 GiB") && !html.contains("off scale"));
}

#[test]
fn html_survives_degenerate_input() {
    let mut report = common::sample();
    report.runs[0].step_time_s = f64::NAN;
    report.runs[0].compute_s = -1.0;
    report.runs[0].memory_series.clear();
    report.runs[0].rank0_timeline = None;
    report.runs[1].tier_bytes.clear();
    let html = sim_report_html(&report);
    assert_eq!(html.matches("<svg").count(), 3 + 1);
    assert!(
        !html.contains("NaN") && !html.contains("inf"),
        "non-finite value leaked"
    );
    let empty = sim_report_html(&hpfsdp_reports::SimReport::default());
    assert_eq!(empty.matches("<svg").count(), 3);
}

#[test]
fn csv_parses_back() {
    let report = common::sample();
    let summary = summary_csv(&report);
    let mut rdr = csv::Reader::from_reader(summary.as_bytes());
    let headers = rdr.headers().expect("headers").clone();
    // One fixed schema: 13 fixed + 8 communication categories + overlap + 3 tiers x 2 + peak
    // + 6 tags + fits + 10 optimizer/memory-spread columns + 3 optimizer tier columns.
    assert_eq!(headers.len(), 13 + 8 + 1 + 6 + 1 + 6 + 1 + 10 + 3);
    assert_eq!(&headers[13], "exposed_comm_fsdp-ag_s");
    let col = |name: &str| headers.iter().position(|h| h == name).expect(name);
    let (range, spread) = (col("optimizer_range_s"), col("peak_memory_spread_bytes"));
    let rows: Vec<csv::StringRecord> = rdr.records().map(|r| r.expect("record")).collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(&rows[1][3], "fsdp2<script>");
    let step: f64 = rows[0][4].parse().expect("float");
    assert_eq!(step, report.runs[0].step_time_s);
    let o = report.runs[0]
        .optimizer
        .as_ref()
        .expect("optimizer figures");
    assert_eq!(rows[0][range].parse::<f64>().expect("float"), o.range_s);
    assert_eq!(
        rows[0][spread].parse::<u64>().expect("int"),
        report.runs[0].memory_spread.spread_bytes()
    );
    assert_eq!(&rows[0][col("optimizer_intra-machine_bytes")], "1048576");

    let timeline = timeline_csv(&report);
    let mut rdr = csv::Reader::from_reader(timeline.as_bytes());
    assert_eq!(
        rdr.headers().expect("headers").iter().collect::<Vec<_>>(),
        [
            "strategy", "rank", "stream", "category", "op", "start_ns", "end_ns", "bytes"
        ]
    );
    let rows: Vec<csv::StringRecord> = rdr.records().map(|r| r.expect("record")).collect();
    assert_eq!(rows.len(), 14);
    assert!(rows.iter().all(|r| r.len() == 8));
    assert_eq!(&rows[6][7], "", "host span has no bytes");
}

#[test]
fn trace_json_has_named_processes_threads_and_spans() {
    let report = common::sample();
    let text = chrome_trace_json(&report);
    assert_eq!(text, chrome_trace_json(&report));
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let meta = |name: &str| -> BTreeMap<(u64, u64), String> {
        events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == name)
            .map(|e| {
                let key = (
                    e["pid"].as_u64().expect("pid"),
                    e["tid"].as_u64().expect("tid"),
                );
                (key, e["args"]["name"].as_str().expect("name").to_string())
            })
            .collect()
    };
    let processes = meta("process_name");
    assert_eq!(processes[&(1, 0)], "hyperparallel");
    assert_eq!(processes[&(2, 0)], "fsdp2<script>");
    let threads = meta("thread_name");
    let names: Vec<&str> = threads
        .iter()
        .filter(|((pid, _), _)| *pid == 1)
        .map(|(_, n)| n.as_str())
        .collect();
    assert_eq!(
        names,
        ["compute", "copy", "all-gather", "reduce-scatter", "host"]
    );
    let spans: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(spans.len(), 14);
    let ag = spans
        .iter()
        .find(|e| e["name"] == "layers.1.ag" && e["pid"] == 1)
        .expect("span");
    assert_eq!(ag["cat"], "fsdp-ag");
    assert_eq!(
        threads[&(1, ag["tid"].as_u64().expect("tid"))],
        "all-gather"
    );
    // Timestamps are microseconds (1500 ns -> 1.5); the declared display unit must be one
    // the format accepts and not claim the microsecond values are nanoseconds.
    assert_eq!(v["displayTimeUnit"], "ms");
    assert_eq!(ag["ts"].as_f64(), Some(1.5));
    assert_eq!(ag["dur"].as_f64(), Some(1.5));
    assert_eq!(ag["args"]["bytes"].as_u64(), Some(1 << 29));
    assert!(events.iter().any(|e| e["ph"] == "C"));
}

#[test]
fn table_report_renders_and_escapes() {
    let report = TableReport {
        title: "verify <all>".into(),
        subtitle: "a & b".into(),
        verdict: Some(Verdict {
            passed: false,
            text: "1 of 2 <failed>".into(),
        }),
        sections: vec![Section {
            heading: "Gradients".into(),
            text: "max |err|".into(),
            table: Table {
                headers: vec!["param".into(), "max abs err".into()],
                rows: vec![
                    vec!["w<1>".into(), "1.5e-3".into()],
                    vec!["a,\"b\"".into(), "0".into()],
                ],
            },
        }],
    };
    let html = report.to_html();
    assert!(html.contains("verify &lt;all&gt;"));
    assert!(html.contains("class=\"verdict fail\""));
    assert!(html.contains("1 of 2 &lt;failed&gt;"));
    assert!(html.contains("<td>w&lt;1&gt;</td>"));
    assert!(html.contains("<td class=\"num\">1.5e-3</td>"));
    assert!(!html.contains("<script"));
    assert_tags_balanced(&html);

    let table = &report.sections[0].table;
    let table_csv = table.to_csv();
    let mut rdr = csv::Reader::from_reader(table_csv.as_bytes());
    assert_eq!(rdr.headers().expect("headers").len(), 2);
    let rows: Vec<csv::StringRecord> = rdr.records().map(|r| r.expect("record")).collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(&rows[1][0], "a,\"b\"");

    let md = table.to_markdown();
    assert_eq!(md.lines().count(), 4);
    assert!(md.starts_with("| param | max abs err |\n| --- | --- |\n"));
    assert!(report.to_markdown().contains("**FAIL**: 1 of 2 <failed>"));
}

#[test]
fn writes_four_files_and_names_failing_path() {
    let dir = std::env::temp_dir().join(format!("hpfsdp-reports-test-{}", std::process::id()));
    let out = dir.join("nested/out");
    let report = common::sample();
    let paths = write_sim_report(&out, &report).expect("written");
    let names: Vec<String> = paths
        .iter()
        .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["report.html", "summary.csv", "timeline.csv", "trace.json"]
    );
    for p in &paths {
        assert!(std::fs::metadata(p).expect("exists").len() > 0);
    }
    assert_eq!(
        std::fs::read_to_string(&paths[0]).expect("read"),
        sim_report_html(&report)
    );

    // A regular file where the directory should be: creating the directory fails.
    let blocker = dir.join("blocker");
    std::fs::write(&blocker, "x").expect("write blocker");
    let bad = blocker.join("sub");
    let e = write_sim_report(&bad, &report).expect_err("must fail");
    assert!(e.to_string().contains(&bad.display().to_string()), "{e}");

    // A directory where a file should be: writing that file fails and is named.
    let clash = dir.join("clash");
    std::fs::create_dir_all(clash.join("summary.csv")).expect("mkdir");
    let e = write_sim_report(&clash, &report).expect_err("must fail");
    assert!(e.to_string().contains("summary.csv"), "{e}");

    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn huge_timelines_stay_small() {
    let mut report = common::sample();
    report.runs.truncate(1);
    let streams = ["compute", "copy", "all-gather", "reduce-scatter", "host"];
    let cats = ["compute", "copy", "fsdp-ag", "fsdp-rs", "tp", "ep"];
    let spans: Vec<hpfsdp_reports::SpanView> = (0..200_000u64)
        .map(|k| hpfsdp_reports::SpanView {
            op: format!("op{k}"),
            stream: streams[(k % 5) as usize].into(),
            category: cats[(k % 6) as usize].into(),
            start_ns: k * 50,
            end_ns: k * 50 + 40 + (k % 13) * 7,
            bytes: None,
        })
        .collect();
    report.runs[0].step_time_s = 200_000.0 * 50e-9;
    report.runs[0].rank0_timeline = Some(hpfsdp_reports::RankTimelineView { rank: 0, spans });
    let html = sim_report_html(&report);
    eprintln!("HTML with a 200k-span timeline: {} bytes", html.len());
    assert!(html.len() < 2_000_000, "HTML is {} bytes", html.len());
    assert_eq!(html.matches("<svg").count(), 4);
    assert!(html.contains("200,000 spans"));
}
