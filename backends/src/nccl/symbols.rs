//! The NCCL functions the backend calls, resolved once at load time (notes §2.3).

use std::ffi::{c_char, c_int, c_void};

use super::abi::{CudaStreamHandle, NcclCommHandle, NcclResult, NcclUniqueId};
use crate::device::LibrarySet;
use crate::error::CommResult;

/// Function pointers into the loaded NCCL; valid for the rest of the process (a
/// [`LibrarySet`] never unmaps).
#[derive(Clone, Copy)]
pub(crate) struct NcclFns {
    pub get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub get_unique_id: unsafe extern "C" fn(*mut NcclUniqueId) -> NcclResult,
    pub comm_init_rank:
        unsafe extern "C" fn(*mut NcclCommHandle, c_int, NcclUniqueId, c_int) -> NcclResult,
    pub comm_split: Option<
        unsafe extern "C" fn(
            NcclCommHandle,
            c_int,
            c_int,
            *mut NcclCommHandle,
            *mut c_void,
        ) -> NcclResult,
    >,
    pub comm_destroy: unsafe extern "C" fn(NcclCommHandle) -> NcclResult,
    pub get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    pub get_last_error: Option<unsafe extern "C" fn(NcclCommHandle) -> *const c_char>,
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        NcclCommHandle,
        CudaStreamHandle,
    ) -> NcclResult,
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        NcclCommHandle,
        CudaStreamHandle,
    ) -> NcclResult,
    pub reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        NcclCommHandle,
        CudaStreamHandle,
    ) -> NcclResult,
    pub all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        NcclCommHandle,
        CudaStreamHandle,
    ) -> NcclResult,
    pub send: unsafe extern "C" fn(
        *const c_void,
        usize,
        c_int,
        c_int,
        NcclCommHandle,
        CudaStreamHandle,
    ) -> NcclResult,
    pub recv: unsafe extern "C" fn(
        *mut c_void,
        usize,
        c_int,
        c_int,
        NcclCommHandle,
        CudaStreamHandle,
    ) -> NcclResult,
    pub group_start: unsafe extern "C" fn() -> NcclResult,
    pub group_end: unsafe extern "C" fn() -> NcclResult,
}

impl NcclFns {
    /// Resolve every symbol; optional ones (`ncclCommSplit`, `ncclGetLastError`) may be absent.
    pub(crate) fn resolve(libs: &LibrarySet) -> CommResult<NcclFns> {
        // SAFETY: each type is the prototype declared in nccl.h (notes §2.3); the pointers are
        // kept next to the LibrarySet that owns the mapping.
        unsafe {
            Ok(NcclFns {
                get_version: libs.required("ncclGetVersion")?,
                get_unique_id: libs.required("ncclGetUniqueId")?,
                comm_init_rank: libs.required("ncclCommInitRank")?,
                comm_split: libs.optional("ncclCommSplit"),
                comm_destroy: libs.required("ncclCommDestroy")?,
                get_error_string: libs.required("ncclGetErrorString")?,
                get_last_error: libs.optional("ncclGetLastError"),
                all_reduce: libs.required("ncclAllReduce")?,
                broadcast: libs.required("ncclBroadcast")?,
                reduce_scatter: libs.required("ncclReduceScatter")?,
                all_gather: libs.required("ncclAllGather")?,
                send: libs.required("ncclSend")?,
                recv: libs.required("ncclRecv")?,
                group_start: libs.required("ncclGroupStart")?,
                group_end: libs.required("ncclGroupEnd")?,
            })
        }
    }
}
