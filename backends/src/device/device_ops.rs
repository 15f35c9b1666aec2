//! Collectives and point-to-point batches on device-resident [`DeviceBuffer`]s: no host copies,
//! so a replay times the communication alone. Each call is enqueued between two timing events
//! on the communicator's stream; [`DeviceWork::wait`] returns the device microseconds.

use std::marker::PhantomData;
use std::sync::Arc;

use super::buffer::DeviceBuffer;
use super::comm::DeviceComm;
use super::library::{CollLibrary, Launch, P2pDirection, P2pOp};
use super::p2p;
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

impl<L: CollLibrary> DeviceComm<L> {
    /// Enqueue a collective on device-resident buffers (no host copies) between timing events.
    /// The returned work borrows the buffers; its [`DeviceWork::wait`] gives the device time.
    /// Reductions the library lacks (HCCL's average) are refused here.
    pub fn issue_device<'a>(&self, group: &Group, op: DeviceOp<'a>) -> CommResult<DeviceWork<'a>> {
        let (spec, send, recv, root) = self.device_spec(group, &op)?;
        let kind = spec.kind();
        validate::position(kind, group, self.world.rank, self.world.world_size)?;
        if let Some(o) = spec.op().filter(|o| !self.shared.lib.supports(*o)) {
            return Err(CommError::Unavailable {
                backend: L::BACKEND.into(),
                reason: format!("{kind} with {o} is not a native reduction of this library"),
            });
        }
        let out_len = spec.output_elements(group.size());
        check_device_buffer(kind, "output", recv, send.dtype(), out_len)?;
        self.activate()?;
        p2p::flush(&self.shared)?;
        let comm = self.comm_for(group)?;
        let meta = self.record(&spec, group, send.dtype(), send.len(), root);
        let at = Launch {
            comm,
            stream: self.shared.stream,
        };
        let ctx = &self.shared.ctx;
        let events = record_around(ctx, self.shared.stream, || {
            self.enqueue(&spec, send.ptr(), recv.ptr(), send.dtype(), at)
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

    /// The spec, send and receive buffers, and root of a device operation.
    fn device_spec<'a>(
        &self,
        group: &Group,
        op: &DeviceOp<'a>,
    ) -> CommResult<(Spec, &'a DeviceBuffer, &'a DeviceBuffer, Option<usize>)> {
        use CollectiveKind as K;
        Ok(match *op {
            DeviceOp::AllGather { send, recv } => (
                validate::spec_for(K::AllGather, group, send.len(), None, None)?,
                send,
                recv,
                None,
            ),
            DeviceOp::ReduceScatter { send, recv, op } => (
                validate::spec_for(K::ReduceScatter, group, send.len(), Some(op), None)?,
                send,
                recv,
                None,
            ),
            DeviceOp::AllReduce { send, recv, op } => (
                validate::spec_for(K::AllReduce, group, send.len(), Some(op), None)?,
                send,
                recv,
                None,
            ),
            DeviceOp::Broadcast { buffer, root } => (
                validate::spec_for(K::Broadcast, group, buffer.len(), None, Some(root))?,
                buffer,
                buffer,
                Some(root),
            ),
            DeviceOp::AllToAll { send, recv } => (
                validate::spec_for(K::AllToAll, group, send.len(), None, None)?,
                send,
                recv,
                None,
            ),
            DeviceOp::AllToAllV {
                send,
                recv,
                send_counts,
                recv_counts,
            } => (
                validate::spec_all_to_all_v(group, send.len(), send_counts, recv_counts)?,
                send,
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
