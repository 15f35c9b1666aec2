//! The per-rank program walker: executes one step of a rank's step program on a backend.
//!
//! Execution model (the simulator's, on one CPU thread per rank):
//! - the **host** launches ops in program order; a [`Stream::Host`] op blocks the host until
//!   its dependencies finished, then runs for its duration;
//! - every device **stream** runs its launched ops one at a time in launch order; an op starts
//!   when its dependencies finished and the stream's previous op finished;
//! - a **collective** starts by being issued on the backend (asynchronously) and ends when its
//!   handle completes; collectives of one process group are issued in program order, the
//!   matching rule of NCCL/HCCL communicators; its span starts when this rank issued it, so it
//!   includes waiting for peers, as the predicted span does;
//! - **compute and copy** ops run on the rank's thread (busy or real work, see
//!   [`crate::replay::work`]), one at a time (a CPU rank has one core, so kernels of different
//!   streams serialize); while one runs (or a host op runs), in-flight collectives are polled,
//!   so their end times are recorded when they happen, and ready collectives are issued, so
//!   communication overlaps compute as it would on a device.
//!
//! A collective that fails (mismatch, dead peer, timeout), an injected fault or a fault posted
//! by another rank ends the walk with a [`RankFault`] naming the op.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use hpfsdp_program::step::{OpSpan, Payload, StepProgram, Stream};

use crate::collective::{Collective, Handle};
use crate::error::CommError;
use crate::group::Group;
use crate::replay::fault::{FaultBoard, FaultCause, FaultOp, RankFault};
use crate::replay::issue::{issue, recycle};
use crate::replay::options::{ComputeMode, FaultInjection, FaultKind, ReplayOptions};
use crate::replay::pool::BufferPool;
use crate::replay::work::{GemmScratch, copy_bytes, gemm_flops, spin_for};

/// One issued collective waiting for completion.
struct InFlight {
    op: usize,
    stream: Stream,
    handles: Vec<Handle>,
    issued: Instant,
}

/// The state of one step being walked.
struct StepState {
    step: usize,
    t0: Instant,
    start_ns: Vec<Option<u64>>,
    end_ns: Vec<Option<u64>>,
    launched_ns: Vec<Option<u64>>,
    queues: BTreeMap<Stream, VecDeque<usize>>,
    busy_streams: BTreeMap<Stream, usize>,
    group_cursor: Vec<usize>,
    in_flight: Vec<InFlight>,
    next_launch: usize,
    done: usize,
    fault: Option<RankFault>,
}

impl StepState {
    fn now_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }
}

/// Walks steps of one rank's program on one backend communicator.
pub struct Walker<'a, C: Collective + ?Sized> {
    comm: &'a C,
    program: &'a StepProgram,
    op_ns: &'a [u64],
    groups: Vec<Group>,
    group_ops: Vec<Vec<usize>>,
    pool: BufferPool,
    scratch: GemmScratch,
    options: &'a ReplayOptions,
    board: &'a FaultBoard,
    fault: Option<FaultInjection>,
    /// The op being executed (for naming the op of a panic).
    pub current_op: Option<usize>,
}

impl<'a, C: Collective + ?Sized> Walker<'a, C> {
    /// A walker for `program` (whose rank must be the communicator's) with per-op busy
    /// durations `op_ns` (nanoseconds, one per op; ignored for collectives).
    pub fn new(
        comm: &'a C,
        program: &'a StepProgram,
        op_ns: &'a [u64],
        options: &'a ReplayOptions,
        board: &'a FaultBoard,
    ) -> Result<Self, String> {
        if program.rank != comm.rank() {
            return Err(format!(
                "the program is for rank {} but this process is rank {}",
                program.rank,
                comm.rank()
            ));
        }
        if op_ns.len() != program.ops.len() {
            return Err(format!(
                "rank {}: {} op durations for {} ops",
                program.rank,
                op_ns.len(),
                program.ops.len()
            ));
        }
        let groups = program_groups(program, comm.world_size())?;
        let mut group_ops = vec![Vec::new(); groups.len()];
        for (i, op) in program.ops.iter().enumerate() {
            if let Payload::Collective(c) = &op.payload {
                group_ops[c.group.index()].push(i);
            }
        }
        let fault = options.fault.filter(|f| f.rank == program.rank);
        Ok(Self {
            comm,
            program,
            op_ns,
            groups,
            group_ops,
            pool: BufferPool::new(),
            scratch: GemmScratch::new(),
            options,
            board,
            fault,
            current_op: None,
        })
    }

