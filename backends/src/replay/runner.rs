//! Running a replay: every rank walks its own step program for warm-up plus measured steps,
//! then the measured spans are gathered on rank 0 and turned into a measured [`Timeline`].

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use hpfsdp_program::step::{
    OpSpan, Payload, RankRange, RankTimeline, StepProgram, Timeline, TimelineKind, TimelineSource,
};

use crate::collective::Collective;
use crate::group::Group;
use crate::inproc::InProcWorld;
use crate::replay::fault::{FaultBoard, FaultCause, FaultOp, RankFault, ReplayError};
use crate::replay::gather::{RankMeasurement, gather_measurements};
use crate::replay::options::{FaultKind, ReplayOptions};
use crate::replay::walker::{Walker, idle_wait};

/// What one rank replays: its step program and the busy duration of each op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayRank {
    /// The rank's step program (the one the simulator times).
    pub program: StepProgram,
    /// Nanoseconds each op keeps the CPU busy (compute, copy: the predicted span; host: its
    /// duration; collectives: unused, 0). One entry per op.
    pub op_ns: Vec<u64>,
    /// Nanoseconds the predicted host spends launching each op (the time between the host
    /// finishing the previous op and this one; 0 for host ops and where the prediction has
    /// no launch times). The device walker's busy mode spends them before each launch.
    pub launch_ns: Vec<u64>,
}

impl ReplayRank {
    /// Takes busy durations from a predicted timeline of the same program: compute and copy
    /// ops last as long as their predicted span, host ops their planned duration.
    pub fn from_prediction(
        program: StepProgram,
        predicted: &RankTimeline,
    ) -> Result<Self, ReplayError> {
        let mut op_ns = vec![0u64; program.ops.len()];
        let mut launched = vec![None; program.ops.len()];
        let mut seen = vec![false; program.ops.len()];
        for s in &predicted.spans {
            let i = s.op.index();
            if i < op_ns.len() {
                op_ns[i] = s.end_ns.saturating_sub(s.start_ns);
                launched[i] = s.launched_ns;
                seen[i] = true;
            }
        }
        let mut launch_ns = vec![0u64; program.ops.len()];
        let mut host_at = 0u64;
        for (i, op) in program.ops.iter().enumerate() {
            let Some(at) = launched[i] else { continue };
            if !matches!(op.payload, Payload::Host { .. }) {
                launch_ns[i] = at.saturating_sub(host_at);
            }
            host_at = at;
        }
        for (i, op) in program.ops.iter().enumerate() {
            match op.payload {
                Payload::Host { duration_ns } => op_ns[i] = duration_ns,
                Payload::Collective(_) => op_ns[i] = 0,
                Payload::Compute(_) | Payload::Copy(_) if !seen[i] => {
                    return Err(ReplayError::Setup(format!(
                        "rank {}: the prediction has no span for op #{i}; predict with the same program",
                        program.rank
                    )));
                }
                _ => {}
            }
        }
        Ok(Self {
            program,
            op_ns,
            launch_ns,
        })
    }
}

/// Peak bytes of communication buffers one rank holds: at most one collective in flight per
/// stream, each holding its send and receive buffers, doubled for backend staging (the
/// in-process backend keeps every member's contribution and output until all have taken
/// theirs). A pre-flight estimate, so a replay too big for the machine is refused with a
/// message instead of aborting on a failed allocation.
pub fn buffer_bytes_estimate(rank: &ReplayRank) -> u64 {
    let mut per_stream: std::collections::BTreeMap<hpfsdp_program::step::Stream, u64> =
        std::collections::BTreeMap::new();
    for op in &rank.program.ops {
        if let Payload::Collective(c) = &op.payload {
            let e = per_stream.entry(op.stream).or_default();
            *e = (*e).max(c.input_bytes + c.output_bytes);
        }
    }
    2 * per_stream.values().sum::<u64>()
}

/// Checks an injected fault against the programs: rank and op exist, and a mismatch names a
/// collective.
pub fn check_injection(ranks: &[ReplayRank], options: &ReplayOptions) -> Result<(), ReplayError> {
    let Some(f) = options.fault else {
        return Ok(());
    };
    let Some(r) = ranks.iter().find(|r| r.program.rank == f.rank) else {
        return Err(ReplayError::Setup(format!(
            "--inject-fault: rank {} is not one of the {} replayed ranks",
            f.rank,
            ranks.len()
        )));
    };
    let Some(op) = r.program.ops.get(f.op) else {
        return Err(ReplayError::Setup(format!(
            "--inject-fault: rank {} has {} ops; op #{} does not exist",
            f.rank,
            r.program.ops.len(),
            f.op
        )));
    };
    if f.kind == FaultKind::Mismatch && !matches!(op.payload, Payload::Collective(_)) {
        return Err(ReplayError::Setup(format!(
            "--inject-fault {}:{}:mismatch: op #{} is not a collective; pick a collective op",
            f.rank, f.op, f.op
        )));
    }
    Ok(())
}

