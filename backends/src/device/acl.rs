//! The Ascend ACL runtime (`libascendcl.so`), loaded at run time, as a [`DeviceRuntime`] for
//! HCCL.

use std::ffi::{CStr, c_char, c_int, c_void};

use super::loader::{LibrarySet, LibrarySpec};
use super::runtime::{DevPtr, DeviceRuntime, Event, Stream};
use super::world::EnvLookup;
use crate::error::{CommError, CommResult};

/// Where ACL is looked for; `HPFSDP_ACL_LIB` overrides the list.
pub const ACL_SPEC: LibrarySpec = LibrarySpec {
    backend: "hccl",
    library: "ACL runtime",
    env_var: "HPFSDP_ACL_LIB",
    candidates: &["libascendcl.so"],
};

/// `ACL_SUCCESS`.
pub const ACL_SUCCESS: c_int = 0;
/// `ACL_ERROR_REPEAT_INITIALIZE`: `aclInit` was already called in this process (harmless).
pub const ACL_ERROR_REPEAT_INITIALIZE: c_int = 100_002;
/// `ACL_EVENT_TIME_LINE`: the event flag that enables `aclrtEventElapsedTime`.
pub const ACL_EVENT_TIME_LINE: u32 = 0x8;
/// `ACL_MEM_MALLOC_HUGE_FIRST` (`aclrtMemMallocPolicy`).
pub const ACL_MEM_MALLOC_HUGE_FIRST: c_int = 0;
/// `ACL_MEMCPY_HOST_TO_DEVICE` (`aclrtMemcpyKind`).
pub const ACL_MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `ACL_MEMCPY_DEVICE_TO_HOST` (`aclrtMemcpyKind`).
pub const ACL_MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `ACL_MEMCPY_DEVICE_TO_DEVICE` (`aclrtMemcpyKind`).
pub const ACL_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

type Handle = *mut c_void;

#[derive(Clone, Copy)]
struct AclFns {
    init: unsafe extern "C" fn(*const c_char) -> c_int,
    get_device_count: unsafe extern "C" fn(*mut u32) -> c_int,
    set_device: unsafe extern "C" fn(i32) -> c_int,
    create_stream: unsafe extern "C" fn(*mut Handle) -> c_int,
    destroy_stream: unsafe extern "C" fn(Handle) -> c_int,
    synchronize_stream: unsafe extern "C" fn(Handle) -> c_int,
    malloc: unsafe extern "C" fn(*mut Handle, usize, c_int) -> c_int,
    free: unsafe extern "C" fn(Handle) -> c_int,
    memcpy: unsafe extern "C" fn(Handle, usize, *const c_void, usize, c_int) -> c_int,
    create_event_with_flag: unsafe extern "C" fn(*mut Handle, u32) -> c_int,
    record_event: unsafe extern "C" fn(Handle, Handle) -> c_int,
    synchronize_event: unsafe extern "C" fn(Handle) -> c_int,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, Handle, Handle) -> c_int,
    destroy_event: unsafe extern "C" fn(Handle) -> c_int,
    stream_wait_event: unsafe extern "C" fn(Handle, Handle) -> c_int,
    memcpy_async: unsafe extern "C" fn(Handle, usize, *const c_void, usize, c_int, Handle) -> c_int,
    soc_name: Option<unsafe extern "C" fn() -> *const c_char>,
    recent_err_msg: Option<unsafe extern "C" fn() -> *const c_char>,
}

/// ACL's symbol table (the library stays mapped until the process exits). `aclInit` is called
/// once when loading; `aclFinalize` is left to process exit because other code in the process
/// (or a second communicator) may still use ACL.
pub struct AclRuntime {
    fns: AclFns,
    libs: LibrarySet,
}

impl std::fmt::Debug for AclRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclRuntime")
            .field("paths", &self.libs.paths())
            .finish()
    }
}

