//! The replay report: a measured timeline beside the simulator's prediction of the same
//! step programs.
//!
//! [`ReplayReport::build`] joins every rank's program with both timelines into one row per
//! (rank, op) and aggregates per category and per collective kind; writers render
//! `replay.csv` ([`replay_csv`]), `report.html` ([`replay_html`]) and `trace.json`
//! ([`replay_trace_json`], the Chrome-trace writer of [`crate::chrome_trace`] with the
//! measured and the predicted step as two processes, one thread per rank and stream).

use crate::charts;
use crate::chrome_trace::chrome_trace_json;
use crate::csv::write_records;
use crate::model::{RankTimelineView, SimReport, SpanView, StrategyRun};
use crate::page::{self, escape};
use crate::units;
use crate::write::ReportError;
use hpfsdp_program::step::{Payload, StepProgram, Timeline};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Header of `replay.csv`, exactly.
pub const REPLAY_CSV_COLUMNS: [&str; 9] = [
    "op",
    "rank",
    "kind",
    "category",
    "bytes",
    "start_us",
    "end_us",
    "predicted_start_us",
    "predicted_end_us",
];

/// File names written by [`write_replay_report`], in order.
pub const REPLAY_REPORT_FILES: [&str; 3] = ["replay.csv", "trace.json", "report.html"];

/// One op on one rank, measured and predicted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayOpRow {
    /// Op index in the rank's program.
    pub index: usize,
    /// Op name (`op#N` when unnamed).
    pub op: String,
    /// Rank.
    pub rank: usize,
    /// `compute`, `copy`, `host` or the collective kind (`all-gather`, ...).
    pub kind: String,
    /// Category name (`fsdp-ag`, `compute`, ...).
    pub category: String,
    /// Stream name.
    pub stream: String,
    /// Bytes moved (collective output bytes, copy bytes; 0 otherwise).
    pub bytes: u64,
    /// Measured start, ns from the step start.
    pub start_ns: u64,
    /// Measured end, ns.
    pub end_ns: u64,
    /// Predicted start, ns.
    pub predicted_start_ns: u64,
    /// Predicted end, ns.
    pub predicted_end_ns: u64,
}

impl ReplayOpRow {
    /// Measured duration, ns.
    pub fn measured_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// Predicted duration, ns.
    pub fn predicted_ns(&self) -> u64 {
        self.predicted_end_ns
            .saturating_sub(self.predicted_start_ns)
    }

    /// Measured minus predicted duration, ns.
    pub fn error_ns(&self) -> i64 {
        self.measured_ns() as i64 - self.predicted_ns() as i64
    }
}

/// Predicted vs measured busy time of a group of ops (a category or a collective kind).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompareRow {
    /// Category or kind name.
    pub name: String,
    /// Ops per rank (mean).
    pub ops_per_rank: f64,
    /// Mean over ranks of the summed predicted op durations, ns.
    pub predicted_ns: u64,
    /// Mean over ranks of the summed measured op durations, ns.
    pub measured_ns: u64,
}

/// Step-level figures of one timeline (on its critical rank, as `simulate` reports them).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct StepFigures {
    /// Step time (latest op end), ns.
    pub step_ns: u64,
    /// Exposed communication of the critical rank, ns.
    pub exposed_comm_ns: u64,
    /// Exposed communication per category of the critical rank, ns.
    pub exposed_by_category_ns: BTreeMap<String, u64>,
}

/// Everything a replay report shows.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ReplayReport {
    /// Scenario name.
    pub scenario: String,
    /// Backend name.
    pub backend: String,
    /// Hardware profile of the prediction.
    pub hardware: String,
    /// Strategy replayed.
    pub strategy: String,
    /// Ranks replayed.
    pub world_size: usize,
    /// `busy` or `real`.
    pub compute: String,
    /// How the scenario was scaled down for the replay (empty when it was not).
    pub scaling: Vec<String>,
    /// Warm-up steps.
    pub warmup: usize,
    /// Step time of every measured step, ns.
    pub measured_steps_ns: Vec<u64>,
    /// The measured step shown (the median).
    pub shown_step: usize,
    /// Predicted step figures.
    pub predicted: StepFigures,
    /// Measured step figures (of the shown step).
    pub measured: StepFigures,
    /// One row per (rank, op), by rank then op.
    pub rows: Vec<ReplayOpRow>,
}

