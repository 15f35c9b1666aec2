//! Moonlight's distributed Muon, ZeRO-1 style (`muon.md` 2.2, paper Algorithm 1 of Moonlight;
//! Megatron PR #1428).
//!
//! Gradients are already reduce-scattered by the FSDP/DDP strategy. Per **bucket** of the
//! distributed optimizer (Muon parameters in reverse model order, per sharding domain, closed
//! at Megatron's default `max(40M, 1M x dp)` elements, notes `pytorch-baselines.md` 4.2):
//! momentum on the local partition, one "DP gather" (an all-gather, Moonlight issue #45) per
//! shard axis of the members whose matrix plane is cut (the others hold whole matrices in
//! their partition, "only those params split in the DP boundary need the extra gather"),
//! then NS of every gathered matrix **redundantly on every rank** (no dedup, per-parameter NS
//! calls), and the update of the local partition. Every replica keeps its momentum.

use super::schedule::{Dep, Schedule};
use super::{
    NsImpl, RankView, adamw_units, apply, local_matrices, momentum, ns_ops, per_param_calls,
    unpadded_gathers,
};
use crate::muon::OptimizerRoute;
use crate::program::MemTag;
use crate::strategy::Ctx;
use std::collections::BTreeMap;

/// Megatron's default bucket size in elements for a data-parallel group of `dp` ranks.
pub fn bucket_elems(dp: u64) -> u64 {
    40_000_000u64.max(1_000_000 * dp)
}

/// The Moonlight schedule of one rank.
pub(crate) fn schedule(ctx: &Ctx, view: &RankView, mut s: Schedule) -> Schedule {
    let oc = &ctx.opt;
    let gb = ctx.opts.reduce_dtype.bytes();
    adamw_units(ctx, view, &mut s, |_, _| false);
    // Buckets per sharding domain (same shard axes), reverse model order.
    let mut domains: BTreeMap<Vec<(String, usize)>, Vec<Vec<usize>>> = BTreeMap::new();
    for i in (0..oc.params.len()).rev() {
        let p = &oc.params[i];
        if p.route != OptimizerRoute::Muon || !p.held_by(view.class) {
            continue;
        }
        let key: Vec<(String, usize)> = p.shard.iter().map(|a| (a.name.clone(), a.size)).collect();
        let dp = p.shard_size() * p.replicate.iter().map(|a| a.size as u64).product::<u64>();
        let cap = bucket_elems(dp);
        let buckets = domains.entry(key).or_default();
        let full = buckets
            .last()
            .is_none_or(|b| b.iter().map(|&j| oc.params[j].plan_elems).sum::<u64>() >= cap);
        if full {
            buckets.push(Vec::new());
        }
        if let Some(b) = buckets.last_mut() {
            b.push(i);
        }
    }
    let mut k = 0;
    for buckets in domains.values() {
        for members in buckets {
            let prefix = format!("muon.bucket{k}");
            k += 1;
            let elems: u64 = members.iter().map(|&i| oc.params[i].local_elems).sum();
            s.momentum_bytes += elems * gb;
            momentum(
                ctx,
                &mut s,
                format!("{prefix}.momentum"),
                elems,
                members.len() as u32,
            );
            let gathered: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&i| oc.params[i].needs_gather)
                .collect();
            let (last, buf) = unpadded_gathers(ctx, &mut s, &prefix, &gathered);
            let items: Vec<((u64, u64), u64)> = members
                .iter()
                .filter_map(|&i| {
                    let p = &oc.params[i];
                    let n = if p.needs_gather {
                        p.matrices
                    } else {
                        local_matrices(ctx, p, view)
                    };
                    Some((p.core?, n))
                })
                .collect();
            let deps: Vec<Dep> = last.map(Dep::Op).into_iter().collect();
            ns_ops(
                ctx,
                &mut s,
                &prefix,
                per_param_calls(items),
                &deps,
                NsImpl::Bf16,
            );
            let op = apply(
                ctx,
                &mut s,
                format!("{prefix}.apply"),
                elems,
                members.len() as u32,
                vec![],
            );
            s.free(op, MemTag::Buffers, buf);
        }
    }
    s
}
