//! Torch-level forward operator census: which torch calls a module's forward makes on
//! DTensors, read from the forward code the measured runs executed, and how many DTensors each
//! call wraps. HyperParallel's validation mode charges host work per wrapped output (see
//! [`super::EVENTS_PER_WRAP`]), so this census, not the device-kernel list, is what its extra
//! CPU operator events follow: a view launches no kernel but is still intercepted and wrapped,
//! and one torch call may launch several kernels (or none).
//!
//! Interception mechanism (mindspore-ai/hyper-parallel, `core/dtensor/_dtensor_base.py`
//! `DTensorBase.__torch_function__` and `core/shard/_op_dispatch.py`
//! `OpDispatcher._with_layout_infer`): every torch function or `Tensor` method called with a
//! DTensor argument enters `__torch_function__`; the dispatcher unwraps the inputs
//! (`to_local`, a plain attribute read), runs the local op, and wraps each tensor output with
//! `DTensor.from_local`, whose `DTensorBase.__new__` calls `Tensor._make_subclass`. The
//! `Tensor.to` / `float` / `type` methods are overridden in `DTensorBase` (no dispatch) but
//! wrap their result with `_make_subclass` too. Shape queries (`.shape`, `.size()`, `.dtype`,
//! `.device`) are overridden Python properties: no call, no wrap. Ops on plain tensors only
//! (rotary `cos`/`sin` built from `position_ids`, labels) are never intercepted.
//!
//! Checked against the real profiler: `tools/validation_census_probe.py` wraps these forwards
//! in a DTensor stand-in with HyperParallel's wrap / dispatch / override mechanism and records
//! the extra CPU operator events with `torch.profiler` (torch 2.15): every table below, and
//! the whole GQA and MLA attention modules of the paper's models, add exactly
//! [`super::EVENTS_PER_WRAP`] events per counted wrap
//! (`program/tests/fixtures/validation_census_torch.toml`, replayed by
//! `program/tests/validation_events.rs`). That checks the mechanism and the transcription of
//! the HF code, not HyperParallel's own dispatcher.
//!
//! Model code (HuggingFace transformers, the paper's setup names Transformers 5.13 and
//! `attn_implementation = sdpa`): `src/transformers/models/qwen3_moe/modeling_qwen3_moe.py`
//! (identical structure in `qwen3/modeling_qwen3.py` and `llama/modeling_llama.py` for
//! everything but the q/k norms), `src/transformers/integrations/sdpa_attention.py`,
//! `src/transformers/loss/loss_utils.py`, `torch/nn/modules/{linear,sparse}.py`.
//!
//! Fused replacements: the current hyper-parallel Qwen3-MoE recipe
//! (`models/qwen3_moe/recipes/train.yaml`) swaps `Qwen3MoeRMSNorm` and `Qwen3MoeAttention`
//! for fused NPU modules, but nothing says the paper's snapshot (`bada2df4`) did, and the
//! project's device-kernel census of the same runs ([`hpfsdp_plan::model::EagerRecipe`]: eight-kernel
//! RMSNorm, ten-kernel RoPE) already sits below the measured 57,560 kernels per step; fused
//! norms would widen that gap. The census therefore follows the HF eager code, as the kernel
//! census does.
//!
//! Attention mask: with no padding mask, HF's causal-mask helper returns `None` for SDPA,
//! `use_gqa_in_sdpa` is then true on NPU as on CUDA (`sdpa_attention.py`), and SDPA runs with
//! `enable_gqa=True`: no `repeat_kv` expand/reshape. The census assumes that path (it
//! counts three fewer calls per K and V than the masked path).
//!
//! Multi-head latent attention follows `models/deepseek_v3/modeling_deepseek_v3.py`
//! (`DeepseekV3Attention.forward`, `apply_rotary_pos_emb_interleave`: the HF
//! `DeepseekV3Config` defaults `rope_interleave = True`, and the checkpoints' `config.json`
//! does not set it). Its keys and values share one head count (`num_key_value_groups = 1`), so
//! no `repeat_kv` either way.
//!
//! Ops without a census here ([`forward_calls`] returns `None`): routed experts and their
//! combine (the measured runs replace `Qwen3MoeExperts` by HyperParallel's grouped-GEMM
//! module, whose torch-level calls are not in a source read for this table; they sit inside the
//! MoE local region whenever expert parallelism is on), DeepSeek's router, and ops built by
//! hand. The caller counts one single-output call per launched device kernel for those.

use hpfsdp_plan::model::{ComputeOp, EagerRecipe, ModelConfig, ModelFamily, OpShape};

/// One torch-level call a module's forward makes on DTensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TorchCall {
    /// The call as written in the forward code (`F.linear`, `Tensor.view`, `__mul__`, ...).
    pub call: &'static str,
    /// DTensors the call creates: one per tensor output of a dispatched op (`topk` has two),
    /// one for an overridden `Tensor.to` / `float`.
    pub wraps: u32,
}

