//! Collectives and point-to-point batches on device-resident [`DeviceBuffer`]s: no host copies,
//! so a replay times the communication alone. Each call is enqueued between two timing events
//! on the communicator's stream; [`DeviceWork::wait`] returns the device microseconds.

use std::marker::PhantomData;
use std::sync::Arc;

use super::buffer::DeviceBuffer;
use super::comm::DeviceComm;
use super::library::{CollLibrary, Launch, P2pDirection, P2pOp, RawComm};
use super::p2p;
use super::runtime::{DevPtr, Stream};
use super::staging::{Output, StagedWork, record_around};
use super::validate::{self, Spec};
use crate::error::{CommError, CommResult};
use crate::group::Group;
use crate::types::{CollectiveKind, DType, ReduceOp};

/// A collective on device-resident buffers (see [`DeviceComm::issue_device`]). Counts come
/// from the buffers: all-gather sends all of `send`; `recv` must hold at least the output.
#[derive(Debug, Clone, Copy)]
pub enum DeviceOp<'a> {
    /// Gather `send` from every member into `recv`.
    AllGather {
        /// Input.
        send: &'a DeviceBuffer,
        /// Output (`send.len() * group size` elements at least).
        recv: &'a DeviceBuffer,
    },
    /// Reduce `send` and scatter equal chunks.
    ReduceScatter {
        /// Input (a multiple of the group size).
        send: &'a DeviceBuffer,
        /// Output (`send.len() / group size` elements at least).
        recv: &'a DeviceBuffer,
        /// Reduction.
        op: ReduceOp,
    },
    /// Reduce `send` into `recv` on every member (the two may be the same buffer).
    AllReduce {
        /// Input.
        send: &'a DeviceBuffer,
        /// Output (`send.len()` elements at least).
        recv: &'a DeviceBuffer,
        /// Reduction.
        op: ReduceOp,
    },
    /// Broadcast `buffer` from global rank `root`, in place.
    Broadcast {
        /// Payload (input on the root, output elsewhere).
        buffer: &'a DeviceBuffer,
        /// Global rank of the root.
        root: usize,
    },
    /// Equal-chunk all-to-all.
    AllToAll {
        /// Input (a multiple of the group size).
        send: &'a DeviceBuffer,
        /// Output (`send.len()` elements at least).
        recv: &'a DeviceBuffer,
    },
    /// All-gather in place, as nccl-tests' in-place column: `buffer` holds the whole output
    /// (a multiple of the group size) and this member's input is its own chunk of it.
    AllGatherInPlace {
        /// Output; this member's chunk is the input.
        buffer: &'a DeviceBuffer,
    },
    /// Reduce-scatter in place: `buffer` is the input (a multiple of the group size) and this
    /// member's chunk of it receives the result.
    ReduceScatterInPlace {
        /// Input; this member's chunk is the output.
        buffer: &'a DeviceBuffer,
        /// Reduction.
        op: ReduceOp,
    },
    /// All-to-all with per-member counts (packed chunks in member order).
    AllToAllV {
        /// Input.
        send: &'a DeviceBuffer,
        /// Output.
        recv: &'a DeviceBuffer,
        /// Elements sent to each member.
        send_counts: &'a [usize],
        /// Elements received from each member.
        recv_counts: &'a [usize],
    },
}

/// An enqueued device-resident collective; borrows its buffers until waited on or dropped.
pub struct DeviceWork<'a> {
    work: StagedWork,
    _buffers: PhantomData<&'a DeviceBuffer>,
}

impl DeviceWork<'_> {
    /// Block until the operation finished; returns its device time in microseconds.
    pub fn wait(mut self) -> CommResult<f64> {
        self.work.finish().map(|(_, us)| us)
    }
}

/// The per-member chunk of an in-place buffer (its length must split evenly over the group).
fn in_place_chunk(kind: CollectiveKind, b: &DeviceBuffer, group: &Group) -> CommResult<usize> {
    let n = group.size();
    if b.is_empty() || !b.len().is_multiple_of(n) {
        return Err(CommError::InvalidArgument {
            kind,
            reason: format!(
                "an in-place buffer of {} elements does not split into {n} equal chunks",
                b.len()
            ),
        });
    }
    Ok(b.len() / n)
}

