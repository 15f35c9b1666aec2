//! HyperParallel's layout-driven distributed Muon (notes `hyper-parallel.md` 6.4-6.7, 8.1;
//! paper §6, Algorithm "One distributed Muon step"; the shard path as HyperParallel's
//! `_process_shard_params` runs it at commit 3ad2a77, the revision whose `min_batch_size`
//! the plan's memory batches follow).
//!
//! Per execution slot of the Muon plan (descending size; a slot holds one batch for every
//! rank, or one per expert-parallel coordinate for per-expert weights), on every rank
//! holding the slot's batch of its coordinate:
//! 1. **Replica dedup (6.5):** only parameters whose replica owner is the rank's replica
//!    coordinate (coordinate modulo the subgroup size `R_s`) are processed; their momentum
//!    is the only Muon state the rank keeps (1/R_s of the one-copy-per-replica state).
//! 2. **Momentum** on the local shards of those parameters (one foreach op).
//! 3. Per NS memory batch (the plan's 2^29 / shard-size split with `min_batch_size = S`,
//!    restricted to the owned parameters), in order, each finished before the next starts:
//!    - **shard path** (`_process_shard_params`: `for sub_batch in safe_batches:
//!      _gather_and_compute_shard_updates(sub_batch)` then
//!      `_fused_broadcast_and_apply(sub_batch)`): one fused bf16 all-gather per shard axis
//!      in axis order, each segment padded to 512 bytes (6.4 "fused gather"); the shard
//!      owner (balanced over the whole assignment, inside its replica subset) runs **batched
//!      NS** per core shape on the full matrices; then the sub-batch's **relay broadcast**
//!      (6.4 `_batched_relay_broadcast`): per shard dim `d`, one async broadcast per compute
//!      coordinate owning a matrix of the sub-batch and aligned with the rank on dims `> d`,
//!      all waited before dim `d + 1`; then **slice and apply** of the sub-batch on the local
//!      shards (`_foreach_mul_` / `_foreach_add_`), which waits for the relay;
//!    - **local path** (no shard axis cuts the matrix plane, e.g. experts sharded on `E`):
//!      batched NS on the rank's local matrices with no communication; one apply after the
//!      batch's last NS.
//! 4. **Replica broadcast** (6.5): per source coordinate of the subgroup, buffers of at most
//!    512 MiB (512-byte aligned segments), sent hop by hop over the replicate dims (a rank
//!    joins dim `d` when it matches the source on later dims; every hop but the last is
//!    waited). The last hop stays in flight: after the next batch flushes, the oldest batch
//!    is landed (unpacked), so at most one batch is in flight (`_max_inflight_batches = 1`);
//!    a final drain lands the last one. This is the pipelining of the paper's Fig. "Batched
//!    orthogonalization and pipelining": the replica broadcast runs on the replicate process
//!    group's stream, beneath the next batch's compute.
//!
//! No prefetch on the shard path: every collective of the optimizer step is issued from the
//! compute stream on the shard process group, so its communication stream first waits for
//! the compute issued before it (c10d `syncStreams`, [`Dep::Issue`]), and the relay's
//! `work.wait()` makes the apply wait for the relay. The next sub-batch's gather is issued
//! after that apply (source order above), so gather, NS, relay and apply of consecutive
//! sub-batches run one after the other; only the replica broadcast overlaps compute. (An
//! earlier model issued the next sub-batch's gather before the current NS and relayed once
//! per assignment after all its NS; the source does neither.) Ops follow a
//! rank-independent sequence of (slot, memory batch) steps, so every member of a
//! communicator issues its collectives in the same order.
//!
//! **Paper and code agree on this order** (checked against the three versions of
//! `hyper_parallel/core/optimizer/muon.py` with a shard path in the public index: 3ad2a77 and
//! the earlier `_gather_and_compute_shard_updates(valid_params, ..., lr, rms, ns_steps,
//! buffer_cache)` one run it exactly as above; the first one is more serial still, one
//! owner per batch (`compute_flat = batch_idx % total_shard_size`) and a blocking
//! `dist.broadcast` per parameter followed by a host read of its learning rate
//! (`lrs_to_broadcast[p].item()`) before its apply). The paper's Algorithm "One distributed Muon
//! step" (`hyperparallel-fsdp-paper.tex` lines 1807-1829) loops over the batches: "fused-gather
//! ... owners: batched NS ... issue-async relay broadcast of B along shard axes / subgroup
//! shard ranks: slice from relay; apply with decay / replica owners: issue-async per-axis
//! broadcast" with the comment "<= 1 in flight; new batch settles oldest" on the *replica*
//! line. Its text (lines 1831-1841) says which broadcast is pipelined: "Each batch's replica
//! broadcast is issued asynchronously as soon as the batch finishes, with at most one batch
//! in flight. Admitting a new batch settles the oldest ...; dimension-by-dimension relay
//! removes host-side bubbles." The "async" relay is `_batched_relay_broadcast`'s
//! `async_op=True` broadcasts within one dimension, waited before the next dimension
//! (its docstring: "By operating asynchronously within each dimension, we eliminate CPU
//! overhead bubbles while strictly preserving the multidimensional relay dependency"), and the
//! apply of the same batch consumes the relay. The pipelining with at most one batch in
//! flight is `AsyncReplicateBroadcaster` (`optimizer.py`: `_max_inflight_batches = 1`,
//! `flush_group` issues the async hierarchical broadcast then `_wait_and_release_oldest`
//! while more than one is in flight, `wait_all` is the final drain), modelled in step 4.
//! On a pure FSDP mesh (the dense Muon comparisons) there is no replica broadcast, so
//! nothing of the optimizer step's communication is sunk beneath compute, in the paper's
//! algorithm as in the code; Figure "Batched orthogonalization and pipelining" (b) draws
//! the replica-broadcast case.
//!
//! Op names carry the slot, not the plan batch index, so ranks of different EP coordinates
//! doing the same work get identical programs and fold in the simulator.

