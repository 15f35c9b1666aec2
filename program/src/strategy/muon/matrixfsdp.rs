//! MatrixFSDP (`muon.md` 7.5; paper related work and Tables "design contrast"). Each
//! modelling choice and the source fact it rests on:
//!
//! - **Owner-shaped ZeRO-3 shards** (paper: "for each 2-D weight one data-parallel rank owns
//!   the whole matrix and the remaining ranks hold empty shards"; "a global owner planner
//!   balances resident bytes and optimizer work"): each selected matrix lives whole on one
//!   owner of the FSDP shard group, owners by greedy LPT on numel.
//! - **Owner traffic in the model path** (paper: "the ordinary backward reduction delivers
//!   the full Muon input to the owner", "owner-segment point-to-point collectives"): the
//!   **FSDP part** keeps FSDP's schedule but its collectives carry the owner-shaped shards
//!   (see `strategy::hyperparallel`), as MatrixFSDP's runtime does with its default
//!   `matrix_collective_backend = "owner_broadcast"` (`matrix_fsdp/api.py`):
//!   - **publication**: the unit's all-gather becomes `broadcast_rank_segments_1d_into_async`
//!     (`runtime/collectives.py`), one async `dist.broadcast` of each owner's whole-matrix
//!     segment from its owner (the owner's matrices of the unit coalesced into one segment:
//!     one broadcast per owner and unit, `Hp::matrixfsdp_publications`), on the unit's
//!     process group. On Ascend that is HCCL's
//!     broadcast, a scatter then an all-gather (`sim/src/cost.rs`), so a publication moves
//!     twice the bytes an all-gather of the unit would. The other paths do not apply here:
//!     the "custom" owner-segment P2P kernels and the uneven all-gather need NCCL
//!     (`_supports_uneven_all_gather` checks for the `nccl` backend), and the padded
//!     `matrix_all_gather` (every rank's empty shard padded to the largest owner's, `p` times
//!     the bytes) is taken only when some parameter of the unit is not whole on one owner,
//!     while MatrixFSDP packs non-matrix tensors into tail owners (paper appendix table);
//!   - **prefetch**: `prefetch_forward` / `prefetch_backward` skip only the custom backend
//!     (`owner_segment_prefetch_skip_reason` is `None` for `owner_broadcast`), so
//!     publications are prefetched like FSDP all-gathers;
//!   - **recompute**: `_pre_forward` returns at once inside a backward graph task while the
//!     unit is unsharded (`checkpoint_recompute_pre_forward`): one publication feeds both the
//!     recompute and the backward (unlike DMuon);
//!   - **reduction**: `reduce_owner_rank_chunks_1d_async` issues one `dist.reduce` per owner
//!     rank with a non-empty chunk of the unit, costed as a broadcast of the same bytes
//!     (HCCL's A3 reduce is a reduce-scatter then a gather).
//! - **Flat-buffer work around the owner collectives** (`runtime/flat_buffer.py`, with
//!   `use_zero_copy_grad_bucket = False` and `bucket_reduce_scatter`, the `fully_shard`
//!   defaults): before each publication the owner casts its FP32 local shard to bf16 and
//!   copies it into the full buffer; after each unit's backward every rank casts the unit's
//!   bf16 gradients to f32, zeroes the packed owner workspace and copies every gradient into
//!   it before the reduces; once they are waited the owner divides its chunk and copies it
//!   out. All on the compute stream (`strategy::muon::matrixfsdp_buffers`).
//! - **No host synchronisation** on this path: the owner-collective signature check
//!   (`all_gather_object`) runs only with `MATRIX_FSDP_VALIDATE_OWNER_COLLECTIVE_SIGNATURE`
//!   set, the prefetch-epoch barrier only for the `custom` backend, the post-optimizer event
//!   and cache trimming only with CUDA (`MatrixFSDPCommContext`), and `work.wait()` of an
//!   asynchronous HCCL collective makes the current stream wait, not the host. Its Python
//!   runtime events (`runtime_trace_enabled`, on by default) are host-only bookkeeping and
//!   are not modelled (the host is far from the critical path at these layer sizes).
//! - **Communication-free optimizer step** (paper Table: "None in the optimizer step"): the
//!   owner runs momentum, NS and the update on its whole matrices; the momentum lives only
//!   there.
//! - **Per-matrix `torch.optim.Muon`** (calibration README, MatrixFSDP comparison: "per-matrix
//!   `torch.optim.Muon` with fixed NS coefficients"; `muon.md` 3.1: "Only a for-loop
//!   implementation exists"): one bf16 NS call per matrix, GEMM batch 1, no shape batching,
//!   and per-parameter momentum (two lerps) and apply (scale, add) launches
//!   ([`dmuon::OwnerLoop::TorchMuon`]).
//! - **Not placed** (paper: "Matrices already fragmented by tensor parallelism are excluded
//!   from owner placement"): they take the naive per-parameter gather path; matrices whose
//!   plane no shard axis cuts (experts sharded on `E`) are orthogonalized locally.

use super::schedule::Schedule;
use super::{
    NsImpl, RankView, adamw_routed_units, apply, dmuon, local_matrices, momentum, naive, ns_ops,
    per_param_calls,
};
use crate::strategy::Ctx;
use hpfsdp_plan::muon::OptimizerRoute;

/// The MatrixFSDP optimizer schedule of one rank.
pub(crate) fn schedule(ctx: &Ctx, view: &RankView, mut s: Schedule) -> Schedule {
    let oc = &ctx.opt;
    adamw_routed_units(ctx, view, &mut s);
    // Per-matrix `torch.optim.Muon` (calibration README, "Setups of the distributed-Muon
    // comparisons": per-matrix torch.optim.Muon with fixed NS coefficients): one bf16 NS
    // call per matrix, no shape batching.
    dmuon::owner_step(ctx, view, &mut s, dmuon::OwnerLoop::TorchMuon);
    let rest: Vec<usize> = (0..oc.params.len())
        .filter(|&i| {
            let p = &oc.params[i];
            p.route == OptimizerRoute::Muon && p.held_by(view.class) && oc.placed[i].is_none()
        })
        .collect();
    let elems: u64 = rest.iter().map(|&i| oc.params[i].local_elems).sum();
    if rest.is_empty() {
        return s;
    }
    s.momentum_bytes += elems * super::grad_dtype(ctx).bytes();
    momentum(
        ctx,
        &mut s,
        "muon.rest.momentum".into(),
        elems,
        rest.len() as u32,
    );
    let (gather, local): (Vec<usize>, Vec<usize>) =
        rest.into_iter().partition(|&i| oc.params[i].needs_gather);
    let items: Vec<((u64, u64), u64)> = local
        .iter()
        .filter_map(|&i| Some((oc.params[i].core?, local_matrices(ctx, &oc.params[i], view))))
        .collect();
    ns_ops(
        ctx,
        &mut s,
        "muon.local",
        per_param_calls(items),
        &[],
        NsImpl::Bf16,
    );
    if !local.is_empty() {
        let e: u64 = local.iter().map(|&i| oc.params[i].local_elems).sum();
        apply(
            ctx,
            &mut s,
            "muon.local.apply".into(),
            e,
            local.len() as u32,
            vec![],
        );
    }
    naive::gather_everywhere(ctx, &mut s, &gather);
    s
}
