//! What the optimizer schedule builders share: a rank's view ([`RankView`]), the AdamW units
//! of AdamW-routed parameters, momentum and apply ops, and Newton-Schulz calls and their ops.

use super::ns_cost;
use super::opt_ctx::{AxisRef, OptParam};
use super::schedule::{Dep, Schedule};
use crate::step::{MemTag, Stream};
use crate::strategy::Ctx;
use crate::strategy::options::StrategyKind;
use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::muon::OptimizerRoute;
use std::collections::BTreeMap;

/// A rank's coordinates on both meshes and its expert-parallel class.
#[derive(Debug, Clone)]
pub(crate) struct RankView {
    /// EP class.
    pub class: usize,
    /// Dense and expert mesh coordinates.
    pub coords: [Vec<usize>; 2],
    /// Position in the dense and expert FSDP shard groups.
    pub fsdp_pos: [usize; 2],
}

impl RankView {
    /// The view of `rank`.
    pub fn new(ctx: &Ctx, rank: usize) -> Self {
        Self {
            class: ctx.class_of(rank),
            coords: [
                ctx.dense_mesh.coords_of(rank),
                ctx.expert_mesh.coords_of(rank),
            ],
            fsdp_pos: [
                ctx.position_in(ctx.opt.fsdp_shard_slot[0], rank),
                ctx.position_in(ctx.opt.fsdp_shard_slot[1], rank),
            ],
        }
    }

    /// Coordinate along an axis.
    pub fn coord(&self, a: &AxisRef) -> usize {
        self.coords[usize::from(a.expert)]
            .get(a.mesh_axis)
            .copied()
            .unwrap_or(0)
    }

    /// Shard-owner coordinate of this rank for a parameter.
    pub fn shard_coord(&self, p: &OptParam) -> Vec<usize> {
        p.shard.iter().map(|a| self.coord(a)).collect()
    }

    /// Replica-owner coordinate (coordinate modulo the subgroup size).
    pub fn replica_coord(&self, p: &OptParam) -> Vec<usize> {
        p.replicate
            .iter()
            .map(|a| self.coord(a) % a.coord_size.max(1))
            .collect()
    }

    /// Everything the schedule depends on: the class, the coordinates on the axes the Muon
    /// parameters use (replicate axes modulo the subgroup) and the FSDP positions.
    pub(crate) fn key(&self, ctx: &Ctx) -> Vec<usize> {
        let mut k = vec![self.class, self.fsdp_pos[0], self.fsdp_pos[1]];
        for (e, coords) in self.coords.iter().enumerate() {
            let mesh = if e == 0 {
                &ctx.dense_mesh
            } else {
                &ctx.expert_mesh
            };
            for (i, &c) in coords.iter().enumerate() {
                let axis = &mesh.axes()[i];
                let modulo = if axis.name.ends_with("replicate") {
                    ctx.opt.plan.replica_subgroup_size(&axis.name, axis.size)
                } else {
                    usize::MAX
                };
                k.push(c % modulo.max(1));
            }
        }
        k
    }
}

/// Whether owner placement puts parameter `i` whole on `rank` (DMuon / MatrixFSDP); `None`
/// when the parameter is not placed.
pub(crate) fn placed_owner(ctx: &Ctx, i: usize, fsdp_pos: [usize; 2]) -> Option<bool> {
    let o = (*ctx.opt.placed.get(i)?)?;
    let p = &ctx.opt.params[i];
    Some(o == fsdp_pos[Ctx::domain_index(p.domain)])
}

// ------------------------------------------------------------------ shared schedule pieces

/// Bytes of `elems` bf16 elements rounded up to 512 bytes (HyperParallel's segment padding).
pub(crate) fn pad512_bf16(elems: u64) -> u64 {
    (elems * ns_cost::NS_ELEM_BYTES).div_ceil(512) * 512
}

/// The device work of an AdamW implementation over `(elements, tensors, master dtype,
/// gradient dtype)`.
pub(crate) type AdamwWork =
    fn(u64, u32, hpfsdp_plan::model::DType, hpfsdp_plan::model::DType) -> crate::step::ComputeWork;

