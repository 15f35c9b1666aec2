//! Simulation results: step time, breakdowns, traffic, memory and the predicted timeline.

use crate::SIM_VERSION;
use crate::memory::MemoryReport;
use crate::metrics::{Breakdown, breakdown};
use crate::profile::HardwareProfile;
use crate::sim_options::SimOptions;
use crate::workload::Workload;
use hpfsdp_plan::{CollectiveKind, Tier};
use hpfsdp_program::step::{
    Category, Op, OpSpan, Payload, RankRange, RankTimeline, SharedOps, StepProgram, Timeline,
    TimelineKind, TimelineSource,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Collectives of one kind on one tier issued by one rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveStats {
    /// What the collectives are for (FSDP gather, TP, optimizer, ...).
    pub category: Category,
    /// The kind.
    pub kind: CollectiveKind,
    /// The tier (slowest link of the group).
    pub tier: Tier,
    /// Number of calls.
    pub count: u64,
    /// Sum of per-rank input bytes.
    pub input_bytes: u64,
    /// Sum of per-rank output bytes.
    pub output_bytes: u64,
}

/// Results of one simulated rank (standing for every rank in `represents`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankResult {
    /// The representative rank.
    pub rank: usize,
    /// Every rank this result stands for.
    pub represents: Vec<RankRange>,
    /// When the rank's last op ended, nanoseconds.
    pub end_ns: u64,
    /// Time breakdown over the job's step time (an empty one for ranks other than the
    /// critical rank when [`SimOptions::all_ranks`] is off).
    pub breakdown: Breakdown,
    /// Collective counts and bytes per (kind, tier), sorted.
    pub collectives: Vec<CollectiveStats>,
    /// Live-memory figures.
    pub memory: MemoryReport,
    /// Launch counts of the rank's step program.
    #[serde(default)]
    pub launches: LaunchCounts,
}

/// What one rank's step launches: device kernels (compute and copies, communication
/// excluded, as the profiler's device-kernel count of experiment A), collectives and host
/// synchronisations. `calibrate` prints them next to the measured counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LaunchCounts {
    /// Device kernels per step (compute and copy kernels).
    pub device_kernels: u64,
    /// Driver device-to-device copies per step (`CopyWork::memcpys`: listed by a profiler as
    /// memcpy, not as kernels).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memcpys: u64,
    /// Collectives per step.
    pub collectives: u64,
    /// Host ops that wait for device work (device -> host synchronisations and host work).
    pub host_ops: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl LaunchCounts {
    /// Counts the launches of `program`.
    pub fn of(program: &hpfsdp_program::step::StepProgram) -> Self {
        let mut c = Self::default();
        for op in &program.ops {
            c.add(op);
        }
        c
    }

    /// Counts the launches of one more op.
    fn add(&mut self, op: &Op) {
        match &op.payload {
            Payload::Compute(w) => self.device_kernels += w.kernels as u64,
            Payload::Copy(w) => {
                self.device_kernels += u64::from(w.kernels);
                self.memcpys += u64::from(w.memcpys);
            }
            Payload::Collective(_) => self.collectives += 1,
            Payload::Host { .. } => self.host_ops += 1,
        }
    }
}

/// Collective totals (count, input bytes, output bytes) by (category index, kind, tier).
type CollTotals = BTreeMap<(usize, CollectiveKind, Tier), (u64, u64, u64)>;

/// What a rank's report counts over its ops: collective totals and launches.
#[derive(Debug, Clone, Default)]
struct Tally {
    collectives: CollTotals,
    launches: LaunchCounts,
}

impl Tally {
    /// Adds `ops`. Consecutive collectives of one (category, kind, tier) are summed before
    /// they go into the map (a Muon tail is thousands of relay collectives in a row); the
    /// totals are sums, so the grouping changes nothing.
    fn add<'a>(&mut self, ops: impl Iterator<Item = &'a Op>) {
        type Run = ((usize, CollectiveKind, Tier), (u64, u64, u64));
        let mut run: Option<Run> = None;
        let flush = |map: &mut CollTotals, run: Option<Run>| {
            if let Some((key, (n, input, output))) = run {
                let e = map.entry(key).or_default();
                e.0 += n;
                e.1 += input;
                e.2 += output;
            }
        };
        for op in ops {
            if let Payload::Collective(c) = &op.payload {
                let category = Category::ALL
                    .iter()
                    .position(|&x| x == op.category)
                    .unwrap_or(0);
                let key = (category, c.kind, c.tier);
                match &mut run {
                    Some((k, t)) if *k == key => {
                        t.0 += 1;
                        t.1 += c.input_bytes;
                        t.2 += c.output_bytes;
                    }
                    _ => {
                        flush(&mut self.collectives, run.take());
                        run = Some((key, (1, c.input_bytes, c.output_bytes)));
                    }
                }
            }
            self.launches.add(op);
        }
        flush(&mut self.collectives, run);
    }
}

