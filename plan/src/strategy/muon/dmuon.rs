//! DMuon ("dedicated ownership", `muon.md` 7.4; paper Tables "design contrast": owner
//! publication and gradient reduction hooked into the FSDP2 lifecycle).
//!
//! `dedicate_params()` gives each selected 2-D Muon matrix one owner rank of the data-parallel
//! (FSDP shard) group, by greedy LPT on numel; the owner keeps the full parameter and its
//! momentum, the others hold zero-size placeholders. The **FSDP part** of the program changes
//! (see `strategy::hyperparallel`): instead of the per-parameter all-gather the owner
//! **publishes** the matrix by broadcast before forward, before recompute and before backward
//! (the recompute forward fires the publication hook again), and the gradient is **reduced
//! to the owner** instead of reduce-scattered. The **optimizer step** is local: the owner runs
//! momentum and batched NS (one call per core shape; Gram-space NS costs are not modelled
//! separately) on its whole matrices and applies them; there is no optimizer collective (the
//! next forward's publication ships the update).
//!
//! Not selected: fused 3-D expert weights stay on FSDP and the original optimizer (AdamW, the
//! paper's "unselected fused [E,M,N] weights"); TP-fragmented matrices (DMuon's nested TP
//! `gather`/`scatter` ownership is not modelled) take the naive per-parameter gather path.

use super::schedule::Schedule;
use super::{
    NsCall, NsImpl, RankView, adamw_units, apply, fused_calls, momentum, naive, ns_ops,
    placed_owner,
};
use crate::muon::OptimizerRoute;
use crate::strategy::Ctx;

/// Momentum, NS and apply on the whole matrices this rank owns under owner placement, with
/// the implementation's NS calls (`calls` groups the owned `(core shape, matrices)` items)
/// and kernels (`imp`); returns the owned parameters.
pub(crate) fn owner_step(
    ctx: &Ctx,
    view: &RankView,
    s: &mut Schedule,
    calls: fn(Vec<((u64, u64), u64)>) -> Vec<NsCall>,
    imp: NsImpl,
) -> Vec<usize> {
    let oc = &ctx.opt;
    let owned: Vec<usize> = (0..oc.params.len())
        .filter(|&i| {
            oc.params[i].held_by(view.class) && placed_owner(ctx, i, view.fsdp_pos) == Some(true)
        })
        .collect();
    if owned.is_empty() {
        return owned;
    }
    let elems: u64 = owned.iter().map(|&i| oc.params[i].plan_elems).sum();
    s.momentum_bytes += elems * ctx.opts.reduce_dtype.bytes();
    momentum(
        ctx,
        s,
        "muon.owned.momentum".into(),
        elems,
        owned.len() as u32,
    );
    let items: Vec<((u64, u64), u64)> = owned
        .iter()
        .filter_map(|&i| Some((oc.params[i].core?, oc.params[i].plan_matrices)))
        .collect();
    ns_ops(ctx, s, "muon.owned", calls(items), &[], imp);
    apply(
        ctx,
        s,
        "muon.owned.apply".into(),
        elems,
        owned.len() as u32,
        vec![],
    );
    owned
}

/// The DMuon optimizer schedule of one rank.
pub(crate) fn schedule(ctx: &Ctx, view: &RankView, mut s: Schedule) -> Schedule {
    let oc = &ctx.opt;
    let unselected_expert = |i: usize, p: &super::OptParam| {
        p.route == OptimizerRoute::Muon && oc.placed[i].is_none() && p.plan_shape.len() >= 3
    };
    adamw_units(ctx, view, &mut s, unselected_expert);
    // Shape-grouped batched Gram-space NS (`muon.md` 7.4; paper Table "design contrast":
    // "Gram-NS batching with SYRK kernels"): FP32 normalization, FP16 iterations.
    owner_step(ctx, view, &mut s, fused_calls, NsImpl::GramFp16);
    let rest: Vec<usize> = (0..oc.params.len())
        .filter(|&i| {
            let p = &oc.params[i];
            p.route == OptimizerRoute::Muon
                && p.held_by(view.class)
                && oc.placed[i].is_none()
                && !unselected_expert(i, p)
        })
        .collect();
    let elems: u64 = rest.iter().map(|&i| oc.params[i].local_elems).sum();
    if !rest.is_empty() {
        s.momentum_bytes += elems * ctx.opts.reduce_dtype.bytes();
        momentum(
            ctx,
            &mut s,
            "muon.rest.momentum".into(),
            elems,
            rest.len() as u32,
        );
        naive::gather_everywhere(ctx, &mut s, &rest);
    }
    s
}
