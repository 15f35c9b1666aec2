//! The HCCL functions the backend calls, resolved once at load time (notes §1.3).

use std::ffi::{c_char, c_void};

use super::abi::{AclStreamHandle, HcclCommHandle, HcclResult, HcclRootInfo, HcclSendRecvItem};
use crate::device::LibrarySet;
use crate::error::CommResult;

/// Function pointers into the loaded HCCL; valid for the rest of the process (a
/// [`LibrarySet`] never unmaps).
#[derive(Clone, Copy)]
pub(crate) struct HcclFns {
    pub get_root_info: unsafe extern "C" fn(*mut HcclRootInfo) -> HcclResult,
    pub comm_init_root_info:
        unsafe extern "C" fn(u32, *const HcclRootInfo, u32, *mut HcclCommHandle) -> HcclResult,
    pub comm_destroy: unsafe extern "C" fn(HcclCommHandle) -> HcclResult,
    pub get_error_string: Option<unsafe extern "C" fn(HcclResult) -> *const c_char>,
    pub all_reduce: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        u64,
        i32,
        i32,
        HcclCommHandle,
        AclStreamHandle,
    ) -> HcclResult,
    pub broadcast: unsafe extern "C" fn(
        *mut c_void,
        u64,
        i32,
        u32,
        HcclCommHandle,
        AclStreamHandle,
    ) -> HcclResult,
    pub reduce_scatter: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        u64,
        i32,
        i32,
        HcclCommHandle,
        AclStreamHandle,
    ) -> HcclResult,
    pub all_gather: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        u64,
        i32,
        HcclCommHandle,
        AclStreamHandle,
    ) -> HcclResult,
    pub all_to_all: unsafe extern "C" fn(
        *const c_void,
        u64,
        i32,
        *const c_void,
        u64,
        i32,
        HcclCommHandle,
        AclStreamHandle,
    ) -> HcclResult,
    #[allow(clippy::type_complexity)]
    pub all_to_all_v: unsafe extern "C" fn(
        *const c_void,
        *const c_void,
        *const c_void,
        i32,
        *const c_void,
        *const c_void,
        *const c_void,
        i32,
        HcclCommHandle,
        AclStreamHandle,
    ) -> HcclResult,
    pub batch_send_recv: unsafe extern "C" fn(
        *mut HcclSendRecvItem,
        u32,
        HcclCommHandle,
        AclStreamHandle,
    ) -> HcclResult,
}

impl HcclFns {
    /// Resolve every symbol, from `libhccl.so` first and `libhcomm.so` second.
    pub(crate) fn resolve(libs: &LibrarySet) -> CommResult<HcclFns> {
        // SAFETY: each type is the prototype declared in hccl.h (notes §1.3); the pointers are
        // kept next to the LibrarySet that owns the mapping.
        unsafe {
            Ok(HcclFns {
                get_root_info: libs.required("HcclGetRootInfo")?,
                comm_init_root_info: libs.required("HcclCommInitRootInfo")?,
                comm_destroy: libs.required("HcclCommDestroy")?,
                get_error_string: libs.optional("HcclGetErrorString"),
                all_reduce: libs.required("HcclAllReduce")?,
                broadcast: libs.required("HcclBroadcast")?,
                reduce_scatter: libs.required("HcclReduceScatter")?,
                all_gather: libs.required("HcclAllGather")?,
                all_to_all: libs.required("HcclAlltoAll")?,
                all_to_all_v: libs.required("HcclAlltoAllV")?,
                batch_send_recv: libs.required("HcclBatchSendRecv")?,
            })
        }
    }
}