/// Tallies of programs, the shared op prefix of each counted once ([`OpSeq`]): the sums are
/// the same whatever the split, and on a folded Muon job hundreds of units share a prefix of
/// tens of thousands of ops. A program whose ops are the very storage of an earlier one's
/// (a relabelled copy, `OpSeq::share_tail`) gets that program's tally.
#[derive(Default)]
struct Tallies {
    /// By prefix address (the prefix kept alive, so an address is never reused).
    prefixes: HashMap<usize, (Arc<SharedOps>, Tally)>,
    /// By (prefix address, tail address, tail length): equal keys are the same op storage
    /// (the programs outlive the tallies, so an address is not reused meanwhile; an empty
    /// tail adds nothing).
    programs: HashMap<(usize, usize, usize), Tally>,
}

impl Tallies {
    fn of(&mut self, program: &StepProgram) -> Tally {
        let Some(shared) = program.ops.shared() else {
            let mut t = Tally::default();
            t.add(program.ops.iter());
            return t;
        };
        let tail = program.ops.tail();
        let id = (
            Arc::as_ptr(shared) as usize,
            tail.as_ptr() as usize,
            tail.len(),
        );
        if let Some(t) = self.programs.get(&id) {
            return t.clone();
        }
        let (_, base) = self
            .prefixes
            .entry(Arc::as_ptr(shared) as usize)
            .or_insert_with(|| {
                let mut t = Tally::default();
                t.add(shared.ops.iter());
                (shared.clone(), t)
            });
        let mut t = base.clone();
        t.add(program.ops.iter_from(program.ops.prefix_len()));
        self.programs.insert(id, t.clone());
        t
    }
}

/// The prediction for one training step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimResult {
    /// Simulator version.
    pub simulator: String,
    /// Hardware profile name.
    pub profile: String,
    /// Ranks in the job.
    pub world_size: usize,
    /// Ranks actually simulated (symmetry classes).
    pub simulated_ranks: usize,
    /// True when symmetric ranks were folded.
    pub folded: bool,
    /// Step time: the latest op end over all ranks, nanoseconds.
    pub step_time_ns: u64,
    /// The rank that finished last (lowest on ties); the summary figures are its own.
    pub critical_rank: usize,
    /// Breakdown of the critical rank.
    pub breakdown: Breakdown,
    /// Tokens per second, when tokens per step were given.
    pub tokens_per_s: Option<f64>,
    /// Model FLOPs utilisation, when model FLOPs per step were given.
    pub mfu: Option<f64>,
    /// Highest peak memory over all ranks, bytes.
    pub peak_memory_bytes: u64,
    /// True when that peak fits in the device's HBM capacity.
    pub memory_fits: bool,
    /// Per simulated rank, ascending.
    pub ranks: Vec<RankResult>,
    /// Predicted per-op spans of every simulated rank (absent when not recorded).
    pub timeline: Option<Timeline>,
    /// Events the engine processed.
    pub events_processed: u64,
}

impl SimResult {
    /// Step time in seconds.
    pub fn step_time_s(&self) -> f64 {
        self.step_time_ns as f64 * 1e-9
    }

    /// The result of the simulated rank standing for `rank`.
    pub fn rank(&self, rank: usize) -> Option<&RankResult> {
        self.ranks.iter().find(|r| {
            r.represents
                .iter()
                .any(|x| (x.start..x.end).contains(&rank))
        })
    }

    /// Collective stats of the critical rank summed per tier: (tier, count, output bytes).
    pub fn traffic_per_tier(&self) -> Vec<(Tier, u64, u64)> {
        let mut out: BTreeMap<Tier, (u64, u64)> = BTreeMap::new();
        if let Some(r) = self.rank(self.critical_rank) {
            for c in &r.collectives {
                let e = out.entry(c.tier).or_default();
                e.0 += c.count;
                e.1 += c.output_bytes;
            }
        }
        out.into_iter().map(|(t, (n, b))| (t, n, b)).collect()
    }
}