/// One rank's step walker: the host walker ([`Walker`]) or, on accelerator backends, the
/// device walker (`replay::device::DeviceWalker`).
pub trait StepWalk {
    /// Walks one step (warm-up included in the count) and returns one span per op.
    fn walk_step(&mut self, step: usize) -> Result<Vec<OpSpan>, RankFault>;
    /// The op being executed, for naming the op of a panic.
    fn current(&self) -> Option<usize>;
    /// What op `i` does in step `step`, for fault messages.
    fn describe_at(&self, i: usize, step: usize) -> FaultOp;
}

impl<C: Collective + ?Sized> StepWalk for Walker<'_, C> {
    fn walk_step(&mut self, step: usize) -> Result<Vec<OpSpan>, RankFault> {
        self.walk(step)
    }
    fn current(&self) -> Option<usize> {
        self.current_op
    }
    fn describe_at(&self, i: usize, step: usize) -> FaultOp {
        self.describe(i, step)
    }
}

/// Runs warm-up and measured steps of `rank` on `comm`, then gathers every rank's spans on
/// rank 0 (which gets `Some`). Faults are posted on `board` (shared by the ranks of one
/// process) so the other ranks stop; the error lists every fault the board holds.
pub fn run_rank<C: Collective + ?Sized>(
    comm: &C,
    rank: &ReplayRank,
    options: &ReplayOptions,
    board: &FaultBoard,
) -> Result<Option<Vec<RankMeasurement>>, ReplayError> {
    let walker = Walker::new(comm, &rank.program, &rank.op_ns, options, board)
        .map_err(|m| post_setup(comm, board, m))?;
    run_steps(comm, rank, options, board, walker)
}

/// Posts a set-up failure of this rank and returns the board's error.
pub(crate) fn post_setup<C: Collective + ?Sized>(
    comm: &C,
    board: &FaultBoard,
    message: String,
) -> ReplayError {
    board.post(RankFault {
        rank: comm.rank(),
        cause: FaultCause::Died,
        op: None,
        message,
    });
    ReplayError::from_faults(board.faults())
}

/// Creates the communicators, walks warm-up and measured steps with `walker`, and gathers the
/// measured spans on rank 0 (see [`run_rank`]).
pub fn run_steps<C: Collective + ?Sized>(
    comm: &C,
    rank: &ReplayRank,
    options: &ReplayOptions,
    board: &FaultBoard,
    mut walker: impl StepWalk,
) -> Result<Option<Vec<RankMeasurement>>, ReplayError> {
    let fail = |fault: RankFault| {
        board.post(fault);
        ReplayError::from_faults(board.faults())
    };
    let setup = |message: String| post_setup(comm, board, message);
    let world = Group::world(comm.world_size()).map_err(|e| setup(e.to_string()))?;
    // Communicators up front: collectives are issued asynchronously, so two ranks may first
    // use two shared groups in different orders.
    let mut groups = vec![world.clone()];
    for g in &rank.program.groups {
        groups
            .push(Group::new(g.label.clone(), g.ranks.clone()).map_err(|e| setup(e.to_string()))?);
    }
    comm.prepare_groups(&groups)
        .map_err(|e| setup(format!("creating the communicators: {e}")))?;
    let mut measured = Vec::with_capacity(options.steps);
    for step in 0..options.warmup + options.steps.max(1) {
        sync_world(comm, &world, board).map_err(setup)?;
        let walked = catch_unwind(AssertUnwindSafe(|| walker.walk_step(step)));
        let spans = match walked {
            Ok(Ok(spans)) => spans,
            Ok(Err(fault)) => return Err(fail(fault)),
            Err(payload) => {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                return Err(fail(RankFault {
                    rank: comm.rank(),
                    cause: FaultCause::Died,
                    op: walker.current().map(|i| walker.describe_at(i, step)),
                    message: format!("panicked: {message}"),
                }));
            }
        };
        if step >= options.warmup {
            measured.push(spans);
        }
    }
    let mine = RankMeasurement {
        rank: comm.rank(),
        steps: measured,
    };
    gather_measurements(comm, &mine).map_err(|e| setup(format!("gathering spans: {e}")))
}

/// A world barrier that gives up when another rank of this process faulted.
fn sync_world<C: Collective + ?Sized>(
    comm: &C,
    world: &Group,
    board: &FaultBoard,
) -> Result<(), String> {
    let h = comm
        .barrier(world)
        .map_err(|e| format!("step barrier: {e}"))?;
    let mut idle = 0;
    while !h.is_complete() {
        if board.aborted() {
            return Err("stopped at the step barrier because another rank faulted".into());
        }
        idle_wait(&mut idle);
    }
    h.wait()
        .map(|_| ())
        .map_err(|e| format!("step barrier: {e}"))
}

