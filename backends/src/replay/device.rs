//! The device walker: one step of a rank's program on an accelerator backend, launched as a
//! training framework launches it (feature `nccl` or `hccl`).
//!
//! Execution model (the simulator's, on the device):
//! - the host launches every op in program order without waiting for the device; each
//!   program stream is a device stream of its own, so ops of one stream run in launch order
//!   and ops of different streams run side by side;
//! - a dependency on an op of another stream is a device-side wait
//!   (`cudaStreamWaitEvent` / `aclrtStreamWaitEvent`) on that op's end event;
//! - collectives are enqueued on their stream on device-resident buffers (allocated before
//!   the first step, reused every step): no host copy, no allocation inside a step;
//! - compute and copy ops are device work ([`crate::replay::device_work`]): a spin kernel of
//!   the predicted duration (`--compute busy`) or GEMMs and copies of the op's shapes and
//!   bytes (`--compute real`), so communication contends with them for SMs and memory
//!   bandwidth as in a real step;
//! - host ops (and, on a backend without device kernels, compute and copy ops) block the host:
//!   it waits for their dependencies' end events, then spins for their duration;
//! - `--compute busy` also spends, on the host before each launch, the time the prediction's
//!   host spent launching that op (its kernels' launch costs), so a host-bound prediction
//!   stays host-bound; `--compute real` launches as fast as the host issues the calls.
//!
//! Every device op is recorded between a start and an end event on its stream; spans are
//! the events' times from an origin event recorded, and waited for, at the step's start
//! (host ops use the host clock from that moment). A collective's span thus starts when its
//! stream reached it, so it includes waiting for peers, as the predicted span does.
//!
//! Faults: an end event not complete within the timeout names the first unfinished op; an
//! injected fault behaves as in the host walker. After a fault the walker leaks its device
//! resources instead of waiting on streams that may never drain.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hpfsdp_plan::CollectiveKind as PlanKind;
use hpfsdp_program::step::{CollectiveOp, OpSpan, Payload, StepProgram, Stream as ProgStream};

use crate::device::kernels::DeviceKernels;
use crate::device::{DevPtr, DeviceBuffer, DeviceCollective, DeviceOp, DeviceP2p};
use crate::device::{DeviceRuntime, Event, Stream};
use crate::error::{CommError, CommResult};
use crate::group::Group;
use crate::replay::device_work::{Launch, ScratchNeed, real_launches};
use crate::replay::fault::{FaultBoard, FaultCause, FaultOp, RankFault};
use crate::replay::issue::{elements, even_split, input_elements, wire_dtype};
use crate::replay::options::{ComputeMode, FaultInjection, FaultKind, ReplayOptions};
use crate::replay::runner::ReplayRank;
use crate::replay::walker::{describe_op, idle_wait};
use crate::replay::work::spin_for;
use crate::types::{DType, ReduceOp};

/// A communication buffer's role in its op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Role {
    Send,
    Recv,
    /// The receive buffer of an injected mismatch (an all-gather where an all-reduce was
    /// planned).
    Swap,
}

type BufferKey = (ProgStream, Role, DType, usize);

/// One stream's GEMM operands and copy buffers (real mode).
#[derive(Default)]
struct Scratch {
    gemm: Option<[DeviceBuffer; 3]>,
    copy: Option<[DeviceBuffer; 2]>,
}

/// Walks steps of one rank's program on a device backend (see the module doc).
pub struct DeviceWalker<'a> {
    comm: &'a dyn DeviceCollective,
    rt: Arc<dyn DeviceRuntime>,
    device_index: usize,
    program: &'a StepProgram,
    op_ns: &'a [u64],
    launch_ns: &'a [u64],
    groups: Vec<Group>,
    options: &'a ReplayOptions,
    board: &'a FaultBoard,
    fault: Option<FaultInjection>,
    kernels: Option<Box<dyn DeviceKernels>>,
    streams: BTreeMap<ProgStream, Stream>,
    origin: Event,
    events: Vec<Option<(Event, Event)>>,
    buffers: HashMap<BufferKey, DeviceBuffer>,
    a2av: HashMap<usize, (Vec<usize>, Vec<usize>)>,
    launches: Vec<Vec<Launch>>,
    scratch: BTreeMap<ProgStream, Scratch>,
    poisoned: bool,
    /// The op being launched (for naming the op of a panic).
    pub current_op: Option<usize>,
}

