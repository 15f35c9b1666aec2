//! The figures `hpfsdp simulate` prints and writes, derived from one simulated strategy.
//!
//! One struct ([`StrategySummary`]) feeds the terminal table, the `--json` output and (through
//! [`to_report_run`]) the HTML/CSV/trace reports, so the three never disagree.

use hpfsdp_program::step::Category;
use hpfsdp_program::step::StepProgram;
use hpfsdp_reports::model as rm;
use hpfsdp_sim::SimResult;
use hpfsdp_sim::scenario_run::StrategyRun;
use serde::Serialize;
use std::collections::BTreeMap;

/// Collectives of one kind issued per step by the critical rank.
#[derive(Debug, Clone, Serialize)]
pub struct CollectiveSummary {
    /// Calls per step.
    pub count: u64,
    /// Receive-buffer bytes per step (all-gather output, reduce-scatter output, ...).
    pub output_bytes: u64,
}

/// Traffic of one tier per step on the critical rank.
#[derive(Debug, Clone, Serialize)]
pub struct TierSummary {
    /// Collectives whose group's slowest link is this tier.
    pub collectives: u64,
    /// Their receive-buffer bytes.
    pub bytes: u64,
}

/// The per-strategy figures of `hpfsdp simulate --json`.
#[derive(Debug, Clone, Serialize)]
pub struct StrategySummary {
    /// Strategy name.
    pub strategy: String,
    /// Optimizer strategy of the programs (`hyperparallel` distributed Muon, a Muon baseline,
    /// or `adamw`).
    pub optimizer: String,
    /// The optimizer step's range, busy time, communication and bytes per tier on the
    /// critical rank (absent without optimizer ops).
    pub optimizer_figures: Option<rm::OptimizerFigures>,
    /// Peak memory across every rank: min, mean, max and the ranks holding them.
    pub memory_spread: rm::MemorySpread,
    /// Predicted step time, seconds.
    pub step_time_s: f64,
    /// Tokens per second of the whole job.
    pub tokens_per_s: Option<f64>,
    /// Model FLOPs utilisation (recompute excluded).
    pub mfu: Option<f64>,
    /// Device compute time of the critical rank, seconds.
    pub compute_s: f64,
    /// Device copy time, seconds.
    pub copy_s: f64,
    /// Communication time (union of collective intervals), seconds.
    pub comm_s: f64,
    /// Exposed communication in total, seconds.
    pub exposed_comm_total_s: f64,
    /// Exposed communication per category (`fsdp-ag`, `fsdp-rs`, `fsdp-ar`, `tp`, `ep`, ...).
    pub exposed_comm_s: BTreeMap<String, f64>,
    /// Time no device stream works, seconds.
    pub idle_s: f64,
    /// Host thread busy time, seconds.
    pub host_s: f64,
    /// `1 - exposed / communication`.
    pub overlap_rate: f64,
    /// Highest peak allocated memory over ranks, bytes.
    pub peak_memory_bytes: u64,
    /// Peak memory by what it holds, on the rank with the highest peak.
    pub peak_memory_by_tag: BTreeMap<String, u64>,
    /// True when the peak fits the device memory.
    pub memory_fits: bool,
    /// Collectives per kind (`all-gather`, ...).
    pub collectives: BTreeMap<String, CollectiveSummary>,
    /// Traffic per tier (`intra-machine`, `intra-supernode`, `inter-supernode`).
    pub tier_bytes: BTreeMap<String, TierSummary>,
    /// The rank whose figures these are (the one that finished last).
    pub critical_rank: usize,
    /// Ranks simulated after symmetry folding, of `world_size`.
    pub simulated_ranks: usize,
    /// Ranks in the job.
    pub world_size: usize,
    /// Engine events processed.
    pub events: u64,
}

const NS: f64 = 1e-9;

/// Summarises one simulated strategy.
pub fn summarize(run: &StrategyRun) -> StrategySummary {
    let r = &run.result;
    let b = &r.breakdown;
    let exposed_comm_s = b
        .by_category
        .iter()
        .filter(|c| c.exposed_comm_ns > 0 || is_comm(c.category.name()))
        .map(|c| (c.category.name().to_string(), c.exposed_comm_ns as f64 * NS))
        .collect();
    let mut collectives: BTreeMap<String, CollectiveSummary> = BTreeMap::new();
    let mut tier_bytes: BTreeMap<String, TierSummary> = BTreeMap::new();
    if let Some(rank) = r.rank(r.critical_rank) {
        for c in &rank.collectives {
            let e = collectives
                .entry(c.kind.to_string())
                .or_insert(CollectiveSummary {
                    count: 0,
                    output_bytes: 0,
                });
            e.count += c.count;
            e.output_bytes += c.output_bytes;
            let t = tier_bytes.entry(c.tier.to_string()).or_insert(TierSummary {
                collectives: 0,
                bytes: 0,
            });
            t.collectives += c.count;
            t.bytes += c.output_bytes;
        }
    }
    let peak_rank = r
        .ranks
        .iter()
        .max_by_key(|x| (x.memory.peak_bytes, std::cmp::Reverse(x.rank)));
    let peak_memory_by_tag = peak_rank
        .map(|x| {
            x.memory
                .at_peak
                .iter()
                .map(|t| (t.tag.name().to_string(), t.bytes))
                .collect()
        })
        .unwrap_or_default();
    StrategySummary {
        strategy: run.strategy.clone(),
        optimizer: run.optimizer.clone(),
        optimizer_figures: optimizer_figures(r),
        memory_spread: memory_spread(r),
        step_time_s: r.step_time_s(),
        tokens_per_s: r.tokens_per_s,
        mfu: r.mfu,
        compute_s: b.compute_ns as f64 * NS,
        copy_s: b.copy_ns as f64 * NS,
        comm_s: b.comm_ns as f64 * NS,
        exposed_comm_total_s: b.exposed_comm_ns as f64 * NS,
        exposed_comm_s,
        idle_s: b.idle_ns as f64 * NS,
        host_s: b.host_busy_ns as f64 * NS,
        overlap_rate: b.overlap_rate,
        peak_memory_bytes: r.peak_memory_bytes,
        peak_memory_by_tag,
        memory_fits: r.memory_fits,
        collectives,
        tier_bytes,
        critical_rank: r.critical_rank,
        simulated_ranks: r.simulated_ranks,
        world_size: r.world_size,
        events: r.events_processed,
    }
}

