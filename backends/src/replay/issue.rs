//! How one planned collective becomes a backend call: element type, element counts and the
//! backend group.
//!
//! Rules (the plan counts bytes per rank, backends move f32 or bf16 elements):
//! - element type: 4-byte plan dtypes move as f32, 2-byte ones (bf16, f16) as bf16, 1-byte
//!   ones (fp8) as bf16 with half as many elements (same bytes, rounded up);
//! - all-gather sends `ceil(input_bytes / size)` elements; reduce-scatter receives
//!   `ceil(output_bytes / size)` and sends group-size times that; all-reduce and broadcast
//!   move `ceil(input_bytes / size)`; all-to-all rounds its elements up to a multiple of the
//!   group size;
//! - all-to-all-v (the plan gives load-balanced expected sizes) sends its elements split as
//!   evenly as possible, lower members getting the remainder, and expects the same split
//!   from every peer;
//! - send/recv (groups of two) sends `input_bytes` to the other member and receives
//!   `output_bytes` from it, on tag 0 (the per-pair sequence keeps calls matched);
//! - reductions are sums; broadcasts come from the group's lowest rank.

use hpfsdp_plan::{CollectiveKind as PlanKind, DType as PlanDType};
use hpfsdp_program::step::CollectiveOp;

use crate::buffer::Buffer;
use crate::collective::{Collective, Handle};
use crate::error::CommResult;
use crate::group::Group;
use crate::replay::pool::BufferPool;
use crate::types::{CollectiveKind, DType, ReduceOp};

/// The backend element type for a plan dtype, and how many plan bytes one element carries.
pub fn wire_dtype(dtype: PlanDType) -> DType {
    match dtype.bytes() {
        4 => DType::F32,
        _ => DType::Bf16,
    }
}

/// Elements of `dtype` needed to hold `bytes` bytes (rounded up).
pub fn elements(bytes: u64, dtype: DType) -> usize {
    bytes.div_ceil(dtype.size_bytes() as u64) as usize
}

/// The backend kind a planned collective is issued as (send/recv issues a send then a recv).
pub fn backend_kind(kind: PlanKind) -> CollectiveKind {
    match kind {
        PlanKind::AllGather => CollectiveKind::AllGather,
        PlanKind::ReduceScatter => CollectiveKind::ReduceScatter,
        PlanKind::AllReduce => CollectiveKind::AllReduce,
        PlanKind::Broadcast => CollectiveKind::Broadcast,
        PlanKind::AllToAll => CollectiveKind::AllToAll,
        PlanKind::AllToAllV => CollectiveKind::AllToAllV,
        PlanKind::SendRecv => CollectiveKind::Send,
    }
}

/// Elements this rank sends for `c` on a group of `p` ranks.
pub fn input_elements(c: &CollectiveOp, p: usize) -> usize {
    let dt = wire_dtype(c.dtype);
    match c.kind {
        PlanKind::ReduceScatter => elements(c.output_bytes, dt) * p,
        PlanKind::AllToAll => elements(c.input_bytes, dt).div_ceil(p) * p,
        _ => elements(c.input_bytes, dt),
    }
}

/// Even split of `n` elements over `p` members, lower members taking the remainder.
pub fn even_split(n: usize, p: usize) -> Vec<usize> {
    (0..p).map(|j| n / p + usize::from(j < n % p)).collect()
}

/// Handles of one issued planned collective (send/recv gives two).
pub struct Issued {
    /// The handles, to be waited on in order.
    pub handles: Vec<Handle>,
}

/// Issues `c` on `group` from the calling rank with buffers from `pool`. With `swap_kind`,
/// issues a deliberately different collective (fault injection: all-reduce instead of the
/// planned kind, all-gather instead of an all-reduce).
pub fn issue<C: Collective + ?Sized>(
    comm: &C,
    c: &CollectiveOp,
    group: &Group,
    pool: &mut BufferPool,
    swap_kind: bool,
) -> CommResult<Issued> {
    let dt = wire_dtype(c.dtype);
    let p = group.size();
    let me = comm.rank();
    let fill = (me % 7) as f32 + 1.0;
    let n = input_elements(c, p);
    let input = pool.take(dt, n, fill);
    if swap_kind {
        let h = if c.kind == PlanKind::AllReduce {
            comm.all_gather(group, input)?
        } else {
            comm.all_reduce(group, input, ReduceOp::Sum)?
        };
        return Ok(Issued { handles: vec![h] });
    }
    let h = match c.kind {
        PlanKind::AllGather => comm.all_gather(group, input)?,
        PlanKind::ReduceScatter => comm.reduce_scatter(group, input, ReduceOp::Sum)?,
        PlanKind::AllReduce => comm.all_reduce(group, input, ReduceOp::Sum)?,
        PlanKind::Broadcast => comm.broadcast(group, input, group.ranks()[0])?,
        PlanKind::AllToAll => comm.all_to_all(group, input)?,
        PlanKind::AllToAllV => {
            let send = even_split(n, p);
            let pos = group.position(me).unwrap_or(0);
            let recv = vec![send[pos]; p];
            comm.all_to_all_v(group, input, &send, &recv)?
        }
        PlanKind::SendRecv => {
            let peer = group
                .ranks()
                .iter()
                .copied()
                .find(|&r| r != me)
                .unwrap_or(me);
            let sent = comm.send(input, peer, 0)?;
            let got = comm.recv(peer, 0, dt, elements(c.output_bytes, dt))?;
            return Ok(Issued {
                handles: vec![sent, got],
            });
        }
    };
    Ok(Issued { handles: vec![h] })
}

/// Puts every buffer a finished collective gave back into the pool.
pub fn recycle(pool: &mut BufferPool, buffers: Vec<Buffer>) {
    for b in buffers {
        pool.put(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_plan::Tier;
    use hpfsdp_program::step::GroupId as PlanGroupId;

    fn op(kind: PlanKind, input_bytes: u64, output_bytes: u64, dtype: PlanDType) -> CollectiveOp {
        CollectiveOp {
            kind,
            group: PlanGroupId(0),
            tier: Tier::IntraMachine,
            input_bytes,
            output_bytes,
            dtype,
            aligned_512: false,
        }
    }

    #[test]
    fn element_counts_follow_the_rules() {
        assert_eq!(wire_dtype(PlanDType::F32), DType::F32);
        assert_eq!(wire_dtype(PlanDType::F8e4m3), DType::Bf16);
        let ag = op(PlanKind::AllGather, 10, 40, PlanDType::F32);
        assert_eq!(input_elements(&ag, 4), 3);
        let rs = op(PlanKind::ReduceScatter, 64, 16, PlanDType::Bf16);
        assert_eq!(input_elements(&rs, 4), 32);
        let a2a = op(PlanKind::AllToAll, 40, 40, PlanDType::F32);
        assert_eq!(input_elements(&a2a, 4), 12);
        assert_eq!(even_split(10, 4), vec![3, 3, 2, 2]);
    }
}
