//! TorchTitan FlexShard / DistributedMuon (`muon.md` 5.3, 7.3; paper §6.2 and Tables "design
//! contrast": storage-to-compute resharding lowered onto packed all-to-all).
//!
//! Matrices whose plane is sharded are grouped by core shape (Dion's megabatch key,
//! `_create_ortho_tasks`) and cut into buckets under the NS memory cap (`BucketConfig`
//! stand-in: 2^29 / shard-size elements). Per bucket of `N` matrices over the `BlockShard`
//! axis of size `S` (DistMuon allows one non-unit axis: the first shard axis; any further
//! shard axes are first all-gathered, one per axis): **pack** the local bf16 shards into one
//! buffer (the list padded to a multiple of `S` with zero matrices), **all-to-all** so rank
//! `r` receives everybody's shard of matrices `[r·N/S, (r+1)·N/S)`, **NS** on those (the
//! compute layout), the reverse **all-to-all**, **unpack** and apply on the local shard. Each
//! matrix is orthogonalized once per shard group; replicas compute redundantly (HSDP passes
//! only the shard sub-mesh, no replica dedup). Matrices with an unsharded plane (native 3-D
//! `Shard(0)` batches) are orthogonalized locally with no communication.

use super::ns_cost;
use super::schedule::{Dep, Schedule};
use super::{
    NsImpl, RankView, adamw_routed_units, apply, fused_calls, local_matrices, momentum, ns_ops,
};
use crate::step::{MemTag, Stream};
use crate::strategy::Ctx;
use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::model::DType;
use hpfsdp_plan::muon::{NS_BATCH_NUMEL, OptimizerRoute};
use std::collections::BTreeMap;

/// A same-shape group: (shard axis names, core shape).
type GroupKey = (Vec<String>, (u64, u64));

/// The FlexShard schedule of one rank.
pub(crate) fn schedule(ctx: &Ctx, view: &RankView, mut s: Schedule) -> Schedule {
    let oc = &ctx.opt;
    adamw_routed_units(ctx, view, &mut s);
    // Plan batch order (descending size), held Muon parameters.
    let mut local = Vec::new();
    let mut groups: BTreeMap<GroupKey, Vec<usize>> = BTreeMap::new();
    let mut order = Vec::new();
    for b in &oc.plan.batches {
        for &i in &b.params {
            let p = &oc.params[i];
            if !p.held_by(view.class) || p.route != OptimizerRoute::Muon {
                continue;
            }
            let Some(core) = p.core else { continue };
            if p.needs_gather {
                let key = (p.shard.iter().map(|a| a.name.to_string()).collect(), core);
                if !groups.contains_key(&key) {
                    order.push(key.clone());
                }
                groups.entry(key).or_default().push(i);
            } else {
                local.push(i);
            }
        }
    }
    let all: u64 = order
        .iter()
        .flat_map(|k| &groups[k])
        .chain(&local)
        .map(|&i| oc.params[i].local_elems)
        .sum();
    let tensors = order.iter().map(|k| groups[k].len()).sum::<usize>() + local.len();
    s.momentum_bytes = all * super::grad_dtype(ctx).bytes();
    if tensors > 0 {
        momentum(ctx, &mut s, "muon.momentum".into(), all, tensors as u32);
    }
    // Local 3-D batches.
    let items: Vec<((u64, u64), u64)> = local
        .iter()
        .filter_map(|&i| Some((oc.params[i].core?, local_matrices(ctx, &oc.params[i], view))))
        .collect();
    ns_ops(
        ctx,
        &mut s,
        "muon.local",
        fused_calls(items),
        &[],
        NsImpl::Bf16,
    );
    let mut k = 0;
    for key in &order {
        let members = &groups[key];
        let first = &oc.params[members[0]];
        let cap = NS_BATCH_NUMEL / first.shard_size().max(1);
        let mut buckets: Vec<Vec<usize>> = vec![Vec::new()];
        let mut cur = 0u64;
        for &i in members {
            let n = oc.params[i].numel;
            if cur > 0 && cur + n > cap {
                buckets.push(Vec::new());
                cur = 0;
            }
            cur += n;
            if let Some(b) = buckets.last_mut() {
                b.push(i);
            }
        }
        for bucket in buckets.iter().filter(|b| !b.is_empty()) {
            bucket_ops(ctx, view, &mut s, &format!("muon.bucket{k}"), bucket);
            k += 1;
        }
    }
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
    s
}

