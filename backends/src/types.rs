//! Small value types shared by every backend: element types, reduction ops, collective kinds.

use std::fmt;

use half::bf16;

/// Element type of a communication payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16 (stored as `half::bf16`).
    Bf16,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }

    /// Lower-case name (`f32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Element-wise reduction applied by all-reduce and reduce-scatter: the plan's own type,
/// so plans and backends cannot disagree. Every backend reduces in ascending rank order;
/// `Avg` is one division by the group size at the end; `Max`/`Min` propagate NaN.
pub use hpfsdp_plan::ReduceOp;

/// The kind of a communication call, as recorded in traces and error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollectiveKind {
    /// Concatenate equal-size inputs in group order on every member.
    AllGather,
    /// Reduce, then give member `i` chunk `i`.
    ReduceScatter,
    /// Reduce; every member gets the whole result.
    AllReduce,
    /// Copy the root's buffer to every member.
    Broadcast,
    /// Member `i` sends chunk `j` to member `j` (equal chunks).
    AllToAll,
    /// All-to-all with per-peer counts.
    AllToAllV,
    /// Synchronise a group; no payload.
    Barrier,
    /// Point-to-point send.
    Send,
    /// Point-to-point receive.
    Recv,
}

impl CollectiveKind {
    /// Kebab-case name (`all-gather`, ...), as used by plan step programs.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllGather => "all-gather",
            CollectiveKind::ReduceScatter => "reduce-scatter",
            CollectiveKind::AllReduce => "all-reduce",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::AllToAll => "all-to-all",
            CollectiveKind::AllToAllV => "all-to-all-v",
            CollectiveKind::Barrier => "barrier",
            CollectiveKind::Send => "send",
            CollectiveKind::Recv => "recv",
        }
    }
}

impl CollectiveKind {
    /// The plan's kind of this call, the one place backends map onto
    /// [`hpfsdp_plan::CollectiveKind`]: send and receive are both halves of the plan's
    /// `SendRecv`; a barrier moves no payload and has no plan counterpart (`None`).
    pub fn plan_kind(self) -> Option<hpfsdp_plan::CollectiveKind> {
        use hpfsdp_plan::CollectiveKind as P;
        Some(match self {
            CollectiveKind::AllGather => P::AllGather,
            CollectiveKind::ReduceScatter => P::ReduceScatter,
            CollectiveKind::AllReduce => P::AllReduce,
            CollectiveKind::Broadcast => P::Broadcast,
            CollectiveKind::AllToAll => P::AllToAll,
            CollectiveKind::AllToAllV => P::AllToAllV,
            CollectiveKind::Send | CollectiveKind::Recv => P::SendRecv,
            CollectiveKind::Barrier => return None,
        })
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_payload_kind_maps_to_the_plan_and_names_agree() {
        use hpfsdp_plan::CollectiveKind as P;
        for k in [
            CollectiveKind::AllGather,
            CollectiveKind::ReduceScatter,
            CollectiveKind::AllReduce,
            CollectiveKind::Broadcast,
            CollectiveKind::AllToAll,
            CollectiveKind::AllToAllV,
        ] {
            assert_eq!(k.plan_kind().map(P::name), Some(k.name()));
        }
        assert_eq!(CollectiveKind::Send.plan_kind(), Some(P::SendRecv));
        assert_eq!(CollectiveKind::Recv.plan_kind(), Some(P::SendRecv));
        assert_eq!(CollectiveKind::Barrier.plan_kind(), None);
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// An element type a backend can move: `f32` or `half::bf16` (sealed).
pub trait Element: sealed::Sealed + Copy + Send + Sync + fmt::Debug + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Wrap a vector of this type into a [`crate::Buffer`].
    fn into_buffer(v: Vec<Self>) -> crate::Buffer;
    /// Unwrap a [`crate::Buffer`] holding this type, or report the dtype it holds.
    fn from_buffer(b: crate::Buffer) -> crate::CommResult<Vec<Self>>;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn into_buffer(v: Vec<Self>) -> crate::Buffer {
        crate::Buffer::F32(v)
    }
    fn from_buffer(b: crate::Buffer) -> crate::CommResult<Vec<Self>> {
        match b {
            crate::Buffer::F32(v) => Ok(v),
            other => Err(crate::CommError::DTypeMismatch {
                expected: DType::F32,
                actual: other.dtype(),
            }),
        }
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
    fn into_buffer(v: Vec<Self>) -> crate::Buffer {
        crate::Buffer::Bf16(v)
    }
    fn from_buffer(b: crate::Buffer) -> crate::CommResult<Vec<Self>> {
        match b {
            crate::Buffer::Bf16(v) => Ok(v),
            other => Err(crate::CommError::DTypeMismatch {
                expected: DType::Bf16,
                actual: other.dtype(),
            }),
        }
    }
}