impl AclRuntime {
    /// Load ACL ([`ACL_SPEC`], overridable through `lookup`) and call `aclInit(NULL)`.
    pub fn load(lookup: EnvLookup<'_>) -> CommResult<AclRuntime> {
        let libs = LibrarySet::open(&ACL_SPEC, lookup)?;
        // SAFETY: each type below is the C prototype from acl.h / acl_rt.h (notes §1.4).
        let fns = unsafe {
            AclFns {
                init: libs.required("aclInit")?,
                get_device_count: libs.required("aclrtGetDeviceCount")?,
                set_device: libs.required("aclrtSetDevice")?,
                create_stream: libs.required("aclrtCreateStream")?,
                destroy_stream: libs.required("aclrtDestroyStream")?,
                synchronize_stream: libs.required("aclrtSynchronizeStream")?,
                malloc: libs.required("aclrtMalloc")?,
                free: libs.required("aclrtFree")?,
                memcpy: libs.required("aclrtMemcpy")?,
                create_event_with_flag: libs.required("aclrtCreateEventWithFlag")?,
                record_event: libs.required("aclrtRecordEvent")?,
                synchronize_event: libs.required("aclrtSynchronizeEvent")?,
                event_elapsed_time: libs.required("aclrtEventElapsedTime")?,
                destroy_event: libs.required("aclrtDestroyEvent")?,
                stream_wait_event: libs.required("aclrtStreamWaitEvent")?,
                memcpy_async: libs.required("aclrtMemcpyAsync")?,
                soc_name: libs.optional("aclrtGetSocName"),
                recent_err_msg: libs.optional("aclGetRecentErrMsg"),
            }
        };
        let rt = AclRuntime { fns, libs };
        // SAFETY: a null config path is documented as "no configuration file".
        let code = unsafe { (rt.fns.init)(std::ptr::null()) };
        if code != ACL_ERROR_REPEAT_INITIALIZE {
            rt.check(code, "aclInit(NULL)")?;
        }
        Ok(rt)
    }

    /// The library file that was opened.
    pub fn paths(&self) -> Vec<&str> {
        self.libs.paths()
    }

    fn check(&self, code: c_int, call: &str) -> CommResult<()> {
        if code == ACL_SUCCESS {
            return Ok(());
        }
        let message = match self.fns.recent_err_msg {
            // SAFETY: aclGetRecentErrMsg returns a thread-local NUL-terminated string or null.
            Some(f) => unsafe {
                let p = f();
                if p.is_null() {
                    String::from("(no description)")
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            },
            None => String::from("(aclGetRecentErrMsg not available)"),
        };
        Err(CommError::DeviceCall {
            backend: "hccl".into(),
            call: call.to_string(),
            code: i64::from(code),
            message,
        })
    }
}

impl DeviceRuntime for AclRuntime {
    fn name(&self) -> &'static str {
        "acl"
    }

    fn device_count(&self) -> CommResult<usize> {
        let mut n = 0u32;
        // SAFETY: valid out-pointer.
        self.check(
            unsafe { (self.fns.get_device_count)(&mut n) },
            "aclrtGetDeviceCount",
        )?;
        Ok(n as usize)
    }

    fn set_device(&self, index: usize) -> CommResult<()> {
        let i = i32::try_from(index).unwrap_or(i32::MAX);
        // SAFETY: plain value argument.
        self.check(
            unsafe { (self.fns.set_device)(i) },
            &format!("aclrtSetDevice({index})"),
        )
    }

    fn create_stream(&self) -> CommResult<Stream> {
        let mut s: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        self.check(
            unsafe { (self.fns.create_stream)(&mut s) },
            "aclrtCreateStream",
        )?;
        Ok(Stream(s))
    }

    fn destroy_stream(&self, stream: Stream) -> CommResult<()> {
        // SAFETY: a stream from create_stream, destroyed once by its owner.
        self.check(
            unsafe { (self.fns.destroy_stream)(stream.0) },
            "aclrtDestroyStream",
        )
    }

    fn synchronize_stream(&self, stream: Stream) -> CommResult<()> {
        // SAFETY: a live stream.
        self.check(
            unsafe { (self.fns.synchronize_stream)(stream.0) },
            "aclrtSynchronizeStream",
        )
    }

    fn malloc(&self, bytes: usize) -> CommResult<DevPtr> {
        let mut p: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let code = unsafe { (self.fns.malloc)(&mut p, bytes, ACL_MEM_MALLOC_HUGE_FIRST) };
        self.check(code, &format!("aclrtMalloc({bytes} bytes)"))?;
        Ok(DevPtr(p))
    }