impl ReplayReport {
    /// Joins every program with its measured and predicted spans into rows (ranks missing
    /// from a timeline get zero times).
    pub fn rows_of(
        programs: &[StepProgram],
        measured: &Timeline,
        predicted: &Timeline,
    ) -> Vec<ReplayOpRow> {
        let mut rows = Vec::new();
        for p in programs {
            let m = measured.rank(p.rank).map(|t| &t.spans[..]).unwrap_or(&[]);
            let q = predicted.rank(p.rank).map(|t| &t.spans[..]).unwrap_or(&[]);
            let at = |spans: &[hpfsdp_program::step::OpSpan], i: usize| {
                spans
                    .iter()
                    .find(|s| s.op.index() == i)
                    .map_or((0, 0), |s| (s.start_ns, s.end_ns))
            };
            for (i, op) in p.ops.iter().enumerate() {
                let (kind, bytes) = match &op.payload {
                    Payload::Compute(_) => ("compute".to_string(), 0),
                    Payload::Copy(c) => ("copy".to_string(), c.bytes),
                    Payload::Host { .. } => ("host".to_string(), 0),
                    Payload::Collective(c) => (c.kind.name().to_string(), c.output_bytes),
                };
                let (start_ns, end_ns) = at(m, i);
                let (predicted_start_ns, predicted_end_ns) = at(q, i);
                rows.push(ReplayOpRow {
                    index: i,
                    op: op.name.clone().unwrap_or_else(|| op.id.to_string()),
                    rank: p.rank,
                    kind,
                    category: op.category.name().to_string(),
                    stream: op.stream.name(),
                    bytes,
                    start_ns,
                    end_ns,
                    predicted_start_ns,
                    predicted_end_ns,
                });
            }
        }
        rows
    }

    /// Predicted vs measured busy time per key (`by(row)`), as means over ranks, sorted by
    /// name in `order`.
    fn compare_by(&self, by: impl Fn(&ReplayOpRow) -> Option<String>) -> Vec<CompareRow> {
        let ranks = self.world_size.max(1) as f64;
        let mut acc: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
        for r in &self.rows {
            if let Some(key) = by(r) {
                let e = acc.entry(key).or_default();
                e.0 += 1;
                e.1 += r.predicted_ns();
                e.2 += r.measured_ns();
            }
        }
        acc.into_iter()
            .map(|(name, (n, p, m))| CompareRow {
                name,
                ops_per_rank: n as f64 / ranks,
                predicted_ns: (p as f64 / ranks).round() as u64,
                measured_ns: (m as f64 / ranks).round() as u64,
            })
            .collect()
    }

    /// Per category, in the plan's category order.
    pub fn by_category(&self) -> Vec<CompareRow> {
        let mut rows = self.compare_by(|r| Some(r.category.clone()));
        let order = crate::order::categories(rows.iter().map(|r| r.name.as_str()));
        rows.sort_by_key(|r| order.iter().position(|o| *o == r.name));
        rows
    }

    /// Per collective kind (collectives only).
    pub fn by_collective_kind(&self) -> Vec<CompareRow> {
        self.compare_by(|r| {
            (!matches!(r.kind.as_str(), "compute" | "copy" | "host")).then(|| r.kind.clone())
        })
    }

    /// The `n` rows with the largest absolute duration error (ties: rank, then op).
    pub fn worst(&self, n: usize) -> Vec<&ReplayOpRow> {
        let mut rows: Vec<&ReplayOpRow> = self.rows.iter().collect();
        rows.sort_by_key(|r| {
            (
                std::cmp::Reverse(r.error_ns().unsigned_abs()),
                r.rank,
                r.index,
            )
        });
        rows.truncate(n);
        rows
    }

    /// The spans of `rank` (or of every rank, streams prefixed by the rank, when `None`) as a
    /// report view, measured or predicted.
    pub fn view(&self, rank: Option<usize>, predicted: bool) -> RankTimelineView {
        let spans = self
            .rows
            .iter()
            .filter(|r| rank.is_none_or(|k| k == r.rank))
            .map(|r| {
                let (s, e) = if predicted {
                    (r.predicted_start_ns, r.predicted_end_ns)
                } else {
                    (r.start_ns, r.end_ns)
                };
                SpanView {
                    op: r.op.clone(),
                    stream: match rank {
                        Some(_) => r.stream.clone(),
                        None => format!("rank {:03} {}", r.rank, r.stream),
                    },
                    category: r.category.clone(),
                    start_ns: s,
                    end_ns: e,
                    bytes: (r.bytes > 0).then_some(r.bytes),
                }
            })
            .collect();
        RankTimelineView {
            rank: rank.unwrap_or(0),
            spans,
        }
    }
}

fn us(ns: u64) -> String {
    (ns as f64 / 1000.0).to_string()
}

/// `replay.csv`: one row per (rank, op) with measured and predicted times in microseconds.
pub fn replay_csv(report: &ReplayReport) -> String {
    let header = std::iter::once(REPLAY_CSV_COLUMNS.iter().map(|s| s.to_string()).collect());
    let rows = report.rows.iter().map(|r| {
        vec![
            r.op.clone(),
            r.rank.to_string(),
            r.kind.clone(),
            r.category.clone(),
            r.bytes.to_string(),
            us(r.start_ns),
            us(r.end_ns),
            us(r.predicted_start_ns),
            us(r.predicted_end_ns),
        ]
    });
    write_records(header.chain(rows))
}

