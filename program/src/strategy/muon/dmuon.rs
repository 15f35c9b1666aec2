//! DMuon ("dedicated ownership", `muon.md` 7.4; paper related work and Tables "design
//! contrast"). Each modelling choice and the source fact it rests on:
//!
//! - **Owners** (`muon.md` 7.4 "`dedicate_params()` ... gives each selected matrix one owner
//!   rank storing the full param"; LPT, "same-layer params on different ranks"): each
//!   selected 2-D Muon matrix gets one owner of the data-parallel (FSDP shard) group by greedy
//!   LPT on numel (DMuon's measured-makespan MILP is not modelled); the owner keeps the full
//!   parameter and its momentum, the others hold zero-size placeholders.
//! - **Publication and reduction in the model path** (`muon.md` 7.4 "forward/backward
//!   broadcast from owner; gradients reduced to owner"; paper: "owner publication, gradient
//!   reduction, and prefetch run on DMuon's own lifecycle hooks", "lookahead publication"):
//!   the **FSDP part** of the program changes (see `strategy::hyperparallel`): the owner
//!   publishes the matrix by broadcast before forward (prefetched one layer ahead: DMuon's
//!   forward prefetch) and before backward (prefetched by the previous layer's pre-backward
//!   hook, `_backward_prefetch`); the gradient is reduced to the owner instead of
//!   reduce-scattered, the previous layer's reduce waited before the next is issued (its
//!   rolling one-outstanding drain).
//! - **Recompute publishes twice, the second time exposed** (`dmuon/_core/state.py`: the
//!   recompute forward fires `_pre_forward`/`_post_forward`, the latter reshards;
//!   `_DedicatedPreBackward.backward` then runs `unshard()` + `wait_for_unshard()`;
//!   `_backends/fsdp2/group.py` `unshard`: `broadcast_stream.wait_stream(current_stream)`):
//!   on a recomputed layer the prefetched publication feeds the recompute forward, and the
//!   backward's own publication starts only after the recompute forward and is waited at
//!   once (no forward prefetch inside backward either). FSDP2/HyperParallel keep the gathered
//!   parameters through the recompute (one gather). This is the paper's "owner publication
//!   and reduction hooks ... cannot be prefetched like FSDP all-gathers".
//! - **AdamW per parameter** (`Muon._step_adamw`: a loop of unfused tensor ops over the
//!   FSDP2-managed parameters, [`DMUON_ADAMW_OPS_PER_PARAM`] launches each).
//! - **Local optimizer step** (paper Table: "Owner-to-all broadcast / all-to-owner reduce" are
//!   its only collectives): momentum, NS and apply on the owner's whole matrices; no
//!   optimizer collective (the next forward's publication ships the update).
//! - **Gram-space NS, one matrix at a time** (`muon.md` 7.4 "NS default is Gram-space NS
//!   (Dao-AILab gram-newton-schulz; restart at `[2]`), fp32 normalization then fp16
//!   iteration"; calibration README: "DMuon normalises the NS input in FP32 and iterates in
//!   FP16"): `Muon._step_muon` (`dmuon/optim/muon.py`) loops over the owned parameters and
//!   calls `NewtonSchulz.local` on each one. The paper's "Gram-NS batching with SYRK kernels"
//!   is DMuon's CUDA path: same-shape batches exist only under
//!   `owner_strategy='profiled_ilp'` (`optim/profiled_batch.py`, whose profiling raises
//!   without CUDA), and the SYRK kernels are CuTe-DSL kernels for SM80+ taken only when
//!   `X.is_cuda`. On the Ascend NPUs of the comparison each owned matrix runs
//!   [`ns_cost::gram_ns_call_kernels`](super::ns_cost::gram_ns_call_kernels) alone (GEMM
//!   batch 1, full GEMMs), and momentum and apply are per-parameter tensor ops
//!   ([`OwnerLoop::DMuon`]). Step programs do not depend on the hardware profile, so a
//!   scenario simulated on a CUDA profile still gets this NPU path (every shipped
//!   comparison scenario is an Ascend one); DMuon's SYRK and batched CUDA paths are not
//!   modelled.
//! - **Not selected** (paper: "`[E,M,N]` expert weights not selected by DMuon remain on the
//!   stock FSDP2 and original-optimizer path"): fused 3-D expert weights stay on FSDP and
//!   AdamW; TP-fragmented matrices (DMuon's nested TP `gather`/`scatter` ownership is not
//!   modelled) take the naive per-parameter gather path.

use super::schedule::{Dep, Schedule};
use super::{
    NsImpl, RankView, adamw_units, momentum, naive, ns_cost, ns_ops, per_param_calls, placed_owner,
};
use crate::step::ComputeWork;
use crate::strategy::Ctx;
use hpfsdp_plan::kernel::KernelWork;
use hpfsdp_plan::model::DType;
use hpfsdp_plan::muon::OptimizerRoute;

