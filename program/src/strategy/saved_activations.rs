//! Bytes autograd keeps from a piece's forward to its backward, per rank and micro-batch:
//! what the real HuggingFace modules save, not a fraction of the forward traffic.
//!
//! The rules come from `tools/saved_activations_probe.py`, which catches every tensor
//! autograd saves (`torch.autograd.graph.saved_tensors_hooks`, storages deduplicated,
//! parameters left out) in transformers' `Qwen3MoeForCausalLM` and `Qwen3ForCausalLM` (bf16,
//! SDPA attention, grouped-mm experts) at two sizes each; `program/tests/saved_activations.rs`
//! replays its fixture against [`layer_bytes`], [`embed_bytes`] and [`head_bytes`] exactly.
//! Per token, with `a` the activation element size (2 for bf16):
//! - RMSNorm over width `w` in `g` groups: the f32 upcast of its input (`4w`), the f32
//!   `rsqrt` (`4g`) and the normalized input back in the model dtype (`a w`, the weight
//!   multiply's operand); its output is saved by the linear that reads it (`a w`);
//! - a linear saves its input once, however many projections read it (q/k/v share it);
//! - SDPA (flash-style, no score matrix): query and key after RoPE, value, the output (which
//!   `o_proj` reads in place, flash kernels lay it out token-major) and the f32 log-sum-exp per
//!   head; RoPE saves only the shared cos/sin tables; residual adds save nothing;
//! - SwiGLU MLP: gate and up outputs, the SiLU output and the product (`4 a I`);
//! - MoE block: the f32 router softmax (`4E`), the int64 top-k indices (`8k`), the f32 top-k
//!   weights and their sum (`4k + 4`); per routed copy the sort permutation and its token
//!   index (2 x int64), the gathered input and the down output (`2 a H`), the gate-up output,
//!   SiLU output and product (`4 a I`), the bf16 routing weight (`a`) and the combine's int64
//!   index: `26 + 4 a H + 8 a I` with bf16 (int32 group offsets `4E` once per micro-batch);
//! - head: the final norm, the `lm_head` input, `ForCausalLMLoss`'s f32 log-softmax over the
//!   vocabulary (`4V`, HF upcasts logits to f32 before the cross entropy) and the int64
//!   shifted labels (`8`); the embedding saves its int64 token ids (`8`);
//! - a vocab-parallel loss ([`super::vocab_parallel_loss`]: Megatron-LM's
//!   `_VocabParallelCrossEntropy`, HyperParallel's `DistributedCrossEntropyFunction`) keeps
//!   the f32 softmax or log-softmax of the rank's `V / tp` columns, the int64 target and the
//!   bool target mask (`4 V / tp + 8 + 1`).
//!
//! A layer under `torch.utils.checkpoint` keeps only its input (`a H` per token): the probe
//! measures it for the non-reentrant checkpoint HF's gradient checkpointing uses.
//!
//! Parallel layout (the conventions of [`super::kernels`]): norms, the router and the MoE
//! bookkeeping on the rank's share of tokens `T / (cp tp)` (sequence-sharded with SP);
//! attention and the row-parallel linears' inputs on the whole CP-local sequence `T / cp`
//! with heads and intermediate features split by `tp`; the column-parallel linears' inputs
//! (attention and MLP inputs, `eh_proj`, `lm_head`) on [`SavedLayout::linear_input_tokens`]:
//! the gathered `T / cp` where the module's `nn.Linear` saves what the boundary gathered
//! (HyperParallel, FSDP2), the rank's `T / (cp tp)` under Megatron-LM's sequence parallelism
//! ([`super::megatron_sp`]); routed copies those of the busiest EP rank; the loss's
//! softmax over `V / tp` columns with a vocab-parallel loss, over the whole vocabulary
//! otherwise (the logits are replicated before HF's loss).
//!
//! Not probed, derived with the same rules: MLA attention (DeepSeek-V3: its low-rank norms,
//! the per-head query and key built by concatenation, value and output of `v_head_dim`),
//! shared experts (a SwiGLU MLP on the rank's tokens) and MTP layers (their embedding, two
//! norms, the `eh_proj` input and a second head).

use super::routing::RoutedLoad;
use hpfsdp_plan::model::{LayerCompute, ModelConfig};

/// Bytes of an f32 element (norm upcasts, log-sum-exp, router softmax, log-softmax).
const F32_BYTES: f64 = 4.0;
/// Bytes of an int64 element (token ids, labels, top-k and permutation indices).
const I64_BYTES: f64 = 8.0;
/// Bytes of an int32 element (grouped-GEMM group offsets).
const I32_BYTES: f64 = 4.0;
/// Bytes of a bool element (the vocab-parallel loss's target mask).
const BOOL_BYTES: f64 = 1.0;

