//! Point-to-point calls are batched: `send`/`recv` queue their operation, and the queue is
//! issued as one batch (`ncclGroupStart/End`, `HcclBatchSendRecv`) at the next collective, at
//! the first wait on any queued call, or at [`super::DeviceComm::synchronize`]. A pair of ranks
//! that both send then receive therefore cannot deadlock, and a rank can send to itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::buffer::host_bytes_mut;
use super::library::{CollLibrary, Launch, P2pOp, RawComm};
use super::runtime::{DevPtr, Stream};
use super::staging::{
    DeviceContext, DeviceTiming, EventPair, Output, elapsed_us, free_all, record_around,
};
use crate::buffer::Buffer;
use crate::collective::Work;
use crate::error::{CommError, CommResult};
use crate::group::GroupId;
use crate::types::DType;

/// State shared by a communicator ([`super::DeviceComm`]) and its in-flight work (here for
/// the point-to-point queue it holds); torn down when the last user goes.
pub(crate) struct Shared<L: CollLibrary> {
    pub(crate) lib: L,
    pub(crate) ctx: Arc<DeviceContext>,
    pub(crate) stream: Stream,
    pub(crate) world: RawComm,
    pub(crate) groups: Mutex<HashMap<GroupId, RawComm>>,
    pub(crate) pending: Mutex<PendingQueue>,
}

impl<L: CollLibrary> Drop for Shared<L> {
    fn drop(&mut self) {
        let rt = &self.ctx.rt;
        let _ = rt.set_device(self.ctx.device_index);
        let _ = rt.synchronize_stream(self.stream);
        let groups = std::mem::take(&mut *self.groups.lock().unwrap_or_else(|e| e.into_inner()));
        for comm in groups.into_values() {
            let _ = self.lib.destroy(comm);
        }
        let _ = self.lib.destroy(self.world);
        let _ = rt.destroy_stream(self.stream);
    }
}

/// Where a queued operation learns which batch carried it.
pub(crate) type Slot = Arc<OnceLock<Arc<Batch>>>;

struct Pending {
    id: u64,
    op: P2pOp,
    slot: Slot,
}

/// Operations queued since the last flush.
#[derive(Default)]
pub(crate) struct PendingQueue {
    next_id: u64,
    ops: Vec<Pending>,
}

/// One issued batch: its events (or the error that stopped it) and its measured time.
pub(crate) struct Batch {
    ctx: Arc<super::staging::DeviceContext>,
    events: Result<EventPair, CommError>,
    elapsed: Mutex<Option<CommResult<f64>>>,
}

impl Batch {
    fn wait(&self) -> CommResult<f64> {
        let events = self.events.as_ref().map_err(Clone::clone)?;
        let mut cached = self.elapsed.lock().unwrap_or_else(|e| e.into_inner());
        cached
            .get_or_insert_with(|| elapsed_us(&self.ctx, events))
            .clone()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Ok(ev) = &self.events {
            let _ = self.ctx.rt.set_device(self.ctx.device_index);
            let _ = self.ctx.rt.synchronize_event(ev.end);
            let _ = self.ctx.rt.destroy_event(ev.start);
            let _ = self.ctx.rt.destroy_event(ev.end);
        }
    }
}

/// Queue `op`; returns its id and the slot the flushing batch fills.
pub(crate) fn enqueue<L: CollLibrary>(shared: &Shared<L>, op: P2pOp) -> (u64, Slot) {
    let mut q = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
    let id = q.next_id;
    q.next_id += 1;
    let slot: Slot = Arc::default();
    q.ops.push(Pending {
        id,
        op,
        slot: Arc::clone(&slot),
    });
    (id, slot)
}

/// Issue every queued operation as one batch on the world communicator.
pub(crate) fn flush<L: CollLibrary>(shared: &Shared<L>) -> CommResult<()> {
    let pending = {
        let mut q = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut q.ops)
    };
    if pending.is_empty() {
        return Ok(());
    }
    let ops: Vec<P2pOp> = pending.iter().map(|p| p.op).collect();
    let at = Launch {
        comm: shared.world,
        stream: shared.stream,
    };
    let events = record_around(&shared.ctx, shared.stream, || {
        shared.lib.p2p_batch(&ops, at)
    });
    let result = events.as_ref().map(|_| ()).map_err(Clone::clone);
    let batch = Arc::new(Batch {
        ctx: Arc::clone(&shared.ctx),
        events,
        elapsed: Mutex::new(None),
    });
    for p in pending {
        let _ = p.slot.set(Arc::clone(&batch));
    }
    result
}

/// Drop a still-queued operation (its handle was dropped unwaited).
fn cancel<L: CollLibrary>(shared: &Shared<L>, id: u64) {
    let mut q = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
    q.ops.retain(|p| p.id != id);
}

/// The handle of a queued send or receive.
pub(crate) struct P2pWork<L: CollLibrary> {
    pub(crate) shared: Arc<Shared<L>>,
    pub(crate) id: u64,
    pub(crate) slot: Slot,
    pub(crate) buffer: Option<DevPtr>,
    pub(crate) output: Option<Output>,
    pub(crate) meta: DeviceTiming,
}

impl<L: CollLibrary> P2pWork<L> {
    fn finish(&mut self) -> CommResult<Buffer> {
        if self.slot.get().is_none() {
            flush(&self.shared)?;
        }
        let batch = self.slot.get().ok_or_else(|| CommError::Unavailable {
            backend: L::BACKEND.into(),
            reason: "a queued send/recv was not issued by the flush that should carry it".into(),
        })?;
        let device_us = batch.wait()?;
        self.shared.ctx.log(self.meta.clone(), device_us);
        Ok(match self.output.take() {
            Some(Output::Device { ptr, dtype, len }) => {
                let mut out = Buffer::zeros(dtype, len);
                self.shared
                    .ctx
                    .rt
                    .set_device(self.shared.ctx.device_index)?;
                self.shared
                    .ctx
                    .rt
                    .copy_to_host(host_bytes_mut(&mut out), ptr)?;
                out
            }
            Some(Output::Host(b)) => b,
            Some(Output::Nothing) | None => Buffer::empty(DType::F32),
        })
    }

    fn release(&mut self) {
        let Some(ptr) = self.buffer.take() else {
            return;
        };
        match self.slot.get() {
            None => cancel(&self.shared, self.id),
            Some(batch) => {
                let _ = batch.wait();
            }
        }
        free_all(&self.shared.ctx, &mut vec![ptr]);
    }
}

impl<L: CollLibrary> Drop for P2pWork<L> {
    fn drop(&mut self) {
        self.release();
    }
}

impl<L: CollLibrary> Work for P2pWork<L> {
    fn is_complete(&self) -> bool {
        match self.slot.get() {
            None => false,
            Some(b) => match &b.events {
                Ok(ev) => self
                    .shared
                    .ctx
                    .rt
                    .query_event(ev.end)
                    .map_or(true, |d| d.unwrap_or(false)),
                Err(_) => true,
            },
        }
    }

    fn wait(mut self: Box<Self>) -> CommResult<Buffer> {
        let r = self.finish();
        self.release();
        r
    }
}