    /// What op `i` does in step `step`, for fault messages.
    pub fn describe(&self, i: usize, step: usize) -> FaultOp {
        describe_op(self.program, &self.groups, i, step)
    }

    fn fault_at(&self, st: &StepState, i: usize, cause: FaultCause, message: String) -> RankFault {
        RankFault {
            rank: self.program.rank,
            cause,
            op: Some(describe_op(self.program, &self.groups, i, st.step)),
            message,
        }
    }

    /// Walks one step; `step` counts from 0 with warm-up steps included. Returns one span
    /// per op in op-id order, times from the step's start.
    pub fn walk(&mut self, step: usize) -> Result<Vec<OpSpan>, RankFault> {
        let n = self.program.ops.len();
        let mut st = StepState {
            step,
            t0: Instant::now(),
            start_ns: vec![None; n],
            end_ns: vec![None; n],
            launched_ns: vec![None; n],
            queues: BTreeMap::new(),
            busy_streams: BTreeMap::new(),
            group_cursor: vec![0; self.groups.len()],
            in_flight: Vec::new(),
            next_launch: 0,
            done: 0,
            fault: None,
        };
        let mut idle = 0u32;
        while st.done < n {
            self.poll(&mut st);
            if let Some(f) = st.fault.take() {
                return Err(f);
            }
            let mut progressed = self.launch(&mut st)?;
            progressed |= self.run_device(&mut st)?;
            if self.board.aborted() {
                let i = (0..n).find(|&i| st.end_ns[i].is_none()).unwrap_or(0);
                return Err(self.fault_at(
                    &st,
                    i,
                    FaultCause::Aborted,
                    "stopped because another rank faulted".into(),
                ));
            }
            if progressed {
                idle = 0;
            } else {
                idle_wait(&mut idle);
            }
        }
        Ok((0..n)
            .map(|i| OpSpan {
                op: self.program.ops[i].id,
                start_ns: st.start_ns[i].unwrap_or(0),
                end_ns: st.end_ns[i].unwrap_or(0),
                launched_ns: st.launched_ns[i],
                transfer_start_ns: None,
            })
            .collect())
    }

    fn deps_done(&self, st: &StepState, i: usize) -> bool {
        self.program.ops[i]
            .deps
            .iter()
            .all(|d| st.end_ns[d.index()].is_some())
    }

    /// Host side: launch device ops in program order; run host ops when their deps are done.
    fn launch(&mut self, st: &mut StepState) -> Result<bool, RankFault> {
        let mut progressed = false;
        while st.next_launch < self.program.ops.len() {
            let i = st.next_launch;
            let op = &self.program.ops[i];
            if op.stream == Stream::Host {
                if !self.deps_done(st, i) {
                    break;
                }
                self.inject(st, i)?;
                st.launched_ns[i] = Some(st.now_ns());
                st.start_ns[i] = Some(st.now_ns());
                self.current_op = Some(i);
                let d = Duration::from_nanos(self.op_ns[i]);
                self.busy(st, d, None)?;
                st.end_ns[i] = Some(st.now_ns());
                st.done += 1;
            } else {
                st.launched_ns[i] = Some(st.now_ns());
                st.queues.entry(op.stream).or_default().push_back(i);
            }
            st.next_launch += 1;
            progressed = true;
        }
        Ok(progressed)
    }

    /// Device side: issue every ready collective, then run at most one ready compute or copy
    /// op (in-flight collectives keep being polled and issued while it runs).
    fn run_device(&mut self, st: &mut StepState) -> Result<bool, RankFault> {
        let issued = self.issue_collectives(st)?;
        Ok(self.run_one_kernel(st)? || issued)
    }

    /// The head op of `stream` when the stream is idle and the op's deps are done.
    fn ready_head(&self, st: &StepState, stream: Stream) -> Option<usize> {
        if st.busy_streams.contains_key(&stream) {
            return None;
        }
        let &i = st.queues.get(&stream)?.front()?;
        self.deps_done(st, i).then_some(i)
    }

