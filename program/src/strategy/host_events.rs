//! Production-mode host CPU operator events: how many profiler CPU operator events eager
//! PyTorch records on the host for each op of a step program, in both modes (HyperParallel's
//! production mode runs plain local tensors: these events are the eager framework's own
//! work, not DTensor dispatch; validation mode adds [`super::validation`]'s events on top).
//!
//! What counts as an event: every `torch.profiler` CPU operator event, i.e. every aten op the
//! dispatcher records (views, `empty`, `as_strided`, `t`, `detach` and the nested calls of
//! composite ops such as `aten::linear` -> `aten::t` -> `aten::transpose` ->
//! `aten::as_strided`, `aten::matmul` -> `aten::mm`), in backward the autograd engine's
//! `evaluate_function: *Backward*` nodes with the formula's aten calls nested in them and
//! `torch::autograd::AccumulateGrad` of each parameter. Eager host time follows these events,
//! not the device kernels: a view launches no kernel but is dispatched and recorded, and a
//! composite op records several events for one launch.
//!
//! Source of the counts: `tools/host_census_probe.py` runs the real HuggingFace modules
//! (transformers 5.24: `Qwen3MoeRMSNorm`, `Qwen3MoeAttention` with SDPA and `enable_gqa`,
//! `apply_rotary_pos_emb`, `Qwen3MoeMLP`, `Qwen3MoeTopKRouter`, `nn.Linear`, `nn.Embedding`,
//! `ForCausalLMLoss`, whole `Qwen3MoeDecoderLayer` / `Qwen3DecoderLayer`) under
//! `torch.profiler` at two sizes (identical counts) and writes
//! `program/tests/fixtures/host_census_torch.toml`; `program/tests/host_events.rs` replays it: every
//! table below equals the fixture (net of the probe's input stub), and the ops of a dense
//! decoder layer, cut as [`hpfsdp_plan::model::ModelIr::compute_profile`] cuts it and looked up
//! through [`op_events`], add up to the measured whole layer, forward and backward, exactly.
//! The probe ran torch's CPU backend: an accelerator backend (torch_npu) dispatches the same
//! aten graph from the same Python code, so the event counts carry over; the per-event host
//! time does not (that is the profile's `[calibration]` constant, see `hpfsdp_sim::host_cost`).
//!
//! transformers' `grouped_mm` experts path has a census of its own
//! (`tools/grouped_experts_census_probe.py`: [`GROUPED_MM_EXPERTS_PER_LAYER`]), and so does
//! its `eager` experts loop
//! (`tools/eager_experts_census_probe.py`: [`eager_experts`], per hit expert, and
//! [`EAGER_EXPERTS_PER_LAYER`]). Ops the probe has no module for ([`op_events`] falls back):
//! routed experts on HyperParallel's grouped-GEMM module (which the measured Ascend runs
//! put in place of `Qwen3MoeExperts`) and their combine and the expert-parallel dispatch
//! bookkeeping, multi-head latent attention and
//! its interleaved RoPE, DeepSeek's router, ops built by hand. They are charged at the
//! measured events per launched kernel of the whole dense decoder layer
//! ([`FALLBACK_FWD_EVENTS_PER_KERNEL`], [`FALLBACK_BWD_EVENTS_PER_KERNEL`]). Ops outside the
//! model path carry no census here except the placeholder AdamW step
//! ([`ADAMW_FOREACH_EVENTS_PER_PARAM`]): the Muon pipelines (their AdamW units included), FSDP copies and casts and the step tail are charged one event per launched
//! kernel by the simulator, the floor (every launch is at least one operator event). The
//! probe also measures `torch.optim.Muon`'s per-matrix step (112 events per matrix on the CPU
//! backend, fixture `muon_per_matrix`); the programs' Muon ops are shape-batched or bucketed
//! per strategy, so that per-matrix figure is recorded, not charged.

use hpfsdp_plan::kernel::KernelWork;
use hpfsdp_plan::model::{ComputeOp, EagerRecipe, ModelConfig, ModelFamily, OpShape};

/// Host CPU operator events of one op's forward and backward (per micro-batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PassEvents {
    /// Events of the forward (with autograd recording).
    pub fwd: u32,
    /// Events of the backward: autograd engine nodes, their aten calls, `AccumulateGrad`.
    pub bwd: u32,
}

const fn ev(fwd: u32, bwd: u32) -> PassEvents {
    PassEvents { fwd, bwd }
}

