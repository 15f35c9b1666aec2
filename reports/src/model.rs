//! The report data model: what a simulation report shows, independent of the simulator crate.
//!
//! The CLI fills a [`SimReport`] from simulator results (one [`StrategyRun`] per strategy);
//! every writer in this crate (HTML, CSV, Chrome trace) reads only this model. Names carry
//! their units (`_s`, `_ns`, `_bytes`). Maps are `BTreeMap`s so that iteration, and hence every
//! rendered output, is deterministic.

use hpfsdp_program::step::{Payload, RankTimeline, StepProgram};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One simulated scenario with the prediction of every strategy compared.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SimReport {
    /// Scenario name (shown as the report title).
    pub scenario: String,
    /// Free-text scenario description.
    pub description: String,
    /// Hardware profile name.
    pub hardware: String,
    /// Ranks in the job.
    pub world_size: usize,
    /// One entry per strategy, in the order they should be shown.
    pub runs: Vec<StrategyRun>,
    /// Memory capacity of one device, bytes (the line a peak must stay under to fit); drawn
    /// on the memory chart when known.
    #[serde(default)]
    pub device_memory_bytes: Option<u64>,
    /// What-if cost rows (baseline, each `[whatif]` fault alone, all); empty when the
    /// scenario sets no fault.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub whatif: Vec<WhatIfCostRow>,
}

/// The step time with one what-if fault (or none, or all) of the scenario's strategy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WhatIfCostRow {
    /// `baseline`, the fault's scenario key, or `all`.
    pub fault: String,
    /// Predicted step time, seconds.
    pub step_time_s: f64,
    /// Step time minus the baseline's, seconds.
    pub delta_s: f64,
    /// `delta_s` as a percentage of the baseline step time.
    pub delta_pct: f64,
    /// The rank that finished last.
    pub critical_rank: usize,
}

/// The prediction for one strategy: step time, breakdown, traffic, memory and rank 0's timeline.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StrategyRun {
    /// Strategy name (`hyperparallel`, `fsdp2`, ...; `+<optimizer>` when the run's optimizer
    /// is not the scenario's default for the strategy).
    pub strategy: String,
    /// Optimizer strategy of the run's programs (`hyperparallel` distributed Muon, a Muon
    /// baseline such as `dmuon`, or `adamw`).
    #[serde(default)]
    pub optimizer_name: String,
    /// The optimizer's figures on the critical rank (absent when the programs have no
    /// optimizer ops).
    #[serde(default)]
    pub optimizer: Option<OptimizerFigures>,
    /// Peak memory across ranks (the spread the owner-based Muon baselines create).
    #[serde(default)]
    pub memory_spread: MemorySpread,
    /// Predicted step time, seconds.
    pub step_time_s: f64,
    /// Tokens per second, when tokens per step are known.
    #[serde(default)]
    pub tokens_per_s: Option<f64>,
    /// Model FLOPs utilisation in `[0, 1]`, when model FLOPs per step are known.
    #[serde(default)]
    pub mfu: Option<f64>,
    /// Union of compute-op intervals of the critical rank, seconds.
    pub compute_s: f64,
    /// Union of copy-op intervals, seconds.
    pub copy_s: f64,
    /// Host thread busy time (launches and host ops), seconds.
    pub host_s: f64,
    /// Time no device stream does anything, seconds.
    pub idle_s: f64,
    /// Union of collective intervals, seconds.
    pub comm_s: f64,
    /// Communication not overlapped by compute or copy, seconds.
    pub exposed_comm_s: f64,
    /// Exposed communication per category name (`fsdp-ag`, `tp`, ...), seconds; sums to
    /// `exposed_comm_s`.
    #[serde(default)]
    pub exposed_comm_by_category_s: BTreeMap<String, f64>,
    /// `1 - exposed / communication` (1 without communication).
    pub overlap_rate: f64,
    /// Collective calls per (kind, tier).
    #[serde(default)]
    pub collectives: Vec<CollectiveRow>,
    /// Collective traffic per tier.
    #[serde(default)]
    pub tier_bytes: Vec<TierRow>,
    /// Highest live device memory, bytes.
    pub peak_memory_bytes: u64,
    /// Peak live bytes per memory tag name (`params`, `activations`, ...).
    #[serde(default)]
    pub peak_memory_by_tag: BTreeMap<String, u64>,
    /// True when the peak fits in the device's memory.
    pub memory_fits: bool,
    /// Live device memory over the step: `(time_ns, live_bytes)`, ascending in time.
    #[serde(default)]
    pub memory_series: Vec<(u64, u64)>,
    /// Rank 0's per-op spans, already joined with the program (absent when not recorded).
    #[serde(default)]
    pub rank0_timeline: Option<RankTimelineView>,
}

/// What the optimizer step costs on one rank: its range on the timeline, its busy time, its
/// communication and where that communication goes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct OptimizerFigures {
    /// From the first optimizer op's start to the last one's end, seconds (for baselines that
    /// hook optimizer work into forward/backward this spans most of the step).
    pub range_s: f64,
    /// Union of optimizer op intervals (compute and communication), seconds.
    pub busy_s: f64,
    /// Union of optimizer collective intervals, seconds.
    pub comm_s: f64,
    /// Optimizer communication not hidden under compute or copy, seconds.
    pub exposed_comm_s: f64,
    /// Optimizer collective calls per step.
    pub collectives: u64,
    /// Optimizer collective bytes (receive buffers) per tier name.
    pub tier_bytes: BTreeMap<String, u64>,
}