/// Replays `ranks` (one per rank, ascending, covering the world) as threads of this process
/// on the in-process backend. Returns rank 0's gathered measurements.
pub fn replay_inproc(
    ranks: &[ReplayRank],
    options: &ReplayOptions,
) -> Result<Vec<RankMeasurement>, ReplayError> {
    for (i, r) in ranks.iter().enumerate() {
        if r.program.rank != i {
            return Err(ReplayError::Setup(format!(
                "programs must be given for ranks 0..{} in order; entry {i} is rank {}",
                ranks.len(),
                r.program.rank
            )));
        }
    }
    check_injection(ranks, options)?;
    let board = Arc::new(FaultBoard::new());
    let world = InProcWorld::new(ranks.len())
        .map_err(|e| ReplayError::Setup(e.to_string()))?
        .with_timeout(options.timeout);
    let run = world.launch(|comm| run_rank(comm, &ranks[comm.rank()], options, &board));
    let faults = board.faults();
    if !faults.is_empty() {
        return Err(ReplayError::from_faults(faults));
    }
    let run = run.map_err(|e| ReplayError::Setup(e.to_string()))?;
    let mut results = run.results.into_iter();
    match results.next() {
        Some(Ok(Some(all))) => Ok(all),
        Some(Err(e)) => Err(e),
        _ => Err(ReplayError::Setup("rank 0 gathered no measurements".into())),
    }
}

/// The measured steps of a replay, condensed for reports.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredSteps {
    /// Spans of the representative step (the median step) of every rank.
    pub timeline: Timeline,
    /// Step time of every measured step (latest span end over the ranks), nanoseconds.
    pub step_ns: Vec<u64>,
    /// Which measured step the timeline shows.
    pub shown_step: usize,
}

/// Picks the median measured step (by step time over all ranks; the lower median for an even
/// count) and builds the measured [`Timeline`] of it, labelled with `producer`.
pub fn measured_timeline(all: &[RankMeasurement], producer: &str) -> MeasuredSteps {
    let steps = all.iter().map(|m| m.steps.len()).min().unwrap_or(0);
    let step_ns: Vec<u64> = (0..steps)
        .map(|k| {
            all.iter()
                .flat_map(|m| m.steps[k].iter().map(|s| s.end_ns))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut order: Vec<usize> = (0..steps).collect();
    order.sort_by_key(|&k| (step_ns[k], k));
    let shown_step = order.get(steps.saturating_sub(1) / 2).copied().unwrap_or(0);
    let ranks = all
        .iter()
        .map(|m| RankTimeline {
            rank: m.rank,
            represents: vec![RankRange {
                start: m.rank,
                end: m.rank + 1,
            }],
            spans: m.steps.get(shown_step).cloned().unwrap_or_default(),
        })
        .collect();
    MeasuredSteps {
        timeline: Timeline {
            source: TimelineSource {
                kind: TimelineKind::Measured,
                producer: producer.to_string(),
            },
            ranks,
        },
        step_ns,
        shown_step,
    }
}

/// Checks that every measured op started no earlier than each of its dependencies ended;
/// returns the violations as `(rank, op, dep)`.
pub fn dependency_violations(
    programs: &[StepProgram],
    timeline: &Timeline,
) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for p in programs {
        let Some(t) = timeline.rank(p.rank) else {
            continue;
        };
        let spans: Vec<&OpSpan> = t.spans.iter().collect();
        for op in &p.ops {
            let Some(s) = spans.get(op.id.index()) else {
                continue;
            };
            for d in &op.deps {
                if let Some(ds) = spans.get(d.index())
                    && s.start_ns < ds.end_ns
                {
                    out.push((p.rank, op.id.index(), d.index()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_program::step::{Category, ComputeWork, OpId, ProgramBuilder};

    /// Launch costs are the predicted host's time between consecutive launches; host ops
    /// (whose time is their duration) cost none.
    #[test]
    fn launch_costs_come_from_the_predicted_host_timeline() {
        let mut b = ProgramBuilder::new(0);
        let c0 = b.compute(ComputeWork::memory_bound(0, 64, 3), &[]);
        let h = b.host(Category::Host, 500, &[c0]);
        b.compute(ComputeWork::memory_bound(0, 64, 1), &[h]);
        let program = b.build().unwrap();
        let span = |op: u32, start_ns, end_ns, launched| OpSpan {
            op: OpId(op),
            start_ns,
            end_ns,
            launched_ns: Some(launched),
            transfer_start_ns: None,
        };
        let predicted = RankTimeline {
            rank: 0,
            represents: vec![RankRange { start: 0, end: 1 }],
            // compute launched at 30 ns (3 kernels), host op 100..600, compute launched at 610.
            spans: vec![
                span(0, 30, 100, 30),
                span(1, 100, 600, 600),
                span(2, 610, 700, 610),
            ],
        };
        let r = ReplayRank::from_prediction(program, &predicted).unwrap();
        assert_eq!(r.op_ns, vec![70, 500, 90]);
        assert_eq!(r.launch_ns, vec![30, 0, 10]);
    }
}