/// `nn.Linear` without bias: forward `aten::linear` (`t`, `transpose`, `as_strided`,
/// `matmul`, `view`s, `mm`, `_unsafe_view`: 11 events, 1 kernel); backward the `MmBackward0`
/// / `TBackward0` / view-backward nodes with the dX and dW `mm`s and the weight's
/// `AccumulateGrad` (35 events, 2 kernels).
pub const LINEAR: PassEvents = ev(11, 35);

/// `Qwen3MoeRMSNorm` (the eight calls of
/// [`super::validation::op_census::RMS_NORM`], with their nested `_to_copy`, `empty_strided`,
/// `copy_` and views): 27 events forward, 64 backward (16 kernels: the table's
/// [`hpfsdp_plan::model::RMSNORM_BWD_KERNELS`]).
pub const RMS_NORM: PassEvents = ev(27, 64);

/// `apply_rotary_pos_emb` of q and k (the fourteen calls of
/// [`super::validation::op_census::ROPE_QK`] plus the two `unsqueeze`s of cos and sin).
pub const ROPE_QK: PassEvents = ev(34, 80);

/// The rest of `Qwen3MoeAttention.forward` (the whole module minus its four projections, q/k
/// norms and RoPE): q/k/v `view` and `transpose`, `sdpa_attention_forward` (SDPA with
/// `enable_gqa`, `transpose(1, 2).contiguous()`), `reshape(...).contiguous()`.
pub const GQA_ATTENTION_CORE: PassEvents = ev(34, 77);

/// `Qwen3MoeMLP.forward` between its projections: `act_fn(gate) * up` forward; backward the
/// SiLU and product nodes plus the accumulation of the two gradient branches into the MLP
/// input (used by `gate_proj` and `up_proj`).
pub const SWIGLU_DENSE: PassEvents = ev(2, 8);

/// A decoder layer's `residual + hidden_states`: 1 event forward; backward the `AddBackward0`
/// node (2 events) plus the accumulation where the residual stream branched (the layer input
/// feeds both the norm and this add: the engine adds the two gradients, 1 `aten::add`, the
/// whole layer's measured backward minus its parts' at two branch points per layer).
pub const RESIDUAL: PassEvents = ev(1, 3);

/// `nn.Embedding` (`aten::embedding` -> `index_select` and its nested reshapes) forward;
/// backward `EmbeddingBackward0` (`embedding_dense_backward`) and the weight's
/// `AccumulateGrad`.
pub const EMBEDDING: PassEvents = ev(10, 12);

/// `ForCausalLMLoss` on the logits (`lm_head` is a [`LINEAR`] op of its own): `logits.float()`,
/// the label `pad` / slice / `contiguous`, `view`s, `cross_entropy` (`log_softmax`,
/// `nll_loss`) forward; its backward nodes.
pub const CAUSAL_LM_LOSS: PassEvents = ev(29, 17);

/// `Qwen3MoeSparseMoeBlock`'s input `view` and `Qwen3MoeTopKRouter.forward` (`reshape`,
/// `F.linear`, fp32 `softmax`, `topk`, `sum`, in-place `/=`, `.to`).
pub const QWEN3_MOE_ROUTER: PassEvents = ev(22, 58);

/// transformers' `eager` experts loop (`Qwen3MoeExperts.forward`), its per-layer part:
/// `zeros_like`, `one_hot`, `permute`, `sum`, `greater`, `nonzero` and the loop's fixed
/// overhead forward; backward the layer-level part of its autograd graph (measured by
/// `tools/eager_experts_census_probe.py`: per layer = 4 experts - 4 x per expert). Charged
/// on the router op, beside [`QWEN3_MOE_ROUTER`].
pub const EAGER_EXPERTS_PER_LAYER: PassEvents = ev(30, 30);

/// transformers' `grouped_mm` experts path (`Qwen3MoeExperts.forward` with
/// `experts_implementation="grouped_mm"`: `grouped_mm_experts_forward` in
/// `integrations/moe.py`), the whole module per layer: the sort of the expert ids, the
/// gathers, `histc`, `cumsum`, the sentinel masks, the two `grouped_mm`s, the gate, the
/// routing-weight multiply and the scatter back; backward their nodes
/// (`tools/grouped_experts_census_probe.py`: transformers 5.17, torch 2.15 CPU, identical
/// forward counts at two sizes; the backward 174 or 178 by size, charged at 176). On the CPU
/// backend each `grouped_mm` loops over the experts (26 forward and 54 backward events per
/// expert, all of them its per-group `mm`s, slices and offsets read-backs); a CUDA `grouped_mm`
/// is one kernel, so the census is the count with that loop taken out. Charged on the gate/up
/// GEMM op; the module's other ops carry none.
pub const GROUPED_MM_EXPERTS_PER_LAYER: PassEvents = ev(117, 176);