/// Peak device memory across every rank of the job (folded ranks counted once per rank).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MemorySpread {
    /// Lowest per-rank peak, bytes.
    pub min_bytes: u64,
    /// Mean per-rank peak, bytes.
    pub mean_bytes: u64,
    /// Highest per-rank peak, bytes.
    pub max_bytes: u64,
    /// A rank with the lowest peak.
    pub min_rank: usize,
    /// A rank with the highest peak.
    pub max_rank: usize,
}

impl MemorySpread {
    /// `max - min`, bytes.
    pub fn spread_bytes(&self) -> u64 {
        self.max_bytes - self.min_bytes.min(self.max_bytes)
    }
}

/// Collective calls of one category and kind on one tier issued by one rank.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CollectiveRow {
    /// What the calls are for (`fsdp-ag`, `tp`, `optimizer`, ...).
    #[serde(default)]
    pub category: String,
    /// Collective kind (`all-gather`, `reduce-scatter`, ...).
    pub kind: String,
    /// Tier name (`intra-machine`, ...).
    pub tier: String,
    /// Number of calls.
    pub count: u64,
    /// Bytes moved (sum of per-rank output bytes).
    pub bytes: u64,
}

/// Collective traffic of one rank on one tier.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TierRow {
    /// Tier name (`intra-machine`, ...).
    pub tier: String,
    /// Bytes moved on the tier.
    pub bytes: u64,
    /// Number of collective calls on the tier.
    pub collectives: u64,
}

/// The spans of one rank with op names, streams and categories resolved, so reports need not
/// look into the step program.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RankTimelineView {
    /// The rank the spans belong to.
    pub rank: usize,
    /// One entry per op, in any order.
    pub spans: Vec<SpanView>,
}

/// One op's execution interval on one rank.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SpanView {
    /// Op name (the program's name, or `op#N` when it has none).
    pub op: String,
    /// Stream name (`compute`, `all-gather`, `host`, ...).
    pub stream: String,
    /// Category name (`compute`, `fsdp-ag`, ...).
    pub category: String,
    /// Start, nanoseconds from the start of the step.
    pub start_ns: u64,
    /// End, nanoseconds from the start of the step.
    pub end_ns: u64,
    /// Bytes the op moves (collective output bytes, copy bytes), when it moves data.
    #[serde(default)]
    pub bytes: Option<u64>,
}

impl SpanView {
    /// Duration in nanoseconds (0 when the span is reversed).
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

impl RankTimelineView {
    /// Joins a rank's spans with its step program: each span's op id is resolved to the op's
    /// name, stream, category and bytes. Spans whose op id is not in the program are kept with
    /// stream and category `unknown`, so a mismatched input degrades instead of failing.
    pub fn from_program(program: &StepProgram, timeline: &RankTimeline) -> Self {
        let spans = timeline
            .spans
            .iter()
            .map(|span| match program.op(span.op) {
                Some(op) => SpanView {
                    op: op.name.clone().unwrap_or_else(|| span.op.to_string()),
                    stream: op.stream.name(),
                    category: op.category.name().to_string(),
                    start_ns: span.start_ns,
                    end_ns: span.end_ns,
                    bytes: match &op.payload {
                        Payload::Collective(c) => Some(c.output_bytes),
                        Payload::Copy(c) => Some(c.bytes),
                        Payload::Compute(_) | Payload::Host { .. } => None,
                    },
                },
                None => SpanView {
                    op: span.op.to_string(),
                    stream: "unknown".to_string(),
                    category: "unknown".to_string(),
                    start_ns: span.start_ns,
                    end_ns: span.end_ns,
                    bytes: None,
                },
            })
            .collect();
        RankTimelineView {
            rank: timeline.rank,
            spans,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_program::step::{Category, ComputeWork, OpSpan, ProgramBuilder, RankRange, Stream};

    #[test]
    fn from_program_resolves_ops() {
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
        b.name(c, "layers.0.fwd");
        let k = b.copy(Stream::Copy, 64, &[c]);
        let h = b.host(Category::Host, 5, &[]);
        let program = b.build().expect("valid program");
        let span = |op, s, e| OpSpan {
            op,
            start_ns: s,
            end_ns: e,
            launched_ns: None,
            transfer_start_ns: None,
        };
        let timeline = RankTimeline {
            rank: 0,
            represents: vec![RankRange { start: 0, end: 1 }],
            spans: vec![
                span(c, 0, 10),
                span(k, 10, 20),
                span(h, 0, 5),
                span(hpfsdp_program::step::OpId(99), 1, 2),
            ],
        };
        let view = RankTimelineView::from_program(&program, &timeline);
        assert_eq!(view.spans[0].op, "layers.0.fwd");
        assert_eq!(view.spans[0].stream, "compute");
        assert_eq!(view.spans[0].bytes, None);
        assert_eq!(view.spans[1].op, "op#1");
        assert_eq!(view.spans[1].category, "copy");
        assert_eq!(view.spans[1].bytes, Some(64));
        assert_eq!(view.spans[2].stream, "host");
        assert_eq!(view.spans[3].stream, "unknown");
    }
}