const fn c(call: &'static str) -> TorchCall {
    TorchCall { call, wraps: 1 }
}

/// `nn.Linear.forward`: `F.linear(input, self.weight, self.bias)`.
pub const LINEAR: &[TorchCall] = &[c("F.linear")];

/// `Qwen3MoeRMSNorm.forward` (same code as `Qwen3RMSNorm`, `LlamaRMSNorm`,
/// `DeepseekV3RMSNorm`): `hidden_states.to(float32)`, `.pow(2)`, `.mean(-1, keepdim)`,
/// `variance + eps`, `torch.rsqrt`, `hidden_states * rsqrt`, `.to(input_dtype)`,
/// `self.weight * ...`.
pub const RMS_NORM: &[TorchCall] = &[
    c("Tensor.to(float32)"),
    c("Tensor.pow"),
    c("Tensor.mean"),
    c("__add__ (variance + eps)"),
    c("torch.rsqrt"),
    c("__mul__ (x * rsqrt)"),
    c("Tensor.to(input_dtype)"),
    c("__mul__ (weight * x)"),
];

/// `apply_rotary_pos_emb` on q and k (`modeling_qwen3_moe.py`): per tensor `x * cos`,
/// `rotate_half(x)` = two `__getitem__` halves, `__neg__`, `torch.cat`, then `* sin` and the
/// `+`. `cos.unsqueeze` / `sin.unsqueeze` act on plain tensors (not intercepted).
pub const ROPE_QK: &[TorchCall] = &[
    c("__mul__ (q * cos)"),
    c("__getitem__ (q[..., :d/2])"),
    c("__getitem__ (q[..., d/2:])"),
    c("__neg__ (-q2)"),
    c("torch.cat (rotate_half q)"),
    c("__mul__ (rotate_half(q) * sin)"),
    c("__add__ (q_embed)"),
    c("__mul__ (k * cos)"),
    c("__getitem__ (k[..., :d/2])"),
    c("__getitem__ (k[..., d/2:])"),
    c("__neg__ (-k2)"),
    c("torch.cat (rotate_half k)"),
    c("__mul__ (rotate_half(k) * sin)"),
    c("__add__ (k_embed)"),
];

/// The rest of `Qwen3MoeAttention.forward` around the projections, norms and RoPE (which
/// are ops of their own): `.view(hidden_shape)` of q, k, v, `.transpose(1, 2)` of q, k, v,
/// `sdpa_attention_forward` (`F.scaled_dot_product_attention` with `enable_gqa`, then
/// `.transpose(1, 2).contiguous()`), and `.reshape(*input_shape, -1).contiguous()` before
/// `o_proj`.
pub const GQA_ATTENTION: &[TorchCall] = &[
    c("Tensor.view (q)"),
    c("Tensor.transpose (q)"),
    c("Tensor.view (k)"),
    c("Tensor.transpose (k)"),
    c("Tensor.view (v)"),
    c("Tensor.transpose (v)"),
    c("F.scaled_dot_product_attention"),
    c("Tensor.transpose (attn_output)"),
    c("Tensor.contiguous (attn_output)"),
    c("Tensor.reshape (attn_output)"),
    c("Tensor.contiguous (o_proj input)"),
];

/// `apply_rotary_pos_emb_interleave` on MLA's rotary parts (`modeling_deepseek_v3.py`): per
/// tensor `.view(b, h, s, d/2, 2)`, `.transpose(4, 3)`, `.reshape(b, h, s, d)`, then the seven
/// calls of [`ROPE_QK`]'s per-tensor rotation.
pub const MLA_ROPE_INTERLEAVED: &[TorchCall] = &[
    c("Tensor.view (q_rot pairs)"),
    c("Tensor.transpose (q_rot pairs)"),
    c("Tensor.reshape (q_rot)"),
    c("__mul__ (q * cos)"),
    c("__getitem__ (q[..., :d/2])"),
    c("__getitem__ (q[..., d/2:])"),
    c("__neg__ (-q2)"),
    c("torch.cat (rotate_half q)"),
    c("__mul__ (rotate_half(q) * sin)"),
    c("__add__ (q_embed)"),
    c("Tensor.view (k_rot pairs)"),
    c("Tensor.transpose (k_rot pairs)"),
    c("Tensor.reshape (k_rot)"),
    c("__mul__ (k * cos)"),
    c("__getitem__ (k[..., :d/2])"),
    c("__getitem__ (k[..., d/2:])"),
    c("__neg__ (-k2)"),
    c("torch.cat (rotate_half k)"),
    c("__mul__ (rotate_half(k) * sin)"),
    c("__add__ (k_embed)"),
];