impl<'a> DeviceWalker<'a> {
    /// A walker for `program` on `comm`: loads the device kernels `options.compute` needs,
    /// creates a device stream per program stream and an event pair per device op, and
    /// allocates every communication buffer and compute scratch buffer up front.
    pub fn new(
        comm: &'a dyn DeviceCollective,
        rank: &'a ReplayRank,
        options: &'a ReplayOptions,
        board: &'a FaultBoard,
    ) -> Result<Self, String> {
        let (program, op_ns) = (&rank.program, &rank.op_ns[..]);
        if program.rank != comm.rank()
            || op_ns.len() != program.ops.len()
            || rank.launch_ns.len() != program.ops.len()
        {
            return Err(format!(
                "rank {}'s program ({} ops, {} durations) given to rank {}",
                program.rank,
                program.ops.len(),
                op_ns.len(),
                comm.rank()
            ));
        }
        let groups = crate::replay::walker::program_groups(program, comm.world_size())?;
        let kernels = comm
            .load_kernels(options.compute == ComputeMode::Real)
            .map_err(|e| format!("loading device kernels: {e}"))?;
        if kernels.is_none() && options.compute == ComputeMode::Real {
            return Err(format!(
                "--compute real needs device GEMMs, which the {} backend cannot load at run time; use --compute busy",
                comm.backend_name()
            ));
        }
        let rt = comm.runtime();
        let origin = rt.create_timing_event().map_err(|e| e.to_string())?;
        let mut w = DeviceWalker {
            comm,
            device_index: comm.device_index(),
            rt,
            program,
            op_ns,
            launch_ns: &rank.launch_ns,
            groups,
            options,
            board,
            fault: options.fault.filter(|f| f.rank == program.rank),
            kernels,
            streams: BTreeMap::new(),
            origin,
            events: vec![None; program.ops.len()],
            buffers: HashMap::new(),
            a2av: HashMap::new(),
            launches: vec![Vec::new(); program.ops.len()],
            scratch: BTreeMap::new(),
            poisoned: false,
            current_op: None,
        };
        w.prepare()
            .map_err(|e| format!("preparing the device replay: {e}"))?;
        Ok(w)
    }

    /// What runs the compute ops, for reports.
    pub fn compute_description(&self) -> String {
        let paced = match self.options.compute {
            ComputeMode::Busy => {
                "; the host spends each op's predicted launch time before launching it"
            }
            ComputeMode::Real => "; launches as fast as the host issues them",
        };
        match &self.kernels {
            Some(k) => format!("{}{paced}", k.describe()),
            None => format!(
                "host spin ({} loads no device kernels at run time)",
                self.comm.backend_name()
            ),
        }
    }

    /// Whether op `i` blocks the host instead of running on a device stream.
    fn on_host(&self, i: usize) -> bool {
        let op = &self.program.ops[i];
        op.stream == ProgStream::Host
            || (self.kernels.is_none()
                && matches!(op.payload, Payload::Compute(_) | Payload::Copy(_)))
    }

    fn prepare(&mut self) -> CommResult<()> {
        self.rt.set_device(self.device_index)?;
        let me = self.comm.rank();
        let mut needs: BTreeMap<ProgStream, ScratchNeed> = BTreeMap::new();
        for i in 0..self.program.ops.len() {
            if self.on_host(i) {
                continue;
            }
            let op = &self.program.ops[i];
            if !self.streams.contains_key(&op.stream) {
                let s = self.rt.create_stream()?;
                self.streams.insert(op.stream, s);
            }
            let start = self.rt.create_timing_event()?;
            let end = self.rt.create_timing_event()?;
            self.events[i] = Some((start, end));
            match &op.payload {
                Payload::Collective(c) => self.allocate_collective(i, op.stream, c, me)?,
                _ if self.options.compute == ComputeMode::Real => {
                    self.launches[i] = real_launches(self.program, i);
                    let need = needs.entry(op.stream).or_default();
                    self.launches[i].iter().for_each(|l| need.add(l));
                }
                _ => self.launches[i] = vec![Launch::Spin(self.op_ns[i])],
            }
        }
        for (stream, need) in needs {
            let scratch = self.allocate_scratch(need)?;
            self.scratch.insert(stream, scratch);
        }
        Ok(())
    }