/// The per-parameter optimizer loop an owner-placement baseline runs on the whole matrices a
/// rank owns. Both baselines' optimizers are Python loops over the parameters (no foreach
/// kernels, no shape batching), so every tensor op below is one launch per parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnerLoop {
    /// `torch.optim.Muon` (MatrixFSDP's `MixedMuonAdamWOptimizer`, `matrix_fsdp/optim/
    /// wrapper.py`; `_single_tensor_muon`, `muon.md` 3.2: "Only a for-loop implementation
    /// exists"): `buf.lerp_(grad)`, `grad.lerp(buf)` (Nesterov), the bf16 standard NS,
    /// `param.mul_(1 - lr wd)`, `param.add_(X)` with the bf16 update.
    TorchMuon,
    /// DMuon's `Muon._step_muon` (`dmuon/optim/muon.py`): `buf.mul_(mu).add_(grad)`,
    /// `grad.add(buf, alpha=mu)` (Nesterov), Gram-space NS returning the gradient dtype,
    /// `owned.mul_(1 - lr wd)`, `owned.add_(update.to(owned.dtype))`.
    DMuon,
}

impl OwnerLoop {
    /// The dtype of the whole gradients the owner reads: DMuon reduces each placed gradient
    /// as autograd produced it, in the parameter (compute) dtype, and keeps it so
    /// (`dmuon/_backends/fsdp2/group.py` `reduce_grads`: `dist.reduce(grad, ...)` with no
    /// cast, `wait_for_reduce`: `_reduced_grad = new_grad.clone()`); MatrixFSDP reduces and
    /// divides its f32 workspace in the reduce dtype
    /// ([`matrixfsdp_buffers`](super::matrixfsdp_buffers)).
    fn grad_dtype(self, ctx: &Ctx) -> DType {
        match self {
            OwnerLoop::TorchMuon => ctx.opts.reduce_dtype,
            OwnerLoop::DMuon => ctx.opts.param_dtype,
        }
    }

    /// Its Newton-Schulz kernels.
    fn ns_impl(self) -> NsImpl {
        match self {
            OwnerLoop::TorchMuon => NsImpl::Bf16,
            OwnerLoop::DMuon => NsImpl::GramFp16,
        }
    }

    /// Momentum and Nesterov input over `elems` elements in `tensors` parameters, gradient
    /// and momentum in `grad`: `TorchMuon` two lerps (each reads two tensors and writes one),
    /// `DMuon` an in-place scale, an in-place add and an out-of-place add.
    pub(crate) fn momentum_kernels(self, elems: u64, tensors: u32, grad: DType) -> Vec<KernelWork> {
        let g = grad.bytes();
        let (launches, flops, bytes) = match self {
            OwnerLoop::TorchMuon => (2, 4, 6 * g),
            OwnerLoop::DMuon => (3, 3, 8 * g),
        };
        vec![KernelWork::memory_bound(
            launches * tensors,
            flops * elems,
            bytes * elems,
        )]
    }

    /// Weight decay and update over `elems` elements in `tensors` parameters held in
    /// `master`: an in-place scale (reads and writes the parameter) and an in-place add of the
    /// update (bf16 for `TorchMuon`; for `DMuon` the NS output in the gradient dtype `grad`,
    /// cast to `master` first by one more kernel when they differ).
    pub(crate) fn apply_kernels(
        self,
        elems: u64,
        tensors: u32,
        master: DType,
        grad: DType,
    ) -> Vec<KernelWork> {
        let mb = master.bytes();
        let update = match self {
            OwnerLoop::TorchMuon => ns_cost::NS_ELEM_BYTES,
            OwnerLoop::DMuon => grad.bytes(),
        };
        let mut k = vec![
            KernelWork::memory_bound(tensors, elems, 2 * mb * elems),
            KernelWork::memory_bound(tensors, 2 * elems, (2 * mb + update) * elems),
        ];
        if self == OwnerLoop::DMuon && grad != master {
            k.push(KernelWork::memory_bound(
                tensors,
                elems,
                (grad.bytes() + mb) * elems,
            ));
        }
        k
    }
}

/// Momentum, NS and apply on the whole matrices this rank owns under owner placement, one
/// parameter at a time as `owner_loop` runs them (one NS call per parameter, batched only
/// over its own leading dims); returns the owned parameters.
pub(crate) fn owner_step(
    ctx: &Ctx,
    view: &RankView,
    s: &mut Schedule,
    owner_loop: OwnerLoop,
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
    let (grad, master) = (owner_loop.grad_dtype(ctx), ctx.opts.master_dtype);
    let elems: u64 = owned.iter().map(|&i| oc.params[i].plan_elems).sum();
    let tensors = owned.len() as u32;
    s.momentum_bytes += elems * grad.bytes();
    let name = s.name(|| "muon.owned.momentum".into());
    let k = owner_loop.momentum_kernels(elems, tensors, grad);
    s.kernels(name, k, vec![Dep::Ready, Dep::Issue]);
    let items: Vec<((u64, u64), u64)> = owned
        .iter()
        .filter_map(|&i| Some((oc.params[i].core?, oc.params[i].plan_matrices)))
        .collect();
    let calls = per_param_calls(items);
    ns_ops(ctx, s, "muon.owned", calls, &[], owner_loop.ns_impl());
    let name = s.name(|| "muon.owned.apply".into());
    let k = owner_loop.apply_kernels(elems, tensors, master, grad);
    s.kernels(name, k, vec![Dep::Issue]);
    owned
}

