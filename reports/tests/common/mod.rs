//! A small hand-made report shared by the integration tests.

use hpfsdp_reports::{
    CollectiveRow, MemorySpread, OptimizerFigures, RankTimelineView, SimReport, SpanView,
    StrategyRun, TierRow,
};
use std::collections::BTreeMap;

fn span(
    op: &str,
    stream: &str,
    category: &str,
    start_ns: u64,
    end_ns: u64,
    bytes: Option<u64>,
) -> SpanView {
    SpanView {
        op: op.into(),
        stream: stream.into(),
        category: category.into(),
        start_ns,
        end_ns,
        bytes,
    }
}

/// The collectives of a run: FSDP all-gathers inside a machine, one reduce-scatter across
/// supernodes.
fn collectives() -> Vec<CollectiveRow> {
    vec![
        CollectiveRow {
            category: "fsdp-ag".into(),
            kind: "all-gather".into(),
            tier: "intra-machine".into(),
            count: 2,
            bytes: 1 << 30,
        },
        CollectiveRow {
            category: "fsdp-rs".into(),
            kind: "reduce-scatter".into(),
            tier: "inter-supernode".into(),
            count: 1,
            bytes: 1 << 28,
        },
    ]
}

/// The bytes per tier of those collectives.
fn tier_rows() -> Vec<TierRow> {
    vec![
        TierRow {
            tier: "intra-machine".into(),
            bytes: 1 << 30,
            collectives: 2,
        },
        TierRow {
            tier: "inter-supernode".into(),
            bytes: 1 << 28,
            collectives: 1,
        },
    ]
}

/// Rank 0's spans: two layers' all-gathers overlapping compute, a copy, a reduce-scatter and
/// a host launch; `ns` scales the times.
fn rank0_timeline(ns: &dyn Fn(u64) -> u64) -> RankTimelineView {
    RankTimelineView {
        rank: 0,
        spans: vec![
            span(
                "layers.0.ag",
                "all-gather",
                "fsdp-ag",
                0,
                ns(1500),
                Some(1 << 29),
            ),
            span(
                "layers.0.fwd",
                "compute",
                "compute",
                ns(1500),
                ns(4000),
                None,
            ),
            span(
                "layers.1.ag",
                "all-gather",
                "fsdp-ag",
                ns(1500),
                ns(3000),
                Some(1 << 29),
            ),
            span("copy-in", "copy", "copy", ns(3000), ns(4000), Some(4096)),
            span(
                "layers.1.fwd",
                "compute",
                "compute",
                ns(4000),
                ns(7500),
                None,
            ),
            span(
                "layers.0.rs",
                "reduce-scatter",
                "fsdp-rs",
                ns(7500),
                ns(9500),
                Some(1 << 28),
            ),
            span("launch", "host", "host", 0, ns(2000), None),
        ],
    }
}

fn run(strategy: &str, scale: f64) -> StrategyRun {
    let ns = |x: u64| (x as f64 * scale) as u64;
    StrategyRun {
        strategy: strategy.into(),
        optimizer_name: "hyperparallel".into(),
        optimizer: Some(OptimizerFigures {
            range_s: 3e-6 * scale,
            busy_s: 2e-6 * scale,
            comm_s: 1e-6 * scale,
            exposed_comm_s: 0.5e-6 * scale,
            collectives: 4,
            tier_bytes: BTreeMap::from([("intra-machine".to_string(), 1 << 20)]),
        }),
        memory_spread: MemorySpread {
            min_bytes: 2 << 30,
            mean_bytes: (5 << 30) / 2,
            max_bytes: 3 << 30,
            min_rank: 1,
            max_rank: 0,
        },
        step_time_s: 10e-6 * scale,
        tokens_per_s: Some(1.0e6 / scale),
        mfu: Some(0.41 / scale),
        compute_s: 6e-6 * scale,
        copy_s: 1e-6 * scale,
        host_s: 2e-6 * scale,
        idle_s: 1e-6 * scale,
        comm_s: 5e-6 * scale,
        exposed_comm_s: 2e-6 * scale,
        exposed_comm_by_category_s: BTreeMap::from([
            ("fsdp-ag".to_string(), 1.5e-6 * scale),
            ("fsdp-rs".to_string(), 0.5e-6 * scale),
        ]),
        overlap_rate: 0.6,
        collectives: collectives(),
        tier_bytes: tier_rows(),
        peak_memory_bytes: 3 << 30,
        peak_memory_by_tag: BTreeMap::from([
            ("params".to_string(), 1 << 30),
            ("activations".to_string(), 2 << 30),
        ]),
        memory_fits: true,
        memory_series: vec![
            (0, 1 << 30),
            (ns(2000), 2 << 30),
            (ns(5000), 3 << 30),
            (ns(9000), 1 << 30),
        ],
        rank0_timeline: Some(rank0_timeline(&ns)),
    }
}

/// Two strategies, one with a name that needs escaping.
pub fn sample() -> SimReport {
    SimReport {
        scenario: "tiny & test".into(),
        description: "Two strategies <compared> on a toy model.".into(),
        hardware: "test-hw".into(),
        world_size: 16,
        runs: vec![run("hyperparallel", 1.0), run("fsdp2<script>", 1.3)],
        device_memory_bytes: Some(4 << 30),
        whatif: Vec::new(),
    }
}