/// What the engine hands over per simulated rank.
#[derive(Debug, Clone)]
pub(crate) struct UnitOutcome {
    /// Spans of every op; empty when the result does not keep them (see
    /// [`SimOptions::all_ranks`]).
    pub spans: Vec<OpSpan>,
    /// When the unit's last op ended.
    pub end_ns: u64,
    pub host_busy_ns: u64,
    pub memory: MemoryReport,
}

pub(crate) fn assemble(
    workload: &Workload,
    profile: &HardwareProfile,
    options: &SimOptions,
    outcomes: Vec<UnitOutcome>,
    events_processed: u64,
) -> SimResult {
    let ends: Vec<u64> = outcomes.iter().map(|o| o.end_ns).collect();
    let critical_u = critical_unit(workload, &ends);
    let step_time_ns = ends.iter().copied().max().unwrap_or(0);
    let mut ranks = Vec::with_capacity(outcomes.len());
    let mut timeline = Vec::new();
    let mut tallies = Tallies::default();
    for (u, ((unit, outcome), end_ns)) in workload.units.iter().zip(outcomes).zip(ends).enumerate()
    {
        let program = &unit.program;
        let Tally {
            collectives: stats,
            launches,
        } = tallies.of(program);
        ranks.push(RankResult {
            rank: program.rank,
            represents: unit.ranks.clone(),
            end_ns,
            breakdown: if options.all_ranks || critical_u == Some(u) {
                breakdown(program, &outcome.spans, step_time_ns, outcome.host_busy_ns)
            } else {
                crate::metrics::breakdown(&empty_program(), &[], 0, 0)
            },
            collectives: stats
                .into_iter()
                .map(
                    |((category, kind, tier), (count, input_bytes, output_bytes))| {
                        CollectiveStats {
                            category: Category::ALL[category],
                            kind,
                            tier,
                            count,
                            input_bytes,
                            output_bytes,
                        }
                    },
                )
                .collect(),
            memory: if options.all_ranks || !outcome.spans.is_empty() {
                outcome.memory
            } else {
                MemoryReport {
                    series: Vec::new(),
                    ..outcome.memory
                }
            },
            launches,
        });
        if options.record_timeline && (options.all_ranks || !outcome.spans.is_empty()) {
            timeline.push(RankTimeline {
                rank: program.rank,
                represents: unit.ranks.clone(),
                spans: outcome.spans,
            });
        }
    }
    let critical = ranks
        .iter()
        .max_by_key(|r| (r.end_ns, std::cmp::Reverse(r.rank)))
        .map_or(0, |r| r.rank);
    let breakdown = ranks
        .iter()
        .find(|r| r.rank == critical)
        .map(|r| r.breakdown.clone())
        .unwrap_or_else(|| crate::metrics::breakdown(&empty_program(), &[], 0, 0));
    let peak_memory_bytes = ranks.iter().map(|r| r.memory.peak_bytes).max().unwrap_or(0);
    let step_s = step_time_ns as f64 * 1e-9;
    let per_s = |x: f64| (step_s > 0.0).then(|| x / step_s);
    SimResult {
        simulator: format!("hpfsdp-sim {SIM_VERSION}"),
        profile: profile.name.clone(),
        world_size: workload.world_size,
        simulated_ranks: workload.units.len(),
        folded: workload.folded,
        step_time_ns,
        critical_rank: critical,
        breakdown,
        tokens_per_s: options.tokens_per_step.and_then(|t| per_s(t as f64)),
        mfu: options.model_flops_per_step.and_then(|f| {
            per_s(f).map(|fps| fps / (workload.world_size as f64 * profile.device.bf16_flops_per_s))
        }),
        peak_memory_bytes,
        memory_fits: peak_memory_bytes <= profile.device.hbm_capacity_bytes,
        ranks,
        timeline: options.record_timeline.then(|| Timeline {
            source: TimelineSource {
                kind: TimelineKind::Predicted,
                producer: format!("hpfsdp-sim {SIM_VERSION} / {}", profile.name),
            },
            ranks: timeline,
        }),
        events_processed,
    }
}

/// The unit that finished last (lowest representative rank on ties); `None` without units.
pub(crate) fn critical_unit(workload: &Workload, ends: &[u64]) -> Option<usize> {
    (0..ends.len()).max_by_key(|&u| (ends[u], std::cmp::Reverse(workload.units[u].program.rank)))
}

fn empty_program() -> hpfsdp_program::step::StepProgram {
    hpfsdp_program::step::StepProgram {
        rank: 0,
        groups: Vec::new(),
        resident: Vec::new(),
        ops: Default::default(),
        kernel_mixes: Default::default(),
    }
}