/// AdamW on the AdamW-routed parameters the rank holds (plus `extra`, e.g. DMuon's
/// unselected experts), one op per FSDP unit in unit order with the implementation's `work`,
/// after the gradients are reduced. Accounts their moments in `s.adamw_state_bytes`.
pub(crate) fn adamw_units(
    ctx: &Ctx,
    view: &RankView,
    s: &mut Schedule,
    extra: impl Fn(usize, &OptParam) -> bool,
    work: AdamwWork,
) {
    let mut per_unit: BTreeMap<usize, (u64, u32)> = BTreeMap::new();
    for (i, p) in ctx.opt.params.iter().enumerate() {
        if p.held_by(view.class) && (p.route == OptimizerRoute::Adamw || extra(i, p)) {
            let e = per_unit.entry(p.unit).or_default();
            e.0 += p.local_elems;
            e.1 += 1;
        }
    }
    emit_adamw_units(ctx, s, per_unit, work);
}

/// [`adamw_units`] without extra parameters: AdamW on the AdamW-routed parameters the rank
/// holds, found from [`OptCtx::adamw_params`](super::OptCtx::adamw_params) instead of a walk over every parameter.
pub(crate) fn adamw_routed_units(ctx: &Ctx, view: &RankView, s: &mut Schedule) {
    let mut per_unit: BTreeMap<usize, (u64, u32)> = BTreeMap::new();
    for &i in &ctx.opt.adamw_params {
        let p = &ctx.opt.params[i];
        if p.held_by(view.class) {
            let e = per_unit.entry(p.unit).or_default();
            e.0 += p.local_elems;
            e.1 += 1;
        }
    }
    emit_adamw_units(ctx, s, per_unit, crate::strategy::optimizer::adamw_work);
}

/// One AdamW op per FSDP unit of `per_unit` ((elements, tensors) by unit), in unit order,
/// each costed by `work`.
fn emit_adamw_units(
    ctx: &Ctx,
    s: &mut Schedule,
    per_unit: BTreeMap<usize, (u64, u32)>,
    work: AdamwWork,
) {
    for (u, (elems, tensors)) in per_unit {
        s.adamw_state_bytes += elems * crate::strategy::optimizer::ADAMW_STATE_BYTES_PER_ELEM;
        let name = &ctx.fsdp.units[u].name;
        let name = name.strip_prefix("model.").unwrap_or(name);
        let work = work(elems, tensors, ctx.opts.master_dtype, grad_dtype(ctx));
        let name = s.name(|| format!("{name}.adamw"));
        s.compute(name, work, vec![Dep::Ready, Dep::Issue]);
    }
}

/// DTensor-style unpadded gathers of the parameters `members` (sharded like `members[0]`),
/// one all-gather per shard axis in order, each waiting for the previous one, in the gradient
/// dtype: on the axis `k` each rank contributes `ceil(numel / product of the remaining axis
/// sizes)` elements per parameter. Returns the last gather and the gathered buffer bytes
/// (allocated here). Shared by the `naive` (one parameter) and `moonlight` (one bucket)
/// baselines.
pub(crate) fn unpadded_gathers(
    ctx: &Ctx,
    s: &mut Schedule,
    prefix: &str,
    members: &[usize],
) -> (Option<u32>, u64) {
    let oc = &ctx.opt;
    let gb = grad_dtype(ctx).bytes();
    let (mut last, mut buf) = (None, 0);
    let Some(&f) = members.first() else {
        return (last, buf);
    };
    let first = &oc.params[f];
    let mut remaining = first.shard_size();
    for a in &first.shard {
        let input: u64 = members
            .iter()
            .map(|&i| oc.params[i].numel.div_ceil(remaining.max(1)) * gb)
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
            grad_dtype(ctx),
            deps,
        ) {
            s.alloc(op, MemTag::Buffers, out);
            buf += out;
            last = Some(op);
        }
    }
    (last, buf)
}

