//! cuBLAS (`libcublas`), loaded at run time: bf16 GEMMs with f32 accumulation on a stream,
//! for replay's `--compute real` on NCCL.
//!
//! Matrices are row-major for the caller: [`Cublas::gemm_bf16`] computes
//! `C[b] = A[b] · B[b]` with `A[b]` `m x k`, `B[b]` `k x n`, `C[b]` `m x n`, for `batch`
//! products whose operands lie `stride_*` elements apart (a stride of 0 reuses one operand).
//! cuBLAS is column-major, so the call passes the transposed problem `C^T = B^T · A^T`
//! (`m` and `n` swapped, `B` first), which reads the same row-major memory.

use std::ffi::{CStr, c_char, c_int, c_longlong, c_void};

use super::gemm::GemmProblem;
use super::loader::{LibrarySet, LibrarySpec};
use super::runtime::{DevPtr, Stream};
use super::world::EnvLookup;
use crate::error::{CommError, CommResult};

/// Where cuBLAS is looked for; `HPFSDP_CUBLAS_LIB` overrides the list.
pub const CUBLAS_SPEC: LibrarySpec = LibrarySpec {
    backend: "nccl",
    library: "cuBLAS",
    env_var: "HPFSDP_CUBLAS_LIB",
    candidates: &[
        "libcublas.so",
        "libcublas.so.13",
        "libcublas.so.12",
        "libcublas.so.11",
    ],
};

/// `CUBLAS_STATUS_SUCCESS`.
pub const CUBLAS_STATUS_SUCCESS: c_int = 0;
/// `CUBLAS_OP_N`.
pub const CUBLAS_OP_N: c_int = 0;
/// `CUDA_R_16BF` (`cudaDataType`).
pub const CUDA_R_16BF: c_int = 14;
/// `CUBLAS_COMPUTE_32F` (`cublasComputeType_t`, CUDA 11+).
pub const CUBLAS_COMPUTE_32F: c_int = 68;
/// `CUBLAS_GEMM_DEFAULT` (`cublasGemmAlgo_t`).
pub const CUBLAS_GEMM_DEFAULT: c_int = -1;

type Handle = *mut c_void;

type GemmStridedBatchedEx = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    c_longlong,
    *const c_void,
    c_int,
    c_int,
    c_longlong,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    c_longlong,
    c_int,
    c_int,
    c_int,
) -> c_int;

#[derive(Clone, Copy)]
struct CublasFns {
    create: unsafe extern "C" fn(*mut Handle) -> c_int,
    destroy: unsafe extern "C" fn(Handle) -> c_int,
    set_stream: unsafe extern "C" fn(Handle, Handle) -> c_int,
    gemm_strided_batched_ex: GemmStridedBatchedEx,
    status_string: Option<unsafe extern "C" fn(c_int) -> *const c_char>,
}

/// A cuBLAS handle on one device, bound to a stream per call.
pub struct Cublas {
    fns: CublasFns,
    libs: LibrarySet,
    handle: Handle,
}

// SAFETY: the handle is used from one thread at a time (the replay rank's); cuBLAS allows a
// handle to move between host threads.
unsafe impl Send for Cublas {}
// SAFETY: every call through `&self` goes to the library, which serialises on the handle's
// stream; replay issues from one thread.
unsafe impl Sync for Cublas {}

impl std::fmt::Debug for Cublas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cublas")
            .field("paths", &self.libs.paths())
            .finish()
    }
}

impl Cublas {
    /// Load cuBLAS ([`CUBLAS_SPEC`]) and create a handle on the current device.
    pub fn load(lookup: EnvLookup<'_>) -> CommResult<Cublas> {
        let libs = LibrarySet::open(&CUBLAS_SPEC, lookup)?;
        // SAFETY: each type below is the C prototype from cublas_api.h (CUDA 11+).
        let fns = unsafe {
            CublasFns {
                create: libs.required("cublasCreate_v2")?,
                destroy: libs.required("cublasDestroy_v2")?,
                set_stream: libs.required("cublasSetStream_v2")?,
                gemm_strided_batched_ex: libs.required("cublasGemmStridedBatchedEx")?,
                status_string: libs.optional("cublasGetStatusString"),
            }
        };
        let mut handle: Handle = std::ptr::null_mut();
        let mut blas = Cublas {
            fns,
            libs,
            handle: std::ptr::null_mut(),
        };
        // SAFETY: valid out-pointer.
        blas.check(unsafe { (fns.create)(&mut handle) }, "cublasCreate_v2")?;
        blas.handle = handle;
        Ok(blas)
    }

    /// The library file that was opened.
    pub fn paths(&self) -> Vec<&str> {
        self.libs.paths()
    }

    fn check(&self, code: c_int, call: &str) -> CommResult<()> {
        if code == CUBLAS_STATUS_SUCCESS {
            return Ok(());
        }
        let message = match self.fns.status_string {
            // SAFETY: a static NUL-terminated string (or null).
            Some(f) => unsafe {
                let p = f(code);
                if p.is_null() {
                    String::from("(no description)")
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            },
            None => String::from("(cublasGetStatusString not available)"),
        };
        Err(CommError::DeviceCall {
            backend: "nccl".into(),
            call: call.to_string(),
            code: i64::from(code),
            message,
        })
    }

    /// Enqueue `C = A · B` (bf16 operands, f32 accumulation, bf16 output) on `stream`.
    /// The buffers must hold the problem's operands (checked by the caller).
    pub fn gemm_bf16(
        &self,
        stream: Stream,
        p: GemmProblem,
        a: DevPtr,
        b: DevPtr,
        c: DevPtr,
    ) -> CommResult<()> {
        let int = |v: usize, what: &str| {
            c_int::try_from(v).map_err(|_| CommError::Unavailable {
                backend: "nccl".into(),
                reason: format!("GEMM {what} = {v} exceeds cuBLAS's 32-bit int"),
            })
        };
        let (m, n, k, batch) = (
            int(p.m, "m")?,
            int(p.n, "n")?,
            int(p.k, "k")?,
            int(p.batch, "batch")?,
        );
        // SAFETY: live handle and stream.
        let code = unsafe { (self.fns.set_stream)(self.handle, stream.0) };
        self.check(code, "cublasSetStream_v2")?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ll = |v: usize| v as c_longlong;
        // SAFETY: column-major transposed problem (module doc): the "A" operand is our B
        // (n x k column-major, ld n), the "B" operand our A (k x m, ld k), C is n x m (ld n);
        // host alpha/beta in f32 for CUBLAS_COMPUTE_32F; buffers sized by the caller.
        let code = unsafe {
            (self.fns.gemm_strided_batched_ex)(
                self.handle,
                CUBLAS_OP_N,
                CUBLAS_OP_N,
                n,
                m,
                k,
                (&alpha as *const f32).cast(),
                b.0,
                CUDA_R_16BF,
                n,
                ll(p.stride_b),
                a.0,
                CUDA_R_16BF,
                k,
                ll(p.stride_a),
                (&beta as *const f32).cast(),
                c.0,
                CUDA_R_16BF,
                n,
                ll(p.stride_c),
                batch,
                CUBLAS_COMPUTE_32F,
                CUBLAS_GEMM_DEFAULT,
            )
        };
        self.check(
            code,
            &format!(
                "cublasGemmStridedBatchedEx(m={}, n={}, k={}, batch={})",
                p.m, p.n, p.k, p.batch
            ),
        )
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        if !self.handle.is_null() {
            // SAFETY: the handle from cublasCreate_v2, destroyed once.
            let _ = unsafe { (self.fns.destroy)(self.handle) };
        }
    }
}
