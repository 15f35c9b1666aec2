//! HyperParallel's layout-driven distributed Muon (notes `hyper-parallel.md` 6.4-6.7, 8.1;
//! paper §6, Algorithm "One distributed Muon step").
//!
//! Per HSDP batch of the Muon plan (descending size), on every rank holding its parameters:
//! 1. **Replica dedup (6.5):** only parameters whose replica owner is the rank's replica
//!    coordinate (coordinate modulo the subgroup size `R_s`) are processed; their momentum
//!    is the only Muon state the rank keeps (1/R_s of the one-copy-per-replica state).
//! 2. **Momentum** on the local shards of those parameters (one foreach op).
//! 3. Per NS memory batch (the plan's 2^29 / shard-size split, restricted to the owned
//!    parameters): **shard path** — one fused bf16 all-gather per shard axis in axis order,
//!    each segment padded to 512 bytes (6.4 "fused gather"); the shard owner (balanced inside
//!    its replica subset) runs **batched NS** per core shape on the full matrices; the
//!    **local path** (no shard axis cuts the matrix plane, e.g. experts sharded on `E`) runs
//!    batched NS on the rank's local matrices with no communication.
//! 4. **Relay broadcast** (6.4): per shard dim `d`, one broadcast per compute coordinate
//!    aligned with the rank on dims `> d` (8.1: once per assignment, after its memory
//!    batches), each dim waited before the next; then **slice and apply** on the local shards.
//! 5. **Replica broadcast** (6.5): per source coordinate of the subgroup, buffers of at most
//!    512 MiB (512-byte aligned segments), sent hop by hop over the replicate dims (a rank
//!    joins dim `d` when it matches the source on later dims; every hop but the last is
//!    waited). The last hop stays in flight: after the next batch flushes, the oldest batch
//!    is landed (unpacked), so at most one batch is in flight (`_max_inflight_batches = 1`);
//!    a final drain lands the last one.
//!
//! Pipelining (paper Fig. "Batched orthogonalization and pipelining"): the gathers of the
//! next NS memory batch are issued before the current batch's NS, so they overlap it; they
//! depend on the compute op issued before them, so they never run ahead of the previous
//! NS: at most one batch of gathers in flight.

use super::ns_cost;
use super::schedule::{Dep, Schedule};
use super::{OptParam, RankView, adamw_units, local_matrices, momentum, ns_ops, pad512_bf16};
use crate::CollectiveKind;
use crate::program::{MemTag, Stream};
use crate::strategy::Ctx;

/// Stream of the replica-domain broadcasts (the replicate process group's stream).
pub const REPLICA_STREAM: Stream = Stream::Aux(0);
/// Replica broadcast buffer cap (`replicate_broadcast_max_bytes`, 512 MiB).
pub const REPLICA_BROADCAST_MAX_BYTES: u64 = 512 * 1024 * 1024;

/// One batch as this rank sees it.
struct RankBatch {
    /// Index in the plan.
    index: usize,
    /// Held parameters.
    held: Vec<usize>,
    /// Held parameters this rank's replica coordinate owns.
    owned: Vec<usize>,
    /// Shard path.
    shard_path: bool,
    /// Owned members of each non-empty NS memory batch.
    units: Vec<Vec<usize>>,
    /// Replica coordinate.
    rc: Vec<usize>,
}

/// All coordinates of a grid, lexicographic.
pub(crate) fn grid(sizes: &[usize]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = vec![Vec::new()];
    for &s in sizes {
        out = out
            .into_iter()
            .flat_map(|c| {
                (0..s.max(1)).map(move |i| {
                    let mut c = c.clone();
                    c.push(i);
                    c
                })
            })
            .collect();
    }
    out
}

fn rank_batches(ctx: &Ctx, view: &RankView) -> Vec<RankBatch> {
    let oc = &ctx.opt;
    let mut out = Vec::new();
    for (index, b) in oc.plan.batches.iter().enumerate() {
        let held: Vec<usize> = b
            .params
            .iter()
            .copied()
            .filter(|&i| oc.params[i].held_by(view.class))
            .collect();
        let Some(&first) = held.first() else {
            continue;
        };
        let rc = view.replica_coord(&oc.params[first]);
        let owned: Vec<usize> = held
            .iter()
            .copied()
            .filter(|i| b.replica_owner.get(i).is_none_or(|c| *c == rc))
            .collect();
        let mut sorted = owned.clone();
        sorted.sort_unstable();
        let units = b
            .memory_batches
            .iter()
            .map(|mb| {
                mb.iter()
                    .copied()
                    .filter(|i| sorted.binary_search(i).is_ok())
                    .collect::<Vec<_>>()
            })
            .filter(|u| !u.is_empty())
            .collect();
        out.push(RankBatch {
            index,
            held,
            owned,
            shard_path: b.shard_path,
            units,
            rc,
        });
    }
    out
}

