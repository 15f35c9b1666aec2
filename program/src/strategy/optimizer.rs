//! Placeholder optimizer step: AdamW on the local shard, one op per parameter group.
//!
//! Kept behind [`optimizer_step`] so that the distributed Muon pipeline can replace it.
//! Costs per element of the local shard: ~12 FLOPs (two moment updates, bias corrections,
//! sqrt, divide, weight decay, update); HBM traffic reads the master parameter, the gradient
//! and both fp32 moments and writes the parameter and both moments. One multi-tensor-apply
//! kernel launch per parameter tensor (PyTorch's `foreach` AdamW chunks per tensor).

use super::emit::Emitter;
use super::host_events::ADAMW_FOREACH_EVENTS_PER_PARAM;
use crate::step::{Category, ComputeWork, OpId, Stream};
use hpfsdp_plan::model::DType;

/// FLOPs per shard element of an AdamW update.
pub const ADAMW_FLOPS_PER_ELEM: u64 = 12;
/// fp32 moment bytes per shard element (exp_avg + exp_avg_sq).
pub const ADAMW_STATE_BYTES_PER_ELEM: u64 = 8;

/// The work of one AdamW update over `elems` shard elements in `tensors` tensors.
pub fn adamw_work(elems: u64, tensors: u32, master: DType, grad: DType) -> ComputeWork {
    let per_elem = 2 * master.bytes() + grad.bytes() + 2 * ADAMW_STATE_BYTES_PER_ELEM;
    ComputeWork {
        flops: ADAMW_FLOPS_PER_ELEM * elems,
        hbm_bytes: per_elem * elems,
        kernels: tensors.max(1),
        mix: None,
    }
}

/// Emits the optimizer step of one parameter group (`name`): `elems` local shard elements in
/// `tensors` tensors, after `deps`. Returns the op.
pub(crate) fn optimizer_step(
    e: &mut Emitter,
    name: &str,
    elems: u64,
    tensors: u32,
    grad_dtype: DType,
    deps: &[OpId],
) -> OpId {
    let work = adamw_work(elems, tensors, e.ctx.opts.master_dtype, grad_dtype);
    let op = e.compute(
        Stream::Compute,
        Category::Optimizer,
        work,
        deps,
        &format!("{name}.optimizer"),
    );
    e.b.host_events(op, ADAMW_FOREACH_EVENTS_PER_PARAM * tensors.max(1));
    op
}
