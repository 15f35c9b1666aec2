//! One enqueued operation's device resources (timing events, staging buffers) and the
//! [`Work`] that waits on it, reads its device time and copies its output back.

use std::sync::{Arc, Mutex};

use super::buffer::{divide_in_place, host_bytes, host_bytes_mut};
use super::runtime::{DevPtr, DeviceRuntime, Event, Stream};
use crate::buffer::Buffer;
use crate::collective::Work;
use crate::error::CommResult;
use crate::types::{CollectiveKind, DType};

/// Smallest staging allocation, so zero-element payloads still get a valid address.
const MIN_STAGING_BYTES: usize = 64;

/// Device time of one completed call, in issue order.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTiming {
    /// The call's index in this rank's trace.
    pub index: usize,
    /// What was called.
    pub kind: CollectiveKind,
    /// The group's label (`p2p` for send/recv).
    pub group_label: String,
    /// The call's per-group (or per-channel) sequence number.
    pub seq: u64,
    /// Payload bytes this rank passed in.
    pub input_bytes: usize,
    /// Microseconds between the events recorded before and after the call on the comm stream
    /// (for send/recv: of the whole batch the call was issued in).
    pub device_us: f64,
}

/// What every piece of in-flight work needs: the runtime, the device, and the timing log.
pub(crate) struct DeviceContext {
    pub(crate) rt: Arc<dyn DeviceRuntime>,
    pub(crate) device_index: usize,
    pub(crate) timings: Mutex<Vec<DeviceTiming>>,
}

impl DeviceContext {
    pub(crate) fn log(&self, mut meta: DeviceTiming, device_us: f64) {
        meta.device_us = device_us;
        self.timings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(meta);
    }
}

/// Start and end events around enqueued work.
pub(crate) struct EventPair {
    pub(crate) start: Event,
    pub(crate) end: Event,
}

/// Record an event, run `enqueue`, record a second event, all on `stream`. On failure the
/// events are destroyed and the error returned.
pub(crate) fn record_around(
    ctx: &DeviceContext,
    stream: Stream,
    enqueue: impl FnOnce() -> CommResult<()>,
) -> CommResult<EventPair> {
    let rt = &ctx.rt;
    rt.set_device(ctx.device_index)?;
    let start = rt.create_timing_event()?;
    let end = match rt.create_timing_event() {
        Ok(e) => e,
        Err(e) => {
            let _ = rt.destroy_event(start);
            return Err(e);
        }
    };
    let run = || -> CommResult<()> {
        rt.record_event(start, stream)?;
        enqueue()?;
        rt.record_event(end, stream)
    };
    match run() {
        Ok(()) => Ok(EventPair { start, end }),
        Err(e) => {
            let _ = rt.destroy_event(start);
            let _ = rt.destroy_event(end);
            Err(e)
        }
    }
}

/// Wait for an event pair and return the device microseconds between them.
pub(crate) fn elapsed_us(ctx: &DeviceContext, events: &EventPair) -> CommResult<f64> {
    ctx.rt.set_device(ctx.device_index)?;
    ctx.rt.synchronize_event(events.end)?;
    Ok(f64::from(ctx.rt.elapsed_ms(events.start, events.end)?) * 1000.0)
}

/// Device allocations freed on drop unless handed over with [`Staging::into_vec`].
pub(crate) struct Staging {
    ctx: Arc<DeviceContext>,
    ptrs: Vec<DevPtr>,
}

impl Staging {
    pub(crate) fn new(ctx: Arc<DeviceContext>) -> Staging {
        Staging {
            ctx,
            ptrs: Vec::new(),
        }
    }

    pub(crate) fn alloc(&mut self, bytes: usize) -> CommResult<DevPtr> {
        let p = self.ctx.rt.malloc(bytes.max(MIN_STAGING_BYTES))?;
        self.ptrs.push(p);
        Ok(p)
    }

