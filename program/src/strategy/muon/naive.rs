//! Naive distributed Muon: "gather-then-compute on every rank" (paper §6.1; `muon.md` 1.4,
//! 7.2 — DTensor `full_tensor()` per parameter, as in DeepSpeed ZeRO-1/2 and the PyTorch
//! FSDP2 Muon recipes).
//!
//! Every rank updates the momentum of its local shards (no replica dedup: every replica keeps
//! the state), then **per parameter**: one all-gather per shard axis (the DTensor
//! redistribution, one mesh dim at a time, in the gradient dtype, no padding), NS on every
//! matrix of the full tensor (one NS call per parameter, batched only over its own leading
//! dims), and the update of the local slice. So each rank runs the full single-device NS
//! work, S·R times redundant in total, and issues one gather per sharded parameter and axis.

use super::schedule::{Dep, Schedule};
use super::{
    NsImpl, RankView, adamw_routed_units, apply, momentum, ns_ops, per_param_calls,
    unpadded_gathers,
};
use crate::step::MemTag;
use crate::strategy::Ctx;
use hpfsdp_plan::muon::OptimizerRoute;

/// Gathers each of `params` whole on every rank, orthogonalizes it there and applies the
/// local slice (the per-parameter loop).
pub(crate) fn gather_everywhere(ctx: &Ctx, s: &mut Schedule, params: &[usize]) {
    let oc = &ctx.opt;
    for &i in params {
        let p = &oc.params[i];
        let Some(core) = p.core else { continue };
        let prefix = format!("muon.p{i}");
        let (last, buf) = unpadded_gathers(ctx, s, &prefix, &[i]);
        let matrices = if last.is_some() {
            p.matrices
        } else {
            p.plan_matrices
        };
        let deps: Vec<Dep> = last.map(Dep::Op).into_iter().collect();
        ns_ops(
            ctx,
            s,
            &prefix,
            per_param_calls([(core, matrices)]),
            &deps,
            NsImpl::Bf16,
        );
        let op = apply(ctx, s, format!("{prefix}.apply"), p.local_elems, 1, vec![]);
        s.free(op, MemTag::Buffers, buf);
    }
}

/// The naive schedule of one rank.
pub(crate) fn schedule(ctx: &Ctx, view: &RankView, mut s: Schedule) -> Schedule {
    let oc = &ctx.opt;
    adamw_routed_units(ctx, view, &mut s);
    let muon: Vec<usize> = (0..oc.params.len())
        .filter(|&i| oc.params[i].route == OptimizerRoute::Muon && oc.params[i].held_by(view.class))
        .collect();
    let elems: u64 = muon.iter().map(|&i| oc.params[i].local_elems).sum();
    s.momentum_bytes = elems * super::grad_dtype(ctx).bytes();
    if !muon.is_empty() {
        momentum(
            ctx,
            &mut s,
            "muon.momentum".into(),
            elems,
            muon.len() as u32,
        );
    }
    gather_everywhere(ctx, &mut s, &muon);
    s
}