/// FP32 moment bytes per element of one AdamW moment (`exp_avg` or `exp_avg_sq`).
const MOMENT_BYTES: u64 = crate::strategy::optimizer::ADAMW_STATE_BYTES_PER_ELEM / 2;

/// Tensor ops per parameter of DMuon's AdamW loop (`Muon._step_adamw`,
/// `dmuon/optim/muon.py`): `param.mul_` (weight decay), `exp_avg.mul_`, `.add_`,
/// `exp_avg_sq.mul_`, `.addcmul_`, `.sqrt()`, `/ sqrt(bc2)`, `.add_(eps)`, `param.addcdiv_`.
pub const DMUON_ADAMW_OPS_PER_PARAM: u32 = 9;

/// DMuon's AdamW on its non-dedicated parameters: a Python loop of
/// [`DMUON_ADAMW_OPS_PER_PARAM`] unfused tensor ops per parameter (no foreach, no fused
/// kernel), each reading and writing its operands once: per element `4 M + 2 g + 17 s` bytes
/// (`M` master, `g` gradient, `s` one FP32 moment element) against the fused kernel's
/// `2 M + g + 4 s`.
fn looped_adamw_work(elems: u64, tensors: u32, master: DType, grad: DType) -> ComputeWork {
    let per_elem = 4 * master.bytes() + 2 * grad.bytes() + 17 * MOMENT_BYTES;
    ComputeWork {
        flops: crate::strategy::optimizer::ADAMW_FLOPS_PER_ELEM * elems,
        hbm_bytes: per_elem * elems,
        kernels: DMUON_ADAMW_OPS_PER_PARAM * tensors.max(1),
        mix: None,
    }
}

/// The DMuon optimizer schedule of one rank.
pub(crate) fn schedule(ctx: &Ctx, view: &RankView, mut s: Schedule) -> Schedule {
    let oc = &ctx.opt;
    let unselected_expert = |i: usize, p: &super::OptParam| {
        p.route == OptimizerRoute::Muon && oc.placed[i].is_none() && p.plan_shape.len() >= 3
    };
    adamw_units(ctx, view, &mut s, unselected_expert, looped_adamw_work);
    // Gram-space NS one owned matrix at a time, FP32 normalization, FP16 GEMM iterations: the
    // NPU path of `_step_muon` (module docs).
    owner_step(ctx, view, &mut s, OwnerLoop::DMuon);
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
        s.momentum_bytes += elems * super::grad_dtype(ctx).bytes();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looped_adamw_by_hand() {
        // 10 FP32 elements in 2 parameters, FP32 gradients: per element 4·4 + 2·4 + 17·4 bytes;
        // nine launches per parameter; against the fused kernel, more traffic, same math.
        let w = looped_adamw_work(10, 2, DType::F32, DType::F32);
        assert_eq!(w.hbm_bytes, 10 * (16 + 8 + 68));
        assert_eq!(w.kernels, 18);
        let fused = crate::strategy::optimizer::adamw_work(10, 2, DType::F32, DType::F32);
        assert_eq!(w.flops, fused.flops);
        assert!(w.hbm_bytes > 2 * fused.hbm_bytes);
    }

    #[test]
    fn owner_loops_by_hand() {
        // torch.optim.Muon: two lerps per parameter over FP32 gradient and momentum.
        let k = OwnerLoop::TorchMuon.momentum_kernels(100, 3, DType::F32);
        assert_eq!((k[0].count, k[0].hbm_bytes), (6, 100 * 24));
        // DMuon: mul_, add_, add.
        let k = OwnerLoop::DMuon.momentum_kernels(100, 3, DType::F32);
        assert_eq!((k[0].count, k[0].hbm_bytes), (9, 100 * 32));
        // Apply: scale and add; DMuon casts its FP32 update to a BF16 parameter first.
        let same = OwnerLoop::DMuon.apply_kernels(100, 3, DType::F32, DType::F32);
        let cast = OwnerLoop::DMuon.apply_kernels(100, 3, DType::Bf16, DType::F32);
        assert_eq!(same.len() + 1, cast.len());
        let torch = OwnerLoop::TorchMuon.apply_kernels(100, 3, DType::F32, DType::F32);
        assert_eq!(torch.iter().map(|w| w.count).sum::<u32>(), 6);
        assert_eq!(
            torch.iter().map(|w| w.hbm_bytes).sum::<u64>(),
            100 * (8 + 8 + 2)
        );
    }
}