/// Fused gathers of one NS memory batch, per shard axis; returns (last op, buffer bytes).
fn gathers(
    ctx: &Ctx,
    s: &mut Schedule,
    prefix: &str,
    first: &OptParam,
    members: &[usize],
) -> (Option<u32>, u64) {
    let mut remaining = first.shard_size();
    let mut last: Option<u32> = None;
    let mut buffers = 0;
    for a in &first.shard {
        let input: u64 = members
            .iter()
            .map(|&i| pad512_bf16(ctx.opt.params[i].numel.div_ceil(remaining.max(1))))
            .sum();
        remaining /= a.size.max(1) as u64;
        let out = input * a.size as u64;
        let mut deps = vec![Dep::Issue];
        deps.extend(last.map(Dep::Op));
        if let Some(op) = s.coll(
            format!("{prefix}.ag.{}", a.name),
            Stream::Optimizer,
            a.slot,
            CollectiveKind::AllGather,
            input,
            out,
            crate::model::DType::Bf16,
            deps,
        ) {
            s.alloc(op, MemTag::Buffers, out);
            buffers += out;
            last = Some(op);
        }
    }
    (last, buffers)
}

/// The HyperParallel Muon schedule of one rank.
pub(crate) fn schedule(ctx: &Ctx, view: &RankView) -> Schedule {
    let oc = &ctx.opt;
    let mut s = Schedule::default();
    adamw_units(ctx, view, &mut s, |_, _| false);
    let grad_bytes = ctx.opts.reduce_dtype.bytes();
    let master = ctx.opts.master_dtype.bytes();
    let batches = rank_batches(ctx, view);
    for b in &batches {
        s.momentum_bytes += b
            .owned
            .iter()
            .map(|&i| oc.params[i].local_elems * grad_bytes)
            .sum::<u64>();
    }
    // Flattened NS memory batches: (batch position, unit position).
    let flat: Vec<(usize, usize)> = batches
        .iter()
        .enumerate()
        .flat_map(|(bp, b)| (0..b.units.len()).map(move |u| (bp, u)))
        .collect();
    let mut issued = 0usize;
    let mut unit_gather: Vec<(Option<u32>, u64)> = vec![(None, 0); flat.len()];
    let mut momentum_done = vec![false; batches.len()];
    let mut in_flight: Option<(Vec<u32>, u64, usize)> = None;
    let mut k = 0usize;
    for b in &batches {
        let plan_b = &oc.plan.batches[b.index];
        let bi = b.index;
        let mut ns_of_batch = Vec::new();
        for u in 0..b.units.len() {
            // Issue the gathers of this NS batch (if not yet) and of the next one.
            while issued < flat.len() && issued <= k + 1 {
                let (ibp, iu) = flat[issued];
                let ib = &batches[ibp];
                if !momentum_done[ibp] {
                    momentum_done[ibp] = true;
                    let elems = ib.owned.iter().map(|&i| oc.params[i].local_elems).sum();
                    momentum(
                        ctx,
                        &mut s,
                        format!("muon.b{}.momentum", ib.index),
                        elems,
                        ib.owned.len() as u32,
                    );
                }
                if ib.shard_path {
                    let members = &ib.units[iu];
                    let first = &oc.params[members[0]];
                    unit_gather[issued] = gathers(
                        ctx,
                        &mut s,
                        &format!("muon.b{}.m{iu}", ib.index),
                        first,
                        members,
                    );
                }
                issued += 1;
            }
            let members = &b.units[u];
            let prefix = format!("muon.b{bi}.m{u}");
            let (gather, buf) = unit_gather[k];
            let deps: Vec<Dep> = gather.map(Dep::Op).into_iter().collect();
            let ns = if b.shard_path {
                let items = members.iter().filter_map(|&i| {
                    let p = &oc.params[i];
                    let mine = plan_b.shard_owner.get(&i) == Some(&view.shard_coord(p));
                    (mine).then_some((p.core?, p.matrices))
                });
                ns_ops(ctx, &mut s, &prefix, items.collect::<Vec<_>>(), &deps, true)
            } else {
                let items = members.iter().filter_map(|&i| {
                    let p = &oc.params[i];
                    Some((p.core?, local_matrices(ctx, p, view)))
                });
                ns_ops(ctx, &mut s, &prefix, items.collect::<Vec<_>>(), &deps, true)
            };
            if let Some(&last) = ns.last().or(gather.as_ref()) {
                s.free(last, MemTag::Buffers, buf);
            }
            ns_of_batch.extend(ns);
            k += 1;
        }
        // Relay broadcast, dim by dim, then slice and apply.
        let mut relay: Vec<u32> = Vec::new();
        let mut relay_buf = 0;
        if b.shard_path && !b.owned.is_empty() {
            let first = &oc.params[b.owned[0]];
            let sizes: Vec<usize> = first.shard.iter().map(|a| a.size).collect();
            let mine = view.shard_coord(first);
            let coords = grid(&sizes);
            let bytes: Vec<u64> = coords
                .iter()
                .map(|c| {
                    b.owned
                        .iter()
                        .filter(|&&i| plan_b.shard_owner.get(&i) == Some(c))
                        .map(|&i| pad512_bf16(oc.params[i].numel))
                        .sum()
                })
                .collect();
            let mut prev_dim: Vec<u32> = Vec::new();
            for (d, a) in first.shard.iter().enumerate() {
                let mut this_dim = Vec::new();
                for (c, &n) in coords.iter().zip(&bytes) {
                    if n == 0 || c[d + 1..] != mine[d + 1..] {
                        continue;
                    }
                    let mut deps = vec![Dep::Issue];
                    deps.extend(prev_dim.iter().map(|&o| Dep::Op(o)));
                    let label = c
                        .iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join("_");
                    if let Some(op) = s.coll(
                        format!("muon.b{bi}.relay.{}.c{label}", a.name),
                        Stream::Optimizer,
                        a.slot,
                        CollectiveKind::Broadcast,
                        n,
                        n,
                        crate::model::DType::Bf16,
                        deps,
                    ) {
                        s.alloc(op, MemTag::Buffers, n);
                        relay_buf += n;
                        this_dim.push(op);
                    }
                }
                relay.extend(&this_dim);
                prev_dim = this_dim;
            }
        }
        if !b.owned.is_empty() {
            let elems = b.owned.iter().map(|&i| oc.params[i].local_elems).sum();
            let mut deps: Vec<Dep> = relay.iter().map(|&o| Dep::Op(o)).collect();
            deps.push(Dep::Issue);
            let apply = s.compute(
                format!("muon.b{bi}.apply"),
                ns_cost::apply_work(elems, b.owned.len() as u32, ctx.opts.master_dtype),
                deps,
            );
            s.free(apply, MemTag::Buffers, relay_buf);
        }
        // Replica broadcast of the updated local parameters; land the previous batch.
        let first = &oc.params[b.held[0]];
        let flush = replica_broadcast(&mut s, ctx, b, first, master);
        if let Some(f) = flush {
            if let Some(prev) = in_flight.take() {
                land(&mut s, prev);
            }
            in_flight = Some(f);
        }
    }
    if let Some(prev) = in_flight.take() {
        land(&mut s, prev);
    }
    s
}