use super::hp_parts::{Part, PartCache, PartKey, Parts, SlotInputs, UnitInputs};
use super::hp_pieces::{Held, NO_OWNERS, Owned, SourceBytes, SourceGroup, UnitOwners, cached};
use super::hp_shapes::OwnedShape;
use super::ns_cost;
use super::schedule::{Dep, Schedule};
use super::{
    NsCall, NsImpl, OptParam, RankView, adamw_routed_units, apply, capped_calls, fused_calls,
    local_matrices, local_shard_elems, momentum, ns_ops, pad512_bf16,
};
use crate::step::{MemTag, Stream};
use crate::strategy::Ctx;
use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::kernel::KernelWork;
use hpfsdp_plan::muon::NS_BATCH_NUMEL;
use std::sync::Arc;

/// Stream of the replica-domain broadcasts (the replicate process group's stream).
pub const REPLICA_STREAM: Stream = Stream::Aux(0);
/// Replica broadcast buffer cap (`replicate_broadcast_max_bytes`, 512 MiB).
pub const REPLICA_BROADCAST_MAX_BYTES: u64 = 512 * 1024 * 1024;

/// The batch a rank runs in one slot of the plan.
struct RankBatch {
    /// Index in the plan.
    index: usize,
    /// The EP class its pieces are keyed by ([`class_key`]).
    class: usize,
    /// Slot (names use it: equal across EP coordinates).
    slot: usize,
    /// Held parameters.
    held: Arc<Held>,
    /// What the rank's replica coordinate owns of them.
    owned: Arc<Owned>,
    /// Shard path.
    shard_path: bool,
    /// Replica coordinate.
    rc: Vec<usize>,
}

/// The parameters of plan batch `index` EP class `class` holds, which domains have
/// replicated ones, and those grouped by replica owner and local shard size.
fn held_of(ctx: &Ctx, index: usize, class: usize) -> Held {
    let oc = &ctx.opt;
    let b = &oc.plan.batches[index];
    let params = oc.held(index, class);
    let mut replicated = [false; 2];
    type GroupKey<'a> = (&'a [usize], Option<u64>, u64, usize, u64);
    let mut groups: std::collections::BTreeMap<GroupKey<'_>, (usize, u64)> = Default::default();
    for &i in &params {
        let Some(owner) = b.replica_owner.get(&i) else {
            continue;
        };
        let p = &oc.params[i];
        let d = Ctx::domain_index(p.domain);
        replicated[d] = true;
        // Everything `local_shard_elems` reads of the parameter.
        let key = (
            owner.as_slice(),
            p.plan_shape.get(p.fsdp_dim).copied(),
            p.local_elems,
            d,
            p.plan_elems,
        );
        groups.entry(key).or_insert((i, 0)).1 += 1;
    }
    let sourced = groups
        .into_iter()
        .map(|((owner, ..), (rep, count))| SourceGroup {
            owner: owner.to_vec(),
            rep,
            count,
        })
        .collect();
    Held {
        params,
        replicated,
        sourced,
    }
}

/// What replica coordinate `rc` owns of the held parameters `held` of plan batch `index`.
fn owned_by(ctx: &Ctx, index: usize, held: &[usize], rc: &[usize]) -> Owned {
    let b = &ctx.opt.plan.batches[index];
    let params: Vec<usize> = held
        .iter()
        .copied()
        .filter(|i| b.replica_owner.get(i).is_none_or(|c| c.as_slice() == rc))
        .collect();
    let mut sorted = params.clone();
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
        .collect::<Vec<Vec<usize>>>();
    let owners = if b.shard_path {
        units
            .iter()
            .map(|members| {
                let owners: Vec<Option<(&[usize], u64)>> = members
                    .iter()
                    .map(|i| {
                        let c = b.shard_owner.get(i)?;
                        Some((c.as_slice(), pad512_bf16(ctx.opt.params[*i].numel)))
                    })
                    .collect();
                UnitOwners::new(&owners)
            })
            .collect()
    } else {
        Vec::new()
    };
    let shape = owned_shape(ctx, b, held, rc, (&params, &units, &owners));
    Owned {
        params,
        units,
        owners,
        shape,
    }
}