/// The eager loop per hit expert, up to the gate/up GEMM: the loop test, `torch.where`,
/// the hidden-state gather, `gate_up_proj[e]`, `linear`, `chunk` (and the expert's row of
/// `expert_hit`'s `unbind`); backward the chunk's `cat`, the two GEMM gradients,
/// `select_backward` of the whole parameter, the gather's index backward and the
/// accumulations (census: 46 forward, 48 backward).
pub const EAGER_GATE_UP_PER_EXPERT: PassEvents = ev(46, 48);

/// The eager loop per hit expert: `silu(gate) * up` and its backward (census: 2, 7).
pub const EAGER_ACT_PER_EXPERT: PassEvents = ev(2, 7);

/// The eager loop per hit expert: `down_proj[e]`, `linear`; backward the two GEMM
/// gradients, `select_backward` and the accumulation (census: 12, 34).
pub const EAGER_DOWN_PER_EXPERT: PassEvents = ev(12, 34);

/// The eager loop per hit expert after the down GEMM: the routing-weight gather, `*`,
/// `.to`, `index_add_`; backward their nodes and the routing weights' index backward
/// (census: 16, 34).
pub const EAGER_COMBINE_PER_EXPERT: PassEvents = ev(16, 34);

/// Events a checkpointed decoder layer adds on top of re-running its forward
/// (`torch.utils.checkpoint`, `use_reentrant=False`, as transformers'
/// `GradientCheckpointingLayer` runs it: the saved-tensor unpack hooks, the recompute's
/// autograd bookkeeping, the early stop), measured on the dense decoder layer: 343 events of
/// recompute against 257 of forward.
pub const RECOMPUTE_OVERHEAD_PER_LAYER: u32 = 86;

/// Forward events per launched kernel of the whole dense decoder layer (257 events, 58
/// compute ops that launch a kernel): the rate charged to model ops with no census entry.
pub const FALLBACK_FWD_EVENTS_PER_KERNEL: (u32, u32) = (257, 58);

/// Backward events per launched kernel of the whole dense decoder layer (672 events, 109
/// launching compute ops, input stub removed): the rate charged to model ops with no census
/// entry.
pub const FALLBACK_BWD_EVENTS_PER_KERNEL: (u32, u32) = (672, 109);

/// How much more host time one extra validation-mode event costs than one production event,
/// measured like for like by `tools/host_census_probe.py` (the validation probe's GQA
/// attention forward on plain tensors, time per event, against its DTensor stand-in, extra
/// time per extra event; x86, torch CPU build, the median of nine; repeated probe runs gave
/// 2.3 to 2.7):
/// a validation event carries the Python `__torch_function__` dispatch and wrap around it, a
/// production event only the C++ dispatcher and the Python module code between calls. The
/// simulator derives the production per-event cost from the validation one with it when the
/// profile gives none (`hpfsdp_sim::host_cost`).
pub const VALIDATION_OVER_PRODUCTION_EVENT_COST: f64 = 2.521;

/// Host CPU operator events per parameter of one `torch.optim.AdamW(foreach=True)` step on a
/// device backend with fused foreach kernels (the probe's `adamw_foreach.per_param_device_path`:
/// the events outside the CPU fallback's per-tensor loops nested in `aten::_foreach_*`, which a
/// device backend replaces by multi-tensor launches). The step's fixed part (15 events per
/// parameter group and step) is not charged: the programs emit AdamW per FSDP unit, not per
/// group. Charged on [`super::optimizer::optimizer_step`] ops (the placeholder `adamw`
/// optimizer) instead of the one-per-kernel floor; the AdamW units of the Muon strategies are
/// lowered from their schedule (`super::muon::schedule`), whose ops carry no host events yet,
/// and stay at the floor.
pub const ADAMW_FOREACH_EVENTS_PER_PARAM: u32 = 4;

/// The census entry of `op`, if the probe measured its module (see the module documentation).
pub fn census(op: &ComputeOp, cfg: &ModelConfig) -> Option<PassEvents> {
    let gqa = cfg.mla.is_none();
    match op.shape {
        OpShape::Linear { .. } => Some(LINEAR),
        OpShape::Attention { .. } if gqa => Some(GQA_ATTENTION_CORE),
        OpShape::Router { .. } if cfg.family == ModelFamily::Qwen3Moe => Some(QWEN3_MOE_ROUTER),
        OpShape::MemoryBound { recipe, routed, .. } => match recipe {
            EagerRecipe::RmsNorm => Some(RMS_NORM),
            EagerRecipe::Rope if gqa => Some(ROPE_QK),
            EagerRecipe::SwiGlu if !routed => Some(SWIGLU_DENSE),
            EagerRecipe::Residual => Some(RESIDUAL),
            EagerRecipe::Embedding => Some(EMBEDDING),
            EagerRecipe::CrossEntropy => Some(CAUSAL_LM_LOSS),
            _ => None,
        },
        _ => None,
    }
}

