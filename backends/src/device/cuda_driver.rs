//! The CUDA driver API (`libcuda`), loaded at run time: the device's name, its SM count, and
//! kernels from PTX text (`cuModuleLoadData`, `cuLaunchKernel`), so replay can run a device
//! kernel without a CUDA toolkit at build time.
//!
//! The driver and the runtime share the device's primary context: [`CudaDriver::make_current`]
//! retains it and makes it current for the calling thread, so a module loaded here and a
//! stream created by the runtime (`cudaStream_t` is a `CUstream`) work together.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};

use super::loader::{LibrarySet, LibrarySpec};
use super::runtime::Stream;
use super::world::EnvLookup;
use crate::error::{CommError, CommResult};

/// Where the driver is looked for; `HPFSDP_CUDA_DRIVER_LIB` overrides the list.
pub const CUDA_DRIVER_SPEC: LibrarySpec = LibrarySpec {
    backend: "nccl",
    library: "CUDA driver",
    env_var: "HPFSDP_CUDA_DRIVER_LIB",
    candidates: &["libcuda.so.1", "libcuda.so"],
};

/// `CUDA_SUCCESS`.
pub const CUDA_DRIVER_SUCCESS: c_int = 0;
/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
/// Longest device name asked for (`cudaDeviceProp::name` is 256 bytes).
const NAME_BYTES: usize = 256;

type Handle = *mut c_void;

#[derive(Clone, Copy)]
struct DriverFns {
    init: unsafe extern "C" fn(c_uint) -> c_int,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> c_int,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int,
    primary_ctx_retain: unsafe extern "C" fn(*mut Handle, c_int) -> c_int,
    ctx_set_current: unsafe extern "C" fn(Handle) -> c_int,
    module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> c_int,
    module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> c_int,
    launch_kernel: unsafe extern "C" fn(
        Handle,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Handle,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> c_int,
    get_error_string: Option<unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int>,
}

/// A loaded module (`CUmodule`); modules stay loaded until the process exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Module(pub *mut c_void);

/// A kernel of a loaded module (`CUfunction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Function(pub *mut c_void);

// SAFETY: opaque driver handles, usable from any thread with the right context current.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}
// SAFETY: as above.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

/// Grid and block dimensions of a launch (one-dimensional: what replay needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
}

/// The driver's symbol table; `cuInit(0)` has been called.
pub struct CudaDriver {
    fns: DriverFns,
    libs: LibrarySet,
}

impl std::fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDriver")
            .field("paths", &self.libs.paths())
            .finish()
    }
}

impl CudaDriver {
    /// Load the driver ([`CUDA_DRIVER_SPEC`], overridable through `lookup`) and initialise it.
    pub fn load(lookup: EnvLookup<'_>) -> CommResult<CudaDriver> {
        let libs = LibrarySet::open(&CUDA_DRIVER_SPEC, lookup)?;
        // SAFETY: each type below is the C prototype from cuda.h.
        let fns = unsafe {
            DriverFns {
                init: libs.required("cuInit")?,
                device_get: libs.required("cuDeviceGet")?,
                device_get_name: libs.required("cuDeviceGetName")?,
                device_get_attribute: libs.required("cuDeviceGetAttribute")?,
                primary_ctx_retain: libs.required("cuDevicePrimaryCtxRetain")?,
                ctx_set_current: libs.required("cuCtxSetCurrent")?,
                module_load_data: libs.required("cuModuleLoadData")?,
                module_get_function: libs.required("cuModuleGetFunction")?,
                launch_kernel: libs.required("cuLaunchKernel")?,
                get_error_string: libs.optional("cuGetErrorString"),
            }
        };
        let driver = CudaDriver { fns, libs };
        // SAFETY: flags must be 0.
        driver.check(unsafe { (driver.fns.init)(0) }, "cuInit(0)")?;
        Ok(driver)
    }

    /// The library file that was opened.
    pub fn paths(&self) -> Vec<&str> {
        self.libs.paths()
    }