/// The shape id of what replica coordinate `rc` owns of plan batch `b` (`held`: the batch's
/// parameters its EP class holds; `owned`: its owned parameters, members per NS memory
/// batch and their shard owners), see [`super::hp_shapes`].
fn owned_shape(
    ctx: &Ctx,
    b: &hpfsdp_plan::muon::MuonBatch,
    held: &[usize],
    rc: &[usize],
    (params, units, owners): (&[usize], &[Vec<usize>], &[UnitOwners]),
) -> u32 {
    let shapes = &ctx.opt.hp_pieces.shapes;
    let ids = shapes.params(|| param_shape_ids(ctx));
    let by_id = |list: &[usize]| list.iter().map(|&i| ids[i]).collect::<Vec<u32>>();
    shapes.owned(OwnedShape {
        slot: b.slot,
        shard_path: b.shard_path,
        rc: rc.to_vec(),
        first_held: held.first().map(|&i| ids[i]),
        params: by_id(params),
        units: units.iter().map(|u| by_id(u)).collect(),
        sources: owners.iter().map(|o| o.sources.clone()).collect(),
    })
}

/// The shape id of every parameter (plan order): parameters of equal optimizer view and Muon
/// plan entry but for name, FSDP unit and EP owner share one ([`super::hp_shapes`]).
fn param_shape_ids(ctx: &Ctx) -> Vec<u32> {
    let oc = &ctx.opt;
    let mut ids: std::collections::HashMap<Vec<u8>, u32> = Default::default();
    let mut buf = Vec::new();
    oc.params
        .iter()
        .zip(&oc.plan.params)
        .map(|(p, m)| {
            buf.clear();
            write_param(&mut ByteSink(&mut buf), p, m);
            if let Some(&id) = ids.get(buf.as_slice()) {
                return id;
            }
            let id = ids.len() as u32;
            ids.insert(buf.clone(), id);
            id
        })
        .collect()
}

/// A `Hasher` that only collects the bytes written (the exact content, compared whole).
struct ByteSink<'a>(&'a mut Vec<u8>);

impl std::hash::Hasher for ByteSink<'_> {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn finish(&self) -> u64 {
        0
    }
}

/// Every field of a parameter's optimizer view and Muon plan entry but its name, FSDP unit
/// and EP owner.
fn write_param(h: &mut impl std::hash::Hasher, p: &OptParam, m: &hpfsdp_plan::muon::MuonParam) {
    use hpfsdp_plan::muon::OptimizerRoute;
    use std::hash::Hash;
    (p.route == OptimizerRoute::Muon).hash(h);
    p.local_elems.hash(h);
    p.numel.hash(h);
    p.plan_elems.hash(h);
    p.core.hash(h);
    p.matrices.hash(h);
    p.plan_matrices.hash(h);
    p.needs_gather.hash(h);
    p.shard.hash(h);
    p.replicate.hash(h);
    p.domain.hash(h);
    p.fsdp_dim.hash(h);
    p.plan_shape.hash(h);
    (m.route == OptimizerRoute::Muon).hash(h);
    m.shape.hash(h);
    m.core_shape.hash(h);
    m.matrices.hash(h);
    m.needs_gather.hash(h);
    m.shard_axes.len().hash(h);
    for a in &m.shard_axes {
        a.axis.hash(h);
        a.tensor_dim.hash(h);
        a.size.hash(h);
    }
    m.replicate_axes.hash(h);
}

/// The EP class that keys plan batch `index`'s pieces for a rank of class `class`: `class`
/// when the batch holds per-expert weights, else 0 (the pieces of a batch every class holds
/// whole do not depend on the class).
fn class_key(ctx: &Ctx, index: usize, class: usize) -> usize {
    let oc = &ctx.opt;
    let per_class = oc.hp_pieces.per_class.get_or_init(|| {
        oc.plan
            .batches
            .iter()
            .map(|b| b.params.iter().any(|&i| oc.params[i].ep_owner.is_some()))
            .collect()
    });
    if per_class.get(index).copied().unwrap_or(true) {
        class
    } else {
        0
    }
}

/// Whether `view`'s shard coordinate on `p`'s shard axes is `owner` (allocation-free
/// [`RankView::shard_coord`] comparison).
fn is_shard_owner(view: &RankView, p: &OptParam, owner: Option<&[usize]>) -> bool {
    owner.is_some_and(|o| {
        o.len() == p.shard.len() && o.iter().zip(&p.shard).all(|(&c, a)| c == view.coord(a))
    })
}

