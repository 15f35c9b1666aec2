//! Small value types shared by every backend: element types, reduction ops, collective kinds.

use std::fmt;

/// Element type of a communication payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16 (stored as `half::bf16`).
    Bf16,
    /// IEEE binary64 (optimizer states, loss sums, calibration payloads).
    F64,
    /// Raw bytes (serialized records, masks); reductions wrap modulo 256 (see [`crate::reduce`]).
    U8,
}

impl DType {
    /// Every element type, in code order (the order of [`DType::code`]).
    pub const ALL: [DType; 4] = [DType::F32, DType::Bf16, DType::F64, DType::U8];

    /// A small stable integer for this type, used in wire headers between processes.
    pub fn code(self) -> u64 {
        match self {
            DType::F32 => 0,
            DType::Bf16 => 1,
            DType::F64 => 2,
            DType::U8 => 3,
        }
    }

    /// The type with wire code `code`, if any.
    pub fn from_code(code: u64) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }
}

impl DType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
            DType::F64 => 8,
            DType::U8 => 1,
        }
    }

    /// Lower-case name (`f32`, `bf16`, `f64`, `u8`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F64 => "f64",
            DType::U8 => "u8",
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

    #[test]
    fn dtype_codes_round_trip_and_sizes() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()), Some(d));
        }
        assert_eq!(DType::from_code(99), None);
        let sizes: Vec<usize> = DType::ALL.iter().map(|d| d.size_bytes()).collect();
        assert_eq!(sizes, vec![4, 2, 8, 1]);
    }
}