/// The hierarchical replica broadcasts of one batch; returns (last-hop ops, bytes received,
/// batch index) when the rank takes part in any.
fn replica_broadcast(
    s: &mut Schedule,
    ctx: &Ctx,
    b: &RankBatch,
    first: &OptParam,
    master: u64,
) -> Option<(Vec<u32>, u64, usize)> {
    if first.replicate.iter().all(|a| a.slot.is_none()) {
        return None;
    }
    let plan_b = &ctx.opt.plan.batches[b.index];
    let sizes: Vec<usize> = first.replicate.iter().map(|a| a.coord_size).collect();
    let mut last_hops = Vec::new();
    let mut received = 0;
    for src in grid(&sizes) {
        let bytes: u64 = b
            .held
            .iter()
            .filter(|&&i| plan_b.replica_owner.get(&i) == Some(&src))
            .map(|&i| (ctx.opt.params[i].local_elems * master).div_ceil(512) * 512)
            .sum();
        let chunks = bytes.div_ceil(REPLICA_BROADCAST_MAX_BYTES);
        let label = src
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join("_");
        for c in 0..chunks {
            let n = (bytes - c * REPLICA_BROADCAST_MAX_BYTES).min(REPLICA_BROADCAST_MAX_BYTES);
            let mut prev: Option<u32> = None;
            for (d, a) in first.replicate.iter().enumerate() {
                if src[d + 1..] != b.rc[d + 1..] {
                    continue;
                }
                let mut deps = vec![Dep::Issue];
                deps.extend(prev.map(Dep::Op));
                if let Some(op) = s.coll(
                    format!("muon.b{}.rb.{}.s{label}.k{c}", b.index, a.name),
                    REPLICA_STREAM,
                    a.slot,
                    CollectiveKind::Broadcast,
                    n,
                    n,
                    ctx.opts.master_dtype,
                    deps,
                ) {
                    prev = Some(op);
                }
            }
            if let Some(op) = prev {
                last_hops.push(op);
                if src != b.rc {
                    received += n;
                    s.alloc(op, MemTag::Buffers, n);
                }
            }
        }
    }
    (!last_hops.is_empty()).then_some((last_hops, received, b.index))
}

/// Lands an in-flight batch: waits its broadcasts and unpacks what was received.
fn land(s: &mut Schedule, (ops, bytes, index): (Vec<u32>, u64, usize)) {
    let mut deps: Vec<Dep> = ops.iter().map(|&o| Dep::Op(o)).collect();
    deps.push(Dep::Issue);
    let op = s.copy(format!("muon.b{index}.land"), bytes, 1, deps);
    s.free(op, MemTag::Buffers, bytes);
}