    fn free(&self, ptr: DevPtr) -> CommResult<()> {
        // SAFETY: a pointer from malloc, freed once by its owner.
        self.check(unsafe { (self.fns.free)(ptr.0) }, "aclrtFree")
    }

    fn copy_to_device(&self, dst: DevPtr, src: &[u8]) -> CommResult<()> {
        let n = src.len();
        // SAFETY: `dst` holds at least `n` bytes; `src` is a live host slice.
        let code = unsafe {
            (self.fns.memcpy)(dst.0, n, src.as_ptr().cast(), n, ACL_MEMCPY_HOST_TO_DEVICE)
        };
        self.check(code, &format!("aclrtMemcpy(host to device, {n} bytes)"))
    }

    fn copy_to_host(&self, dst: &mut [u8], src: DevPtr) -> CommResult<()> {
        let n = dst.len();
        // SAFETY: as above, in the other direction.
        let code = unsafe {
            (self.fns.memcpy)(
                dst.as_mut_ptr().cast(),
                n,
                src.0,
                n,
                ACL_MEMCPY_DEVICE_TO_HOST,
            )
        };
        self.check(code, &format!("aclrtMemcpy(device to host, {n} bytes)"))
    }

    fn create_timing_event(&self) -> CommResult<Event> {
        let mut e: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; TIME_LINE is required for elapsed-time queries.
        let code = unsafe { (self.fns.create_event_with_flag)(&mut e, ACL_EVENT_TIME_LINE) };
        self.check(code, "aclrtCreateEventWithFlag(ACL_EVENT_TIME_LINE)")?;
        Ok(Event(e))
    }

    fn record_event(&self, event: Event, stream: Stream) -> CommResult<()> {
        // SAFETY: live handles.
        self.check(
            unsafe { (self.fns.record_event)(event.0, stream.0) },
            "aclrtRecordEvent",
        )
    }

    fn synchronize_event(&self, event: Event) -> CommResult<()> {
        // SAFETY: a live event.
        self.check(
            unsafe { (self.fns.synchronize_event)(event.0) },
            "aclrtSynchronizeEvent",
        )
    }

    fn query_event(&self, _event: Event) -> CommResult<Option<bool>> {
        Ok(None)
    }

    fn elapsed_ms(&self, start: Event, end: Event) -> CommResult<f32> {
        let mut ms = 0f32;
        // SAFETY: valid out-pointer and live, completed events.
        let code = unsafe { (self.fns.event_elapsed_time)(&mut ms, start.0, end.0) };
        self.check(code, "aclrtEventElapsedTime")?;
        Ok(ms)
    }

    fn destroy_event(&self, event: Event) -> CommResult<()> {
        // SAFETY: an event from create_timing_event, destroyed once by its owner.
        self.check(
            unsafe { (self.fns.destroy_event)(event.0) },
            "aclrtDestroyEvent",
        )
    }

    fn device_name(&self, _index: usize) -> CommResult<String> {
        // aclrtGetSocName names the SoC of the process's devices (one kind per machine).
        let Some(f) = self.fns.soc_name else {
            return Err(CommError::Unavailable {
                backend: "hccl".into(),
                reason: "aclrtGetSocName is not in this ACL; pass --hardware NAME".into(),
            });
        };
        // SAFETY: returns a static NUL-terminated string, or null before aclInit.
        let p = unsafe { f() };
        if p.is_null() {
            return Err(CommError::Unavailable {
                backend: "hccl".into(),
                reason: "aclrtGetSocName returned no name".into(),
            });
        }
        // SAFETY: non-null, NUL-terminated.
        Ok(unsafe { CStr::from_ptr(p) }
            .to_string_lossy()
            .trim()
            .to_string())
    }

    fn stream_wait_event(&self, stream: Stream, event: Event) -> CommResult<()> {
        // SAFETY: live handles.
        self.check(
            unsafe { (self.fns.stream_wait_event)(stream.0, event.0) },
            "aclrtStreamWaitEvent",
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
            (self.fns.memcpy_async)(
                dst.0,
                bytes,
                src.0,
                bytes,
                ACL_MEMCPY_DEVICE_TO_DEVICE,
                stream.0,
            )
        };
        self.check(
            code,
            &format!("aclrtMemcpyAsync(device to device, {bytes} bytes)"),
        )
    }
}
