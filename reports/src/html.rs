//! The self-contained HTML simulation report: summary tables and inline SVG charts.

use crate::charts::{self, ChartError};
use crate::model::SimReport;
use crate::page::{self, escape};
use crate::{order, units};
use std::fmt::Write as _;

/// Renders `report` as one self-contained HTML page (inline CSS and SVG, no scripts, no
/// external resources). The output is a pure function of the input: rendering the same report
/// twice gives byte-identical HTML. A chart that cannot be drawn is replaced by a note.
pub fn sim_report_html(report: &SimReport) -> String {
    let mut body = String::new();
    let _ = writeln!(body, "<h1>{}</h1>", escape(&report.scenario));
    let _ = writeln!(
        body,
        "<p class=\"sub\">Hardware <b>{}</b> · world size <b>{}</b> · {} strateg{}</p>",
        escape(&report.hardware),
        report.world_size,
        report.runs.len(),
        if report.runs.len() == 1 { "y" } else { "ies" }
    );
    if !report.description.is_empty() {
        let _ = writeln!(body, "<p>{}</p>", escape(&report.description));
    }
    let _ = writeln!(
        body,
        "<p class=\"sub\">{}</p>",
        escape(units::SIZE_UNITS_NOTE)
    );

    body.push_str("<h2>Summary</h2>\n");
    let _ = writeln!(
        body,
        "<p class=\"sub\">Times in milliseconds on the critical rank. Peak memory is the highest \
         peak over every rank; fits = at most the device capacity{}. Exposed communication is \
         collective time not overlapped by compute or copy; overlap = 1 − exposed / \
         communication.</p>",
        report
            .device_memory_bytes
            .map_or_else(String::new, |c| format!(" ({})", units::bytes(c)))
    );
    let (headers, rows) = summary_table(report);
    body.push_str(&page::table(&headers, &rows));
    whatif_section(&mut body, report);

    body.push_str("<h2>Exposed communication and traffic per tier</h2>\n");
    body.push_str(
        "<p class=\"sub\">Exposed communication per category in milliseconds; collectives and \
         receive-buffer bytes per tier issued by the critical rank.</p>\n",
    );
    let (headers, rows) = traffic_table(report);
    body.push_str(&page::table(&headers, &rows));

    body.push_str("<h2>Optimizer step</h2>\n");
    body.push_str(
        "<p class=\"sub\">Optimizer range: first optimizer op start to last optimizer op end on \
         the critical rank (baselines that hook optimizer work into forward and backward span \
         most of the step); busy, communication and exposed communication of the optimizer's \
         ops; bytes per tier its collectives receive.</p>\n",
    );
    let (headers, rows) = optimizer_table(report);
    body.push_str(&page::table(&headers, &rows));

    body.push_str("<h2>Peak memory across ranks</h2>\n");
    body.push_str(
        "<p class=\"sub\">Per-rank peak memory: lowest, mean and highest over every rank (with \
         a rank holding the extreme); spread = highest − lowest.</p>\n",
    );
    let (headers, rows) = memory_spread_table(report);
    body.push_str(&page::table(&headers, &rows));

    body.push_str("<h2>Collectives</h2>\n");
    let (headers, rows) = collectives_table(report);
    body.push_str(&page::table(&headers, &rows));

    body.push_str("<h2>Peak memory by tag</h2>\n");
    let (headers, rows) = memory_table(report);
    body.push_str(&page::table(&headers, &rows));

    charts_section(&mut body, report);
    page::page(&format!("{} — hpfsdp simulation", report.scenario), &body)
}

