//! The MPI backend: one rank per process, launched by `mpirun` (feature `mpi`).
//!
//! - [`MpiComm::world`] initialises MPI (`MPI_THREAD_SERIALIZED`) once per process and
//!   finalises it when the communicator is dropped.
//! - Every plan [`crate::Group`] gets its own communicator, created on the group's first
//!   payload with `MPI_Comm_create_group` (collective over the group's members only) and cached
//!   by group id.
//! - Calls are MPI-3 immediate collectives (`MPI_Iallgather`, `MPI_Ialltoall(v)`, `MPI_Ibcast`,
//!   `MPI_Iallreduce`, `MPI_Ireduce_scatter_block`, `MPI_Ibarrier`) and `MPI_Isend`/`MPI_Irecv`;
//!   the handle's [`crate::Work`] owns the buffers until the call completes.
//! - Two reduction modes ([`ReductionMode`]): `deterministic` (default) gathers every
//!   contribution and reduces in ascending rank order with [`crate::reduce`], so bits equal the
//!   in-process backend, and exchanges a per-call header first so a member calling something
//!   else is reported as [`CommError::Mismatch`] naming both ranks, the call number and the
//!   group; `native` uses MPI's reductions (bf16 widened to f32, u8 to u32).
//! - Every wait polls with a deadline (default 300 s): a peer that never arrives gives
//!   [`CommError::Timeout`] naming the rank(s), the call and the group. [`MpiComm::abort`] then
//!   ends the job (`MPI_Abort`); a peer process that dies makes `mpirun` end the job.
//! - The per-rank trace is recorded exactly as the in-process backend records it.

mod engine;
mod header;
mod payload;
mod raw;
mod watchdog;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use engine::Engine;
use header::CallHeader;
use payload::PayloadCall;
pub use payload::ReductionMode;
pub use watchdog::WATCHDOG_EXIT;

use crate::buffer::Buffer;
use crate::collective::{Collective, Handle, Work};
use crate::error::{CommError, CommResult};
use crate::group::{Group, GroupId};
use crate::trace::TraceEvent;
use crate::types::{CollectiveKind, DType, ReduceOp};

#[cfg(target_endian = "big")]
compile_error!(
    "the MPI backend moves payloads as little-endian bytes; big-endian hosts are not supported"
);

/// Default bound on any single wait (ranks may compute for a long time between calls).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// How an [`MpiComm`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpiOptions {
    /// Where reductions happen.
    pub mode: ReductionMode,
    /// Bound on every wait.
    pub timeout: Duration,
}