impl RankBatch {
    /// The shard owners of the rank's NS memory batch `u` (none on the local path).
    fn owners(&self, u: usize) -> &UnitOwners {
        self.owned.owners.get(u).unwrap_or(&NO_OWNERS)
    }
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

/// The batch the rank runs in every slot (`None`: it holds none of the slot's batches).
fn rank_batches(ctx: &Ctx, view: &RankView) -> Vec<Option<RankBatch>> {
    let oc = &ctx.opt;
    let pieces = &oc.hp_pieces;
    oc.slots
        .iter()
        .map(|slot| {
            // The slot's batch of this rank's EP coordinate (or of every rank).
            slot.batches.iter().find_map(|&index| {
                let b = &oc.plan.batches[index];
                if b.ep_owner.is_some_and(|o| o != view.class) {
                    return None;
                }
                let class = class_key(ctx, index, view.class);
                let held = cached(&pieces.held, (index, class), || held_of(ctx, index, class));
                let &first = held.params.first()?;
                let rc = view.replica_coord(&oc.params[first]);
                let owned = cached(&pieces.owned, (index, class, rc.clone()), || {
                    owned_by(ctx, index, &held.params, &rc)
                });
                Some(RankBatch {
                    index,
                    class,
                    slot: b.slot,
                    held,
                    owned,
                    shard_path: b.shard_path,
                    rc,
                })
            })
        })
        .collect()
}

/// Elements of the largest piece of parameter `i` any rank holds before the fused gather
/// along its shard axis `from` (the earlier axes already gathered): every tensor dim
/// ceil-chunked by the axes `from..` that cut it (notes 6.4: a segment is the elementwise
/// max of the ranks' local shapes, rounded up to 512 bytes).
fn max_piece(ctx: &Ctx, i: usize, from: usize) -> u64 {
    let p = &ctx.opt.plan.params[i];
    let mut shape: smallvec::SmallVec<[u64; 6]> = p.shape.iter().copied().collect();
    for a in p.shard_axes.iter().skip(from) {
        if let Some(d) = shape.get_mut(a.tensor_dim) {
            *d = d.div_ceil(a.size.max(1) as u64);
        }
    }
    shape.iter().product()
}

/// The kernels `fused_allgather_dtensor_params` (hyper-parallel
/// `core/optimizer/sharding_category.py`) launches around the fused gather of shard axis `k`
/// of the parameters `members` (`kept`: the ones this rank computes, the only ones unpacked
/// after the last axis):
/// - before it, `_prepare_gather_inputs` moves each parameter's shard dim to dim 0 and makes
///   it contiguous (`t.movedim(d, 0).contiguous()`), a copy kernel unless the dim is 0 and the
///   input already contiguous (the momentum output on the first axis; after an earlier axis
///   the unpacked result is a `movedim` view of its concatenation, contiguous only when that
///   axis cut dim 0). Packing into the buffer (`pack_buffer[...].copy_(gi.view(-1))`) is a
///   contiguous same-dtype copy, which torch_npu runs as a device memcpy, not a kernel;
/// - after it, `_unpack_gathered_results` concatenates each parameter's per-rank rows
///   (`torch.cat(param_chunks)`): one kernel per unpacked parameter; after the last axis
///   only the kept ones, whose (count, bytes) `kept` gives ([`kept_unpack`]).
///
/// Each copy reads and writes the bf16 piece once. Returns (before, after).
fn gather_staging(
    ctx: &Ctx,
    members: &[usize],
    kept: (u32, u64),
    k: usize,
) -> (Vec<KernelWork>, Vec<KernelWork>) {
    let plan = &ctx.opt.plan.params;
    let bytes = |i: usize, from: usize| 2 * max_piece(ctx, i, from) * ns_cost::NS_ELEM_BYTES;
    let mut moved = (0u32, 0u64);
    for &i in members {
        let axes = &plan[i].shard_axes;
        let dim = axes.get(k).map_or(0, |a| a.tensor_dim);
        let input_contiguous = k == 0 || axes.get(k - 1).is_some_and(|a| a.tensor_dim == 0);
        if dim != 0 || !input_contiguous {
            moved = (moved.0 + 1, moved.1 + bytes(i, k));
        }
    }
    let last = k + 1 == ctx.opt.params[members[0]].shard.len();
    let cats = if last {
        kept
    } else {
        (
            members.len() as u32,
            members.iter().map(|&i| bytes(i, k + 1)).sum::<u64>(),
        )
    };
    let work = |(n, b): (u32, u64)| {
        (n > 0)
            .then(|| KernelWork::memory_bound(n, 0, b))
            .into_iter()
            .collect()
    };
    (work(moved), work(cats))
}

/// Fused gathers of one NS memory batch, per shard axis, with the kernels around each
/// ([`gather_staging`]; `kept`: (count, bytes) of the members this rank computes, see
/// [`kept_unpack`]); returns (last op, buffer bytes).
fn gathers(
    ctx: &Ctx,
    s: &mut Schedule,
    prefix: &str,
    members: &[usize],
    kept: (u32, u64),
) -> (Option<u32>, u64) {
    let first = &ctx.opt.params[members[0]];
    let mut last: Option<u32> = None;
    let mut buffers = 0;
    for (k, a) in first.shard.iter().enumerate() {
        let input: u64 = members
            .iter()
            .map(|&i| pad512_bf16(max_piece(ctx, i, k)))
            .sum();
        let out = input * a.size as u64;
        let (before, after) = gather_staging(ctx, members, kept, k);
        let mut deps = vec![Dep::Issue];
        deps.extend(last.map(Dep::Op));
        if !before.is_empty() {
            let name = s.name(|| format!("{prefix}.pack.{}", a.name));
            let op = s.kernels(name, before, deps);
            deps = vec![Dep::Op(op), Dep::Issue];
        }
        if let Some(op) = s.coll(
            s.name(|| format!("{prefix}.ag.{}", a.name)),
            Stream::Optimizer,
            a.slot,
            CollectiveKind::AllGather,
            input,
            out,
            hpfsdp_plan::model::DType::Bf16,
            deps,
        ) {
            s.alloc(op, MemTag::Buffers, out);
            buffers += out;
            last = Some(op);
            if !after.is_empty() {
                let name = s.name(|| format!("{prefix}.unpack.{}", a.name));
                last = Some(s.kernels(name, after, vec![Dep::Op(op), Dep::Issue]));
            }
        }
    }
    (last, buffers)
}

/// The HyperParallel Muon schedule of one rank.
///
/// Steps: every NS memory batch position of every slot, in slot order, whether or not the
/// rank takes part in it. Every op has a rank-independent position (step, phase), and a
/// rank emits an op on a communicator exactly when its fellow members do, so all members of
/// a communicator issue the same sequence (whatever the EP coordinate and the replica
/// ownership in other domains). Built from its parts ([`parts`], none cached).
pub(crate) fn schedule(ctx: &Ctx, view: &RankView, s: Schedule) -> Schedule {
    parts(ctx, view, s.anonymous, None).assemble(s)
}

/// The rank's schedule as parts ([`super::hp_parts`]): the AdamW head and one part per slot,
/// taken from `cache` when given (anonymous parts only) and built there when absent.
pub(crate) fn parts(
    ctx: &Ctx,
    view: &RankView,
    anonymous: bool,
    cache: Option<&PartCache>,
) -> Parts {
    let get = |key: PartKey, make: &dyn Fn() -> Part| match cache {
        Some(c) => c.get(key, make),
        None => Arc::new(make()),
    };
    let empty = || Schedule {
        anonymous,
        ..Schedule::default()
    };
    let head = get(PartKey::Head(view.class), &|| {
        let mut s = empty();
        adamw_routed_units(ctx, view, &mut s);
        Part::new(s, None)
    });
    let slots = rank_batches(ctx, view)
        .into_iter()
        .enumerate()
        .map(|(slot, b)| {
            let b = b?;
            let inputs = Arc::new(slot_inputs(ctx, view, &b, slot, !anonymous));
            Some(get(PartKey::Slot(inputs.clone()), &|| {
                slot_part(ctx, &b, slot, &inputs, empty())
            }))
        })
        .collect();
    Parts { head, slots }
}

/// What slot `slot`'s part takes from the rank's view besides its batch `b` (a function of
/// the plan batch, the EP class and the replica coordinate, all in the result): per NS
/// memory batch, the kernels of what the rank computes, its NS calls and the relay
/// broadcasts it joins; the bytes of every replica-broadcast source. Owner labels of relay
/// broadcasts (op names) only when `named`.
fn slot_inputs(ctx: &Ctx, view: &RankView, b: &RankBatch, slot: usize, named: bool) -> SlotInputs {
    let units = (0..ctx.opt.slots[slot].steps)
        .map(|u| {
            let members = b.owned.units.get(u).filter(|m| !m.is_empty())?;
            let (kept, calls, (relay, relay_owners)) = if b.shard_path {
                let kept = computed_here(ctx, view, b.owners(u), members);
                (
                    kept_unpack(ctx, members, &kept),
                    shard_ns_calls(ctx, members, &kept),
                    relays_joined(ctx, view, b, u, members, named),
                )
            } else {
                let calls = unit_ns_calls(ctx, view, b, u, members);
                ((0, 0), calls, (Vec::new(), Vec::new()))
            };
            Some(UnitInputs {
                kept,
                calls,
                relay,
                relay_owners,
            })
        })
        .collect();
    SlotInputs {
        owned: b.owned.shape,
        units,
        sources: replica_sources(ctx, view, b, ctx.opts.master_dtype.bytes()),
    }
}

/// (count, bytes) of the unpack kernels after the last fused gather of `members`: one per
/// parameter this rank computes (`kept`), each its full bf16 matrix read and written once.
fn kept_unpack(ctx: &Ctx, members: &[usize], kept: &[usize]) -> (u32, u64) {
    let last = ctx.opt.params[members[0]].shard.len();
    let bytes = kept
        .iter()
        .map(|&i| 2 * max_piece(ctx, i, last) * ns_cost::NS_ELEM_BYTES)
        .sum();
    (kept.len() as u32, bytes)
}

/// The rank's ops of slot `slot` (its batch `b`) appended to `s` (empty): the momentum of
/// its owned parameters before their first NS memory batch, every memory batch it takes
/// part in, then the end of the slot ([`finish_slot`]), whose replica broadcast is left in
/// flight.
fn slot_part(ctx: &Ctx, b: &RankBatch, slot: usize, inputs: &SlotInputs, mut s: Schedule) -> Part {
    let oc = &ctx.opt;
    let grad_bytes = super::grad_dtype(ctx).bytes();
    s.momentum_bytes = b
        .owned
        .params
        .iter()
        .map(|&i| oc.params[i].local_elems * grad_bytes)
        .sum();
    let mut momentum_done = false;
    for (u, unit) in inputs.units.iter().enumerate() {
        let (Some(unit), Some(members)) = (unit, b.owned.units.get(u)) else {
            continue;
        };
        if !std::mem::replace(&mut momentum_done, true) {
            let owned = &b.owned.params;
            let elems = owned.iter().map(|&i| oc.params[i].local_elems).sum();
            let name = s.name(|| format!("muon.b{}.momentum", b.slot));
            momentum(ctx, &mut s, name, elems, owned.len() as u32);
        }
        memory_batch(ctx, &mut s, b, (slot, u), members, unit);
    }
    let in_flight = finish_slot(ctx, &mut s, b, slot, inputs.sources.as_deref());
    Part::new(s, in_flight)
}

/// One NS memory batch `u` of slot `slot` on this rank (`members`: the owned parameters of
/// the batch), in source order (`_process_shard_params`): on the shard path the batch's
/// fused gathers, which wait for the previous sub-batch's apply already issued
/// ([`Dep::Issue`]; nothing is prefetched), then the NS of the matrices the rank computes,
/// then `_fused_broadcast_and_apply(sub_batch)`: the relay, then the slice-and-apply on the
/// local shards; on the local path the NS alone. What depends on the rank is in `unit`.
fn memory_batch(
    ctx: &Ctx,
    s: &mut Schedule,
    b: &RankBatch,
    (slot, u): (usize, usize),
    members: &[usize],
    unit: &UnitInputs,
) {
    let oc = &ctx.opt;
    let (gather, buf) = if b.shard_path {
        let prefix = s.name(|| format!("muon.b{}.m{u}", b.slot));
        gathers(ctx, s, &prefix, members, unit.kept)
    } else {
        (None, 0)
    };
    let prefix = s.name(|| format!("muon.b{slot}.m{u}"));
    let deps: Vec<Dep> = gather.map(Dep::Op).into_iter().collect();
    let ns = ns_ops(
        ctx,
        s,
        &prefix,
        unit.calls.iter().copied(),
        &deps,
        NsImpl::Bf16,
    );
    if let Some(&last) = ns.last().or(gather.as_ref()) {
        s.free(last, MemTag::Buffers, buf);
    }
    if b.shard_path {
        let relay = relay_broadcast(ctx, s, b, u, members, unit);
        let elems = members.iter().map(|&i| oc.params[i].local_elems).sum();
        let mut deps: Vec<Dep> = relay.0.iter().map(|&o| Dep::Op(o)).collect();
        deps.push(Dep::Issue);
        if let Some(k) = slice_copies(ctx, members) {
            let name = s.name(|| format!("muon.b{slot}.m{u}.slice"));
            deps = vec![Dep::Op(s.kernels(name, vec![k], deps)), Dep::Issue];
        }
        let name = s.name(|| format!("muon.b{slot}.m{u}.apply"));
        let op = apply(ctx, s, name, elems, members.len() as u32, deps);
        s.free(op, MemTag::Buffers, relay.1);
    }
}

/// The end of the rank's batch in slot `slot`: on the local path one apply after the
/// batch's last NS; then the replica broadcast of the updated local parameters (returned
/// as in flight when the rank takes part in any).
fn finish_slot(
    ctx: &Ctx,
    s: &mut Schedule,
    b: &RankBatch,
    slot: usize,
    sources: Option<&[u64]>,
) -> Option<(Vec<u32>, u64, usize)> {
    let oc = &ctx.opt;
    let owned = &b.owned.params;
    if !b.shard_path && !owned.is_empty() {
        let elems = owned.iter().map(|&i| oc.params[i].local_elems).sum();
        let name = s.name(|| format!("muon.b{slot}.apply"));
        apply(ctx, s, name, elems, owned.len() as u32, vec![Dep::Issue]);
    }
    replica_broadcast(s, ctx, b, sources)
}

/// The copies `chunk_update_by_layout` (hyper-parallel `core/optimizer/sharding_category.py`)
/// makes when it slices each full update back to the local shard: `narrow` along every shard
/// axis's tensor dim is a view, made contiguous (`local_update.contiguous()`) before the
/// apply's `view(local shape)`; a slice along a dim other than 0 is not contiguous, so one
/// copy of the local shard (bf16, read and written once) per such parameter, none when every
/// shard axis cuts dim 0.
fn slice_copies(ctx: &Ctx, members: &[usize]) -> Option<KernelWork> {
    let oc = &ctx.opt;
    let moved: Vec<usize> = members
        .iter()
        .copied()
        .filter(|&i| {
            oc.plan.params[i]
                .shard_axes
                .iter()
                .any(|a| a.tensor_dim != 0 && a.size > 1)
        })
        .collect();
    let bytes: u64 = moved
        .iter()
        .map(|&i| 2 * oc.params[i].local_elems * ns_cost::NS_ELEM_BYTES)
        .sum();
    (!moved.is_empty()).then(|| KernelWork::memory_bound(moved.len() as u32, 0, bytes))
}

/// The members of a shard-path memory batch whose Newton-Schulz this rank computes (its
/// shard coordinate is the parameter's owner in the batch's shard group).
fn computed_here(ctx: &Ctx, view: &RankView, owners: &UnitOwners, members: &[usize]) -> Vec<usize> {
    let oc = &ctx.opt;
    members
        .iter()
        .enumerate()
        .filter(|&(k, &i)| is_shard_owner(view, &oc.params[i], owners.owner_of(k)))
        .map(|(_, &i)| i)
        .collect()
}

/// The NS calls of one memory batch on this rank: on the shard path the matrices it owns in
/// the shard group, per core shape, in calls under 2^29 / S whole-matrix elements each
/// (`_gather_and_compute_shard_updates`); on the local path its local matrices, per core
/// shape.
fn unit_ns_calls(
    ctx: &Ctx,
    view: &RankView,
    b: &RankBatch,
    u: usize,
    members: &[usize],
) -> Vec<NsCall> {
    let oc = &ctx.opt;
    if b.shard_path {
        let kept = computed_here(ctx, view, b.owners(u), members);
        shard_ns_calls(ctx, members, &kept)
    } else {
        fused_calls(members.iter().filter_map(|&i| {
            let p = &oc.params[i];
            Some((p.core?, local_matrices(ctx, p, view)))
        }))
    }
}

/// The NS calls of a shard-path memory batch (`members`) on a rank that computes `kept` of
/// them (in member order): per core shape, under 2^29 / S whole-matrix elements each.
fn shard_ns_calls(ctx: &Ctx, members: &[usize], kept: &[usize]) -> Vec<NsCall> {
    let oc = &ctx.opt;
    let mine: Vec<((u64, u64), u64, u64)> = kept
        .iter()
        .filter_map(|&i| {
            let p = &oc.params[i];
            Some((p.core?, p.matrices, p.numel))
        })
        .collect();
    let cap = NS_BATCH_NUMEL / oc.params[members[0]].shard_size().max(1);
    capped_calls(&mine, cap)
}

/// The relay broadcasts each rank of a shard-path batch joins in NS memory batch `u`
/// (`members`: its owned parameters), per shard dim but the last: every compute coordinate
/// that owns a matrix of the sub-batch and is aligned with the rank on later dims
/// ([`relay_sources`]): (bytes per dim, owner coordinates per dim, the latter only when
/// `named` (op names)). On the last dim every rank joins every source's broadcast, so that
/// dim is no input ([`relay_broadcast`] lists it).
type Relays = (Vec<Vec<u64>>, Vec<Vec<Vec<usize>>>);
fn relays_joined(
    ctx: &Ctx,
    view: &RankView,
    b: &RankBatch,
    u: usize,
    members: &[usize],
    named: bool,
) -> Relays {
    let Some(&f) = members.first().filter(|_| b.shard_path) else {
        return (Vec::new(), Vec::new());
    };
    let first = &ctx.opt.params[f];
    let mine = view.shard_coord(first);
    let bytes = &b.owners(u).sources;
    let dims = first.shard.len().saturating_sub(1);
    let mut sizes = Vec::with_capacity(dims);
    let mut owners = Vec::new();
    for d in 0..dims {
        let joined: Vec<(&[usize], u64)> = bytes
            .iter()
            .filter(|&(c, n)| *n != 0 && c.get(d + 1..) == mine.get(d + 1..))
            .map(|(c, n)| (c.as_slice(), *n))
            .collect();
        sizes.push(joined.iter().map(|&(_, n)| n).collect());
        if named {
            owners.push(joined.iter().map(|&(c, _)| c.to_vec()).collect());
        }
    }
    (sizes, owners)
}

/// The relay broadcasts of dim `d` the rank joins: from `unit` ([`relays_joined`]), or on
/// the last dim every source with bytes whose coordinate spans the shard dims (the rank's
/// alignment on no later dim: the same for every rank). (bytes, owner coordinates when
/// `named`.)
fn relays_of_dim(
    b: &RankBatch,
    u: usize,
    unit: &UnitInputs,
    (d, dims): (usize, usize),
    named: bool,
) -> Vec<(u64, Option<Vec<usize>>)> {
    if d + 1 < dims {
        let owners = unit.relay_owners.get(d);
        return unit.relay.get(d).map_or(Vec::new(), |sizes| {
            sizes
                .iter()
                .enumerate()
                .map(|(j, &n)| (n, owners.and_then(|o| o.get(j)).cloned()))
                .collect()
        });
    }
    b.owners(u)
        .sources
        .iter()
        .filter(|(c, n)| *n != 0 && c.len() == dims)
        .map(|(c, n)| (*n, named.then(|| c.clone())))
        .collect()
}

/// The relay broadcasts of NS memory batch `u` of a shard-path batch (`members`: its owned
/// parameters; `unit`: the broadcasts the rank joins, see [`relays_of_dim`]), dim by dim,
/// each dim waited before the next (`_batched_relay_broadcast`: one async broadcast per
/// compute coordinate). The broadcasts of one dim share the shard process group's stream,
/// so they run one after the other. Returns (ops, buffer bytes).
fn relay_broadcast(
    ctx: &Ctx,
    s: &mut Schedule,
    b: &RankBatch,
    u: usize,
    members: &[usize],
    unit: &UnitInputs,
) -> (Vec<u32>, u64) {
    let oc = &ctx.opt;
    let mut relay: Vec<u32> = Vec::new();
    let mut relay_buf = 0;
    let Some(&f) = members.first().filter(|_| b.shard_path) else {
        return (relay, relay_buf);
    };
    let first = &oc.params[f];
    let dims = first.shard.len();
    let mut prev_dim: Vec<u32> = Vec::new();
    for (d, a) in first.shard.iter().enumerate() {
        let mut this_dim = Vec::new();
        for (n, c) in relays_of_dim(b, u, unit, (d, dims), !s.anonymous) {
            let mut deps = vec![Dep::Issue];
            deps.extend(prev_dim.iter().map(|&o| Dep::Op(o)));
            let name = s.name(|| {
                let label: Vec<String> = c.into_iter().flatten().map(|x| x.to_string()).collect();
                format!(
                    "muon.b{}.m{u}.relay.{}.c{}",
                    b.slot,
                    a.name,
                    label.join("_")
                )
            });
            if let Some(op) = s.coll(
                name,
                Stream::Optimizer,
                a.slot,
                CollectiveKind::Broadcast,
                n,
                n,
                hpfsdp_plan::model::DType::Bf16,
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
    (relay, relay_buf)
}

/// The hierarchical replica broadcasts of one batch; returns (last-hop ops, bytes received,
/// slot) when the rank takes part in any. Each parameter travels as the local shard the
/// source really holds: its replica group shares the rank's FSDP shard position, so that is
/// the rank's own unpadded shard (short, or empty, on the last positions of a dim that does
/// not split evenly), each segment padded to 512 bytes.
fn replica_broadcast(
    s: &mut Schedule,
    ctx: &Ctx,
    b: &RankBatch,
    sources: Option<&[u64]>,
) -> Option<(Vec<u32>, u64, usize)> {
    let first = &ctx.opt.params[*b.held.params.first()?];
    let sources = sources?;
    let sizes: Vec<usize> = first.replicate.iter().map(|a| a.coord_size).collect();
    let mut last_hops = Vec::new();
    let mut received = 0;
    let mut first_op: Option<u32> = None;
    for (src, &bytes) in grid(&sizes).into_iter().zip(sources) {
        let chunks = bytes.div_ceil(REPLICA_BROADCAST_MAX_BYTES);
        let label = s.name(|| {
            let c: Vec<String> = src.iter().map(|x| x.to_string()).collect();
            c.join("_")
        });
        for c in 0..chunks {
            let n = (bytes - c * REPLICA_BROADCAST_MAX_BYTES).min(REPLICA_BROADCAST_MAX_BYTES);
            let mut prev: Option<u32> = None;
            for (d, a) in first.replicate.iter().enumerate() {
                if src[d + 1..] != b.rc[d + 1..] {
                    continue;
                }
                let mut deps = vec![Dep::Issue];
                deps.extend(prev.map(Dep::Op));
                let name = s.name(|| format!("muon.b{}.rb.{}.s{label}.k{c}", b.slot, a.name));
                if let Some(op) = s.coll(
                    name,
                    REPLICA_STREAM,
                    a.slot,
                    CollectiveKind::Broadcast,
                    n,
                    n,
                    ctx.opts.master_dtype,
                    deps,
                ) {
                    first_op.get_or_insert(op);
                    prev = Some(op);
                }
            }
            if let Some(op) = prev {
                last_hops.push(op);
                if src != b.rc {
                    received += n;
                }
            }
        }
    }
    // The receive buffers of every source are packed when the batch is flushed (notes 6.5:
    // `flush_group` packs, then issues the async broadcasts), so they are allocated with the
    // batch's first broadcast: the same op on every member, whichever source it is.
    if let Some(op) = first_op {
        s.alloc(op, MemTag::Buffers, received);
    }
    (!last_hops.is_empty()).then_some((last_hops, received, b.slot))
}

/// Bytes each replica source of batch `b` sends, in [`grid`] order of the replica
/// coordinates ([`source_bytes`]); `None` when the batch's parameters have no replica group
/// (a single replica).
fn replica_sources(ctx: &Ctx, view: &RankView, b: &RankBatch, master: u64) -> Option<Vec<u64>> {
    let first = &ctx.opt.params[*b.held.params.first()?];
    if first.replicate.iter().all(|a| a.slot.is_none()) {
        return None;
    }
    let sizes: Vec<usize> = first.replicate.iter().map(|a| a.coord_size).collect();
    let by_src = source_bytes(ctx, view, b, master);
    Some(
        grid(&sizes)
            .iter()
            .map(|src| by_src.get(src).copied().unwrap_or(0))
            .collect(),
    )
}

/// Bytes each replica owner of batch `b` sources (every held parameter with a replica owner,
/// as the local shard the rank holds, 512-byte padded), shared by every rank of the same
/// batch, EP class and FSDP positions of the domains those parameters are in ([`Pieces`](super::hp_pieces::Pieces)).
fn source_bytes(ctx: &Ctx, view: &RankView, b: &RankBatch, master: u64) -> Arc<SourceBytes> {
    let oc = &ctx.opt;
    let pos: [usize; 2] = std::array::from_fn(|d| {
        if b.held.replicated[d] {
            view.fsdp_pos[d]
        } else {
            usize::MAX
        }
    });
    cached(
        &oc.hp_pieces.sources,
        (b.index, b.class, pos, master),
        || {
            let mut by_src = SourceBytes::new();
            for g in &b.held.sourced {
                let elems = local_shard_elems(ctx, &oc.params[g.rep], view);
                *by_src.entry(g.owner.clone()).or_default() +=
                    g.count * ((elems * master).div_ceil(512) * 512);
            }
            by_src
        },
    )
}
