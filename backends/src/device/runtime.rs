//! The accelerator runtime calls both vendor backends need (CUDA runtime for NCCL, ACL for
//! HCCL): device selection, streams, device memory, host/device copies and timing events.

use std::ffi::c_void;

use crate::error::CommResult;

/// A device memory address (opaque to the host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevPtr(pub *mut c_void);

/// A runtime stream handle (`cudaStream_t`, `aclrtStream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream(pub *mut c_void);

/// A runtime event handle (`cudaEvent_t`, `aclrtEvent`), created with timing enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event(pub *mut c_void);

// SAFETY: these are opaque handles owned by the vendor runtime, which allows using them from any
// host thread once the right device is current (every entry point below sets it first).
unsafe impl Send for DevPtr {}
// SAFETY: as above.
unsafe impl Sync for DevPtr {}
// SAFETY: as above.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}
// SAFETY: as above.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl DevPtr {
    /// The address `offset_bytes` past this one.
    pub fn offset(self, offset_bytes: usize) -> DevPtr {
        DevPtr(self.0.cast::<u8>().wrapping_add(offset_bytes).cast())
    }
}

/// Accelerator runtime operations. Every call returns a typed error naming the C function and
/// the code it returned; none panics.
pub trait DeviceRuntime: Send + Sync {
    /// Runtime name (`cuda`, `acl`).
    fn name(&self) -> &'static str;
    /// Number of visible devices.
    fn device_count(&self) -> CommResult<usize>;
    /// Make device `index` current for the calling thread.
    fn set_device(&self, index: usize) -> CommResult<()>;
    /// Create a stream on the current device.
    fn create_stream(&self) -> CommResult<Stream>;
    /// Destroy a stream.
    fn destroy_stream(&self, stream: Stream) -> CommResult<()>;
    /// Block until all work queued on `stream` has finished.
    fn synchronize_stream(&self, stream: Stream) -> CommResult<()>;
    /// Allocate `bytes` of device memory.
    fn malloc(&self, bytes: usize) -> CommResult<DevPtr>;
    /// Free device memory from [`DeviceRuntime::malloc`].
    fn free(&self, ptr: DevPtr) -> CommResult<()>;
    /// Copy `src` to device memory at `dst` (synchronous).
    fn copy_to_device(&self, dst: DevPtr, src: &[u8]) -> CommResult<()>;
    /// Copy `dst.len()` bytes from device memory at `src` (synchronous).
    fn copy_to_host(&self, dst: &mut [u8], src: DevPtr) -> CommResult<()>;
    /// Create an event that records timestamps.
    fn create_timing_event(&self) -> CommResult<Event>;
    /// Enqueue `event` on `stream`.
    fn record_event(&self, event: Event, stream: Stream) -> CommResult<()>;
    /// Block until `event` has completed.
    fn synchronize_event(&self, event: Event) -> CommResult<()>;
    /// Whether `event` has completed, or `None` when the runtime cannot tell without blocking.
    fn query_event(&self, event: Event) -> CommResult<Option<bool>>;
    /// Milliseconds of device time between two completed events.
    fn elapsed_ms(&self, start: Event, end: Event) -> CommResult<f32>;
    /// Destroy an event.
    fn destroy_event(&self, event: Event) -> CommResult<()>;
    /// The name the runtime gives device `index` (`NVIDIA H200`, `Ascend910B2`), which picks
    /// the hardware profile a prediction uses.
    fn device_name(&self, index: usize) -> CommResult<String>;
    /// Make later work on `stream` wait on the device until `event` has completed (the host
    /// does not block).
    fn stream_wait_event(&self, stream: Stream, event: Event) -> CommResult<()>;
    /// Enqueue a device-to-device copy of `bytes` from `src` to `dst` on `stream`.
    fn copy_device_async(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
        stream: Stream,
    ) -> CommResult<()>;
}