    fn check(&self, code: c_int, call: &str) -> CommResult<()> {
        if code == CUDA_DRIVER_SUCCESS {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        let message = match self.fns.get_error_string {
            // SAFETY: valid out-pointer; the driver returns a static string or leaves null.
            Some(f) if unsafe { f(code, &mut text) } == 0 && !text.is_null() => {
                // SAFETY: a static NUL-terminated string from the driver.
                unsafe { CStr::from_ptr(text) }
                    .to_string_lossy()
                    .into_owned()
            }
            _ => String::from("(no description)"),
        };
        Err(CommError::DeviceCall {
            backend: "nccl".into(),
            call: call.to_string(),
            code: i64::from(code),
            message,
        })
    }

    fn device(&self, index: usize) -> CommResult<c_int> {
        let ordinal = c_int::try_from(index).unwrap_or(c_int::MAX);
        let mut dev: c_int = 0;
        // SAFETY: valid out-pointer.
        let code = unsafe { (self.fns.device_get)(&mut dev, ordinal) };
        self.check(code, &format!("cuDeviceGet({index})"))?;
        Ok(dev)
    }

    /// The device's name (`NVIDIA H200`).
    pub fn device_name(&self, index: usize) -> CommResult<String> {
        let dev = self.device(index)?;
        let mut buf = vec![0 as c_char; NAME_BYTES];
        // SAFETY: the buffer holds NAME_BYTES characters; the driver NUL-terminates.
        let code =
            unsafe { (self.fns.device_get_name)(buf.as_mut_ptr(), NAME_BYTES as c_int, dev) };
        self.check(code, &format!("cuDeviceGetName({index})"))?;
        buf[NAME_BYTES - 1] = 0;
        // SAFETY: NUL-terminated within the buffer (forced above).
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Ok(name.to_string_lossy().trim().to_string())
    }

    /// Streaming multiprocessors of the device.
    pub fn sm_count(&self, index: usize) -> CommResult<u32> {
        let dev = self.device(index)?;
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        let code = unsafe {
            (self.fns.device_get_attribute)(&mut n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
        };
        self.check(code, "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)")?;
        Ok(u32::try_from(n).unwrap_or(1).max(1))
    }

    /// Make the device's primary context (the one the runtime uses) current on this thread.
    pub fn make_current(&self, index: usize) -> CommResult<()> {
        let dev = self.device(index)?;
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the retained context lives until the process exits.
        let code = unsafe { (self.fns.primary_ctx_retain)(&mut ctx, dev) };
        self.check(code, &format!("cuDevicePrimaryCtxRetain({index})"))?;
        // SAFETY: a live context.
        self.check(
            unsafe { (self.fns.ctx_set_current)(ctx) },
            "cuCtxSetCurrent",
        )
    }

    /// Load a module from PTX text into the current context (the driver compiles it for the
    /// device).
    pub fn load_ptx(&self, ptx: &str) -> CommResult<Module> {
        let text = CString::new(ptx).map_err(|_| CommError::Unavailable {
            backend: "nccl".into(),
            reason: "PTX text with an interior NUL byte".into(),
        })?;
        let mut module: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a NUL-terminated PTX image.
        let code = unsafe { (self.fns.module_load_data)(&mut module, text.as_ptr().cast()) };
        self.check(code, "cuModuleLoadData(PTX)")?;
        Ok(Module(module))
    }

    /// A kernel of a loaded module, by its `.entry` name.
    pub fn function(&self, module: Module, name: &str) -> CommResult<Function> {
        let c_name = CString::new(name).unwrap_or_default();
        let mut f: Handle = std::ptr::null_mut();
        // SAFETY: valid out-pointer, live module, NUL-terminated name.
        let code = unsafe { (self.fns.module_get_function)(&mut f, module.0, c_name.as_ptr()) };
        self.check(code, &format!("cuModuleGetFunction({name})"))?;
        Ok(Function(f))
    }

    /// Enqueue `f` on `stream` with the given parameter pointers (one per kernel parameter,
    /// each pointing at the value).
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list in number, order and sizes.
    pub unsafe fn launch(
        &self,
        f: Function,
        dims: LaunchDims,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> CommResult<()> {
        // SAFETY: forwarded to the caller for the parameters; live handles.
        let code = unsafe {
            (self.fns.launch_kernel)(
                f.0,
                dims.grid,
                1,
                1,
                dims.block,
                1,
                1,
                0,
                stream.0,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.check(
            code,
            &format!("cuLaunchKernel(grid {}, block {})", dims.grid, dims.block),
        )
    }
}