/// Events of `op` on transformers' eager experts loop with `hits` experts hit: its part's
/// census per expert times `hits` (`hidden` tells the gate/up projection, whose input is
/// the hidden size, from the down projection); `None` for ops outside the loop's
/// per-expert parts (the router carries [`EAGER_EXPERTS_PER_LAYER`]).
pub fn eager_experts(op: &ComputeOp, hidden: u64, hits: u64) -> Option<PassEvents> {
    let per_expert = match op.shape {
        OpShape::Experts { input, .. } if input == hidden => EAGER_GATE_UP_PER_EXPERT,
        OpShape::Experts { .. } => EAGER_DOWN_PER_EXPERT,
        OpShape::MemoryBound {
            recipe: EagerRecipe::SwiGlu,
            routed: true,
            ..
        } => EAGER_ACT_PER_EXPERT,
        OpShape::MemoryBound {
            recipe: EagerRecipe::ExpertCombine,
            ..
        } => EAGER_COMBINE_PER_EXPERT,
        _ => return None,
    };
    let times = |events: u32| u32::try_from(u64::from(events) * hits).unwrap_or(u32::MAX);
    Some(PassEvents {
        fwd: times(per_expert.fwd),
        bwd: times(per_expert.bwd),
    })
}

/// Events of `op` on transformers' `grouped_mm` experts path: the module's per-layer census
/// ([`GROUPED_MM_EXPERTS_PER_LAYER`]) on its gate/up GEMM (the expert op whose input is the
/// hidden size `hidden`), none on its activation, down GEMM and combine; `None` for ops
/// outside the module.
pub fn grouped_mm_experts(op: &ComputeOp, hidden: u64) -> Option<PassEvents> {
    match op.shape {
        OpShape::Experts { input, .. } if input == hidden => Some(GROUPED_MM_EXPERTS_PER_LAYER),
        OpShape::Experts { .. }
        | OpShape::MemoryBound {
            recipe: EagerRecipe::SwiGlu,
            routed: true,
            ..
        }
        | OpShape::MemoryBound {
            recipe: EagerRecipe::ExpertCombine,
            ..
        } => Some(PassEvents::default()),
        _ => None,
    }
}

/// Launched kernels of a kernel list.
fn launches(kernels: &[KernelWork]) -> u64 {
    kernels.iter().map(|k| u64::from(k.count)).sum()
}

/// `kernels` launches at the rate `(events, per_kernels)`, rounded to the nearest event.
fn at_rate(kernels: &[KernelWork], (events, per_kernels): (u32, u32)) -> u32 {
    let n = launches(kernels) * u64::from(events);
    let d = u64::from(per_kernels.max(1));
    u32::try_from((n + d / 2) / d).unwrap_or(u32::MAX)
}

/// Production host CPU operator events of `op` per micro-batch: its census entry, or, for an
/// op the probe has no module for, its launched forward (`fwd`) and backward (`bwd`) kernels
/// at the dense decoder layer's measured events per kernel.
pub fn op_events(
    op: &ComputeOp,
    cfg: &ModelConfig,
    fwd: &[KernelWork],
    bwd: &[KernelWork],
) -> PassEvents {
    census(op, cfg).unwrap_or_else(|| PassEvents {
        fwd: at_rate(fwd, FALLBACK_FWD_EVENTS_PER_KERNEL),
        bwd: at_rate(bwd, FALLBACK_BWD_EVENTS_PER_KERNEL),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_rate_rounds_to_the_nearest_event_and_is_zero_without_launches() {
        let k = |count| KernelWork::memory_bound(count, 0, 0);
        // 58 kernels at 257 per 58 are the layer's 257 events; 1 kernel is 4.43 -> 4.
        assert_eq!(at_rate(&[k(58)], FALLBACK_FWD_EVENTS_PER_KERNEL), 257);
        assert_eq!(at_rate(&[k(1)], FALLBACK_FWD_EVENTS_PER_KERNEL), 4);
        assert_eq!(at_rate(&[k(2), k(3)], (3, 1)), 15);
        assert_eq!(at_rate(&[], FALLBACK_BWD_EVENTS_PER_KERNEL), 0);
    }
}