impl Default for MpiOptions {
    fn default() -> Self {
        MpiOptions {
            mode: ReductionMode::Deterministic,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// Whether this process was started by an MPI launcher (`mpirun`/`mpiexec`/`srun` set these).
pub fn launched_by_mpirun() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// This process's rank of an MPI world. Use from one thread at a time.
pub struct MpiComm {
    rank: usize,
    world_size: usize,
    engine: Arc<Mutex<Engine>>,
    group_seq: RefCell<HashMap<GroupId, u64>>,
    send_seq: RefCell<HashMap<(usize, u64), u64>>,
    recv_seq: RefCell<HashMap<(usize, u64), u64>>,
    trace: RefCell<Vec<TraceEvent>>,
    /// Finalises MPI when dropped; declared last so it drops after everything else.
    _universe: mpi::environment::Universe,
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

fn unavailable(reason: impl Into<String>) -> CommError {
    CommError::Unavailable {
        backend: "mpi".into(),
        reason: reason.into(),
    }
}

impl MpiComm {
    /// Initialise MPI and return this process's communicator with the default options
    /// (deterministic reductions, 300 s timeout). The constructor a backend factory calls.
    pub fn world() -> CommResult<MpiComm> {
        MpiComm::world_with(MpiOptions::default())
    }

    /// [`MpiComm::world`] with explicit options. Fails if MPI was already initialised in this
    /// process (one world per process).
    pub fn world_with(options: MpiOptions) -> CommResult<MpiComm> {
        use mpi::traits::Communicator;
        let (universe, _threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| {
                unavailable("MPI is already initialised in this process (one MpiComm per process)")
            })?;
        let world = universe.world();
        let rank = world.rank() as usize;
        let world_size = world.size() as usize;
        let engine = Engine::new(rank, options.mode, options.timeout)?;
        Ok(MpiComm {
            rank,
            world_size,
            engine: Arc::new(Mutex::new(engine)),
            group_seq: RefCell::default(),
            send_seq: RefCell::default(),
            recv_seq: RefCell::default(),
            trace: RefCell::default(),
            _universe: universe,
        })
    }

    /// The reduction mode.
    pub fn mode(&self) -> ReductionMode {
        self.lock().mode
    }

    /// End every process of the job with `code` (`MPI_Abort`); for fatal errors, after the
    /// message has been printed.
    pub fn abort(&self, code: i32) -> ! {
        raw::abort(code)
    }

    fn lock(&self) -> MutexGuard<'_, Engine> {
        // The engine's state is consistent between calls; a panic inside one leaves nothing
        // half-updated that a later call depends on.
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn member_position(&self, kind: CollectiveKind, group: &Group) -> CommResult<usize> {
        crate::args::position(kind, group, self.rank, self.world_size)
    }

    fn divisible(kind: CollectiveKind, input: &Buffer, group: &Group) -> CommResult<()> {
        crate::args::chunk_len(kind, input.len(), group).map(|_| ())
    }

    fn next_seq(map: &RefCell<HashMap<(usize, u64), u64>>, key: (usize, u64)) -> u64 {
        let mut m = map.borrow_mut();
        let s = m.entry(key).or_insert(0);
        *s += 1;
        *s - 1
    }

    /// Record, then issue a validated group collective.
    #[allow(clippy::too_many_arguments)]
    fn issue(
        &self,
        kind: CollectiveKind,
        group: &Group,
        pos: usize,
        input: Buffer,
        op: Option<ReduceOp>,
        root: Option<usize>,
        counts: (Vec<usize>, Vec<usize>),
        output_elements: usize,
    ) -> CommResult<Handle> {
        let seq = {
            let mut seqs = self.group_seq.borrow_mut();
            let s = seqs.entry(group.id()).or_insert(0);
            *s += 1;
            *s - 1
        };
        let dtype = input.dtype();
        let mut ev = TraceEvent::collective(self.trace.borrow().len(), kind, group, seq);
        ev.dtype = dtype;
        ev.input_elements = input.len();
        ev.input_bytes = input.bytes();
        ev.output_bytes = output_elements * dtype.size_bytes();
        ev.op = op;
        ev.root = root;
        self.trace.borrow_mut().push(ev);
        let header = CallHeader {
            kind,
            dtype,
            len: input.len(),
            op,
            root,
            seq,
            group_id: group.id().0,
            send_counts: counts.0.clone(),
            recv_counts: counts.1.clone(),
        };
        let mut engine = self.lock();
        let call = PayloadCall {
            kind,
            op,
            root_pos: root.and_then(|r| group.position(r)).unwrap_or(0),
            send_counts: counts.0,
            recv_counts: counts.1,
            mode: engine.mode,
        };
        let id = engine.issue_collective(group, pos, header, input, call)?;
        Ok(self.handle(kind, id))
    }

    fn handle(&self, kind: CollectiveKind, id: u64) -> Handle {
        Handle::new(
            kind,
            Box::new(MpiWork {
                engine: Arc::clone(&self.engine),
                id,
            }),
        )
    }

    fn simple(
        &self,
        kind: CollectiveKind,
        group: &Group,
        input: Buffer,
        op: Option<ReduceOp>,
        root: Option<usize>,
        output_elements: usize,
    ) -> CommResult<Handle> {
        let pos = self.member_position(kind, group)?;
        let none = (Vec::new(), Vec::new());
        self.issue(kind, group, pos, input, op, root, none, output_elements)
    }

    fn check_peer(&self, kind: CollectiveKind, peer: usize) -> CommResult<()> {
        if peer < self.world_size {
            Ok(())
        } else {
            Err(CommError::InvalidArgument {
                kind,
                reason: format!("peer rank {peer} outside a world of {}", self.world_size),
            })
        }
    }

    fn record_p2p(
        &self,
        kind: CollectiveKind,
        peer: usize,
        tag: u64,
        seq: u64,
        input: &Buffer,
        out: usize,
    ) {
        let mut ranks = vec![self.rank.min(peer), self.rank.max(peer)];
        ranks.dedup();
        let ev = TraceEvent {
            index: self.trace.borrow().len(),
            kind,
            group_label: "p2p".into(),
            group_id: None,
            ranks,
            seq,
            dtype: input.dtype(),
            input_elements: input.len(),
            input_bytes: input.bytes(),
            output_bytes: out * input.dtype().size_bytes(),
            op: None,
            root: None,
            peer: Some(peer),
            tag: Some(tag),
        };
        self.trace.borrow_mut().push(ev);
    }
}

impl Collective for MpiComm {
    fn backend_name(&self) -> &'static str {
        "mpi"
    }

    /// Creates the communicators of the groups this rank belongs to in ascending (ranks,
    /// label) order, an order every rank agrees on, so no two ranks wait on each other's
    /// `MPI_Comm_create_group` in opposite orders.
    fn prepare_groups(&self, groups: &[Group]) -> CommResult<()> {
        let mut mine: Vec<&Group> = groups
            .iter()
            .filter(|g| g.position(self.rank).is_some())
            .collect();
        mine.sort_by(|a, b| (a.ranks(), a.label()).cmp(&(b.ranks(), b.label())));
        mine.dedup_by(|a, b| a.id() == b.id());
        let mut engine = self.lock();
        for g in mine {
            g.check_world(self.world_size)?;
            engine.ensure_comm(g)?;
        }
        Ok(())
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_gather(&self, group: &Group, input: Buffer) -> CommResult<Handle> {
        let out = input.len() * group.size();
        self.simple(CollectiveKind::AllGather, group, input, None, None, out)
    }

    fn reduce_scatter(&self, group: &Group, input: Buffer, op: ReduceOp) -> CommResult<Handle> {
        let kind = CollectiveKind::ReduceScatter;
        Self::divisible(kind, &input, group)?;
        let out = input.len() / group.size();
        self.simple(kind, group, input, Some(op), None, out)
    }

    fn all_reduce(&self, group: &Group, input: Buffer, op: ReduceOp) -> CommResult<Handle> {
        let out = input.len();
        self.simple(CollectiveKind::AllReduce, group, input, Some(op), None, out)
    }

    fn broadcast(&self, group: &Group, buffer: Buffer, root: usize) -> CommResult<Handle> {
        let kind = CollectiveKind::Broadcast;
        self.member_position(kind, group)?;
        crate::args::root_position(kind, group, root)?;
        let out = buffer.len();
        self.simple(kind, group, buffer, None, Some(root), out)
    }

    fn all_to_all(&self, group: &Group, input: Buffer) -> CommResult<Handle> {
        let kind = CollectiveKind::AllToAll;
        Self::divisible(kind, &input, group)?;
        let out = input.len();
        self.simple(kind, group, input, None, None, out)
    }

    fn all_to_all_v(
        &self,
        group: &Group,
        input: Buffer,
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> CommResult<Handle> {
        let kind = CollectiveKind::AllToAllV;
        let pos = self.member_position(kind, group)?;
        crate::args::check_counts(group, input.len(), send_counts, recv_counts)?;
        let out = recv_counts.iter().sum();
        let counts = (send_counts.to_vec(), recv_counts.to_vec());
        self.issue(kind, group, pos, input, None, None, counts, out)
    }

    fn barrier(&self, group: &Group) -> CommResult<Handle> {
        let empty = Buffer::empty(DType::F32);
        self.simple(CollectiveKind::Barrier, group, empty, None, None, 0)
    }

    fn send(&self, input: Buffer, dst: usize, tag: u64) -> CommResult<Handle> {
        let kind = CollectiveKind::Send;
        self.check_peer(kind, dst)?;
        let seq = Self::next_seq(&self.send_seq, (dst, tag));
        self.record_p2p(kind, dst, tag, seq, &input, 0);
        let id = self.lock().issue_send(input, dst, tag, seq)?;
        Ok(self.handle(kind, id))
    }

    fn recv(&self, src: usize, tag: u64, dtype: DType, len: usize) -> CommResult<Handle> {
        let kind = CollectiveKind::Recv;
        self.check_peer(kind, src)?;
        let seq = Self::next_seq(&self.recv_seq, (src, tag));
        self.record_p2p(kind, src, tag, seq, &Buffer::empty(dtype), len);
        let id = self.lock().issue_recv(src, tag, seq, dtype, len)?;
        Ok(self.handle(kind, id))
    }

    fn trace(&self) -> Vec<TraceEvent> {
        self.trace.borrow().clone()
    }
}

/// A pending MPI call: its buffers live in the engine until it completes.
struct MpiWork {
    engine: Arc<Mutex<Engine>>,
    id: u64,
}

impl MpiWork {
    fn lock(&self) -> MutexGuard<'_, Engine> {
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Work for MpiWork {
    fn is_complete(&self) -> bool {
        self.lock().is_complete(self.id)
    }

    fn wait(self: Box<Self>) -> CommResult<Buffer> {
        self.lock().wait(self.id)
    }
}
