//! HCCL's C ABI as declared in `hccl_types.h` (Ascend/pytorch third_party copy; notes §1.2):
//! the root-info blob, result codes, data-type and reduction enums, and the batch send/recv
//! item.

use std::ffi::{c_char, c_void};

use crate::types::{DType, ReduceOp};

/// `HCCL_ROOT_INFO_BYTES`.
pub const HCCL_ROOT_INFO_BYTES: usize = 4108;

/// `HcclRootInfo`: the bootstrap blob, passed **by pointer** to `HcclCommInitRootInfo`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HcclRootInfo {
    /// Opaque bytes.
    pub internal: [c_char; HCCL_ROOT_INFO_BYTES],
}

impl HcclRootInfo {
    /// A root info from bytes received through the rendezvous (`bytes.len()` must be 4108).
    pub fn from_bytes(bytes: &[u8]) -> Option<HcclRootInfo> {
        let arr: &[u8; HCCL_ROOT_INFO_BYTES] = bytes.try_into().ok()?;
        Some(HcclRootInfo {
            internal: arr.map(|b| b as c_char),
        })
    }

    /// The root info's bytes, to send through the rendezvous.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.internal.iter().map(|&c| c as u8).collect()
    }
}

/// `HcclComm`.
pub type HcclCommHandle = *mut c_void;
/// `aclrtStream`.
pub type AclStreamHandle = *mut c_void;
/// `HcclResult`.
pub type HcclResult = i32;

/// `HCCL_SUCCESS`.
pub const HCCL_SUCCESS: HcclResult = 0;

/// `HcclDataType` (HCCL numbering; it differs from NCCL's).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HcclDataType {
    /// `HCCL_DATA_TYPE_INT8`.
    Int8 = 0,
    /// `HCCL_DATA_TYPE_INT16`.
    Int16 = 1,
    /// `HCCL_DATA_TYPE_INT32`.
    Int32 = 2,
    /// `HCCL_DATA_TYPE_FP16`.
    Fp16 = 3,
    /// `HCCL_DATA_TYPE_FP32`.
    Fp32 = 4,
    /// `HCCL_DATA_TYPE_INT64`.
    Int64 = 5,
    /// `HCCL_DATA_TYPE_UINT64`.
    Uint64 = 6,
    /// `HCCL_DATA_TYPE_UINT8`.
    Uint8 = 7,
    /// `HCCL_DATA_TYPE_UINT16`.
    Uint16 = 8,
    /// `HCCL_DATA_TYPE_UINT32`.
    Uint32 = 9,
    /// `HCCL_DATA_TYPE_FP64`.
    Fp64 = 10,
    /// `HCCL_DATA_TYPE_BFP16`.
    Bfp16 = 11,
}

/// `HcclReduceOp` (no average: HCCL has none).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HcclReduceOp {
    /// `HCCL_REDUCE_SUM`.
    Sum = 0,
    /// `HCCL_REDUCE_PROD`.
    Prod = 1,
    /// `HCCL_REDUCE_MAX`.
    Max = 2,
    /// `HCCL_REDUCE_MIN`.
    Min = 3,
}

/// `HcclSendRecvType`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HcclSendRecvType {
    /// `HCCL_SEND`.
    Send = 0,
    /// `HCCL_RECV`.
    Recv = 1,
}

/// `HcclSendRecvItem`: one entry of `HcclBatchSendRecv`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HcclSendRecvItem {
    /// Send or receive.
    pub send_recv_type: HcclSendRecvType,
    /// Device buffer.
    pub buf: *mut c_void,
    /// Elements.
    pub count: u64,
    /// Element type.
    pub data_type: HcclDataType,
    /// Peer's rank in the communicator.
    pub remote_rank: u32,
}

/// HCCL's type for one of our element types.
pub fn hccl_dtype(dtype: DType) -> HcclDataType {
    match dtype {
        DType::F32 => HcclDataType::Fp32,
        DType::Bf16 => HcclDataType::Bfp16,
        DType::F64 => HcclDataType::Fp64,
        DType::U8 => HcclDataType::Uint8,
    }
}

/// HCCL's operation for one of our reductions; `None` for `Avg`, which HCCL lacks.
pub fn hccl_op(op: ReduceOp) -> Option<HcclReduceOp> {
    match op {
        ReduceOp::Sum => Some(HcclReduceOp::Sum),
        ReduceOp::Max => Some(HcclReduceOp::Max),
        ReduceOp::Min => Some(HcclReduceOp::Min),
        ReduceOp::Avg => None,
    }
}