/// Dtype of the sharded gradients the optimizer reads from the FSDP runtime. HyperParallel's
/// `apply_reduced_grad` (`TorchHSDPParamV2`: `reduced_grad.to(self.orig_dtype)`) and FSDP2's
/// `foreach_reduce` (`_to_dtype_if_needed(reduce_output, orig_dtype)`) cast each reduced
/// shard back to the parameter's own dtype, the master dtype, so the momentum buffer
/// (`zeros_like(grad)`), the foreach momentum kernels and AdamW read that dtype; with an FP32
/// `main_grad` (`[fsdp] fp32_main_grad`) and under Megatron (FP32 main grads) the gradient
/// stays in the reduce dtype.
pub(crate) fn grad_dtype(ctx: &Ctx) -> hpfsdp_plan::DType {
    let o = &ctx.opts;
    if o.fp32_main_grad || o.kind == StrategyKind::MegatronDdp {
        o.reduce_dtype
    } else {
        o.master_dtype
    }
}

/// Momentum update over `elems` local elements in `tensors` tensors (memory-bound foreach
/// kernels), once the gradients are reduced.
pub(crate) fn momentum(ctx: &Ctx, s: &mut Schedule, name: String, elems: u64, tensors: u32) -> u32 {
    let k = ns_cost::momentum_kernels(elems, tensors, grad_dtype(ctx));
    s.kernels(name, k, vec![Dep::Ready, Dep::Issue])
}

/// Slice-and-apply of the update on `elems` local elements in `tensors` tensors (memory-bound
/// foreach kernels), after `deps` and the issue point.
pub(crate) fn apply(
    ctx: &Ctx,
    s: &mut Schedule,
    name: String,
    elems: u64,
    tensors: u32,
    mut deps: Vec<Dep>,
) -> u32 {
    deps.push(Dep::Issue);
    let k = ns_cost::apply_kernels(elems, tensors, ctx.opts.master_dtype);
    s.kernels(name, k, deps)
}

/// How an implementation runs Newton-Schulz.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NsImpl {
    /// The standard quintic iteration in bf16 ([`ns_cost::ns_call_kernels`]).
    Bf16,
    /// DMuon's Gram-space iteration as it runs on an NPU: FP32 normalization, FP16 GEMM
    /// iterations (no CUDA SYRK), input and output in the gradient dtype
    /// ([`ns_cost::gram_ns_call_kernels`]).
    GramFp16,
}

pub(crate) use super::ns_call::NsCall;

/// Shape-fused batching (notes 6.6): one call per core shape over all its matrices.
pub(crate) fn fused_calls(items: impl IntoIterator<Item = ((u64, u64), u64)>) -> Vec<NsCall> {
    let mut by_shape: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for (core, n) in items {
        *by_shape.entry(core).or_default() += n;
    }
    by_shape
        .into_iter()
        .map(|(core, matrices)| NsCall { core, matrices })
        .collect()
}

/// One call per parameter (per-parameter optimizer loops: `torch.optim.Muon`, DTensor
/// `full_tensor()` recipes), batched only over the parameter's own leading dims.
pub(crate) fn per_param_calls(items: impl IntoIterator<Item = ((u64, u64), u64)>) -> Vec<NsCall> {
    items
        .into_iter()
        .map(|(core, matrices)| NsCall { core, matrices })
        .collect()
}

/// HyperParallel's owner-side NS calls (`_gather_and_compute_shard_updates`): per core shape,
/// the rank's gathered matrices split sequentially under `cap` whole-matrix elements
/// (`_split_into_memory_safe_batches(shard_size = S)`, at least one matrix per call).
/// `items` are (core shape, matrices, elements) per parameter in plan order.
pub(crate) fn capped_calls(items: &[((u64, u64), u64, u64)], cap: u64) -> Vec<NsCall> {
    // Per core shape in ascending order, each shape's items in their order (a stable sort).
    let mut sorted: smallvec::SmallVec<[((u64, u64), u64, u64); 32]> =
        items.iter().copied().collect();
    sorted.sort_by_key(|&(core, ..)| core);
    let mut out = Vec::new();
    for group in sorted.chunk_by(|a, b| a.0 == b.0) {
        let core = group[0].0;
        let (mut matrices, mut elems) = (0u64, 0u64);
        for &(_, m, e) in group {
            if matrices > 0 && elems + e > cap {
                out.push(NsCall { core, matrices });
                (matrices, elems) = (0, 0);
            }
            matrices += m;
            elems += e;
        }
        if matrices > 0 {
            out.push(NsCall { core, matrices });
        }
    }
    out
}