/// What the saved bytes of one rank depend on besides the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SavedLayout {
    /// Tokens of the rank's share for norms, the router and MoE bookkeeping, `T / (cp tp)`.
    pub local_tokens: f64,
    /// Tokens the attention and the row-parallel linear inputs cover, `T / cp`.
    pub sequence_tokens: f64,
    /// Tokens of the saved input of a column-parallel linear (attention and MLP inputs,
    /// `eh_proj`, `lm_head`): `sequence_tokens` when the gathered input is saved,
    /// `local_tokens` when the sequence-parallel input is saved un-gathered and gathered
    /// again in backward (Megatron-LM, [`super::megatron_sp`]).
    pub linear_input_tokens: f64,
    /// Tensor-parallel degree (splits heads and intermediate features).
    pub tp: u64,
    /// Bytes per activation element (the compute dtype).
    pub act_bytes: u64,
    /// Routed copies the busiest EP rank computes per MoE layer (`None`: the balanced
    /// figure, `local_tokens * top_k`).
    pub routed: Option<RoutedLoad>,
    /// Whether the loss stays vocab-sharded ([`super::vocab_parallel_loss::runs`]).
    pub loss_parallel: bool,
    /// Positions of one CP-local sequence, `seq_len / cp` (rows of the rotary tables).
    pub positions: f64,
}

impl SavedLayout {
    fn a(&self) -> f64 {
        self.act_bytes as f64
    }

    /// `features` split over the TP ranks (at least one, as kernel shapes do).
    fn split(&self, features: u64) -> f64 {
        features.div_ceil(self.tp.max(1)).max(1) as f64
    }
}

/// Saved bytes per token of an RMSNorm over `width` in `groups` groups, without its output.
fn norm_per_token(width: f64, groups: f64, a: f64) -> f64 {
    F32_BYTES * width + F32_BYTES * groups + a * width
}

/// Bytes decoder layer `layer` keeps for backward on one rank and micro-batch (without
/// recompute; the rotary cos/sin tables, shared by every layer, are in [`embed_bytes`]).
pub fn layer_bytes(cfg: &ModelConfig, layer: usize, l: &SavedLayout) -> f64 {
    let h = cfg.hidden_size as f64;
    let a = l.a();
    // The two norms at the rank's share; their outputs read by the attention and MLP
    // projections, saved gathered or local (`linear_input_tokens`).
    let norms = 2.0 * norm_per_token(h, 1.0, a) * l.local_tokens;
    let attn_input = a * h * l.linear_input_tokens;
    let attention = attention_bytes(cfg, l);
    let mlp = if cfg.is_moe_layer(layer) {
        moe_bytes(cfg, l)
    } else {
        a * h * l.linear_input_tokens + swiglu_bytes(cfg.intermediate_size, l)
    };
    let mtp = if layer >= cfg.num_hidden_layers {
        mtp_extra_bytes(cfg, l)
    } else {
        0.0
    };
    norms + attn_input + attention + mlp + mtp
}

/// A SwiGLU MLP of `intermediate` features, TP-split, on the whole sequence (its input is
/// counted by the caller).
fn swiglu_bytes(intermediate: u64, l: &SavedLayout) -> f64 {
    4.0 * l.a() * l.split(intermediate) * l.sequence_tokens
}

/// The attention block after the input norm's output: per-head norms, RoPE'd query and key,
/// value, output and log-sum-exp (GQA), or MLA's low-rank path.
fn attention_bytes(cfg: &ModelConfig, l: &SavedLayout) -> f64 {
    let a = l.a();
    let heads = l.split(cfg.num_attention_heads);
    let per_token = match &cfg.mla {
        None => {
            let kv = l.split(cfg.num_key_value_heads);
            let hd = cfg.head_dim as f64;
            let qk_norms = if cfg.family.has_qk_norm() {
                norm_per_token(heads * hd, heads, a) + norm_per_token(kv * hd, kv, a)
            } else {
                0.0
            };
            // query, output (heads) and key, value (kv heads) in the model dtype, f32 LSE.
            qk_norms + a * (2.0 * heads * hd + 2.0 * kv * hd) + F32_BYTES * heads
        }
        Some(mla) => {
            let q_rank = mla.q_lora_rank.map_or(0.0, |r| r as f64);
            let kv_rank = mla.kv_lora_rank as f64;
            let qk = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) as f64;
            let vd = mla.v_head_dim as f64;
            let low_rank = |r: f64| {
                if r > 0.0 {
                    norm_per_token(r, 1.0, a) + a * r
                } else {
                    0.0
                }
            };
            low_rank(q_rank)
                + low_rank(kv_rank)
                + a * heads * (2.0 * qk + 2.0 * vd)
                + F32_BYTES * heads
        }
    };
    per_token * l.sequence_tokens
}