/// `trace.json`: the measured and the predicted step as two processes of one Chrome /
/// Perfetto trace, one thread per rank and stream.
pub fn replay_trace_json(report: &ReplayReport) -> String {
    let run = |name: &str, predicted: bool| StrategyRun {
        strategy: name.to_string(),
        rank0_timeline: Some(report.view(None, predicted)),
        ..StrategyRun::default()
    };
    chrome_trace_json(&SimReport {
        scenario: report.scenario.clone(),
        description: format!("replay on {}", report.backend),
        hardware: report.hardware.clone(),
        world_size: report.world_size,
        runs: vec![
            run(&format!("measured ({})", report.backend), false),
            run(&format!("predicted ({})", report.hardware), true),
        ],
        device_memory_bytes: None,
        whatif: Vec::new(),
    })
}

fn ms_ns(ns: u64) -> String {
    units::ms(ns as f64 * 1e-9)
}

fn ratio(measured: u64, predicted: u64) -> String {
    if predicted == 0 {
        units::MISSING.to_string()
    } else {
        format!("{:.2}", measured as f64 / predicted as f64)
    }
}

fn compare_table(rows: &[CompareRow]) -> String {
    let headers: Vec<String> = [
        "",
        "ops per rank",
        "predicted ms",
        "measured ms",
        "measured / predicted",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                format!("{:.1}", r.ops_per_rank),
                ms_ns(r.predicted_ns),
                ms_ns(r.measured_ns),
                ratio(r.measured_ns, r.predicted_ns),
            ]
        })
        .collect();
    page::table(&headers, &body)
}