/// The optimizer category's figures on the critical rank.
fn optimizer_figures(r: &SimResult) -> Option<rm::OptimizerFigures> {
    let rank = r.rank(r.critical_rank)?;
    let c = rank
        .breakdown
        .by_category
        .iter()
        .find(|c| c.category == Category::Optimizer)?;
    let mut tier_bytes: BTreeMap<String, u64> = BTreeMap::new();
    let mut collectives = 0;
    for s in rank
        .collectives
        .iter()
        .filter(|s| s.category == Category::Optimizer)
    {
        *tier_bytes.entry(s.tier.to_string()).or_default() += s.output_bytes;
        collectives += s.count;
    }
    Some(rm::OptimizerFigures {
        range_s: c.last_end_ns.saturating_sub(c.first_start_ns) as f64 * NS,
        busy_s: c.busy_ns as f64 * NS,
        comm_s: c.comm_busy_ns as f64 * NS,
        exposed_comm_s: c.exposed_comm_ns as f64 * NS,
        collectives,
        tier_bytes,
    })
}

/// Peak memory over every rank of the job: each simulated rank counts once per rank it
/// stands for.
fn memory_spread(r: &SimResult) -> rm::MemorySpread {
    let mut out = rm::MemorySpread {
        min_bytes: u64::MAX,
        ..rm::MemorySpread::default()
    };
    let (mut total, mut ranks) = (0u128, 0u128);
    for x in &r.ranks {
        let n: usize = x.represents.iter().map(|g| g.end - g.start).sum();
        let peak = x.memory.peak_bytes;
        total += peak as u128 * n as u128;
        ranks += n as u128;
        if peak < out.min_bytes || (peak == out.min_bytes && x.rank < out.min_rank) {
            out.min_bytes = peak;
            out.min_rank = x.rank;
        }
        if peak > out.max_bytes || (peak == out.max_bytes && x.rank < out.max_rank) {
            out.max_bytes = peak;
            out.max_rank = x.rank;
        }
    }
    if ranks == 0 {
        return rm::MemorySpread::default();
    }
    out.mean_bytes = (total / ranks) as u64;
    out
}

fn is_comm(category: &str) -> bool {
    matches!(
        category,
        "fsdp-ag" | "fsdp-rs" | "fsdp-ar" | "tp" | "ep" | "cp" | "pp" | "optimizer"
    )
}

/// Converts a summary plus its run into the reports crate's model (adds rank 0's timeline and
/// the memory series).
pub fn to_report_run(summary: &StrategySummary, run: &StrategyRun) -> rm::StrategyRun {
    let r = &run.result;
    let memory_series = r
        .rank(0)
        .map(|x| {
            x.memory
                .series
                .iter()
                .map(|s| (s.time_ns, s.live_bytes))
                .collect()
        })
        .unwrap_or_default();
    rm::StrategyRun {
        strategy: summary.strategy.clone(),
        optimizer_name: summary.optimizer.clone(),
        optimizer: summary.optimizer_figures.clone(),
        memory_spread: summary.memory_spread.clone(),
        step_time_s: summary.step_time_s,
        tokens_per_s: summary.tokens_per_s,
        mfu: summary.mfu,
        compute_s: summary.compute_s,
        copy_s: summary.copy_s,
        host_s: summary.host_s,
        idle_s: summary.idle_s,
        comm_s: summary.comm_s,
        exposed_comm_s: summary.exposed_comm_total_s,
        exposed_comm_by_category_s: summary.exposed_comm_s.clone(),
        overlap_rate: summary.overlap_rate,
        collectives: r
            .rank(r.critical_rank)
            .map(|x| {
                x.collectives
                    .iter()
                    .map(|c| rm::CollectiveRow {
                        category: c.category.name().to_string(),
                        kind: c.kind.to_string(),
                        tier: c.tier.to_string(),
                        count: c.count,
                        bytes: c.output_bytes,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        tier_bytes: summary
            .tier_bytes
            .iter()
            .map(|(tier, t)| rm::TierRow {
                tier: tier.clone(),
                bytes: t.bytes,
                collectives: t.collectives,
            })
            .collect(),
        peak_memory_bytes: summary.peak_memory_bytes,
        peak_memory_by_tag: summary.peak_memory_by_tag.clone(),
        memory_fits: summary.memory_fits,
        memory_series,
        rank0_timeline: rank0_view(&run.rank0_program, run),
    }
}

fn rank0_view(program: &StepProgram, run: &StrategyRun) -> Option<rm::RankTimelineView> {
    let timeline = run.result.timeline.as_ref()?.rank(0)?;
    Some(rm::RankTimelineView::from_program(program, timeline))
}
