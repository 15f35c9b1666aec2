//! The CUDA runtime (`libcudart`), loaded at run time, as a [`DeviceRuntime`] for NCCL.

use std::ffi::{CStr, c_char, c_int, c_void};

use std::sync::Arc;

use super::cuda_driver::CudaDriver;
use super::loader::{LibrarySet, LibrarySpec};
use super::runtime::{DevPtr, DeviceRuntime, Event, Stream};
use super::world::EnvLookup;
use crate::error::{CommError, CommResult};

/// Where the CUDA runtime is looked for; `HPFSDP_CUDART_LIB` overrides the list.
pub const CUDART_SPEC: LibrarySpec = LibrarySpec {
    backend: "nccl",
    library: "CUDA runtime",
    env_var: "HPFSDP_CUDART_LIB",
    candidates: &[
        "libcudart.so",
        "libcudart.so.13",
        "libcudart.so.12",
        "libcudart.so.11.0",
    ],
};

/// `cudaSuccess`.
pub const CUDA_SUCCESS: c_int = 0;
/// `cudaErrorNotReady`, returned by `cudaEventQuery` while an event is pending.
pub const CUDA_ERROR_NOT_READY: c_int = 600;
/// `cudaMemcpyHostToDevice`.
pub const CUDA_MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `cudaMemcpyDeviceToHost`.
pub const CUDA_MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `cudaMemcpyDeviceToDevice`.
pub const CUDA_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

type Handle = *mut c_void;

#[derive(Clone, Copy)]
struct CudaFns {
    get_device_count: unsafe extern "C" fn(*mut c_int) -> c_int,
    set_device: unsafe extern "C" fn(c_int) -> c_int,
    stream_create: unsafe extern "C" fn(*mut Handle) -> c_int,
    stream_destroy: unsafe extern "C" fn(Handle) -> c_int,
    stream_synchronize: unsafe extern "C" fn(Handle) -> c_int,
    malloc: unsafe extern "C" fn(*mut Handle, usize) -> c_int,
    free: unsafe extern "C" fn(Handle) -> c_int,
    memcpy: unsafe extern "C" fn(Handle, *const c_void, usize, c_int) -> c_int,
    event_create: unsafe extern "C" fn(*mut Handle) -> c_int,
    event_record: unsafe extern "C" fn(Handle, Handle) -> c_int,
    event_synchronize: unsafe extern "C" fn(Handle) -> c_int,
    event_query: unsafe extern "C" fn(Handle) -> c_int,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, Handle, Handle) -> c_int,
    event_destroy: unsafe extern "C" fn(Handle) -> c_int,
    stream_wait_event: unsafe extern "C" fn(Handle, Handle, u32) -> c_int,
    memcpy_async: unsafe extern "C" fn(Handle, *const c_void, usize, c_int, Handle) -> c_int,
    get_error_string: Option<unsafe extern "C" fn(c_int) -> *const c_char>,
}

/// The CUDA runtime's symbol table (the library stays mapped until the process exits), and
/// the CUDA driver beside it (device names, kernels from PTX) when it loaded.
pub struct CudaRuntime {
    fns: CudaFns,
    libs: LibrarySet,
    driver: Result<Arc<CudaDriver>, CommError>,
}

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRuntime")
            .field("paths", &self.libs.paths())
            .finish()
    }
}

impl CudaRuntime {
    /// Load the CUDA runtime ([`CUDART_SPEC`], overridable through `lookup`), and try the
    /// CUDA driver ([`super::cuda_driver::CUDA_DRIVER_SPEC`]): its failure is kept and
    /// reported by the calls that need it.
    pub fn load(lookup: EnvLookup<'_>) -> CommResult<CudaRuntime> {
        let libs = LibrarySet::open(&CUDART_SPEC, lookup)?;
        // SAFETY: each type below is the C prototype from the CUDA runtime API (notes §2.4).
        let fns = unsafe {
            CudaFns {
                get_device_count: libs.required("cudaGetDeviceCount")?,
                set_device: libs.required("cudaSetDevice")?,
                stream_create: libs.required("cudaStreamCreate")?,
                stream_destroy: libs.required("cudaStreamDestroy")?,
                stream_synchronize: libs.required("cudaStreamSynchronize")?,
                malloc: libs.required("cudaMalloc")?,
                free: libs.required("cudaFree")?,
                memcpy: libs.required("cudaMemcpy")?,
                event_create: libs.required("cudaEventCreate")?,
                event_record: libs.required("cudaEventRecord")?,
                event_synchronize: libs.required("cudaEventSynchronize")?,
                event_query: libs.required("cudaEventQuery")?,
                event_elapsed_time: libs.required("cudaEventElapsedTime")?,
                event_destroy: libs.required("cudaEventDestroy")?,
                stream_wait_event: libs.required("cudaStreamWaitEvent")?,
                memcpy_async: libs.required("cudaMemcpyAsync")?,
                get_error_string: libs.optional("cudaGetErrorString"),
            }
        };
        let driver = CudaDriver::load(lookup).map(Arc::new);
        Ok(CudaRuntime { fns, libs, driver })
    }

    /// The CUDA driver, or why it did not load.
    pub fn driver(&self) -> CommResult<Arc<CudaDriver>> {
        self.driver.clone()
    }

    /// The library file that was opened.
    pub fn paths(&self) -> Vec<&str> {
        self.libs.paths()
    }

    fn check(&self, code: c_int, call: &str) -> CommResult<()> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        let message = match self.fns.get_error_string {
            // SAFETY: cudaGetErrorString returns a static NUL-terminated string (or null).
            Some(f) => unsafe {
                let p = f(code);
                if p.is_null() {
                    String::from("(no description)")
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            },
            None => String::from("(cudaGetErrorString not available)"),
        };
        Err(CommError::DeviceCall {
            backend: "nccl".into(),
            call: call.to_string(),
            code: i64::from(code),
            message,
        })
    }
}