/// The MoE block after the post-attention norm: router on the rank's tokens, the busiest
/// rank's routed copies, shared experts.
fn moe_bytes(cfg: &ModelConfig, l: &SavedLayout) -> f64 {
    let Some(moe) = &cfg.moe else { return 0.0 };
    let a = l.a();
    let h = cfg.hidden_size as f64;
    let e = moe.num_experts as f64;
    let k = moe.experts_per_token as f64;
    let i = moe.moe_intermediate_size as f64;
    // The router reads the norm output on the rank's tokens.
    let router = (a * h + F32_BYTES * e + (I64_BYTES + F32_BYTES) * k + F32_BYTES) * l.local_tokens;
    let copies = l.routed.map_or(l.local_tokens * k, |r| r.busiest_copies);
    let local_experts = l.routed.map_or(moe.num_experts, |r| r.local_experts) as f64;
    let per_copy = 3.0 * I64_BYTES + a + 2.0 * a * h + 4.0 * a * i;
    let offsets = I32_BYTES * local_experts;
    let shared = if moe.shared_experts > 0 {
        let width = cfg.shared_expert_intermediate_size();
        a * h * l.linear_input_tokens + swiglu_bytes(width, l)
    } else {
        0.0
    };
    router + per_copy * copies + offsets + shared
}

/// What an MTP layer adds to a decoder layer: its token ids, the `enorm`/`hnorm` norms, the
/// concatenated `eh_proj` input and its own head and loss.
fn mtp_extra_bytes(cfg: &ModelConfig, l: &SavedLayout) -> f64 {
    let h = cfg.hidden_size as f64;
    let a = l.a();
    let inputs = I64_BYTES * l.local_tokens
        + 2.0 * norm_per_token(h, 1.0, a) * l.local_tokens
        + 2.0 * a * h * l.linear_input_tokens;
    inputs + head_bytes(cfg, l)
}

/// Bytes the embedding keeps: the int64 token ids, plus the rotary cos/sin tables (model
/// dtype, one row per CP-local position of one sequence) every layer's RoPE saves.
pub fn embed_bytes(cfg: &ModelConfig, l: &SavedLayout) -> f64 {
    let rope_dim = match &cfg.mla {
        Some(mla) => mla.qk_rope_head_dim,
        None => cfg.head_dim,
    } as f64;
    I64_BYTES * l.local_tokens + 2.0 * l.a() * rope_dim * l.positions
}

/// Bytes the head keeps: final norm, `lm_head` input, the f32 log-softmax over the rank's
/// vocabulary columns and the int64 labels (plus the f32 scalar loss normaliser); a
/// vocab-parallel loss also keeps its bool target mask.
pub fn head_bytes(cfg: &ModelConfig, l: &SavedLayout) -> f64 {
    let h = cfg.hidden_size as f64;
    let (vocab, mask) = if l.loss_parallel {
        (l.split(cfg.vocab_size), BOOL_BYTES)
    } else {
        (cfg.vocab_size as f64, 0.0)
    };
    norm_per_token(h, 1.0, l.a()) * l.local_tokens
        + l.a() * h * l.linear_input_tokens
        + (F32_BYTES * vocab + I64_BYTES + mask) * l.sequence_tokens
        + F32_BYTES
}

/// Working memory of the head beyond what it saves, `(forward, backward)` bytes, for a
/// scenario with `[train] loss_logits = "whole_f32"`: with HF's `ForCausalLMLoss` (not
/// vocab-parallel) the forward holds the bf16 logits and their
/// f32 upcast next to the saved f32 log-softmax (`(a + 4) V` per token), and the loss
/// backward holds two f32 `[tokens, V]` gradients at once (`nll_loss_backward`'s and
/// `_log_softmax_backward_data`'s, `8 V`). Measured on a one-layer Qwen3-1.7B-shaped FSDP2
/// step at 4,096 tokens (CPU replica of the H200 harness, profiler memory events): the
/// forward and backward peaks 8.00 and 9.24 GB above the step's start. A vocab-parallel
/// loss keeps its own buffers (0 here).
pub fn head_working_bytes(cfg: &ModelConfig, l: &SavedLayout) -> (f64, f64) {
    if l.loss_parallel {
        return (0.0, 0.0);
    }
    let v = cfg.vocab_size as f64 * l.sequence_tokens;
    ((l.a() + F32_BYTES) * v, 2.0 * F32_BYTES * v)
}

/// Saved bytes of one profile piece (`piece.layer` a decoder layer, `model.embed_tokens` the
/// embedding, anything else the head), rounded to whole bytes.
pub fn stage_bytes(cfg: &ModelConfig, piece: &LayerCompute, l: &SavedLayout) -> u64 {
    let bytes = match piece.layer {
        Some(layer) => layer_bytes(cfg, layer, l),
        None if piece.name == "model.embed_tokens" => embed_bytes(cfg, l),
        None => head_bytes(cfg, l),
    };
    bytes.round() as u64
}

/// Bytes a layer under `torch.utils.checkpoint` keeps: its input on the rank's tokens.
pub fn checkpoint_bytes(cfg: &ModelConfig, l: &SavedLayout) -> f64 {
    l.a() * cfg.hidden_size as f64 * l.local_tokens
}