/// Appends the what-if cost table (nothing when the scenario sets no `[whatif]` fault).
fn whatif_section(body: &mut String, report: &SimReport) {
    if report.whatif.is_empty() {
        return;
    }
    body.push_str("<h2>What-if faults</h2>\n");
    let _ = writeln!(
        body,
        "<p class=\"sub\">Step time of {} without any fault (baseline), with each \
         <code>[whatif]</code> fault alone, then with all; delta against the baseline.</p>",
        escape(
            report
                .runs
                .first()
                .map_or("the scenario's strategy", |r| &r.strategy)
        )
    );
    let headers: Vec<String> = ["fault", "step (ms)", "delta (ms)", "delta", "critical rank"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rows: Vec<Vec<String>> = report
        .whatif
        .iter()
        .map(|w| {
            vec![
                w.fault.clone(),
                units::ms(w.step_time_s),
                format!("{:+.3}", w.delta_s * 1e3),
                format!("{:+.2}%", w.delta_pct),
                w.critical_rank.to_string(),
            ]
        })
        .collect();
    body.push_str(&page::table(&headers, &rows));
}

/// Appends the charts: step breakdown, tier traffic, memory with the device capacity, and
/// one stream timeline per strategy on a shared time axis.
fn charts_section(body: &mut String, report: &SimReport) {
    body.push_str("<h2>Charts</h2>\n");
    figure(
        body,
        charts::step_breakdown_svg(report),
        "Step time per strategy: compute, copy not hidden under compute, exposed communication \
         per category and idle. The black tick marks the step time.",
    );
    figure(
        body,
        charts::tier_traffic_svg(report),
        "Collective bytes per tier issued by the critical rank.",
    );
    figure(
        body,
        charts::memory_svg(report),
        "Live device memory of rank 0 over the step; the dashed red line is the device \
         capacity a peak must stay under (stated in the title instead when far above the \
         series).",
    );
    let span_ns = report
        .runs
        .iter()
        .map(|r| step_ns(r.step_time_s))
        .max()
        .unwrap_or(0);
    for run in &report.runs {
        match charts::timeline_svg(run, span_ns) {
            Ok(None) => {}
            Ok(Some(t)) => {
                let caption = format!(
                    "{}: rank {} per stream, coloured by category; {} spans drawn as {} \
                     rectangles (merged per pixel column).",
                    run.strategy,
                    run.rank0_timeline.as_ref().map_or(0, |v| v.rank),
                    units::count(t.spans as u64),
                    units::count(t.rectangles as u64)
                );
                figure(body, Ok(t.svg), &caption);
            }
            Err(e) => figure(body, Err(e), &run.strategy),
        }
    }
}

/// Seconds to whole nanoseconds (0 for negative or non-finite input).
fn step_ns(seconds: f64) -> u64 {
    if seconds.is_finite() && seconds > 0.0 {
        (seconds * 1e9).round() as u64
    } else {
        0
    }
}

/// Appends a `<figure>` with an SVG (trusted: produced by plotters, text escaped there) or a
/// note saying why the chart is missing; the caption is escaped here.
fn figure(body: &mut String, svg: Result<String, ChartError>, caption: &str) {
    body.push_str("<figure>\n");
    match svg {
        Ok(svg) => body.push_str(strip_xml_declaration(&svg)),
        Err(e) => {
            let _ = writeln!(body, "<p>{}</p>", escape(&e.to_string()));
        }
    }
    let _ = writeln!(
        body,
        "<figcaption>{}</figcaption>\n</figure>",
        escape(caption)
    );
}

/// An SVG document without a leading `<?xml …?>` declaration (not allowed inline in HTML).
fn strip_xml_declaration(svg: &str) -> &str {
    let trimmed = svg.trim_start();
    if trimmed.starts_with("<?xml")
        && let Some(end) = trimmed.find("?>")
    {
        return trimmed[end + 2..].trim_start();
    }
    trimmed
}

/// Exposed-communication category names over all runs, in canonical order.
fn exposed_categories(report: &SimReport) -> Vec<String> {
    order::categories(
        report
            .runs
            .iter()
            .flat_map(|r| r.exposed_comm_by_category_s.keys().map(String::as_str)),
    )
}

/// Tier names over all runs, in canonical order.
fn tier_names(report: &SimReport) -> Vec<String> {
    order::tiers(
        report
            .runs
            .iter()
            .flat_map(|r| r.tier_bytes.iter().map(|t| t.tier.as_str())),
    )
}

/// Columns of the summary table: the headline figures first (step time, throughput, peak
/// memory and whether it fits), then the time breakdown. A fixed, small set, so the table fits
/// the page whatever the scenario; per-category and per-tier columns are in
/// [`traffic_table`].
const SUMMARY_HEADERS: [&str; 13] = [
    "strategy",
    "step (ms)",
    "tokens/s",
    "MFU",
    "peak memory",
    "fits",
    "compute (ms)",
    "copy (ms)",
    "host (ms)",
    "idle (ms)",
    "comm (ms)",
    "exposed comm (ms)",
    "overlap",
];

/// The per-strategy summary table (headers, rows), formatted for reading.
fn summary_table(report: &SimReport) -> (Vec<String>, Vec<Vec<String>>) {
    let headers = SUMMARY_HEADERS.iter().map(|s| s.to_string()).collect();
    let rows = report
        .runs
        .iter()
        .map(|r| {
            vec![
                r.strategy.clone(),
                units::ms(r.step_time_s),
                units::opt_rate(r.tokens_per_s),
                units::opt_percent(r.mfu),
                units::bytes(r.peak_memory_bytes),
                if r.memory_fits { "yes" } else { "NO" }.into(),
                units::ms(r.compute_s),
                units::ms(r.copy_s),
                units::ms(r.host_s),
                units::ms(r.idle_s),
                units::ms(r.comm_s),
                units::ms(r.exposed_comm_s),
                units::percent(r.overlap_rate),
            ]
        })
        .collect();
    (headers, rows)
}

/// Per strategy: exposed communication per category, then collectives and bytes per tier.
fn traffic_table(report: &SimReport) -> (Vec<String>, Vec<Vec<String>>) {
    let cats = exposed_categories(report);
    let tiers = tier_names(report);
    let mut headers = vec!["strategy".to_string()];
    headers.extend(cats.iter().map(|c| format!("exposed {c} (ms)")));
    for t in &tiers {
        headers.push(format!("{t} collectives"));
        headers.push(format!("{t} bytes"));
    }
    let rows = report
        .runs
        .iter()
        .map(|r| {
            let mut row = vec![r.strategy.clone()];
            row.extend(cats.iter().map(|c| {
                r.exposed_comm_by_category_s
                    .get(c)
                    .map_or_else(|| units::ms(0.0), |s| units::ms(*s))
            }));
            for t in &tiers {
                let matching = r.tier_bytes.iter().filter(|x| x.tier == *t);
                let (n, b) = matching.fold((0u64, 0u64), |(n, b), x| {
                    (n.saturating_add(x.collectives), b.saturating_add(x.bytes))
                });
                row.push(units::count(n));
                row.push(units::bytes(b));
            }
            row
        })
        .collect();
    (headers, rows)
}

/// Per strategy: the lowest, mean and highest per-rank peak memory with the ranks holding the
/// extremes, and the spread.
fn memory_spread_table(report: &SimReport) -> (Vec<String>, Vec<Vec<String>>) {
    let headers = [
        "strategy",
        "lowest peak",
        "on rank",
        "mean peak",
        "highest peak",
        "on rank",
        "spread",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows = report
        .runs
        .iter()
        .map(|r| {
            let m = &r.memory_spread;
            vec![
                r.strategy.clone(),
                units::bytes(m.min_bytes),
                m.min_rank.to_string(),
                units::bytes(m.mean_bytes),
                units::bytes(m.max_bytes),
                m.max_rank.to_string(),
                units::bytes(m.spread_bytes()),
            ]
        })
        .collect();
    (headers, rows)
}

/// Per strategy: the optimizer's range, busy time, communication and exposed communication,
/// and optimizer bytes per tier (step-wide communication and overlap are in the summary).
fn optimizer_table(report: &SimReport) -> (Vec<String>, Vec<Vec<String>>) {
    let tiers = order::tiers(report.runs.iter().flat_map(|r| {
        r.optimizer
            .iter()
            .flat_map(|o| o.tier_bytes.keys().map(String::as_str))
    }));
    let mut headers: Vec<String> = [
        "strategy",
        "optimizer",
        "step (ms)",
        "optimizer range (ms)",
        "optimizer busy (ms)",
        "optimizer comm (ms)",
        "optimizer exposed (ms)",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    headers.extend(tiers.iter().map(|t| format!("optimizer {t} bytes")));
    let rows = report
        .runs
        .iter()
        .map(|r| {
            let o = r.optimizer.clone().unwrap_or_default();
            let mut row = vec![
                r.strategy.clone(),
                r.optimizer_name.clone(),
                units::ms(r.step_time_s),
                units::ms(o.range_s),
                units::ms(o.busy_s),
                units::ms(o.comm_s),
                units::ms(o.exposed_comm_s),
            ];
            row.extend(
                tiers
                    .iter()
                    .map(|t| units::bytes(o.tier_bytes.get(t).copied().unwrap_or(0))),
            );
            row
        })
        .collect();
    (headers, rows)
}

/// Collective calls per strategy, category, kind and tier.
fn collectives_table(report: &SimReport) -> (Vec<String>, Vec<Vec<String>>) {
    let headers = ["strategy", "category", "kind", "tier", "calls", "bytes"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rows = report
        .runs
        .iter()
        .flat_map(|r| {
            r.collectives.iter().map(|c| {
                vec![
                    r.strategy.clone(),
                    c.category.clone(),
                    c.kind.clone(),
                    c.tier.clone(),
                    units::count(c.count),
                    units::bytes(c.bytes),
                ]
            })
        })
        .collect();
    (headers, rows)
}

/// Peak memory per strategy and tag.
fn memory_table(report: &SimReport) -> (Vec<String>, Vec<Vec<String>>) {
    let tags = order::mem_tags(
        report
            .runs
            .iter()
            .flat_map(|r| r.peak_memory_by_tag.keys().map(String::as_str)),
    );
    let mut headers = vec!["strategy".to_string(), "peak".to_string()];
    headers.extend(tags.iter().cloned());
    let rows = report
        .runs
        .iter()
        .map(|r| {
            let mut row = vec![r.strategy.clone(), units::bytes(r.peak_memory_bytes)];
            row.extend(
                tags.iter()
                    .map(|t| units::bytes(r.peak_memory_by_tag.get(t).copied().unwrap_or(0))),
            );
            row
        })
        .collect();
    (headers, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_declaration() {
        assert_eq!(
            strip_xml_declaration("<?xml version=\"1.0\"?>\n<svg/>"),
            "<svg/>"
        );
        assert_eq!(strip_xml_declaration("<svg/>"), "<svg/>");
    }
}