    fn buffer(&mut self, key: BufferKey) -> CommResult<()> {
        if !self.buffers.contains_key(&key) {
            let b = self.comm.alloc_device(key.2, key.3)?;
            self.buffers.insert(key, b);
        }
        Ok(())
    }

    /// Allocates the send and receive buffers of collective op `i` (shared by every op of
    /// the same stream, role, type and length: a stream runs one op at a time).
    fn allocate_collective(
        &mut self,
        i: usize,
        stream: ProgStream,
        c: &CollectiveOp,
        me: usize,
    ) -> CommResult<()> {
        let g = &self.groups[c.group.index()];
        let p = g.size();
        let dt = wire_dtype(c.dtype);
        let n = input_elements(c, p);
        let recv = match c.kind {
            PlanKind::AllGather => n * p,
            PlanKind::ReduceScatter => n / p,
            PlanKind::Broadcast => 0,
            PlanKind::AllReduce | PlanKind::AllToAll => n,
            PlanKind::AllToAllV => {
                let send = even_split(n, p);
                let pos = g.position(me).unwrap_or(0);
                let recv = vec![send[pos]; p];
                let total = recv.iter().sum();
                self.a2av.insert(i, (send, recv));
                total
            }
            PlanKind::SendRecv => elements(c.output_bytes, dt),
        };
        self.buffer((stream, Role::Send, dt, n))?;
        if c.kind != PlanKind::Broadcast {
            self.buffer((stream, Role::Recv, dt, recv))?;
        }
        if self
            .fault
            .is_some_and(|f| f.op == i && f.kind == FaultKind::Mismatch)
        {
            self.buffer((stream, Role::Swap, dt, n * p))?;
        }
        Ok(())
    }

    fn allocate_scratch(&self, need: ScratchNeed) -> CommResult<Scratch> {
        let bf16 = |len: usize| self.comm.alloc_device(DType::Bf16, len.max(1));
        let gemm = match need.gemm {
            (0, 0, 0) => None,
            (a, b, c) => Some([bf16(a)?, bf16(b)?, bf16(c)?]),
        };
        let copy = match usize::try_from(need.copy_bytes).unwrap_or(usize::MAX) {
            0 => None,
            bytes => Some([
                self.comm.alloc_device(DType::U8, bytes)?,
                self.comm.alloc_device(DType::U8, bytes)?,
            ]),
        };
        Ok(Scratch { gemm, copy })
    }
}

