//! [`DeviceComm`]: the [`Collective`] implementation shared by the NCCL and HCCL backends.
//!
//! Host [`Buffer`]s are copied to device memory, the operation is enqueued on the rank's
//! communication stream between two timing events, and the handle's wait synchronises on the
//! end event, logs the device time ([`DeviceComm::last_device_time_us`]) and copies the output
//! back. [`DeviceComm::issue_device`] runs the same operations on [`DeviceBuffer`]s that stay on
//! the device, for replays that must time the communication alone; `enqueue_on` puts them on
//! a caller's stream (replay's device walker) and `time_calls` times back-to-back launches
//! between two events (collbench).
//!
//! Groups map to vendor communicators: a group of the whole world uses the world communicator;
//! other groups are split from it ([`DeviceComm::create_groups`], NCCL >= 2.18) or created on
//! first use from a fresh unique id / root info shared through the [`IdExchange`].
//!
//! Reductions are the library's own: bitwise equality with the `inproc` backend is not
//! promised. Send/recv tags are recorded in the trace only: messages between two ranks match
//! in issue order whatever their tags, and a receive's length must equal the send's.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::buffer::DeviceBuffer;
use super::kernels::DeviceKernels;
use super::library::{CollLibrary, Launch, P2pDirection, P2pOp, RawComm};
use super::p2p::{self, P2pWork, Shared};
use super::rendezvous::IdExchange;
use super::runtime::{DevPtr, DeviceRuntime};
use super::staging::{DeviceContext, Output, StagedWork, Staging, record_around};
use super::validate::{self, Spec};
use super::world::WorldSpec;
use crate::buffer::Buffer;
use crate::collective::{Collective, Handle};
use crate::error::{CommError, CommResult};
use crate::group::{Group, GroupId};
use crate::trace::TraceEvent;
use crate::types::{CollectiveKind, DType, ReduceOp};

pub use super::device_ops::{DeviceOp, DeviceP2p, DeviceWork};
pub use super::staging::DeviceTiming;

/// One rank's communicator on a run-time loaded vendor library (`L` = NCCL or HCCL).
///
/// Not `Sync`: issue calls from one thread. Handles are `Send`, but waiting on a queued
/// send/recv issues the pending batch on the communicator, so wait on the issuing thread.
pub struct DeviceComm<L: CollLibrary> {
    pub(super) shared: Arc<Shared<L>>,
    pub(super) world: WorldSpec,
    exchange: Box<dyn IdExchange>,
    group_seq: RefCell<HashMap<GroupId, u64>>,
    p2p_seq: RefCell<HashMap<(CollectiveKind, usize, u64), u64>>,
    trace: RefCell<Vec<TraceEvent>>,
}

impl<L: CollLibrary> DeviceComm<L> {
    /// Join the world: select the device, share the world id from rank 0 through `exchange`,
    /// create the world communicator and the communication stream.
    pub fn new(lib: L, world: WorldSpec, exchange: Box<dyn IdExchange>) -> CommResult<Self> {
        let rt = Arc::clone(lib.runtime());
        let count = rt.device_count()?;
        if world.device_index >= count {
            return Err(CommError::Unavailable {
                backend: L::BACKEND.into(),
                reason: format!(
                    "rank {} wants device {} but the {} runtime sees {count} device(s); set \
                     HPFSDP_DEVICE or LOCAL_RANK to an index below {count}",
                    world.rank,
                    world.device_index,
                    rt.name()
                ),
            });
        }
        rt.set_device(world.device_index)?;
        let mut id = vec![0u8; L::ID_BYTES];
        if world.rank == 0 {
            id = lib.unique_id()?;
        }
        exchange.broadcast_id(&mut id)?;
        let world_comm = lib.init_rank(&id, world.world_size, world.rank)?;
        let stream = match rt.create_stream() {
            Ok(s) => s,
            Err(e) => {
                let _ = lib.destroy(world_comm);
                return Err(e);
            }
        };
        let ctx = Arc::new(DeviceContext {
            rt,
            device_index: world.device_index,
            timings: Mutex::default(),
        });
        Ok(DeviceComm {
            shared: Arc::new(Shared {
                lib,
                ctx,
                stream,
                world: world_comm,
                groups: Mutex::default(),
                pending: Mutex::default(),
            }),
            world,
            exchange,
            group_seq: RefCell::default(),
            p2p_seq: RefCell::default(),
            trace: RefCell::default(),
        })
    }

