//! Moonlight's distributed Muon, ZeRO-1 style (`muon.md` 2.2, paper Algorithm 1 of Moonlight;
//! Megatron PR #1428).
//!
//! Gradients are already reduce-scattered by the FSDP/DDP strategy. Per **bucket** of the
//! distributed optimizer (Muon parameters in reverse model order, per sharding domain, closed
//! at Megatron's default `max(40M, 1M x dp)` elements, notes `pytorch-baselines.md` 4.2), laid
//! out back to back in one flat buffer whose `dp` equal contiguous ranges are the ranks'
//! ZeRO-1 partitions: momentum on the local partition, one "DP gather" (an all-gather,
//! Moonlight issue #45) per shard axis of the members that **straddle a partition boundary**
//! (Moonshot's author in PR #1428: "only those params ... split in the DP boundary will need
//! the extra gather"; a member inside one range is whole on its rank), then NS of **only the
//! matrices overlapping the rank's own partition** (the distributed optimizer updates its
//! partition; a straddling matrix is orthogonalized by every rank it overlaps, redundantly),
//! one call per parameter, and the update of the local partition. Every replica keeps its
//! momentum.

use super::schedule::{Dep, Schedule};
use super::{
    NsImpl, RankView, adamw_routed_units, apply, local_matrices, momentum, ns_ops, per_param_calls,
    unpadded_gathers,
};
use crate::step::MemTag;
use crate::strategy::Ctx;
use hpfsdp_plan::muon::OptimizerRoute;
use std::collections::BTreeMap;

/// Megatron's default bucket size in elements for a data-parallel group of `dp` ranks.
pub fn bucket_elems(dp: u64) -> u64 {
    40_000_000u64.max(1_000_000 * dp)
}

/// The Moonlight schedule of one rank.
pub(crate) fn schedule(ctx: &Ctx, view: &RankView, mut s: Schedule) -> Schedule {
    let oc = &ctx.opt;
    let gb = super::grad_dtype(ctx).bytes();
    adamw_routed_units(ctx, view, &mut s);
    // Buckets per sharding domain (same shard axes), reverse model order.
    let mut domains: BTreeMap<Vec<(String, usize)>, Vec<Vec<usize>>> = BTreeMap::new();
    for i in (0..oc.params.len()).rev() {
        let p = &oc.params[i];
        if p.route != OptimizerRoute::Muon || !p.held_by(view.class) {
            continue;
        }
        let key: Vec<(String, usize)> = p
            .shard
            .iter()
            .map(|a| (a.name.to_string(), a.size))
            .collect();
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
            let (straddling, mine) = partition_overlap(ctx, view, members);
            let (last, buf) = unpadded_gathers(ctx, &mut s, &prefix, &straddling);
            let items: Vec<((u64, u64), u64)> = mine
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

/// The bucket's ZeRO-1 layout seen by `view`: the members that straddle a partition boundary
/// (they need the DP gather) and the members overlapping the rank's own partition (it
/// orthogonalizes them). Members are laid out back to back in bucket order (elements after
/// TP), the buffer padded to a multiple of the DP size `dp` (the shard group) and cut into
/// `dp` equal ranges; the rank's range is its position in the shard group.
fn partition_overlap(ctx: &Ctx, view: &RankView, members: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let oc = &ctx.opt;
    let Some(&first) = members.first() else {
        return (Vec::new(), Vec::new());
    };
    let p0 = &oc.params[first];
    let dp = p0.shard_size().max(1);
    // Linear position in the shard group (shard axes in mesh order, last fastest).
    let pos = p0
        .shard
        .iter()
        .fold(0u64, |acc, a| acc * a.size as u64 + view.coord(a) as u64);
    let total: u64 = members.iter().map(|&i| oc.params[i].plan_elems).sum();
    let part = total.div_ceil(dp);
    let (lo, hi) = (pos * part, (pos + 1) * part);
    let (mut straddling, mut mine) = (Vec::new(), Vec::new());
    let mut off = 0u64;
    for &i in members {
        let n = oc.params[i].plan_elems;
        let (start, end) = (off, off + n);
        off = end;
        let p = &oc.params[i];
        if !p.needs_gather {
            // The plane is not sharded (experts cut on E): local matrices on every rank.
            mine.push(i);
            continue;
        }
        if n > 0 && start / part != (end - 1) / part {
            straddling.push(i);
        }
        if start < hi && end > lo {
            mine.push(i);
        }
    }
    (straddling, mine)
}
