//! Chrome trace-event JSON of the recorded rank timelines, for Perfetto / `chrome://tracing`.
//!
//! One process per strategy (`pid` = strategy position + 1, named by a `process_name`
//! metadata event), one thread per stream (`tid` = stream position in canonical order + 1,
//! named by `thread_name`), one complete (`"ph": "X"`) event per span with `ts`/`dur` in
//! microseconds, `cat` = category and `args.bytes` when the op moves data. Live memory is a
//! counter track (`"ph": "C"`) per strategy. Events are emitted in a fixed order through typed
//! structs, so the JSON is deterministic.
//!
//! Time units: the trace-event format fixes `ts` and `dur` in microseconds (fractional values
//! keep nanosecond resolution); `displayTimeUnit` only chooses how viewers label the axis and
//! accepts `"ms"` or `"ns"`. It is [`DISPLAY_TIME_UNIT`] (`"ms"`, the format's default), the
//! unit the HTML report uses for step times, so a viewer never presents microsecond
//! timestamps as nanoseconds.

use crate::model::SimReport;
use crate::order;
use serde::Serialize;

/// The `displayTimeUnit` of every trace this crate writes (timestamps are microseconds).
pub const DISPLAY_TIME_UNIT: &str = "ms";

/// The top-level trace object.
#[derive(Serialize)]
struct Trace<'a> {
    #[serde(rename = "traceEvents")]
    trace_events: Vec<Event<'a>>,
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
    #[serde(rename = "otherData")]
    other_data: OtherData<'a>,
}

/// Free-form metadata shown by trace viewers.
#[derive(Serialize)]
struct OtherData<'a> {
    scenario: &'a str,
    hardware: &'a str,
    world_size: usize,
    generator: String,
}

/// Arguments of an event.
#[derive(Serialize)]
#[serde(untagged)]
enum Args<'a> {
    /// Metadata: a name.
    Name { name: &'a str },
    /// Metadata: a sort index.
    Sort { sort_index: usize },
    /// A span: bytes moved, when any.
    Bytes {
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
    },
    /// A counter sample.
    Live { live_bytes: u64 },
}

/// One trace event (fields shared by the `M`, `X` and `C` phases).
#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    ph: &'static str,
    pid: usize,
    tid: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    args: Args<'a>,
}

/// Nanoseconds to trace microseconds.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The Chrome trace-event JSON of every strategy's recorded timeline and memory series.
pub fn chrome_trace_json(report: &SimReport) -> String {
    // Stream lists are computed first so events can borrow their names.
    let streams: Vec<Vec<String>> = report
        .runs
        .iter()
        .map(|run| {
            run.rank0_timeline.as_ref().map_or_else(Vec::new, |view| {
                order::streams(view.spans.iter().map(|s| s.stream.as_str()))
            })
        })
        .collect();
    let mut events: Vec<Event<'_>> = Vec::new();
    for ((i, run), streams) in report.runs.iter().enumerate().zip(&streams) {
        let pid = i + 1;
        let meta = |name: &'static str, tid: usize, args: Args<'static>| Event {
            name,
            ph: "M",
            pid,
            tid,
            cat: None,
            ts: None,
            dur: None,
            args,
        };
        events.push(Event {
            args: Args::Name {
                name: &run.strategy,
            },
            ..meta("process_name", 0, Args::Sort { sort_index: 0 })
        });
        events.push(meta("process_sort_index", 0, Args::Sort { sort_index: i }));
        if let Some(view) = &run.rank0_timeline {
            for (k, stream) in streams.iter().enumerate() {
                events.push(Event {
                    args: Args::Name { name: stream },
                    ..meta("thread_name", k + 1, Args::Sort { sort_index: 0 })
                });
                events.push(meta(
                    "thread_sort_index",
                    k + 1,
                    Args::Sort { sort_index: k },
                ));
            }
            for span in &view.spans {
                let tid = streams.iter().position(|s| *s == span.stream).unwrap_or(0) + 1;
                events.push(Event {
                    name: &span.op,
                    ph: "X",
                    pid,
                    tid,
                    cat: Some(&span.category),
                    ts: Some(us(span.start_ns)),
                    dur: Some(us(span.duration_ns())),
                    args: Args::Bytes { bytes: span.bytes },
                });
            }
        }
        for &(t, b) in &run.memory_series {
            events.push(Event {
                name: "live memory",
                ph: "C",
                pid,
                tid: 0,
                cat: None,
                ts: Some(us(t)),
                dur: None,
                args: Args::Live { live_bytes: b },
            });
        }
    }
    let trace = Trace {
        trace_events: events,
        display_time_unit: DISPLAY_TIME_UNIT,
        other_data: OtherData {
            scenario: &report.scenario,
            hardware: &report.hardware,
            world_size: report.world_size,
            generator: format!("hpfsdp-reports {}", crate::REPORTS_VERSION),
        },
    };
    // Serialising plain structs of strings and numbers cannot fail.
    serde_json::to_string(&trace).unwrap_or_default()
}