    /// Issues the head collective of every idle stream whose deps are done and which is the
    /// next call on its group.
    fn issue_collectives(&mut self, st: &mut StepState) -> Result<bool, RankFault> {
        let streams: Vec<Stream> = st.queues.keys().copied().collect();
        let mut progressed = false;
        for stream in streams {
            let Some(i) = self.ready_head(st, stream) else {
                continue;
            };
            let Payload::Collective(c) = &self.program.ops[i].payload else {
                continue;
            };
            let g = c.group.index();
            if self.group_ops[g].get(st.group_cursor[g]) != Some(&i) {
                continue;
            }
            self.inject(st, i)?;
            self.current_op = Some(i);
            let swap = self
                .fault
                .is_some_and(|f| f.kind == FaultKind::Mismatch && f.op == i && st.step == 0);
            st.start_ns[i] = Some(st.now_ns());
            let issued = Instant::now();
            let handles = issue(self.comm, c, &self.groups[g], &mut self.pool, swap)
                .map_err(|e| self.fault_at(st, i, cause_of(&e), e.to_string()))?
                .handles;
            st.group_cursor[g] += 1;
            st.busy_streams.insert(stream, i);
            st.in_flight.push(InFlight {
                op: i,
                stream,
                handles,
                issued,
            });
            if let Some(q) = st.queues.get_mut(&stream) {
                q.pop_front();
            }
            progressed = true;
        }
        Ok(progressed)
    }