    /// The vendor library.
    pub fn library(&self) -> &L {
        &self.shared.lib
    }

    /// Library version, files loaded, device and rendezvous, for run metadata.
    pub fn describe(&self) -> String {
        format!(
            "{}; device {}; rank {}/{}; rendezvous {}",
            self.shared.lib.describe(),
            self.world.device_index,
            self.world.rank,
            self.world.world_size,
            self.exchange.method()
        )
    }

    /// Where this rank sits.
    pub fn world_spec(&self) -> WorldSpec {
        self.world
    }

    /// The runtime's name for this rank's device (`NVIDIA H200`, `Ascend910B2`).
    pub fn device_name(&self) -> CommResult<String> {
        let ctx = &self.shared.ctx;
        ctx.rt.device_name(ctx.device_index)
    }

    /// The accelerator runtime (streams, events, copies on this rank's device).
    pub fn runtime(&self) -> Arc<dyn DeviceRuntime> {
        Arc::clone(&self.shared.ctx.rt)
    }

    /// This rank's device index.
    pub fn device_index(&self) -> usize {
        self.shared.ctx.device_index
    }

    /// Device-side compute on this rank's device (see [`CollLibrary::kernels`]).
    pub fn load_kernels(&self, gemm: bool) -> CommResult<Option<Box<dyn DeviceKernels>>> {
        self.activate()?;
        self.shared.lib.kernels(self.shared.ctx.device_index, gemm)
    }

    /// Device microseconds of the most recently completed call (handles record their time when
    /// waited on), or `None` before the first.
    pub fn last_device_time_us(&self) -> Option<f64> {
        let t = self
            .shared
            .ctx
            .timings
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        t.last().map(|t| t.device_us)
    }