impl DeviceWalker<'_> {
    /// What op `i` does in step `step`, for fault messages.
    pub fn describe(&self, i: usize, step: usize) -> FaultOp {
        describe_op(self.program, &self.groups, i, step)
    }

    fn fault_at(&mut self, i: usize, step: usize, cause: FaultCause, message: String) -> RankFault {
        self.poisoned = true;
        RankFault {
            rank: self.program.rank,
            cause,
            op: Some(self.describe(i, step)),
            message,
        }
    }

    /// Walks one step (see the module doc); `step` counts from 0 with warm-up included.
    /// Returns one span per op in op-id order, times from the step's origin event.
    pub fn walk(&mut self, step: usize) -> Result<Vec<OpSpan>, RankFault> {
        let n = self.program.ops.len();
        let t0 = self
            .start_step()
            .map_err(|e| self.fault_at(0, step, FaultCause::Died, e.to_string()))?;
        let mut host: Vec<Option<(u64, u64)>> = vec![None; n];
        let mut launched = vec![0u64; n];
        for i in 0..n {
            self.current_op = Some(i);
            if self.board.aborted() {
                return Err(self.fault_at(
                    i,
                    step,
                    FaultCause::Aborted,
                    "stopped because another rank faulted".into(),
                ));
            }
            self.inject(i, step)?;
            if self.on_host(i) {
                let deps_end = self.wait_deps(i, step, &host)?;
                let begun = t0.elapsed().as_nanos() as u64;
                let board = self.board;
                spin_for(Duration::from_nanos(self.op_ns[i]), &mut || {
                    !board.aborted()
                });
                let took = (t0.elapsed().as_nanos() as u64).saturating_sub(begun);
                // The host clock starts a little after the device's origin: a host op starts
                // no earlier than its dependencies ended on the device.
                let start = begun.max(deps_end);
                host[i] = Some((start, start + took));
                launched[i] = begun;
            } else {
                if self.options.compute == ComputeMode::Busy {
                    let board = self.board;
                    let d = Duration::from_nanos(self.launch_ns[i]);
                    spin_for(d, &mut || !board.aborted());
                }
                let swap = self
                    .fault
                    .is_some_and(|f| f.kind == FaultKind::Mismatch && f.op == i && step == 0);
                self.launch(i, swap)
                    .map_err(|e| self.fault_at(i, step, cause_of(&e), e.to_string()))?;
                launched[i] = t0.elapsed().as_nanos() as u64;
            }
        }
        for i in 0..n {
            if !self.on_host(i) {
                self.wait_done(i, step)?;
            }
        }
        self.spans(&host, &launched)
            .map_err(|e| self.fault_at(0, step, FaultCause::Died, e.to_string()))
    }

    /// Waits for op `i`'s dependencies and returns when the last of them ended (device ops:
    /// their end event's time from the origin; host ops: as measured).
    fn wait_deps(
        &mut self,
        i: usize,
        step: usize,
        host: &[Option<(u64, u64)>],
    ) -> Result<u64, RankFault> {
        let mut end_ns = 0u64;
        for d in self.program.ops[i].deps.clone() {
            let d = d.index();
            self.wait_done(d, step)?;
            let end = match (host[d], self.events[d]) {
                (Some((_, e)), _) => e,
                (None, Some((_, e))) => self
                    .rt
                    .elapsed_ms(self.origin, e)
                    .map(|ms| (f64::from(ms.max(0.0)) * 1e6) as u64)
                    .map_err(|e| self.fault_at(d, step, FaultCause::Died, e.to_string()))?,
                (None, None) => 0,
            };
            end_ns = end_ns.max(end);
        }
        Ok(end_ns)
    }

    /// Records the origin on the first stream and waits for it; the host clock starts then.
    fn start_step(&mut self) -> CommResult<Instant> {
        self.rt.set_device(self.device_index)?;
        if let Some(&s) = self.streams.values().next() {
            self.rt.record_event(self.origin, s)?;
            self.rt.synchronize_event(self.origin)?;
        }
        Ok(Instant::now())
    }

    /// Enqueues device op `i` on its stream between its events, after device-side waits on
    /// its dependencies of other streams.
    fn launch(&mut self, i: usize, swap: bool) -> CommResult<()> {
        let op = &self.program.ops[i];
        let s = self.streams[&op.stream];
        for d in &op.deps {
            let d = d.index();
            if let Some((_, end)) = self.events[d]
                && self.program.ops[d].stream != op.stream
            {
                self.rt.stream_wait_event(s, end)?;
            }
        }
        let Some((start, end)) = self.events[i] else {
            return Ok(());
        };
        self.rt.record_event(start, s)?;
        match &op.payload {
            Payload::Collective(c) => self.enqueue_collective(i, op.stream, c, s, swap)?,
            _ => self.enqueue_compute(i, op.stream, s)?,
        }
        self.rt.record_event(end, s)
    }

    fn buf(
        &self,
        stream: ProgStream,
        role: Role,
        dt: DType,
        len: usize,
    ) -> CommResult<&DeviceBuffer> {
        self.buffers
            .get(&(stream, role, dt, len))
            .ok_or_else(|| CommError::Unavailable {
                backend: self.comm.backend_name().into(),
                reason: format!("no {role:?} buffer of {len} {dt} elements was prepared"),
            })
    }

    fn enqueue_collective(
        &self,
        i: usize,
        stream: ProgStream,
        c: &CollectiveOp,
        s: Stream,
        swap: bool,
    ) -> CommResult<()> {
        let g = &self.groups[c.group.index()];
        let p = g.size();
        let dt = wire_dtype(c.dtype);
        let n = input_elements(c, p);
        let send = self.buf(stream, Role::Send, dt, n)?;
        let recv_len = |len: usize| self.buf(stream, Role::Recv, dt, len);
        let sum = ReduceOp::Sum;
        if swap {
            let op = if c.kind == PlanKind::AllReduce {
                let recv = self.buf(stream, Role::Swap, dt, n * p)?;
                DeviceOp::AllGather { send, recv }
            } else {
                DeviceOp::AllReduce {
                    send,
                    recv: send,
                    op: sum,
                }
            };
            return self.comm.enqueue_on(g, op, s);
        }
        let op = match c.kind {
            PlanKind::AllGather => DeviceOp::AllGather {
                send,
                recv: recv_len(n * p)?,
            },
            PlanKind::ReduceScatter => DeviceOp::ReduceScatter {
                send,
                recv: recv_len(n / p)?,
                op: sum,
            },
            PlanKind::AllReduce => DeviceOp::AllReduce {
                send,
                recv: recv_len(n)?,
                op: sum,
            },
            PlanKind::Broadcast => DeviceOp::Broadcast {
                buffer: send,
                root: g.ranks()[0],
            },
            PlanKind::AllToAll => DeviceOp::AllToAll {
                send,
                recv: recv_len(n)?,
            },
            PlanKind::AllToAllV => {
                let (send_counts, recv_counts) = &self.a2av[&i];
                DeviceOp::AllToAllV {
                    send,
                    recv: recv_len(recv_counts.iter().sum())?,
                    send_counts,
                    recv_counts,
                }
            }
            PlanKind::SendRecv => {
                let me = self.comm.rank();
                let peer = g.ranks().iter().copied().find(|&r| r != me).unwrap_or(me);
                let recv = recv_len(elements(c.output_bytes, dt))?;
                let batch = [
                    DeviceP2p::Send { buffer: send, peer },
                    DeviceP2p::Recv { buffer: recv, peer },
                ];
                return self.comm.enqueue_p2p_on(&batch, 0, s);
            }
        };
        self.comm.enqueue_on(g, op, s)
    }

    fn enqueue_compute(&self, i: usize, stream: ProgStream, s: Stream) -> CommResult<()> {
        let Some(kernels) = &self.kernels else {
            return Ok(());
        };
        let scratch = self.scratch.get(&stream);
        let missing = |what: &str| CommError::Unavailable {
            backend: self.comm.backend_name().into(),
            reason: format!("no {what} scratch was prepared for op #{i}"),
        };
        for launch in &self.launches[i] {
            match *launch {
                Launch::Spin(ns) => kernels.spin(s, ns)?,
                Launch::Gemm(p) => {
                    let [a, b, c] = scratch
                        .and_then(|x| x.gemm.as_ref())
                        .ok_or_else(|| missing("GEMM"))?;
                    kernels.gemm(s, p, a.ptr(), b.ptr(), c.ptr())?;
                }
                Launch::Copy(bytes) => {
                    let [src, dst] = scratch
                        .and_then(|x| x.copy.as_ref())
                        .ok_or_else(|| missing("copy"))?;
                    let (src, dst): (DevPtr, DevPtr) = (src.ptr(), dst.ptr());
                    self.rt.copy_device_async(dst, src, bytes as usize, s)?;
                }
            }
        }
        Ok(())
    }

    /// Waits until device op `i` finished: polls its end event until the timeout (a hung or
    /// dead peer), or blocks where the runtime cannot poll.
    fn wait_done(&mut self, i: usize, step: usize) -> Result<(), RankFault> {
        let Some((_, end)) = self.events[i] else {
            return Ok(());
        };
        let since = Instant::now();
        let mut idle = 0u32;
        loop {
            match self.rt.query_event(end) {
                Ok(Some(true)) => return Ok(()),
                Ok(None) => {
                    return self
                        .rt
                        .synchronize_event(end)
                        .map_err(|e| self.fault_at(i, step, cause_of(&e), e.to_string()));
                }
                Ok(Some(false)) => {}
                Err(e) => return Err(self.fault_at(i, step, cause_of(&e), e.to_string())),
            }
            if self.board.aborted() {
                return Err(self.fault_at(
                    i,
                    step,
                    FaultCause::Aborted,
                    "stopped because another rank faulted".into(),
                ));
            }
            if since.elapsed() > self.options.timeout {
                let first = self.first_unfinished().unwrap_or(i);
                return Err(self.fault_at(
                    first,
                    step,
                    FaultCause::Timeout,
                    format!(
                        "did not complete within {:.1} s (--timeout-s); a peer hangs or died",
                        self.options.timeout.as_secs_f64()
                    ),
                ));
            }
            idle_wait(&mut idle);
        }
    }

    /// The first device op (program order) whose end event has not completed.
    fn first_unfinished(&self) -> Option<usize> {
        (0..self.program.ops.len()).find(|&i| {
            self.events[i].is_some_and(|(_, end)| {
                !matches!(self.rt.query_event(end), Ok(Some(true)) | Ok(None))
            })
        })
    }

    /// The spans of a finished step: device ops from their events, host ops as measured.
    fn spans(&self, host: &[Option<(u64, u64)>], launched: &[u64]) -> CommResult<Vec<OpSpan>> {
        let ns = |e: Event| -> CommResult<u64> {
            let ms = self.rt.elapsed_ms(self.origin, e)?;
            Ok((f64::from(ms.max(0.0)) * 1e6) as u64)
        };
        let mut out = Vec::with_capacity(host.len());
        for (i, op) in self.program.ops.iter().enumerate() {
            let (start_ns, end_ns) = match (host[i], self.events[i]) {
                (Some(h), _) => h,
                (None, Some((start, end))) => (ns(start)?, ns(end)?),
                (None, None) => (0, 0),
            };
            out.push(OpSpan {
                op: op.id,
                start_ns,
                end_ns: end_ns.max(start_ns),
                launched_ns: Some(launched[i]),
                transfer_start_ns: None,
            });
        }
        Ok(out)
    }

    /// Applies an injected fault if this rank is to fail at op `i` (first step only).
    fn inject(&mut self, i: usize, step: usize) -> Result<(), RankFault> {
        let Some(f) = self.fault.filter(|f| f.op == i && step == 0) else {
            return Ok(());
        };
        match f.kind {
            FaultKind::Panic => {
                self.poisoned = true;
                panic!("injected fault: rank {} panics at op #{i}", f.rank)
            }
            FaultKind::Error => Err(self.fault_at(
                i,
                step,
                FaultCause::Died,
                "injected error (--inject-fault)".into(),
            )),
            FaultKind::Hang => {
                let give_up = Instant::now() + 2 * self.options.timeout + Duration::from_secs(1);
                while !self.board.aborted() && Instant::now() < give_up {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(self.fault_at(
                    i,
                    step,
                    FaultCause::Aborted,
                    "this rank was hanging here (injected hang) until the run was aborted".into(),
                ))
            }
            FaultKind::Mismatch => Ok(()),
        }
    }
}