/// Check a device buffer against the element type and minimum length an operation needs.
fn check_device_buffer(
    kind: CollectiveKind,
    what: &str,
    b: &DeviceBuffer,
    dtype: DType,
    min_len: usize,
) -> CommResult<()> {
    if b.dtype() != dtype || b.len() < min_len {
        return Err(CommError::InvalidArgument {
            kind,
            reason: format!(
                "{what} buffer holds {} {} elements but {min_len} {dtype} elements are needed",
                b.len(),
                b.dtype()
            ),
        });
    }
    Ok(())
}

/// A device operation checked and resolved to pointers, ready to enqueue.
pub(super) struct Resolved {
    pub(super) spec: Spec,
    pub(super) send: DevPtr,
    pub(super) recv: DevPtr,
    pub(super) dtype: DType,
    pub(super) input_len: usize,
    pub(super) root: Option<usize>,
    pub(super) comm: RawComm,
}

impl<L: CollLibrary> DeviceComm<L> {
    /// Enqueue a collective on device-resident buffers (no host copies) between timing events.
    /// The returned work borrows the buffers; its [`DeviceWork::wait`] gives the device time.
    /// Reductions the library lacks (HCCL's average) are refused here.
    pub fn issue_device<'a>(&self, group: &Group, op: DeviceOp<'a>) -> CommResult<DeviceWork<'a>> {
        let r = self.resolve(group, &op)?;
        let meta = self.record(&r.spec, group, r.dtype, r.input_len, r.root);
        let at = Launch {
            comm: r.comm,
            stream: self.shared.stream,
        };
        let ctx = &self.shared.ctx;
        let events = record_around(ctx, self.shared.stream, || {
            self.enqueue(&r.spec, r.send, r.recv, r.dtype, at)
        })?;
        Ok(DeviceWork {
            work: StagedWork::new(
                Arc::clone(ctx),
                events,
                Vec::new(),
                Output::Nothing,
                None,
                vec![meta],
            ),
            _buffers: PhantomData,
        })
    }

    /// Enqueue a collective on device-resident buffers on `stream` (one of the caller's),
    /// with no events and no wait: the caller orders it with events of its own and keeps the
    /// buffers alive until the stream has passed it. The call is recorded in the trace.
    pub fn enqueue_on(&self, group: &Group, op: DeviceOp<'_>, stream: Stream) -> CommResult<()> {
        let r = self.resolve(group, &op)?;
        self.record(&r.spec, group, r.dtype, r.input_len, r.root);
        let at = Launch {
            comm: r.comm,
            stream,
        };
        self.enqueue(&r.spec, r.send, r.recv, r.dtype, at)
    }

    /// nccl-tests' timed region: `calls` back-to-back launches of `op` on the communication
    /// stream between two timing events, nothing else; returns the device microseconds
    /// between the events (all calls) once they completed. Checks, copies and allocations
    /// happen before and after, never between the events.
    pub fn time_calls(&self, group: &Group, op: DeviceOp<'_>, calls: usize) -> CommResult<f64> {
        let r = self.resolve(group, &op)?;
        for _ in 0..calls {
            self.record(&r.spec, group, r.dtype, r.input_len, r.root);
        }
        let at = Launch {
            comm: r.comm,
            stream: self.shared.stream,
        };
        let ctx = &self.shared.ctx;
        let events = record_around(ctx, self.shared.stream, || {
            for _ in 0..calls {
                self.enqueue(&r.spec, r.send, r.recv, r.dtype, at)?;
            }
            Ok(())
        })?;
        let mut work = StagedWork::new(
            Arc::clone(ctx),
            events,
            Vec::new(),
            Output::Nothing,
            None,
            Vec::new(),
        );
        work.finish().map(|(_, us)| us)
    }

    /// Validate `op` for `group`, flush queued send/recv calls and find the communicator.
    pub(super) fn resolve(&self, group: &Group, op: &DeviceOp<'_>) -> CommResult<Resolved> {
        let (spec, send, recv, out_buffer, root) = self.device_spec(group, op)?;
        let kind = spec.kind();
        validate::position(kind, group, self.world.rank, self.world.world_size)?;
        if let Some(o) = spec.op().filter(|o| !self.shared.lib.supports(*o)) {
            return Err(CommError::Unavailable {
                backend: L::BACKEND.into(),
                reason: format!("{kind} with {o} is not a native reduction of this library"),
            });
        }
        let dtype = out_buffer.dtype();
        let out_len = spec.output_elements(group.size());
        if !matches!(
            op,
            DeviceOp::AllGatherInPlace { .. } | DeviceOp::ReduceScatterInPlace { .. }
        ) {
            check_device_buffer(kind, "output", out_buffer, send.1, out_len)?;
        }
        self.activate()?;
        p2p::flush(&self.shared)?;
        let comm = self.comm_for(group)?;
        Ok(Resolved {
            spec,
            send: send.0,
            recv,
            dtype,
            input_len: send.2,
            root,
            comm,
        })
    }

    /// The spec, send `(pointer, dtype, elements)`, receive pointer, output buffer and root
    /// of a device operation.
    #[allow(clippy::type_complexity)]
    fn device_spec<'a>(
        &self,
        group: &Group,
        op: &DeviceOp<'a>,
    ) -> CommResult<(
        Spec,
        (DevPtr, DType, usize),
        DevPtr,
        &'a DeviceBuffer,
        Option<usize>,
    )> {
        use CollectiveKind as K;
        let whole = |b: &DeviceBuffer| (b.ptr(), b.dtype(), b.len());
        let pos = group.position(self.world.rank).unwrap_or(0);
        Ok(match *op {
            DeviceOp::AllGather { send, recv } => (
                validate::spec_for(K::AllGather, group, send.len(), None, None)?,
                whole(send),
                recv.ptr(),
                recv,
                None,
            ),
            DeviceOp::ReduceScatter { send, recv, op } => (
                validate::spec_for(K::ReduceScatter, group, send.len(), Some(op), None)?,
                whole(send),
                recv.ptr(),
                recv,
                None,
            ),
            DeviceOp::AllReduce { send, recv, op } => (
                validate::spec_for(K::AllReduce, group, send.len(), Some(op), None)?,
                whole(send),
                recv.ptr(),
                recv,
                None,
            ),
            DeviceOp::Broadcast { buffer, root } => (
                validate::spec_for(K::Broadcast, group, buffer.len(), None, Some(root))?,
                whole(buffer),
                buffer.ptr(),
                buffer,
                Some(root),
            ),
            DeviceOp::AllToAll { send, recv } => (
                validate::spec_for(K::AllToAll, group, send.len(), None, None)?,
                whole(send),
                recv.ptr(),
                recv,
                None,
            ),
            DeviceOp::AllGatherInPlace { buffer } => {
                let count = in_place_chunk(K::AllGather, buffer, group)?;
                let es = buffer.dtype().size_bytes();
                (
                    validate::spec_for(K::AllGather, group, count, None, None)?,
                    (buffer.ptr().offset(pos * count * es), buffer.dtype(), count),
                    buffer.ptr(),
                    buffer,
                    None,
                )
            }
            DeviceOp::ReduceScatterInPlace { buffer, op } => {
                let count = in_place_chunk(K::ReduceScatter, buffer, group)?;
                let es = buffer.dtype().size_bytes();
                (
                    validate::spec_for(K::ReduceScatter, group, buffer.len(), Some(op), None)?,
                    whole(buffer),
                    buffer.ptr().offset(pos * count * es),
                    buffer,
                    None,
                )
            }
            DeviceOp::AllToAllV {
                send,
                recv,
                send_counts,
                recv_counts,
            } => (
                validate::spec_all_to_all_v(group, send.len(), send_counts, recv_counts)?,
                whole(send),
                recv.ptr(),
                recv,
                None,
            ),
        })
    }

    /// Enqueue sends and receives on device buffers as one batch (`ncclGroupStart/End`,
    /// `HcclBatchSendRecv`) on the world communicator; peers are global ranks and `tag` is
    /// recorded in the trace only. Queued host-buffer sends/receives are issued first.
    pub fn issue_device_p2p<'a>(
        &self,
        ops: &[DeviceP2p<'a>],
        tag: u64,
    ) -> CommResult<DeviceWork<'a>> {
        let (raw, metas) = self.resolve_p2p(ops, tag)?;
        let at = Launch {
            comm: self.shared.world,
            stream: self.shared.stream,
        };
        let ctx = &self.shared.ctx;
        let events = record_around(ctx, self.shared.stream, || {
            self.shared.lib.p2p_batch(&raw, at)
        })?;
        Ok(DeviceWork {
            work: StagedWork::new(
                Arc::clone(ctx),
                events,
                Vec::new(),
                Output::Nothing,
                None,
                metas,
            ),
            _buffers: PhantomData,
        })
    }

    /// [`DeviceComm::issue_device_p2p`] on the caller's `stream`, with no events and no wait
    /// (as [`DeviceComm::enqueue_on`]).
    pub fn enqueue_p2p_on(
        &self,
        ops: &[DeviceP2p<'_>],
        tag: u64,
        stream: Stream,
    ) -> CommResult<()> {
        let (raw, _) = self.resolve_p2p(ops, tag)?;
        let at = Launch {
            comm: self.shared.world,
            stream,
        };
        self.shared.lib.p2p_batch(&raw, at)
    }

    /// Check a batch, flush queued host send/recv calls and record the batch in the trace.
    fn resolve_p2p(
        &self,
        ops: &[DeviceP2p<'_>],
        tag: u64,
    ) -> CommResult<(Vec<P2pOp>, Vec<super::staging::DeviceTiming>)> {
        if ops.is_empty() {
            return Err(CommError::InvalidArgument {
                kind: CollectiveKind::Send,
                reason: "an empty batch of device sends/receives".into(),
            });
        }
        let raw: Vec<P2pOp> = ops.iter().map(DeviceP2p::raw).collect();
        for op in &raw {
            self.check_peer(op.kind(), op.peer)?;
        }
        self.activate()?;
        p2p::flush(&self.shared)?;
        let metas = raw
            .iter()
            .map(|op| {
                let (input, output) = match op.direction {
                    P2pDirection::Send => (op.count, 0),
                    P2pDirection::Recv => (0, op.count),
                };
                self.record_p2p(op.kind(), op.peer, tag, op.dtype, input, output)
            })
            .collect();
        Ok((raw, metas))
    }
}

/// One half of a device-resident point-to-point transfer (see
/// [`DeviceComm::issue_device_p2p`]); the whole buffer is sent or received.
#[derive(Debug, Clone, Copy)]
pub enum DeviceP2p<'a> {
    /// Send `buffer` to global rank `peer`.
    Send {
        /// Payload.
        buffer: &'a DeviceBuffer,
        /// Receiver.
        peer: usize,
    },
    /// Receive into `buffer` from global rank `peer`.
    Recv {
        /// Destination (its length is the expected message length).
        buffer: &'a DeviceBuffer,
        /// Sender.
        peer: usize,
    },
}

impl DeviceP2p<'_> {
    fn raw(&self) -> P2pOp {
        let (direction, buffer, peer) = match *self {
            DeviceP2p::Send { buffer, peer } => (P2pDirection::Send, buffer, peer),
            DeviceP2p::Recv { buffer, peer } => (P2pDirection::Recv, buffer, peer),
        };
        P2pOp {
            direction,
            ptr: buffer.ptr(),
            count: buffer.len(),
            dtype: buffer.dtype(),
            peer,
        }
    }
}