    /// Runs the first ready compute or copy op (streams in canonical order), if any.
    fn run_one_kernel(&mut self, st: &mut StepState) -> Result<bool, RankFault> {
        let streams: Vec<Stream> = st.queues.keys().copied().collect();
        for stream in streams {
            let Some(i) = self.ready_head(st, stream) else {
                continue;
            };
            let real = match (self.options.compute, &self.program.ops[i].payload) {
                (_, Payload::Collective(_) | Payload::Host { .. }) => continue,
                (ComputeMode::Real, Payload::Compute(w)) => Some((w.flops, true)),
                (ComputeMode::Real, Payload::Copy(w)) => Some((w.bytes, false)),
                (ComputeMode::Busy, _) => None,
            };
            self.inject(st, i)?;
            self.current_op = Some(i);
            st.busy_streams.insert(stream, i);
            st.start_ns[i] = Some(st.now_ns());
            self.busy(st, Duration::from_nanos(self.op_ns[i]), real)?;
            st.end_ns[i] = Some(st.now_ns());
            st.done += 1;
            st.busy_streams.remove(&stream);
            if let Some(q) = st.queues.get_mut(&stream) {
                q.pop_front();
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// Spends an op's time (spin for `d`, or real work of `(amount, is_gemm)`); meanwhile
    /// in-flight collectives are polled and ready collectives issued, as a device would run
    /// them beside the kernel.
    fn busy(
        &mut self,
        st: &mut StepState,
        d: Duration,
        real: Option<(u64, bool)>,
    ) -> Result<(), RankFault> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut tick = || {
            self.poll(st);
            if st.fault.is_none()
                && let Err(f) = self.issue_collectives(st)
            {
                st.fault = Some(f);
            }
            st.fault.is_none() && !self.board.aborted()
        };
        match real {
            None => spin_for(d, &mut tick),
            Some((flops, true)) => {
                std::hint::black_box(gemm_flops(flops, &mut scratch, &mut tick));
            }
            Some((bytes, false)) => {
                std::hint::black_box(copy_bytes(bytes, &mut scratch, &mut tick));
            }
        }
        self.scratch = scratch;
        match st.fault.take() {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    fn poll(&mut self, st: &mut StepState) {
        poll_in_flight(
            self.program,
            &self.groups,
            &mut self.pool,
            st,
            self.options.timeout,
        );
    }

    /// Applies an injected fault if this rank is to fail at op `i` (first step only).
    fn inject(&mut self, st: &StepState, i: usize) -> Result<(), RankFault> {
        let Some(f) = self.fault.filter(|f| f.op == i && st.step == 0) else {
            return Ok(());
        };
        self.current_op = Some(i);
        match f.kind {
            FaultKind::Panic => panic!("injected fault: rank {} panics at op #{i}", f.rank),
            FaultKind::Error => Err(self.fault_at(
                st,
                i,
                FaultCause::Died,
                "injected error (--inject-fault)".into(),
            )),
            FaultKind::Hang => {
                let give_up = Instant::now() + 2 * self.options.timeout + Duration::from_secs(1);
                while !self.board.aborted() && Instant::now() < give_up {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(self.fault_at(
                    st,
                    i,
                    FaultCause::Aborted,
                    "this rank was hanging here (injected hang) until the run was aborted".into(),
                ))
            }
            FaultKind::Mismatch => Ok(()),
        }
    }
}

/// The backend groups of `program`, each checked against a world of `world_size` ranks.
pub fn program_groups(program: &StepProgram, world_size: usize) -> Result<Vec<Group>, String> {
    let groups = program
        .groups
        .iter()
        .map(|g| {
            Group::new(g.label.clone(), g.ranks.clone())
                .map_err(|e| format!("rank {}: group {}: {e}", program.rank, g.label))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for g in &groups {
        g.check_world(world_size).map_err(|e| {
            format!(
                "rank {}: {e}; replay the scenario with as many ranks as its mesh has",
                program.rank
            )
        })?;
    }
    Ok(groups)
}

/// Waits a little when nothing can progress: yields first (a collective usually completes
/// within microseconds), then sleeps 20 µs per round so idle ranks leave the CPU to ranks
/// doing busy work (ranks may outnumber cores).
pub fn idle_wait(idle: &mut u32) {
    *idle = idle.saturating_add(1);
    if *idle < 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Checks every in-flight collective; records the end of finished ones, turns failed or
/// overdue ones into `st.fault`.
fn poll_in_flight(
    program: &StepProgram,
    groups: &[Group],
    pool: &mut BufferPool,
    st: &mut StepState,
    timeout: Duration,
) {
    if st.fault.is_some() {
        return;
    }
    // Our own deadline, a little after the backend's, for backends whose handles never
    // report a dead call as complete.
    let overdue = timeout + timeout / 4 + Duration::from_millis(50);
    let mut k = 0;
    while k < st.in_flight.len() {
        let f = &st.in_flight[k];
        if !f.handles.iter().all(Handle::is_complete) {
            if f.issued.elapsed() > overdue {
                let i = f.op;
                st.fault = Some(RankFault {
                    rank: program.rank,
                    cause: FaultCause::Timeout,
                    op: Some(describe_op(program, groups, i, st.step)),
                    message: format!(
                        "did not complete within {:.1} s (--timeout-s); a peer hangs or died",
                        timeout.as_secs_f64()
                    ),
                });
                return;
            }
            k += 1;
            continue;
        }
        let f = st.in_flight.swap_remove(k);
        let end = st.now_ns();
        let mut buffers = Vec::with_capacity(f.handles.len());
        for h in f.handles {
            match h.wait() {
                Ok(b) => buffers.push(b),
                Err(e) => {
                    st.fault = Some(RankFault {
                        rank: program.rank,
                        cause: cause_of(&e),
                        op: Some(describe_op(program, groups, f.op, st.step)),
                        message: e.to_string(),
                    });
                    return;
                }
            }
        }
        recycle(pool, buffers);
        st.end_ns[f.op] = Some(end);
        st.done += 1;
        st.busy_streams.remove(&f.stream);
    }
}

/// The fault cause a backend error stands for.
fn cause_of(e: &CommError) -> FaultCause {
    match e {
        CommError::Mismatch { .. } => FaultCause::Mismatch,
        CommError::Timeout { .. } => FaultCause::Timeout,
        CommError::PeerExited { .. } | CommError::RankPanicked { .. } => FaultCause::PeerExited,
        _ => FaultCause::Died,
    }
}

/// Names op `i` of `program`: index, name, and what it does (with its group for collectives).
pub fn describe_op(program: &StepProgram, groups: &[Group], i: usize, step: usize) -> FaultOp {
    let op = &program.ops[i];
    let what = match &op.payload {
        Payload::Compute(_) => "compute".to_string(),
        Payload::Copy(_) => "copy".to_string(),
        Payload::Host { .. } => "host".to_string(),
        Payload::Collective(c) => match groups.get(c.group.index()) {
            Some(g) => format!("{} on group {g}", c.kind.name()),
            None => c.kind.name().to_string(),
        },
    };
    FaultOp {
        index: i,
        name: op.name.clone().unwrap_or_else(|| op.id.to_string()),
        what,
        step,
    }
}