/// NS ops for `calls`: one op per core shape holding the kernels of its calls in order (each
/// call's GEMMs batched over the call's matrices), allocating and freeing the largest call's
/// workspace. Returns the ops.
pub(crate) fn ns_ops(
    ctx: &Ctx,
    s: &mut Schedule,
    prefix: &str,
    calls: impl IntoIterator<Item = NsCall>,
    deps: &[Dep],
    imp: NsImpl,
) -> Vec<u32> {
    let mut by_shape: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
    for c in calls {
        if c.matrices > 0 {
            by_shape.entry(c.core).or_default().push(c.matrices);
        }
    }
    let steps = ctx.opt.ns_steps;
    let mut out = Vec::new();
    for (k, ((r, c), sizes)) in by_shape.into_iter().enumerate() {
        let mut kernels = Vec::new();
        let mut runs: Vec<(u64, u32)> = Vec::new();
        for n in &sizes {
            match runs.last_mut() {
                Some((m, times)) if m == n => *times += 1,
                _ => runs.push((*n, 1)),
            }
        }
        for (n, times) in runs {
            let call = match imp {
                NsImpl::Bf16 => ns_cost::ns_call_kernels(n, r, c, steps),
                NsImpl::GramFp16 => ns_cost::gram_ns_call_kernels(
                    n,
                    r,
                    c,
                    ns_cost::DMUON_COEFFICIENT_SETS,
                    // DMuon's input: its reduced gradient, in the parameter dtype.
                    ctx.opts.param_dtype,
                ),
            };
            kernels.extend(call.into_iter().map(|w| w.repeated(times)));
        }
        let mut d = deps.to_vec();
        d.push(Dep::Issue);
        let name = s.name(|| format!("{prefix}.ns{k}"));
        let op = s.kernels(name, kernels, d);
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let ws = ns_cost::ns_workspace_bytes(largest, r, c);
        s.alloc(op, MemTag::Buffers, ws);
        s.free(op, MemTag::Buffers, ws);
        out.push(op);
    }
    out
}

/// Unpadded elements of this rank's FSDP shard of `p`: the `chunk_range` rows of the FSDP
/// shard dim at the rank's shard position (ceil-sized chunks; the last positions are short,
/// or empty, when the dim does not split evenly) times the other dims of `plan_local_shape`.
/// What the rank really holds, where `local_elems` is the padded (chunk 0) size.
pub(crate) fn local_shard_elems(ctx: &Ctx, p: &OptParam, view: &RankView) -> u64 {
    let Some(&dim) = p.plan_shape.get(p.fsdp_dim) else {
        return p.local_elems;
    };
    let d = Ctx::domain_index(p.domain);
    let s = ctx.shard_size[d] as u64;
    let r = hpfsdp_plan::chunk_range(dim, s, view.fsdp_pos[d] as u64);
    p.plan_elems / dim.max(1) * (r.end - r.start)
}

/// Matrices of a local-path parameter on this rank: its `plan_local_shape` matrices, cut by
/// the FSDP shard of a leading dim (exact ceil-chunk share of the rank).
pub(crate) fn local_matrices(ctx: &Ctx, p: &OptParam, view: &RankView) -> u64 {
    let nd = p.plan_shape.len();
    if nd < 3 || p.fsdp_dim + 2 >= nd {
        return p.plan_matrices;
    }
    let d = Ctx::domain_index(p.domain);
    let s = ctx.shard_size[d] as u64;
    let dim = p.plan_shape[p.fsdp_dim];
    let r = hpfsdp_plan::chunk_range(dim, s, view.fsdp_pos[d] as u64);
    p.plan_matrices / dim.max(1) * (r.end - r.start)
}