/// Pack, all-to-all, NS, all-to-all, unpack and apply of one same-shape bucket.
fn bucket_ops(ctx: &Ctx, view: &RankView, s: &mut Schedule, prefix: &str, bucket: &[usize]) {
    let oc = &ctx.opt;
    let first = &oc.params[bucket[0]];
    let Some((rows, cols)) = first.core else {
        return;
    };
    let bf = ns_cost::NS_ELEM_BYTES;
    let matrices: u64 = bucket.iter().map(|&i| oc.params[i].matrices).sum();
    let local_bytes: u64 = bucket.iter().map(|&i| oc.params[i].local_elems * bf).sum();
    // Pre-gathers over the shard axes after the BlockShard axis.
    let mut last = None;
    let mut remaining = first.shard_size();
    let block = &first.shard[0];
    let mut shard_elems_per_matrix = (rows * cols).div_ceil(remaining.max(1));
    for a in first.shard.iter().skip(1) {
        let input = matrices * (rows * cols).div_ceil(remaining.max(1)) * bf;
        remaining /= a.size.max(1) as u64;
        let mut deps = vec![Dep::Issue];
        deps.extend(last.map(Dep::Op));
        last = s
            .coll(
                format!("{prefix}.ag.{}", a.name),
                Stream::Optimizer,
                a.slot,
                CollectiveKind::AllGather,
                input,
                input * a.size as u64,
                DType::Bf16,
                deps,
            )
            .or(last);
        shard_elems_per_matrix = (rows * cols).div_ceil(remaining.max(1));
    }
    let sz = block.size.max(1) as u64;
    let per_rank = matrices.div_ceil(sz);
    let a2a = per_rank * sz * shard_elems_per_matrix * bf;
    let pack = s.copy(format!("{prefix}.pack"), local_bytes, 1, vec![Dep::Issue]);
    s.alloc(pack, MemTag::Buffers, a2a);
    let mut deps = vec![Dep::Op(pack), Dep::Issue];
    deps.extend(last.map(Dep::Op));
    let fwd = s.coll(
        format!("{prefix}.a2a"),
        Stream::Optimizer,
        block.slot,
        CollectiveKind::AllToAll,
        a2a,
        a2a,
        DType::Bf16,
        deps,
    );
    if let Some(op) = fwd {
        s.alloc(op, MemTag::Buffers, a2a);
    }
    let r = view.coord(block) as u64;
    let mine = matrices.saturating_sub(r * per_rank).min(per_rank);
    let deps: Vec<Dep> = fwd.map(Dep::Op).into_iter().collect();
    ns_ops(
        ctx,
        s,
        prefix,
        fused_calls([((rows, cols), mine)]),
        &deps,
        NsImpl::Bf16,
    );
    let back = s.coll(
        format!("{prefix}.a2a_back"),
        Stream::Optimizer,
        block.slot,
        CollectiveKind::AllToAll,
        a2a,
        a2a,
        DType::Bf16,
        vec![Dep::Issue],
    );
    let mut deps: Vec<Dep> = back.map(Dep::Op).into_iter().collect();
    deps.push(Dep::Issue);
    let unpack = s.copy(format!("{prefix}.unpack"), local_bytes, 1, deps);
    let freed = if fwd.is_some() { 2 * a2a } else { a2a };
    s.free(unpack, MemTag::Buffers, freed);
    apply(
        ctx,
        s,
        format!("{prefix}.apply"),
        bucket.iter().map(|&i| oc.params[i].local_elems).sum(),
        bucket.len() as u32,
        vec![],
    );
}