    /// Device times of every completed call, in completion order.
    pub fn device_times(&self) -> Vec<DeviceTiming> {
        self.shared
            .ctx
            .timings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Take (and clear) the device times logged so far.
    pub fn take_device_times(&self) -> Vec<DeviceTiming> {
        std::mem::take(
            &mut *self
                .shared
                .ctx
                .timings
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// Issue queued send/recv calls and block until everything enqueued has finished.
    pub fn synchronize(&self) -> CommResult<()> {
        p2p::flush(&self.shared)?;
        let ctx = &self.shared.ctx;
        ctx.rt.set_device(ctx.device_index)?;
        ctx.rt.synchronize_stream(self.shared.stream)
    }

    /// Allocate a device buffer on this rank's device (contents undefined).
    pub fn alloc_device(&self, dtype: DType, len: usize) -> CommResult<DeviceBuffer> {
        let ctx = &self.shared.ctx;
        DeviceBuffer::alloc(Arc::clone(&ctx.rt), ctx.device_index, dtype, len)
    }

    /// Allocate a device buffer holding a copy of `host`.
    pub fn upload(&self, host: &Buffer) -> CommResult<DeviceBuffer> {
        let b = self.alloc_device(host.dtype(), host.len())?;
        b.upload(host)?;
        Ok(b)
    }

    /// Create the communicators of `groups` collectively: every rank of the world calls this
    /// with the same list in the same order. With a library that splits communicators the
    /// world communicator is split once per group; otherwise each member creates the group's
    /// communicator through the exchange (which then needs `broadcast_group_id`).
    pub fn create_groups(&self, groups: &[Group]) -> CommResult<()> {
        self.activate()?;
        for g in groups {
            g.check_world(self.world.world_size)?;
            if g.size() == self.world.world_size || self.known(g) {
                continue;
            }
            let pos = g.position(self.world.rank);
            if self.shared.lib.can_split() {
                let key = pos.unwrap_or(self.world.rank);
                let made = self
                    .shared
                    .lib
                    .split(self.shared.world, pos.is_some(), key)?;
                if let Some(c) = made {
                    self.lock_groups().insert(g.id(), c);
                }
            } else if pos.is_some() {
                self.comm_for(g)?;
            }
        }
        Ok(())
    }

    /// Create the communicators of the groups this rank belongs to, in one order every rank
    /// shares (ascending rank lists), so ranks that meet in several groups never wait on
    /// each other in a cycle. Each rank may pass its own list (unlike
    /// [`DeviceComm::create_groups`]); the world communicator already exists.
    pub fn join_groups(&self, groups: &[Group]) -> CommResult<()> {
        self.activate()?;
        let mut mine: Vec<&Group> = groups
            .iter()
            .filter(|g| g.contains(self.world.rank))
            .collect();
        mine.sort_by(|a, b| a.ranks().cmp(b.ranks()));
        mine.dedup_by(|a, b| a.ranks() == b.ranks() && a.id() == b.id());
        for g in mine {
            g.check_world(self.world.world_size)?;
            self.comm_for(g)?;
        }
        Ok(())
    }

    /// Make this rank's device current for the calling thread (library calls that create
    /// communicators or enqueue work need it; the communicator may have moved threads).
    pub(super) fn activate(&self) -> CommResult<()> {
        let ctx = &self.shared.ctx;
        ctx.rt.set_device(ctx.device_index)
    }

    fn lock_groups(&self) -> std::sync::MutexGuard<'_, HashMap<GroupId, RawComm>> {
        self.shared.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn known(&self, group: &Group) -> bool {
        self.lock_groups().contains_key(&group.id())
    }

    /// The communicator of `group` (the caller is a member), created on first use.
    pub(super) fn comm_for(&self, group: &Group) -> CommResult<RawComm> {
        if group.size() == self.world.world_size {
            return Ok(self.shared.world);
        }
        if let Some(c) = self.lock_groups().get(&group.id()) {
            return Ok(*c);
        }
        let pos = group.position(self.world.rank).unwrap_or(0);
        let lib = &self.shared.lib;
        let mut id = vec![0u8; L::ID_BYTES];
        if pos == 0 {
            id = lib.unique_id()?;
        }
        let key = format!("{}-{}", L::BACKEND, group.id());
        self.exchange.broadcast_group_id(&key, group, &mut id)?;
        let comm = lib.init_rank(&id, group.size(), pos)?;
        self.lock_groups().insert(group.id(), comm);
        Ok(comm)
    }

    fn next_group_seq(&self, group: &Group) -> u64 {
        let mut seqs = self.group_seq.borrow_mut();
        let s = seqs.entry(group.id()).or_insert(0);
        let seq = *s;
        *s += 1;
        seq
    }

    /// Record a group call in the trace; returns the timing record to fill when it completes.
    pub(super) fn record(
        &self,
        spec: &Spec,
        group: &Group,
        dtype: DType,
        input_len: usize,
        root: Option<usize>,
    ) -> DeviceTiming {
        let seq = self.next_group_seq(group);
        let kind = spec.kind();
        let index = self.trace.borrow().len();
        let mut ev = TraceEvent::collective(index, kind, group, seq);
        ev.dtype = dtype;
        ev.input_elements = input_len;
        ev.input_bytes = input_len * dtype.size_bytes();
        ev.output_bytes = spec.output_elements(group.size()) * dtype.size_bytes();
        ev.op = spec.op();
        ev.root = root;
        let meta = DeviceTiming {
            index,
            kind,
            group_label: group.label().to_string(),
            seq,
            input_bytes: ev.input_bytes,
            device_us: 0.0,
        };
        self.trace.borrow_mut().push(ev);
        meta
    }

    /// Replace a reduction the library lacks (HCCL's average) by sum + host division.
    fn native_or_host_avg(&self, spec: Spec, group: &Group) -> (Spec, Option<usize>) {
        let lib = &self.shared.lib;
        match spec {
            Spec::AllReduce {
                count,
                op: ReduceOp::Avg,
            } if !lib.supports(ReduceOp::Avg) => (
                Spec::AllReduce {
                    count,
                    op: ReduceOp::Sum,
                },
                Some(group.size()),
            ),
            Spec::ReduceScatter {
                recv_count,
                op: ReduceOp::Avg,
            } if !lib.supports(ReduceOp::Avg) => (
                Spec::ReduceScatter {
                    recv_count,
                    op: ReduceOp::Sum,
                },
                Some(group.size()),
            ),
            other => (other, None),
        }
    }

    pub(super) fn enqueue(
        &self,
        spec: &Spec,
        send: DevPtr,
        recv: DevPtr,
        dtype: DType,
        at: Launch,
    ) -> CommResult<()> {
        let lib = &self.shared.lib;
        match spec {
            Spec::AllGather { count } => lib.all_gather(send, recv, *count, dtype, at),
            Spec::ReduceScatter { recv_count, op } => {
                lib.reduce_scatter(send, recv, *recv_count, dtype, *op, at)
            }
            Spec::AllReduce { count, op } => lib.all_reduce(send, recv, *count, dtype, *op, at),
            Spec::Broadcast { count, root_pos } => {
                lib.broadcast(recv, *count, dtype, *root_pos, at)
            }
            Spec::AllToAll { count, nranks } => {
                lib.all_to_all(send, recv, *count, *nranks, dtype, at)
            }
            Spec::AllToAllV(layout) => lib.all_to_all_v(send, recv, layout, dtype, at),
            Spec::Barrier => lib.all_reduce(send, recv, 1, DType::F32, ReduceOp::Sum, at),
        }
    }

    /// Stage a host buffer, enqueue `spec` between timing events, and hand back the work.
    fn host_collective(
        &self,
        group: &Group,
        spec: Spec,
        input: Buffer,
        root: Option<usize>,
    ) -> CommResult<Handle> {
        let kind = spec.kind();
        validate::position(kind, group, self.world.rank, self.world.world_size)?;
        self.activate()?;
        p2p::flush(&self.shared)?;
        let comm = self.comm_for(group)?;
        let dtype = input.dtype();
        let meta = self.record(&spec, group, dtype, input.len(), root);
        let (spec, divide_by) = self.native_or_host_avg(spec, group);
        let out_len = spec.output_elements(group.size());
        let ctx = &self.shared.ctx;
        let mut staging = Staging::new(Arc::clone(ctx));
        let (send, recv) = match spec {
            Spec::Barrier => {
                let p = staging.upload(&Buffer::F32(vec![0.0]))?;
                (p, p)
            }
            Spec::Broadcast { .. } => {
                let p = staging.upload(&input)?;
                (p, p)
            }
            _ => {
                let s = staging.upload(&input)?;
                (s, staging.alloc(out_len * dtype.size_bytes())?)
            }
        };
        let at = Launch {
            comm,
            stream: self.shared.stream,
        };
        let events = record_around(ctx, self.shared.stream, || {
            self.enqueue(&spec, send, recv, dtype, at)
        })?;
        let output = match spec {
            Spec::Barrier => Output::Host(Buffer::empty(DType::F32)),
            _ => Output::Device {
                ptr: recv,
                dtype,
                len: out_len,
            },
        };
        let work = StagedWork::new(
            Arc::clone(ctx),
            events,
            staging.into_vec(),
            output,
            divide_by,
            vec![meta],
        );
        Ok(Handle::new(kind, Box::new(work)))
    }
}

impl<L: CollLibrary> DeviceComm<L> {
    pub(super) fn check_peer(&self, kind: CollectiveKind, peer: usize) -> CommResult<()> {
        if peer < self.world.world_size {
            return Ok(());
        }
        Err(CommError::InvalidArgument {
            kind,
            reason: format!(
                "peer rank {peer} outside a world of {}",
                self.world.world_size
            ),
        })
    }

    /// Record a send/recv in the trace; returns the timing record.
    pub(super) fn record_p2p(
        &self,
        kind: CollectiveKind,
        peer: usize,
        tag: u64,
        dtype: DType,
        input_len: usize,
        output_len: usize,
    ) -> DeviceTiming {
        let seq = {
            let mut seqs = self.p2p_seq.borrow_mut();
            let s = seqs.entry((kind, peer, tag)).or_insert(0);
            let seq = *s;
            *s += 1;
            seq
        };
        let rank = self.world.rank;
        let mut ranks = vec![rank.min(peer), rank.max(peer)];
        ranks.dedup();
        let index = self.trace.borrow().len();
        let ev = TraceEvent {
            index,
            kind,
            group_label: "p2p".into(),
            group_id: None,
            ranks,
            seq,
            dtype,
            input_elements: input_len,
            input_bytes: input_len * dtype.size_bytes(),
            output_bytes: output_len * dtype.size_bytes(),
            op: None,
            root: None,
            peer: Some(peer),
            tag: Some(tag),
        };
        let meta = DeviceTiming {
            index,
            kind,
            group_label: "p2p".into(),
            seq,
            input_bytes: ev.input_bytes,
            device_us: 0.0,
        };
        self.trace.borrow_mut().push(ev);
        meta
    }

    /// Queue one half of a point-to-point transfer (see the `p2p` module for batching).
    fn queue_p2p(
        &self,
        direction: P2pDirection,
        host: Buffer,
        dtype: DType,
        len: usize,
        peer: usize,
        tag: u64,
    ) -> CommResult<Handle> {
        let kind = match direction {
            P2pDirection::Send => CollectiveKind::Send,
            P2pDirection::Recv => CollectiveKind::Recv,
        };
        self.check_peer(kind, peer)?;
        let ctx = &self.shared.ctx;
        ctx.rt.set_device(ctx.device_index)?;
        let mut staging = Staging::new(Arc::clone(ctx));
        let ptr = match direction {
            P2pDirection::Send => staging.upload(&host)?,
            P2pDirection::Recv => staging.alloc(len * dtype.size_bytes())?,
        };
        let (input_len, output_len) = match direction {
            P2pDirection::Send => (len, 0),
            P2pDirection::Recv => (0, len),
        };
        let meta = self.record_p2p(kind, peer, tag, dtype, input_len, output_len);
        let op = P2pOp {
            direction,
            ptr,
            count: len,
            dtype,
            peer,
        };
        let (id, slot) = p2p::enqueue(&self.shared, op);
        let output = match direction {
            P2pDirection::Send => Output::Host(host),
            P2pDirection::Recv => Output::Device { ptr, dtype, len },
        };
        let mut ptrs = staging.into_vec();
        let work = P2pWork {
            shared: Arc::clone(&self.shared),
            id,
            slot,
            buffer: ptrs.pop(),
            output: Some(output),
            meta,
        };
        Ok(Handle::new(kind, Box::new(work)))
    }
}

impl<L: CollLibrary> Collective for DeviceComm<L> {
    fn backend_name(&self) -> &'static str {
        L::BACKEND
    }

    fn rank(&self) -> usize {
        self.world.rank
    }

    fn world_size(&self) -> usize {
        self.world.world_size
    }

    fn all_gather(&self, group: &Group, input: Buffer) -> CommResult<Handle> {
        let spec = validate::spec_for(CollectiveKind::AllGather, group, input.len(), None, None)?;
        self.host_collective(group, spec, input, None)
    }

    fn reduce_scatter(&self, group: &Group, input: Buffer, op: ReduceOp) -> CommResult<Handle> {
        let kind = CollectiveKind::ReduceScatter;
        let spec = validate::spec_for(kind, group, input.len(), Some(op), None)?;
        self.host_collective(group, spec, input, None)
    }

    fn all_reduce(&self, group: &Group, input: Buffer, op: ReduceOp) -> CommResult<Handle> {
        let kind = CollectiveKind::AllReduce;
        let spec = validate::spec_for(kind, group, input.len(), Some(op), None)?;
        self.host_collective(group, spec, input, None)
    }

    fn broadcast(&self, group: &Group, buffer: Buffer, root: usize) -> CommResult<Handle> {
        let kind = CollectiveKind::Broadcast;
        validate::position(kind, group, self.world.rank, self.world.world_size)?;
        let spec = validate::spec_for(kind, group, buffer.len(), None, Some(root))?;
        self.host_collective(group, spec, buffer, Some(root))
    }

    fn all_to_all(&self, group: &Group, input: Buffer) -> CommResult<Handle> {
        let spec = validate::spec_for(CollectiveKind::AllToAll, group, input.len(), None, None)?;
        self.host_collective(group, spec, input, None)
    }

    fn all_to_all_v(
        &self,
        group: &Group,
        input: Buffer,
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> CommResult<Handle> {
        validate::position(
            CollectiveKind::AllToAllV,
            group,
            self.world.rank,
            self.world.world_size,
        )?;
        let spec = validate::spec_all_to_all_v(group, input.len(), send_counts, recv_counts)?;
        self.host_collective(group, spec, input, None)
    }

    fn barrier(&self, group: &Group) -> CommResult<Handle> {
        self.host_collective(group, Spec::Barrier, Buffer::empty(DType::F32), None)
    }

    fn send(&self, input: Buffer, dst: usize, tag: u64) -> CommResult<Handle> {
        let (dtype, len) = (input.dtype(), input.len());
        self.queue_p2p(P2pDirection::Send, input, dtype, len, dst, tag)
    }

    fn recv(&self, src: usize, tag: u64, dtype: DType, len: usize) -> CommResult<Handle> {
        self.queue_p2p(
            P2pDirection::Recv,
            Buffer::empty(dtype),
            dtype,
            len,
            src,
            tag,
        )
    }

    fn trace(&self) -> Vec<TraceEvent> {
        self.trace.borrow().clone()
    }

    fn prepare_groups(&self, groups: &[Group]) -> CommResult<()> {
        self.join_groups(groups)
    }
}