/// The rest of `DeepseekV3Attention.forward` around its projections, norms and RoPE:
/// `q_states.view(query_shape).transpose(1, 2)`, `torch.split` into nope and rope parts (two
/// outputs), `torch.split(compressed_kv)` (two), `kv_b_proj(...).view(key_shape)
/// .transpose(1, 2)` and its `torch.split` into keys and values (two), `k_rot.view`,
/// `k_rot.expand`, the two `torch.cat` of query and key parts, `sdpa_attention_forward`
/// (`F.scaled_dot_product_attention`, `.transpose(1, 2).contiguous()`), and
/// `.reshape(b, s, -1).contiguous()` before `o_proj`.
pub const MLA_ATTENTION: &[TorchCall] = &[
    c("Tensor.view (q)"),
    c("Tensor.transpose (q)"),
    TorchCall {
        call: "torch.split (q_pass, q_rot)",
        wraps: 2,
    },
    TorchCall {
        call: "torch.split (k_pass, k_rot)",
        wraps: 2,
    },
    c("Tensor.view (kv_b_proj output)"),
    c("Tensor.transpose (kv_b_proj output)"),
    TorchCall {
        call: "torch.split (k_pass, value_states)",
        wraps: 2,
    },
    c("Tensor.view (k_rot)"),
    c("Tensor.expand (k_rot)"),
    c("torch.cat (query_states)"),
    c("torch.cat (key_states)"),
    c("F.scaled_dot_product_attention"),
    c("Tensor.transpose (attn_output)"),
    c("Tensor.contiguous (attn_output)"),
    c("Tensor.reshape (attn_output)"),
    c("Tensor.contiguous (o_proj input)"),
];

/// `Qwen3MoeMLP.forward` between its projections: `self.act_fn(gate)` (`nn.SiLU` ->
/// `F.silu`) and `* up`.
pub const SWIGLU: &[TorchCall] = &[c("F.silu"), c("__mul__ (act * up)")];

/// A decoder layer's `residual + hidden_states`.
pub const RESIDUAL: &[TorchCall] = &[c("__add__ (residual)")];

/// `nn.Embedding.forward`: `F.embedding(input_ids, self.weight, ...)` (the ids are plain).
pub const EMBEDDING: &[TorchCall] = &[c("F.embedding")];

/// `Qwen3MoeForCausalLM.forward` and `ForCausalLMLoss` (`loss/loss_utils.py`) around
/// `lm_head`: `hidden_states[:, slice_indices, :]`, `logits.float()`, `logits.view(-1, V)`,
/// `F.cross_entropy` (`fixed_cross_entropy`, mean reduction). Label padding and shifting act
/// on plain tensors.
pub const CAUSAL_LM_LOSS: &[TorchCall] = &[
    c("__getitem__ (hidden_states[:, slice, :])"),
    c("Tensor.float (logits)"),
    c("Tensor.view (logits)"),
    c("F.cross_entropy"),
];

/// `Qwen3MoeSparseMoeBlock.forward` up to the experts and `Qwen3MoeTopKRouter.forward`
/// (transformers v5): `hidden_states.view(-1, H)`, `.reshape(-1, H)`, `F.linear`,
/// `softmax(float)`, `torch.topk` (values and indices: two wraps), `.sum(-1, keepdim)`,
/// `/=` (`norm_topk_prob`), `.to(router_logits.dtype)`.
pub const QWEN3_MOE_ROUTER: &[TorchCall] = &[
    c("Tensor.view (block input)"),
    c("Tensor.reshape (router input)"),
    c("F.linear (gate)"),
    c("F.softmax"),
    TorchCall {
        call: "torch.topk",
        wraps: 2,
    },
    c("Tensor.sum"),
    c("__itruediv__ (renormalise)"),
    c("Tensor.to (router dtype)"),
];

/// The torch-level calls of `op`'s forward on DTensors, or `None` when the table has no
/// census for it (see the module documentation).
pub fn forward_calls(op: &ComputeOp, cfg: &ModelConfig) -> Option<&'static [TorchCall]> {
    let gqa = cfg.mla.is_none();
    match op.shape {
        OpShape::Linear { .. } => Some(LINEAR),
        OpShape::Attention { .. } if gqa => Some(GQA_ATTENTION),
        OpShape::Attention { .. } => Some(MLA_ATTENTION),
        OpShape::Router { .. } if cfg.family == ModelFamily::Qwen3Moe => Some(QWEN3_MOE_ROUTER),
        OpShape::MemoryBound { recipe, routed, .. } => match recipe {
            EagerRecipe::RmsNorm => Some(RMS_NORM),
            EagerRecipe::Rope if gqa => Some(ROPE_QK),
            EagerRecipe::Rope => Some(MLA_ROPE_INTERLEAVED),
            EagerRecipe::SwiGlu if !routed => Some(SWIGLU),
            EagerRecipe::Residual => Some(RESIDUAL),
            EagerRecipe::Embedding => Some(EMBEDDING),
            EagerRecipe::CrossEntropy => Some(CAUSAL_LM_LOSS),
            _ => None,
        },
        _ => None,
    }
}

/// DTensors `calls` create.
pub fn wraps(calls: &[TorchCall]) -> u32 {
    calls.iter().map(|t| t.wraps).sum()
}