impl DeviceRuntime for CudaRuntime {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_count(&self) -> CommResult<usize> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        self.check(
            unsafe { (self.fns.get_device_count)(&mut n) },
            "cudaGetDeviceCount",
        )?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    fn set_device(&self, index: usize) -> CommResult<()> {
        let i = c_int::try_from(index).unwrap_or(c_int::MAX);
        // SAFETY: plain value argument.
        self.check(
            unsafe { (self.fns.set_device)(i) },
            &format!("cudaSetDevice({index})"),
        )
    }

    fn create_stream(&self) -> CommResult<Stream> {
        let mut s: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check(
            unsafe { (self.fns.stream_create)(&mut s) },
            "cudaStreamCreate",
        )?;
        Ok(Stream(s))
    }

    fn destroy_stream(&self, stream: Stream) -> CommResult<()> {
        // SAFETY: a stream from create_stream, destroyed once by its owner.
        self.check(
            unsafe { (self.fns.stream_destroy)(stream.0) },
            "cudaStreamDestroy",
        )
    }

    fn synchronize_stream(&self, stream: Stream) -> CommResult<()> {
        // SAFETY: a live stream.
        self.check(
            unsafe { (self.fns.stream_synchronize)(stream.0) },
            "cudaStreamSynchronize",
        )
    }

    fn malloc(&self, bytes: usize) -> CommResult<DevPtr> {
        let mut p: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check(
            unsafe { (self.fns.malloc)(&mut p, bytes) },
            &format!("cudaMalloc({bytes} bytes)"),
        )?;
        Ok(DevPtr(p))
    }

    fn free(&self, ptr: DevPtr) -> CommResult<()> {
        // SAFETY: a pointer from malloc, freed once by its owner.
        self.check(unsafe { (self.fns.free)(ptr.0) }, "cudaFree")
    }

    fn copy_to_device(&self, dst: DevPtr, src: &[u8]) -> CommResult<()> {
        // SAFETY: `dst` holds at least `src.len()` bytes (callers size allocations from the
        // same element counts); `src` is a live host slice.
        let code = unsafe {
            (self.fns.memcpy)(
                dst.0,
                src.as_ptr().cast(),
                src.len(),
                CUDA_MEMCPY_HOST_TO_DEVICE,
            )
        };
        self.check(
            code,
            &format!("cudaMemcpy(host to device, {} bytes)", src.len()),
        )
    }

    fn copy_to_host(&self, dst: &mut [u8], src: DevPtr) -> CommResult<()> {
        // SAFETY: as above, in the other direction.
        let code = unsafe {
            (self.fns.memcpy)(
                dst.as_mut_ptr().cast(),
                src.0,
                dst.len(),
                CUDA_MEMCPY_DEVICE_TO_HOST,
            )
        };
        self.check(
            code,
            &format!("cudaMemcpy(device to host, {} bytes)", dst.len()),
        )
    }

    fn create_timing_event(&self) -> CommResult<Event> {
        let mut e: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; default flags record timestamps.
        self.check(
            unsafe { (self.fns.event_create)(&mut e) },
            "cudaEventCreate",
        )?;
        Ok(Event(e))
    }

    fn record_event(&self, event: Event, stream: Stream) -> CommResult<()> {
        // SAFETY: live handles.
        self.check(
            unsafe { (self.fns.event_record)(event.0, stream.0) },
            "cudaEventRecord",
        )
    }

    fn synchronize_event(&self, event: Event) -> CommResult<()> {
        // SAFETY: a live event.
        self.check(
            unsafe { (self.fns.event_synchronize)(event.0) },
            "cudaEventSynchronize",
        )
    }

    fn query_event(&self, event: Event) -> CommResult<Option<bool>> {
        // SAFETY: a live event.
        let code = unsafe { (self.fns.event_query)(event.0) };
        if code == CUDA_ERROR_NOT_READY {
            return Ok(Some(false));
        }
        self.check(code, "cudaEventQuery")?;
        Ok(Some(true))
    }

    fn elapsed_ms(&self, start: Event, end: Event) -> CommResult<f32> {
        let mut ms = 0f32;
        // SAFETY: valid out-pointer and live, completed events.
        let code = unsafe { (self.fns.event_elapsed_time)(&mut ms, start.0, end.0) };
        self.check(code, "cudaEventElapsedTime")?;
        Ok(ms)
    }

    fn destroy_event(&self, event: Event) -> CommResult<()> {
        // SAFETY: an event from create_timing_event, destroyed once by its owner.
        self.check(
            unsafe { (self.fns.event_destroy)(event.0) },
            "cudaEventDestroy",
        )
    }

    fn device_name(&self, index: usize) -> CommResult<String> {
        self.driver()?.device_name(index)
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> CommResult<()> {
        // SAFETY: live handles; flags 0 (cudaEventWaitDefault).
        self.check(
            unsafe { (self.fns.stream_wait_event)(stream.0, event.0, 0) },
            "cudaStreamWaitEvent",
        )
    }

    fn copy_device_async(
        &self,
        dst: DevPtr,
        src: DevPtr,
        bytes: usize,
        stream: Stream,
    ) -> CommResult<()> {
        // SAFETY: both allocations hold at least `bytes` (sized by the caller); live stream.
        let code = unsafe {
            (self.fns.memcpy_async)(dst.0, src.0, bytes, CUDA_MEMCPY_DEVICE_TO_DEVICE, stream.0)
        };
        self.check(
            code,
            &format!("cudaMemcpyAsync(device to device, {bytes} bytes)"),
        )
    }
}