    pub(crate) fn upload(&mut self, host: &Buffer) -> CommResult<DevPtr> {
        let p = self.alloc(host.bytes())?;
        self.ctx.rt.copy_to_device(p, host_bytes(host))?;
        Ok(p)
    }

    pub(crate) fn into_vec(mut self) -> Vec<DevPtr> {
        std::mem::take(&mut self.ptrs)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        free_all(&self.ctx, &mut self.ptrs);
    }
}

pub(crate) fn free_all(ctx: &DeviceContext, ptrs: &mut Vec<DevPtr>) {
    if ptrs.is_empty() {
        return;
    }
    let _ = ctx.rt.set_device(ctx.device_index);
    for p in ptrs.drain(..) {
        // A failed free leaks device memory; nobody is left to report it to.
        let _ = ctx.rt.free(p);
    }
}

/// What a finished operation hands back.
pub(crate) enum Output {
    /// Copy `len` elements of `dtype` back from device memory.
    Device {
        ptr: DevPtr,
        dtype: DType,
        len: usize,
    },
    /// Give this host buffer back as it is (a send returns its input).
    Host(Buffer),
    /// Nothing (device-resident operations).
    Nothing,
}

/// An enqueued operation: waits on its end event, logs the device time (once per call it
/// carries), copies back, frees.
pub(crate) struct StagedWork {
    ctx: Arc<DeviceContext>,
    events: Option<EventPair>,
    buffers: Vec<DevPtr>,
    output: Option<Output>,
    divide_by: Option<usize>,
    metas: Vec<DeviceTiming>,
}

impl StagedWork {
    pub(crate) fn new(
        ctx: Arc<DeviceContext>,
        events: EventPair,
        buffers: Vec<DevPtr>,
        output: Output,
        divide_by: Option<usize>,
        metas: Vec<DeviceTiming>,
    ) -> StagedWork {
        StagedWork {
            ctx,
            events: Some(events),
            buffers,
            output: Some(output),
            divide_by,
            metas,
        }
    }

    /// Wait, log the device time, copy the output back; resources are released either way.
    pub(crate) fn finish(&mut self) -> CommResult<(Buffer, f64)> {
        let result = self.finish_inner();
        self.release();
        result
    }

    fn finish_inner(&mut self) -> CommResult<(Buffer, f64)> {
        let Some(events) = &self.events else {
            return Ok((Buffer::empty(DType::F32), 0.0));
        };
        let device_us = elapsed_us(&self.ctx, events)?;
        for meta in &self.metas {
            self.ctx.log(meta.clone(), device_us);
        }
        let out = match self.output.take() {
            Some(Output::Device { ptr, dtype, len }) => {
                let mut out = Buffer::zeros(dtype, len);
                self.ctx.rt.copy_to_host(host_bytes_mut(&mut out), ptr)?;
                if let Some(n) = self.divide_by {
                    divide_in_place(&mut out, n);
                }
                out
            }
            Some(Output::Host(b)) => b,
            Some(Output::Nothing) | None => Buffer::empty(DType::F32),
        };
        Ok((out, device_us))
    }

    fn release(&mut self) {
        if let Some(ev) = self.events.take() {
            let _ = self.ctx.rt.set_device(self.ctx.device_index);
            // Never free memory a queued operation may still touch.
            let _ = self.ctx.rt.synchronize_event(ev.end);
            let _ = self.ctx.rt.destroy_event(ev.start);
            let _ = self.ctx.rt.destroy_event(ev.end);
        }
        free_all(&self.ctx, &mut self.buffers);
    }
}

impl Drop for StagedWork {
    fn drop(&mut self) {
        self.release();
    }
}

impl Work for StagedWork {
    fn is_complete(&self) -> bool {
        match &self.events {
            // An error here makes `wait` report it at once, so the work counts as complete.
            Some(ev) => self
                .ctx
                .rt
                .query_event(ev.end)
                .map_or(true, |d| d.unwrap_or(false)),
            None => true,
        }
    }

    fn wait(mut self: Box<Self>) -> CommResult<Buffer> {
        self.finish().map(|(b, _)| b)
    }
}
