//! NCCL's C ABI as declared in `nccl.h` (NVIDIA/nccl `src/nccl.h.in`, 2.30.7; notes §2.2):
//! the unique id blob, result codes, and the data-type and reduction enums.

use std::ffi::{c_char, c_int, c_void};

use crate::types::{DType, ReduceOp};

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: the bootstrap blob, passed **by value** to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    /// Opaque bytes.
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl NcclUniqueId {
    /// An id from bytes received through the rendezvous (`bytes.len()` must be 128).
    pub fn from_bytes(bytes: &[u8]) -> Option<NcclUniqueId> {
        let arr: &[u8; NCCL_UNIQUE_ID_BYTES] = bytes.try_into().ok()?;
        Some(NcclUniqueId {
            internal: arr.map(|b| b as c_char),
        })
    }

    /// The id's bytes, to send through the rendezvous.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.internal.iter().map(|&c| c as u8).collect()
    }
}

/// `ncclComm_t`.
pub type NcclCommHandle = *mut c_void;
/// `cudaStream_t`.
pub type CudaStreamHandle = *mut c_void;
/// `ncclResult_t`.
pub type NcclResult = c_int;

/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclInProgress` (non-blocking communicators only; ours are blocking).
pub const NCCL_IN_PROGRESS: NcclResult = 7;
/// `NCCL_SPLIT_NOCOLOR`: the colour a rank passes to `ncclCommSplit` to stay out.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// First version with `ncclCommSplit` (2.18.0, encoded as `major*10000 + minor*100 + patch`).
pub const NCCL_SPLIT_MIN_VERSION: c_int = 21_800;

/// `ncclDataType_t` (NCCL numbering; it differs from HCCL's).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclDataType {
    /// `ncclInt8` / `ncclChar`.
    Int8 = 0,
    /// `ncclUint8`.
    Uint8 = 1,
    /// `ncclInt32` / `ncclInt`.
    Int32 = 2,
    /// `ncclUint32`.
    Uint32 = 3,
    /// `ncclInt64`.
    Int64 = 4,
    /// `ncclUint64`.
    Uint64 = 5,
    /// `ncclFloat16` / `ncclHalf`.
    Float16 = 6,
    /// `ncclFloat32` / `ncclFloat`.
    Float32 = 7,
    /// `ncclFloat64` / `ncclDouble`.
    Float64 = 8,
    /// `ncclBfloat16` (NCCL >= 2.10.3).
    Bfloat16 = 9,
    /// `ncclFloat8e4m3` (NCCL >= 2.24.3).
    Float8e4m3 = 10,
    /// `ncclFloat8e5m2` (NCCL >= 2.24.3).
    Float8e5m2 = 11,
}

/// `ncclRedOp_t` (built-in operations).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclRedOp {
    /// `ncclSum`.
    Sum = 0,
    /// `ncclProd`.
    Prod = 1,
    /// `ncclMax`.
    Max = 2,
    /// `ncclMin`.
    Min = 3,
    /// `ncclAvg` (NCCL >= 2.10).
    Avg = 4,
}

/// NCCL's type for one of our element types.
pub fn nccl_dtype(dtype: DType) -> NcclDataType {
    match dtype {
        DType::F32 => NcclDataType::Float32,
        DType::Bf16 => NcclDataType::Bfloat16,
        DType::F64 => NcclDataType::Float64,
        DType::U8 => NcclDataType::Uint8,
    }
}

/// NCCL's operation for one of our reductions (all four are native).
pub fn nccl_op(op: ReduceOp) -> NcclRedOp {
    match op {
        ReduceOp::Sum => NcclRedOp::Sum,
        ReduceOp::Avg => NcclRedOp::Avg,
        ReduceOp::Max => NcclRedOp::Max,
        ReduceOp::Min => NcclRedOp::Min,
    }
}

/// Decode `ncclGetVersion`'s integer: `major*10000 + minor*100 + patch` since 2.9, before that
/// `major*1000 + minor*100 + patch`.
pub fn decode_version(code: c_int) -> (u32, u32, u32) {
    let code = code.max(0) as u32;
    if code >= 10_000 {
        (code / 10_000, (code % 10_000) / 100, code % 100)
    } else {
        (code / 1000, (code % 1000) / 100, code % 100)
    }
}