impl Drop for DeviceWalker<'_> {
    fn drop(&mut self) {
        if self.poisoned {
            // Streams may never drain (a peer is gone): leak the buffers, events and streams
            // rather than block or free memory a queued kernel may still touch.
            for b in std::mem::take(&mut self.buffers).into_values() {
                std::mem::forget(b);
            }
            for s in std::mem::take(&mut self.scratch).into_values() {
                std::mem::forget(s);
            }
            return;
        }
        let _ = self.rt.set_device(self.device_index);
        for &s in self.streams.values() {
            let _ = self.rt.synchronize_stream(s);
        }
        for (start, end) in self.events.iter().flatten() {
            let _ = self.rt.destroy_event(*start);
            let _ = self.rt.destroy_event(*end);
        }
        let _ = self.rt.destroy_event(self.origin);
        for &s in self.streams.values() {
            let _ = self.rt.destroy_stream(s);
        }
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

impl crate::replay::runner::StepWalk for DeviceWalker<'_> {
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

/// What a device replay of one rank gives back: rank 0's gathered measurements (`None` on
/// other ranks) and what ran the compute ops.
pub struct DeviceReplay {
    /// Every rank's measured spans, on rank 0.
    pub measurements: Option<Vec<crate::replay::RankMeasurement>>,
    /// What ran the compute ops (kernels, libraries, or the host).
    pub compute: String,
}

/// [`crate::replay::run_rank`] on an accelerator backend with the device walker.
pub fn run_device_rank(
    comm: &dyn DeviceCollective,
    rank: &crate::replay::ReplayRank,
    options: &ReplayOptions,
    board: &FaultBoard,
) -> Result<DeviceReplay, crate::replay::ReplayError> {
    let walker = DeviceWalker::new(comm, rank, options, board)
        .map_err(|m| crate::replay::runner::post_setup(comm, board, m))?;
    let compute = walker.compute_description();
    let measurements = crate::replay::runner::run_steps(comm, rank, options, board, walker)?;
    Ok(DeviceReplay {
        measurements,
        compute,
    })
}
