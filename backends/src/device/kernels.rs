//! Device-side compute for replay: a spin kernel of a given duration and GEMMs, enqueued on a
//! stream so collectives contend with them for the device as in a training step.
//!
//! On CUDA ([`CudaKernels`]):
//! - **spin**: [`SPIN_PTX`], PTX text loaded through the driver API at run time
//!   (`cuModuleLoadData`, `cuLaunchKernel`), so building needs no CUDA toolkit. One block of
//!   [`SPIN_BLOCK_THREADS`] threads per SM; every thread spins on the device's global
//!   nanosecond timer (`%globaltimer`) until the duration has passed since it started, so the
//!   kernel holds every SM's issue slots for the predicted time while leaving room on each SM
//!   for the communication kernels that run beside it.
//! - **GEMM**: cuBLAS loaded at run time (`cublasGemmStridedBatchedEx`, bf16 with f32
//!   accumulation), only when asked for (`--compute real`).
//!
//! ACL loads no kernel from source text at run time, so the HCCL backend has no
//! [`DeviceKernels`]: its replay runs compute on the host (see `replay::device`).

#[cfg(feature = "nccl")]
use std::sync::Arc;

#[cfg(feature = "nccl")]
use super::cublas::Cublas;
#[cfg(feature = "nccl")]
use super::cuda_driver::{CudaDriver, Function, LaunchDims};
use super::runtime::{DevPtr, Stream};
use crate::error::CommResult;

pub use super::gemm::GemmProblem;

/// The spin kernel: `hpfsdp_spin(u64 duration_ns)`. Assembled and checked with `ptxas` for
/// sm_80, sm_90 and sm_100; PTX ISA 6.0 / sm_60, so any driver since CUDA 9 JIT-compiles it.
pub const SPIN_PTX: &str = r#"//
// hpfsdp replay: every thread spins until `duration_ns` nanoseconds have passed on the
// device's global timer, counted from the moment the thread started.
//
.version 6.0
.target sm_60
.address_size 64

.visible .entry hpfsdp_spin(
	.param .u64 hpfsdp_spin_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [hpfsdp_spin_param_0];
	mov.u64 	%rd2, %globaltimer;
	add.u64 	%rd3, %rd2, %rd1;
$L__spin:
	mov.u64 	%rd4, %globaltimer;
	setp.lt.u64 	%p1, %rd4, %rd3;
	@%p1 bra 	$L__spin;
	ret;
}
"#;

/// The spin kernel's entry name.
pub const SPIN_ENTRY: &str = "hpfsdp_spin";
/// Threads per block of the spin kernel (one block per SM).
pub const SPIN_BLOCK_THREADS: u32 = 128;

/// Kernels a replay enqueues on a device stream.
pub trait DeviceKernels: Send + Sync {
    /// What runs the kernels (libraries, device), for reports.
    fn describe(&self) -> String;
    /// Enqueue a kernel that keeps the device busy for `duration_ns` on `stream`.
    fn spin(&self, stream: Stream, duration_ns: u64) -> CommResult<()>;
    /// Whether [`DeviceKernels::gemm`] is available (cuBLAS loaded).
    fn has_gemm(&self) -> bool;
    /// Enqueue a bf16 batched GEMM (row-major, see [`GemmProblem`]) on `stream`.
    fn gemm(
        &self,
        stream: Stream,
        problem: GemmProblem,
        a: DevPtr,
        b: DevPtr,
        c: DevPtr,
    ) -> CommResult<()>;
}

#[cfg(feature = "nccl")]
/// [`DeviceKernels`] on CUDA: the spin module in the device's primary context, and cuBLAS
/// when GEMMs were asked for.
pub struct CudaKernels {
    driver: Arc<CudaDriver>,
    spin: Function,
    dims: LaunchDims,
    device_index: usize,
    device_name: String,
    cublas: Option<Cublas>,
}

#[cfg(feature = "nccl")]
impl CudaKernels {
    /// Load the spin kernel on device `device_index` (its primary context is made current on
    /// this thread) and, when `cublas` is given, keep it for GEMMs.
    pub fn new(
        driver: Arc<CudaDriver>,
        device_index: usize,
        cublas: Option<Cublas>,
    ) -> CommResult<CudaKernels> {
        driver.make_current(device_index)?;
        let module = driver.load_ptx(SPIN_PTX)?;
        let spin = driver.function(module, SPIN_ENTRY)?;
        let sms = driver.sm_count(device_index)?;
        let device_name = driver.device_name(device_index)?;
        Ok(CudaKernels {
            driver,
            spin,
            dims: LaunchDims {
                grid: sms,
                block: SPIN_BLOCK_THREADS,
            },
            device_index,
            device_name,
            cublas,
        })
    }

    /// Grid and block of the spin kernel.
    pub fn spin_dims(&self) -> LaunchDims {
        self.dims
    }
}

#[cfg(feature = "nccl")]
impl DeviceKernels for CudaKernels {
    fn describe(&self) -> String {
        let blas = match &self.cublas {
            Some(b) => format!("cuBLAS ({})", b.paths().join(", ")),
            None => "no cuBLAS".to_string(),
        };
        format!(
            "device {} ({}): PTX spin kernel {}x{} through the CUDA driver ({}), {blas}",
            self.device_index,
            self.device_name,
            self.dims.grid,
            self.dims.block,
            self.driver.paths().join(", ")
        )
    }

    fn spin(&self, stream: Stream, duration_ns: u64) -> CommResult<()> {
        let mut ns = duration_ns;
        let mut params = [(&mut ns as *mut u64).cast::<std::ffi::c_void>()];
        // SAFETY: hpfsdp_spin takes one .u64 parameter; `ns` outlives the call (the driver
        // copies parameters at launch).
        unsafe {
            self.driver
                .launch(self.spin, self.dims, stream, &mut params)
        }
    }

    fn has_gemm(&self) -> bool {
        self.cublas.is_some()
    }

    fn gemm(
        &self,
        stream: Stream,
        problem: GemmProblem,
        a: DevPtr,
        b: DevPtr,
        c: DevPtr,
    ) -> CommResult<()> {
        match &self.cublas {
            Some(blas) => blas.gemm_bf16(stream, problem, a, b, c),
            None => Err(crate::error::CommError::Unavailable {
                backend: "nccl".into(),
                reason: "GEMMs need cuBLAS, which was not loaded (--compute real loads it)".into(),
            }),
        }
    }
}