fn summary_section(report: &ReplayReport) -> String {
    let headers: Vec<String> = ["", "predicted", "measured", "measured / predicted"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (p, m) = (&report.predicted, &report.measured);
    let mut rows = vec![
        vec![
            "step time (ms)".to_string(),
            ms_ns(p.step_ns),
            ms_ns(m.step_ns),
            ratio(m.step_ns, p.step_ns),
        ],
        vec![
            "exposed communication (ms)".to_string(),
            ms_ns(p.exposed_comm_ns),
            ms_ns(m.exposed_comm_ns),
            ratio(m.exposed_comm_ns, p.exposed_comm_ns),
        ],
    ];
    let cats: Vec<&String> = p
        .exposed_by_category_ns
        .keys()
        .chain(m.exposed_by_category_ns.keys())
        .collect();
    for c in crate::order::categories(cats.iter().map(|s| s.as_str())) {
        let pv = p.exposed_by_category_ns.get(&c).copied().unwrap_or(0);
        let mv = m.exposed_by_category_ns.get(&c).copied().unwrap_or(0);
        rows.push(vec![
            format!("  exposed {c} (ms)"),
            ms_ns(pv),
            ms_ns(mv),
            ratio(mv, pv),
        ]);
    }
    page::table(&headers, &rows)
}

fn worst_section(report: &ReplayReport) -> String {
    let headers: Vec<String> = [
        "rank",
        "op",
        "name",
        "kind",
        "category",
        "predicted ms",
        "measured ms",
        "error ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows: Vec<Vec<String>> = report
        .worst(15)
        .into_iter()
        .map(|r| {
            vec![
                r.rank.to_string(),
                format!("#{}", r.index),
                r.op.clone(),
                r.kind.clone(),
                r.category.clone(),
                ms_ns(r.predicted_ns()),
                ms_ns(r.measured_ns()),
                units::ms(r.error_ns() as f64 * 1e-9),
            ]
        })
        .collect();
    page::table(&headers, &rows)
}

fn charts_section(report: &ReplayReport) -> String {
    let span_ns = report.predicted.step_ns.max(report.measured.step_ns);
    let mut out = String::new();
    for (name, predicted) in [("measured", false), ("predicted", true)] {
        let run = StrategyRun {
            strategy: name.to_string(),
            rank0_timeline: Some(report.view(Some(0), predicted)),
            ..StrategyRun::default()
        };
        match charts::timeline_svg(&run, span_ns) {
            Ok(Some(t)) => {
                let _ = writeln!(
                    out,
                    "<figure>{}<figcaption>Rank 0, {name}: one row per stream, bars coloured by \
                     category, on the same time axis as the other chart.</figcaption></figure>",
                    t.svg
                );
            }
            Ok(None) => {}
            Err(e) => {
                let _ = writeln!(out, "<p>{}</p>", escape(&e.to_string()));
            }
        }
    }
    out
}

/// `report.html`: step time and exposed communication predicted vs measured, per category
/// and per collective kind, the worst mispredicted ops and rank 0's two timelines.
pub fn replay_html(report: &ReplayReport) -> String {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<h1>Replay of {} ({})</h1>",
        escape(&report.scenario),
        escape(&report.strategy)
    );
    let steps: Vec<String> = report.measured_steps_ns.iter().map(|&n| ms_ns(n)).collect();
    let _ = writeln!(
        body,
        "<p class=\"sub\">Backend <b>{}</b> · prediction on <b>{}</b> · {} ranks · compute {} · \
         {} warm-up step(s) · measured step times (ms): {} · shown: the median (step {})</p>",
        escape(&report.backend),
        escape(&report.hardware),
        report.world_size,
        escape(&report.compute),
        report.warmup,
        escape(&steps.join(", ")),
        report.shown_step
    );
    if !report.scaling.is_empty() {
        body.push_str("<h2>Scaled down for the replay</h2>\n<ul>\n");
        for s in &report.scaling {
            let _ = writeln!(body, "<li>{}</li>", escape(s));
        }
        body.push_str("</ul>\n");
    }
    body.push_str("<h2>Step</h2>\n");
    body.push_str(&summary_section(report));
    body.push_str("<h2>Per category</h2>\n<p class=\"sub\">Summed op durations, mean per rank. A collective's span starts when its rank issued it, so it includes waiting for peers.</p>\n");
    body.push_str(&compare_table(&report.by_category()));
    body.push_str("<h2>Per collective kind</h2>\n");
    body.push_str(&compare_table(&report.by_collective_kind()));
    body.push_str("<h2>Worst mispredicted ops</h2>\n");
    body.push_str(&worst_section(report));
    body.push_str("<h2>Timelines</h2>\n");
    body.push_str(&charts_section(report));
    page::page(&format!("hpfsdp replay: {}", report.scenario), &body)
}

/// Writes `replay.csv`, `trace.json` and `report.html` into `dir` (created when missing) and
/// returns their paths.
pub fn write_replay_report(dir: &Path, report: &ReplayReport) -> Result<Vec<PathBuf>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let contents = [
        replay_csv(report),
        replay_trace_json(report),
        replay_html(report),
    ];
    let mut written = Vec::new();
    for (name, text) in REPLAY_REPORT_FILES.iter().zip(contents) {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| ReportError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_program::step::{
        Category, ComputeWork, OpSpan, ProgramBuilder, RankRange, RankTimeline, TimelineKind,
        TimelineSource,
    };

    fn timeline(kind: TimelineKind, spans: Vec<(u64, u64)>) -> Timeline {
        Timeline {
            source: TimelineSource {
                kind,
                producer: "t".into(),
            },
            ranks: vec![RankTimeline {
                rank: 0,
                represents: vec![RankRange { start: 0, end: 1 }],
                spans: spans
                    .into_iter()
                    .enumerate()
                    .map(|(i, (s, e))| OpSpan {
                        op: hpfsdp_program::step::OpId(i as u32),
                        start_ns: s,
                        end_ns: e,
                        launched_ns: None,
                        transfer_start_ns: None,
                    })
                    .collect(),
            }],
        }
    }

    #[test]
    fn rows_aggregates_csv_and_html() {
        let mut b = ProgramBuilder::new(0);
        let c = b.compute(
            ComputeWork {
                flops: 1,
                hbm_bytes: 1,
                kernels: 1,
                mix: None,
            },
            &[],
        );
        b.name(c, "fwd");
        b.host(Category::Host, 10, &[c]);
        let programs = vec![b.build().unwrap()];
        let m = timeline(TimelineKind::Measured, vec![(0, 3000), (3000, 3010)]);
        let p = timeline(TimelineKind::Predicted, vec![(0, 1000), (1000, 1010)]);
        let report = ReplayReport {
            scenario: "s".into(),
            world_size: 1,
            rows: ReplayReport::rows_of(&programs, &m, &p),
            ..ReplayReport::default()
        };
        assert_eq!(report.rows.len(), 2);
        assert_eq!(report.worst(1)[0].op, "fwd");
        let cats = report.by_category();
        assert_eq!(cats[0].name, "compute");
        assert_eq!((cats[0].predicted_ns, cats[0].measured_ns), (1000, 3000));
        assert!(report.by_collective_kind().is_empty());
        let csv = replay_csv(&report);
        assert!(csv.starts_with(
            "op,rank,kind,category,bytes,start_us,end_us,predicted_start_us,predicted_end_us\n"
        ));
        assert!(csv.contains("fwd,0,compute,compute,0,0,3,0,1\n"), "{csv}");
        assert_eq!(replay_html(&report), replay_html(&report));
        let trace = replay_trace_json(&report);
        assert!(trace.contains("measured (") && trace.contains("rank 000 compute"));
    }
}
