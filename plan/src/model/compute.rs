//! Forward compute description: FLOPs and HBM bytes per token of every op, grouped per
//! FSDP-unit-sized piece (embedding, each decoder layer, head).
//!
//! Conventions (all per token, forward only; backward is the simulator's business):
//! - A linear layer `in -> out` costs `2 * in * out` FLOPs; routed experts count only the
//!   `experts_per_token` activated experts, plus the router matmul `2 * H * E`.
//! - Causal attention counts the triangle: a token attends on average to
//!   `ctx = (S + 1) / 2` earlier tokens for sequence length `S`, or with a sliding window `W < S`
//!   to `ctx = (W (W + 1) / 2 + (S - W) W) / S`. Scores cost `2 * heads * qk_dim * ctx`, the
//!   weighted values `2 * heads * v_dim * ctx`; softmax is not counted.
//! - MLA uses its real (non-absorbed) projections: `q_a/q_b` (or `q_proj`), `kv_a_proj_with_mqa`,
//!   `kv_b_proj`, `o_proj`, and attends with `qk_nope + qk_rope` query/key dims per head.
//! - Element-wise ops: RMSNorm 4 FLOPs per element, RoPE 3, SwiGLU 5 per output element,
//!   residual add 1, top-k combine 2 per routed element, cross-entropy 4 per logit.
//! - Bytes count activations only (read + written, [`ACT_BYTES`] per element, flash-style
//!   attention reads q, k, v once and writes its output); weights are not included. These
//!   per-token figures drive the activation-memory accounting.
//! - Every op also carries its [`OpShape`]: the device kernels an eager PyTorch step launches
//!   for it, with the dimensions their rates depend on. The strategy turns shapes into kernel
//!   lists per rank (`crate::strategy::compute`), the simulator costs each kernel by class.
//!   Memory-bound ops follow an [`EagerRecipe`]: the kernel counts and HBM bytes of the eager
//!   (unfused) PyTorch implementation, which differ from the activation bytes above (an eager
//!   RMSNorm upcasts to fp32 and makes eight passes over the data).

use super::{ComputeKind, ComputeOp, LayerCompute, ModelIr};
use serde::{Deserialize, Serialize};

/// The kernels one profile op launches, with their dimensions per token (the strategy scales
/// them by the tokens and parallel degrees of a rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "shape", rename_all = "kebab-case")]
pub enum OpShape {
    /// Linear layer `input -> output` features: one GEMM forward; backward a data-gradient
    /// GEMM and a weight-gradient GEMM. `row_parallel`: tensor parallelism splits the input
    /// features (`o_proj`, `down_proj`), otherwise the output features.
    Linear {
        /// Input features.
        input: u64,
        /// Output features.
        output: u64,
        /// TP splits the input (row-parallel) rather than the output (column-parallel).
        row_parallel: bool,
    },
    /// MoE router: the gate GEMM `hidden -> experts`, then the routing kernels (fp32 softmax,
    /// top-k, renormalisation: [`EagerRecipe::RouterSoftmaxTopk`] over `experts`) and the
    /// token permutation to expert order ([`EagerRecipe::TokenPermute`] over `top_k * hidden`).
    Router {
        /// Hidden size.
        hidden: u64,
        /// Routed experts.
        experts: u64,
        /// Experts per token.
        top_k: u64,
    },
    /// A routed-expert projection `input -> output` for each routed copy of a token: one
    /// grouped GEMM over the rank's experts (rows per expert = routed copies / local experts).
    Experts {
        /// Routed experts in the model.
        experts: u64,
        /// Experts per token.
        top_k: u64,
        /// Input features.
        input: u64,
        /// Output features.
        output: u64,
    },
    /// Fused causal (flash) attention core over `heads` query heads, followed by the copy of
    /// its output back to token-major layout ([`EagerRecipe::AttentionLayout`]).
    Attention {
        /// Query heads (before TP).
        heads: u64,
        /// Query/key head dimension.
        qk_dim: u64,
        /// Value head dimension.
        v_dim: u64,
    },
    /// Memory-bound eager kernels over `width` elements per token (per routed copy when
    /// `routed`: expert activations scale with the routed load, not the tokens).
    MemoryBound {
        /// Which eager implementation (kernel count and bytes per element).
        recipe: EagerRecipe,
        /// Elements per token (or per routed copy).
        width: u64,
        /// Width counts per routed copy of a token.
        routed: bool,
    },
    /// No shape known (ops built by hand): one memory-bound kernel of the op's totals.
    #[default]
    Opaque,
}

/// The eager PyTorch implementation of a memory-bound op: kernels launched and HBM bytes moved
/// per element, forward and backward. The kernel-count rule table of a step (what the
/// simulator compares with the measured 57,560 device kernels of experiment A):
///
/// | recipe | fwd kernels | fwd bytes/elem | bwd kernels | bwd bytes/elem | eager code |
/// | --- | --- | --- | --- | --- | --- |
/// | RmsNorm | 8 | 36 | 16 | 92 | `x.float()`, `pow`, `mean`, `+eps`, `rsqrt`, `mul`, `.to(bf16)`, `weight *` (HF `Qwen3RMSNorm`); backward per [`RMSNORM_BWD_KERNELS`] |
/// | Rope | 10 | 20 | 18 | 30 | per q and k: `x*cos`, `neg`, `cat` (rotate_half), `*sin`, `add`; backward per [`ROPE_BWD_KERNELS`] |
/// | SwiGlu | 2 | 10 | 3 | 18 | `silu(gate)`, `* up` |
/// | Residual | 1 | 6 | 1 | 6 | `a + b`; backward accumulates the two gradient branches |
/// | Embedding | 1 | 4 | 2 | 6 | `index_select`; backward zero-fill + `embedding_dense_backward` |
/// | CrossEntropy | 4 | 14 | 4 | 22 | `logits.float()`, `log_softmax`, `nll_loss`, `mean` |
/// | AttentionLayout | 1 | 4 | 1 | 4 | `transpose(1, 2).contiguous()` of the attention output |
/// | RouterSoftmaxTopk | 6 | 18 | 6 | 26 | `.float()`, `softmax`, `topk`, `sum`, `div`, `.to(bf16)` |
/// | TokenPermute | 3 | 4 | 2 | 6 | `argsort` of expert ids, `histc` counts, `index_select` of tokens |
/// | ExpertCombine | 3 | 10 | 4 | 20 | unpermute `index_select`, `* routing weights`, `sum` over top-k |
/// | EpDispatch | 11 | 4 | 3 | 7 | HyperParallel `ep_routed_forward` before the exchange: `arange`, `repeat_interleave`, `div`, `mul`, `add`, `argsort`, three index gathers, `bincount`; after the index exchange `- expert_offset` |
/// | EpRegroup | 4 | 4 | 2 | 8 | HyperParallel `_local_swiglu_expert_forward`: `argsort`, gather, `bincount`, `cumsum` (the grouped GEMM's group list) |
/// | EpCombine | 5 | 10 | 6 | 16 | HyperParallel `ep_routed_forward` after the combine: weight gather, `mul`, `zeros`, index gather, `index_add_` |
/// | NpuSwiGlu | 1 | 6 | 1 | 10 | HyperParallel `npu_grouped_swiglu` (the expert-parallel grouped-GEMM path): one fused `torch_npu.npu_swiglu` over the packed gate/up output, backward its one `npu_swiglu_backward` |
///
/// Bytes: bf16 = 2, fp32 = 4 per element, each kernel reads its inputs and writes its output
/// once (reductions to one value per token count only their read). Linear layers launch 1
/// GEMM forward and 2 backward (dX, dW); attention 1 fused kernel each way (flash backward
/// does ~2.5x the forward FLOPs: 5 matmuls against 2, Dao 2023, FlashAttention-2 section 3.1).
///
/// Backward counts follow PyTorch's autograd formulas (`tools/autograd/derivatives.yaml`,
/// `torch/csrc/autograd/FunctionsManual.cpp`): every node launches its formula's kernels, a
/// broadcast operand's gradient adds a `sum_to` reduction, a tensor used twice adds one
/// accumulation `add` per extra use, `slice_backward` allocates zeros and copies into them,
/// an index gather's backward is `zeros` + `index_put_(accumulate=True)`.
///
/// The `Ep*` recipes are the expert-parallel (TP-extend-EP) path of HyperParallel
/// (`hyper_models/components/distributed/ep_utils.py`, `ep_routed_forward` and
/// `_local_swiglu_expert_forward` with the grouped GEMM): they replace `TokenPermute` and
/// `ExpertCombine` when `ep > 1` (see `crate::strategy::kernels`). The grouped-GEMM path is
/// the one the measured runs took: the per-expert loop of the same file launches at least four
/// kernels forward and eight backward per local expert (32 on a rank of experiment A), more
/// than the measured per-layer total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EagerRecipe {
    /// RMSNorm with an fp32 upcast.
    RmsNorm,
    /// Rotary position embedding of q and k.
    Rope,
    /// SiLU-gated activation.
    SwiGlu,
    /// Residual add.
    Residual,
    /// Token embedding lookup.
    Embedding,
    /// Cross-entropy over fp32 logits.
    CrossEntropy,
    /// Attention output back to token-major layout.
    AttentionLayout,
    /// Router softmax, top-k and renormalisation in fp32.
    RouterSoftmaxTopk,
    /// Tokens sorted into expert order.
    TokenPermute,
    /// Expert outputs back to token order, weighted and summed.
    ExpertCombine,
    /// Expert-parallel dispatch bookkeeping on the token owner (HyperParallel
    /// `ep_routed_forward`: source indices, destination ranks, sort, gathers, counts).
    EpDispatch,
    /// Received routed copies regrouped by local expert for the grouped GEMM.
    EpRegroup,
    /// Expert-parallel combine on the token owner: weighted `index_add_` back to tokens.
    EpCombine,
    /// The routed experts' activation on HyperParallel's expert-parallel grouped-GEMM path:
    /// one fused `torch_npu.npu_swiglu` each way.
    NpuSwiGlu,
    /// transformers' `grouped_mm` experts (`integrations/moe.py::grouped_mm_experts_forward`,
    /// transformers 5.17) before the first grouped GEMM, per routed copy: `torch.sort` of the
    /// expert ids (8 radix-sort kernels), `perm // top_k`, the gathers of the hidden states and
    /// the routing weights, the int cast, `histc` (2), `cumsum` (3), the sentinel compare,
    /// `clamp_`, `masked_fill_` of the gathered states, and `_grouped_mm`'s
    /// `prepare_grouped_gemm_data` of both grouped GEMMs (2). Backward: the `masked_fill_`,
    /// the gather's index backward (zeros, 8-kernel sort, `indexing_backward`, 2 segment
    /// kernels), the weights' `index_put_` (2) and both GEMMs' data preparation for dX and dW
    /// (4). Bytes per element of the `top_k x hidden` copies (bf16): gather and masked fill
    /// read and write each once. The counts match the MoE run's kernel table
    /// (`shared/calibration/h200/profiles/kernels-moe30b-4l-mbs1-grouped.csv`: 98
    /// radix-sort kernels = 3 sorts x 8 x 4 layers, 24 `prepare_grouped_gemm_data`, 8
    /// `indexing_backward`, 8 `_index_put_impl_`).
    GroupedMmDispatch,
    /// transformers' `grouped_mm` experts after the last grouped GEMM, per routed copy: the
    /// two out-of-place `masked_fill`s (gate-up and down outputs), the routing-weight
    /// multiply, `inv_perm` (`arange`, `index_put_`), the reorder gather and the sum over
    /// `top_k`; backward the reorder's index backward (sort-based, 12 kernels), the multiply's
    /// two gradients (3) and both masked fills (2).
    GroupedMmCombine,
}

/// RMSNorm backward kernels (`Qwen3RMSNorm` forward `w * (x.float() * rsqrt(mean(x.float()^2)
/// + eps)).to(bf16)`), per autograd formula: `weight *` 3 (`grad * w`, `grad * y`, `sum_to`
/// the weight), `.to(bf16)` 1 cast, `x * rsqrt` 3 (two products, `sum_to` the per-row factor),
/// `rsqrt` 3 (`result.pow(3)`, `-0.5 * grad`, product), `+ eps` 0, `mean` 1 (expand / n),
/// `pow(2)` 3 (`pow_backward`: `self.pow(1)` copy, `* 2`, `grad *`), the two uses of
/// `x.float()` 1 `add`, `.float()` 1 cast.
pub const RMSNORM_BWD_KERNELS: u32 = 16;

/// Rotary embedding backward kernels for q and k (HF `apply_rotary_pos_emb`, `q * cos +
/// rotate_half(q) * sin` with `rotate_half = cat(-x[..., d/2:], x[..., :d/2])`), per tensor:
/// `grad * cos`, `grad * sin`, `neg`, two `slice_backward` (zeros + copy each), and two `add`s
/// accumulating the three uses of the input: 9, so 18 for q and k.
pub const ROPE_BWD_KERNELS: u32 = 18;

impl EagerRecipe {
    /// Forward (kernels, HBM bytes per element).
    pub fn fwd(self) -> (u32, f64) {
        match self {
            EagerRecipe::RmsNorm => (8, 36.0),
            EagerRecipe::Rope => (10, 20.0),
            EagerRecipe::SwiGlu => (2, 10.0),
            EagerRecipe::Residual => (1, 6.0),
            EagerRecipe::Embedding => (1, 4.0),
            EagerRecipe::CrossEntropy => (4, 14.0),
            EagerRecipe::AttentionLayout => (1, 4.0),
            EagerRecipe::RouterSoftmaxTopk => (6, 18.0),
            EagerRecipe::TokenPermute => (3, 4.0),
            EagerRecipe::ExpertCombine => (3, 10.0),
            EagerRecipe::EpDispatch => (11, 4.0),
            EagerRecipe::EpRegroup => (4, 4.0),
            EagerRecipe::EpCombine => (5, 10.0),
            EagerRecipe::NpuSwiGlu => (1, 6.0),
            EagerRecipe::GroupedMmDispatch => (22, 8.0),
            EagerRecipe::GroupedMmCombine => (7, 17.0),
        }
    }

    /// Backward (kernels, HBM bytes per element).
    pub fn bwd(self) -> (u32, f64) {
        match self {
            EagerRecipe::RmsNorm => (RMSNORM_BWD_KERNELS, 92.0),
            EagerRecipe::Rope => (ROPE_BWD_KERNELS, 30.0),
            EagerRecipe::SwiGlu => (3, 18.0),
            EagerRecipe::Residual => (1, 6.0),
            EagerRecipe::Embedding => (2, 6.0),
            EagerRecipe::CrossEntropy => (4, 22.0),
            EagerRecipe::AttentionLayout => (1, 4.0),
            EagerRecipe::RouterSoftmaxTopk => (6, 26.0),
            EagerRecipe::TokenPermute => (2, 6.0),
            EagerRecipe::ExpertCombine => (4, 20.0),
            EagerRecipe::EpDispatch => (3, 7.0),
            EagerRecipe::EpRegroup => (2, 8.0),
            EagerRecipe::EpCombine => (6, 16.0),
            EagerRecipe::NpuSwiGlu => (1, 10.0),
            EagerRecipe::GroupedMmDispatch => (19, 10.0),
            EagerRecipe::GroupedMmCombine => (17, 19.0),
        }
    }

    /// The part of [`Self::fwd`] (kernels, HBM bytes per element) that runs strided
    /// (non-vectorized: broadcast, non-contiguous or bf16-to-f32 operands), as the H200
    /// trace of the dense 14B-shaped step lists the kernels (`profiles/trace-dense14b-8l-mbs1`,
    /// `elementwise_kernel` against `vectorized_elementwise_kernel`): RMSNorm's `x.float()`,
    /// `x * rsqrt(..)` (a `[T, 1]` broadcast) and `weight * x` (a `[h]` broadcast); every
    /// rotary-embedding kernel (q and k are transposed views); the loss's `logits.float()`;
    /// the attention output's token-major copy.
    pub fn strided_fwd(self) -> (u32, f64) {
        match self {
            EagerRecipe::RmsNorm => (3, 18.0),
            EagerRecipe::Rope => self.fwd(),
            EagerRecipe::CrossEntropy => (1, 6.0),
            EagerRecipe::AttentionLayout => self.fwd(),
            _ => (0, 0.0),
        }
    }

    /// The strided part of [`Self::bwd`]: RMSNorm's `grad * weight`, the `x.float()` recompute,
    /// the `[T, 1]` broadcast product and the mean's expanded division; rotary embedding's two
    /// products, `neg`, the two `slice_backward` copies and the final accumulation per tensor
    /// (its zero fills and the first accumulation are vectorized); the layout copy.
    pub fn strided_bwd(self) -> (u32, f64) {
        match self {
            EagerRecipe::RmsNorm => (4, 22.0),
            EagerRecipe::Rope => (12, 20.0),
            EagerRecipe::AttentionLayout => self.bwd(),
            _ => (0, 0.0),
        }
    }

    /// Whether the recipe's kernels index, mask or broadcast (gathers, masked fills, sorts,
    /// scatter-adds over `[copies, hidden]`): they reach a fraction of a streaming kernel's
    /// bandwidth ([`crate::kernel::KernelClass::IndexedElementwise`]).
    pub fn is_indexed(self) -> bool {
        matches!(
            self,
            EagerRecipe::GroupedMmDispatch | EagerRecipe::GroupedMmCombine
        )
    }
}

/// Bytes per activation element (bf16 activations).
pub const ACT_BYTES: f64 = 2.0;
const NORM_FLOPS_PER_ELEM: f64 = 4.0;
const ROPE_FLOPS_PER_ELEM: f64 = 3.0;
const SWIGLU_FLOPS_PER_ELEM: f64 = 5.0;
const ADD_FLOPS_PER_ELEM: f64 = 1.0;
const COMBINE_FLOPS_PER_ELEM: f64 = 2.0;
const LOSS_FLOPS_PER_LOGIT: f64 = 4.0;

/// Average number of keys a query attends to under a causal mask over `seq_len` tokens,
/// optionally limited to a sliding `window` (the query itself included).
pub fn avg_causal_context(seq_len: u64, window: Option<u64>) -> f64 {
    if seq_len == 0 {
        return 0.0;
    }
    let s = seq_len as f64;
    let w = window.map_or(s, |w| (w as f64).min(s));
    (w * (w + 1.0) / 2.0 + (s - w) * w) / s
}

impl ModelIr {
    /// Forward compute per token, for sequences of `seq_len` tokens: one [`LayerCompute`] for
    /// `model.embed_tokens`, one per decoder layer `model.layers.{i}` (MTP layers included when
    /// `options.include_mtp`), and one named `lm_head` for the final norm, `lm_head` and loss.
    pub fn compute_profile(&self, seq_len: u64) -> Vec<LayerCompute> {
        let ctx = avg_causal_context(seq_len, self.config.sliding_window);
        let c = &self.config;
        let h = c.hidden_size as f64;
        let v = c.vocab_size as f64;
        let mut out = Vec::with_capacity(self.num_layers_total() + 2);

        let mut embed = Ops::default();
        embed.embedding("model.embed_tokens", h);
        out.push(embed.finish("model.embed_tokens", None));

        for layer in 0..self.num_layers_total() {
            let p = format!("model.layers.{layer}");
            let mut ops = Ops::default();
            let mtp = layer >= c.num_hidden_layers;
            if mtp {
                ops.embedding(&format!("{p}.embed_tokens"), h);
                ops.norm(&format!("{p}.enorm"), h);
                ops.norm(&format!("{p}.hnorm"), h);
                ops.matmul(&format!("{p}.eh_proj"), 2.0 * h, h);
            }
            self.decoder_ops(&mut ops, &p, layer, ctx);
            if mtp {
                ops.norm(&format!("{p}.shared_head.norm"), h);
                ops.matmul(&format!("{p}.shared_head.head"), h, v);
                ops.loss(&format!("{p}.loss"), v);
            }
            out.push(ops.finish(&p, Some(layer)));
        }

        let mut head = Ops::default();
        head.norm("model.norm", h);
        head.matmul("lm_head", h, v);
        head.loss("loss", v);
        out.push(head.finish("lm_head", None));
        out
    }

    fn decoder_ops(&self, ops: &mut Ops, p: &str, layer: usize, ctx: f64) {
        let h = self.config.hidden_size as f64;
        ops.norm(&format!("{p}.input_layernorm"), h);
        if self.config.mla.is_some() {
            self.mla_ops(ops, p, ctx);
        } else {
            self.gqa_ops(ops, p, ctx);
        }
        ops.residual(&format!("{p}.attn_residual"), h);
        ops.norm(&format!("{p}.post_attention_layernorm"), h);
        if self.config.is_moe_layer(layer) {
            self.moe_ops(ops, p);
        } else {
            ops.swiglu(&format!("{p}.mlp"), h, self.config.intermediate_size as f64);
        }
        ops.residual(&format!("{p}.mlp_residual"), h);
    }

    fn gqa_ops(&self, ops: &mut Ops, p: &str, ctx: f64) {
        let c = &self.config;
        let h = c.hidden_size as f64;
        let hd = c.head_dim as f64;
        let heads = c.num_attention_heads as f64;
        let kv_heads = c.num_key_value_heads as f64;
        let a = format!("{p}.self_attn");
        ops.matmul(&format!("{a}.q_proj"), h, heads * hd);
        ops.matmul(&format!("{a}.k_proj"), h, kv_heads * hd);
        ops.matmul(&format!("{a}.v_proj"), h, kv_heads * hd);
        if c.family.has_qk_norm() {
            ops.norm(&format!("{a}.q_norm"), heads * hd);
            ops.norm(&format!("{a}.k_norm"), kv_heads * hd);
        }
        ops.rope(&format!("{a}.rotary_emb"), (heads + kv_heads) * hd);
        ops.attention(
            &format!("{a}.attn"),
            heads,
            hd,
            hd,
            ctx,
            heads * hd + 2.0 * kv_heads * hd,
        );
        ops.matmul(&format!("{a}.o_proj"), heads * hd, h);
    }

    fn mla_ops(&self, ops: &mut Ops, p: &str, ctx: f64) {
        let c = &self.config;
        let Some(mla) = &c.mla else { return };
        let h = c.hidden_size as f64;
        let heads = c.num_attention_heads as f64;
        let nope = mla.qk_nope_head_dim as f64;
        let rope = mla.qk_rope_head_dim as f64;
        let vd = mla.v_head_dim as f64;
        let kvr = mla.kv_lora_rank as f64;
        let qk = nope + rope;
        let a = format!("{p}.self_attn");
        match mla.q_lora_rank {
            Some(r) => {
                let r = r as f64;
                ops.matmul(&format!("{a}.q_a_proj"), h, r);
                ops.norm(&format!("{a}.q_a_layernorm"), r);
                ops.matmul(&format!("{a}.q_b_proj"), r, heads * qk);
            }
            None => ops.matmul(&format!("{a}.q_proj"), h, heads * qk),
        }
        ops.matmul(&format!("{a}.kv_a_proj_with_mqa"), h, kvr + rope);
        ops.norm(&format!("{a}.kv_a_layernorm"), kvr);
        ops.matmul(&format!("{a}.kv_b_proj"), kvr, heads * (nope + vd));
        ops.rope(&format!("{a}.rotary_emb"), (heads + 1.0) * rope);
        // Keys are materialized per head (k_nope from kv_b_proj, the shared k_rope broadcast).
        ops.attention(
            &format!("{a}.attn"),
            heads,
            qk,
            vd,
            ctx,
            2.0 * heads * qk + heads * vd,
        );
        ops.matmul(&format!("{a}.o_proj"), heads * vd, h);
    }

    fn moe_ops(&self, ops: &mut Ops, p: &str) {
        let c = &self.config;
        let Some(moe) = &c.moe else { return };
        let h = c.hidden_size as f64;
        let e = moe.num_experts as f64;
        let k = moe.experts_per_token as f64;
        let i = moe.moe_intermediate_size as f64;
        let mlp = format!("{p}.mlp");
        let (hu, eu, ku, iu) = (
            c.hidden_size,
            moe.num_experts,
            moe.experts_per_token,
            moe.moe_intermediate_size,
        );
        ops.push(
            &format!("{mlp}.gate"),
            ComputeKind::Router,
            2.0 * h * e,
            h + e,
            OpShape::Router {
                hidden: hu,
                experts: eu,
                top_k: ku,
            },
        );
        let x = format!("{mlp}.experts");
        let experts = |input: u64, output: u64| OpShape::Experts {
            experts: eu,
            top_k: ku,
            input,
            output,
        };
        ops.push(
            &format!("{x}.gate_up_proj"),
            ComputeKind::ExpertMatmul,
            k * 2.0 * h * 2.0 * i,
            k * (h + 2.0 * i),
            experts(hu, 2 * iu),
        );
        ops.push(
            &format!("{x}.act_fn"),
            ComputeKind::Elementwise,
            k * SWIGLU_FLOPS_PER_ELEM * i,
            k * 3.0 * i,
            OpShape::MemoryBound {
                recipe: EagerRecipe::SwiGlu,
                width: iu,
                routed: true,
            },
        );
        ops.push(
            &format!("{x}.down_proj"),
            ComputeKind::ExpertMatmul,
            k * 2.0 * i * h,
            k * (i + h),
            experts(iu, hu),
        );
        ops.push(
            &format!("{x}.combine"),
            ComputeKind::Elementwise,
            k * COMBINE_FLOPS_PER_ELEM * h,
            k * h + h,
            // Runs on the token owner after the combine exchange: top_k copies per token.
            OpShape::MemoryBound {
                recipe: EagerRecipe::ExpertCombine,
                width: ku * hu,
                routed: false,
            },
        );
        if moe.shared_experts > 0 {
            let shared = c.shared_expert_intermediate_size() as f64;
            ops.swiglu(&format!("{mlp}.shared_experts"), h, shared);
            ops.residual(&format!("{mlp}.shared_add"), h);
        }
    }
}

/// Ops of one piece under construction.
#[derive(Default)]
struct Ops {
    ops: Vec<ComputeOp>,
}

impl Ops {
    /// Adds an op; `elems` is the number of activation elements read plus written.
    fn push(&mut self, name: &str, kind: ComputeKind, flops: f64, elems: f64, shape: OpShape) {
        self.ops.push(ComputeOp {
            name: name.to_string(),
            kind,
            fwd_flops_per_token: flops,
            fwd_bytes_per_token: elems * ACT_BYTES,
            shape,
        });
    }

    fn memory_bound(
        &mut self,
        name: &str,
        kind: ComputeKind,
        flops: f64,
        elems: f64,
        recipe: EagerRecipe,
        width: f64,
    ) {
        let shape = OpShape::MemoryBound {
            recipe,
            width: width.round() as u64,
            routed: false,
        };
        self.push(name, kind, flops, elems, shape);
    }

    fn matmul(&mut self, name: &str, input: f64, output: f64) {
        // Row-parallel projections (TP splits their input): attention output and MLP down.
        let row_parallel = name.ends_with("o_proj") || name.ends_with("down_proj");
        let shape = OpShape::Linear {
            input: input.round() as u64,
            output: output.round() as u64,
            row_parallel,
        };
        self.push(
            name,
            ComputeKind::Matmul,
            2.0 * input * output,
            input + output,
            shape,
        );
    }

    fn norm(&mut self, name: &str, n: f64) {
        let flops = NORM_FLOPS_PER_ELEM * n;
        self.memory_bound(
            name,
            ComputeKind::Norm,
            flops,
            2.0 * n,
            EagerRecipe::RmsNorm,
            n,
        );
    }

    fn rope(&mut self, name: &str, n: f64) {
        let flops = ROPE_FLOPS_PER_ELEM * n;
        self.memory_bound(
            name,
            ComputeKind::Elementwise,
            flops,
            2.0 * n,
            EagerRecipe::Rope,
            n,
        );
    }

    fn residual(&mut self, name: &str, n: f64) {
        let flops = ADD_FLOPS_PER_ELEM * n;
        self.memory_bound(
            name,
            ComputeKind::Elementwise,
            flops,
            3.0 * n,
            EagerRecipe::Residual,
            n,
        );
    }

    fn embedding(&mut self, name: &str, h: f64) {
        self.memory_bound(
            name,
            ComputeKind::Embedding,
            0.0,
            h,
            EagerRecipe::Embedding,
            h,
        );
    }

    fn loss(&mut self, name: &str, vocab: f64) {
        let flops = LOSS_FLOPS_PER_LOGIT * vocab;
        self.memory_bound(
            name,
            ComputeKind::Loss,
            flops,
            vocab,
            EagerRecipe::CrossEntropy,
            vocab,
        );
    }

    /// Gated MLP `{module}.{gate_proj, up_proj, act_fn, down_proj}`.
    fn swiglu(&mut self, module: &str, h: f64, i: f64) {
        self.matmul(&format!("{module}.gate_proj"), h, i);
        self.matmul(&format!("{module}.up_proj"), h, i);
        self.memory_bound(
            &format!("{module}.act_fn"),
            ComputeKind::Elementwise,
            SWIGLU_FLOPS_PER_ELEM * i,
            3.0 * i,
            EagerRecipe::SwiGlu,
            i,
        );
        self.matmul(&format!("{module}.down_proj"), i, h);
    }

    /// Attention core; `qkv_elems` is the q, k and v elements read per token.
    fn attention(&mut self, name: &str, heads: f64, qk: f64, vd: f64, ctx: f64, qkv_elems: f64) {
        let flops = 2.0 * heads * qk * ctx + 2.0 * heads * vd * ctx;
        let shape = OpShape::Attention {
            heads: heads.round() as u64,
            qk_dim: qk.round() as u64,
            v_dim: vd.round() as u64,
        };
        self.push(
            name,
            ComputeKind::Attention,
            flops,
            qkv_elems + heads * vd,
            shape,
        );
    }

    fn finish(self, name: &str, layer: Option<usize>) -> LayerCompute {
        LayerCompute {
            name: name.to_string(),
            layer,
            ops: self.ops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_context_counts_the_triangle() {
        assert_eq!(avg_causal_context(4096, None), 2048.5);
        assert_eq!(avg_causal_context(4096, Some(8192)), 2048.5);
        assert_eq!(avg_causal_context(4096, Some(2048)), 1536.25);
        assert_eq!(avg_causal_context(1, None), 1.0);
        assert_eq!(avg_causal_context(0, None), 0.0);
    }

    /// The backward recipes are the sums of their autograd nodes' kernels (the node list is
    /// the derivation in the constants' docs; changing one without the other fails here).
    #[test]
    fn norm_and_rope_backward_counts_sum_their_autograd_nodes() {
        // (node, kernels): derivatives.yaml / FunctionsManual.cpp formulas.
        let rmsnorm: [(&str, u32); 8] = [
            ("weight * y: grad*y, sum_to(weight), grad*weight", 3),
            (".to(bf16): cast back", 1),
            ("x * r: grad*r, grad*x, sum_to(r)", 3),
            ("rsqrt: result.pow(3), -0.5*grad, product", 3),
            ("mean: expand / n", 1),
            ("pow(2): self.pow(1), *2, grad*", 3),
            ("x.float() used twice: add", 1),
            (".float(): cast back", 1),
        ];
        let rope_per_tensor: [(&str, u32); 6] = [
            ("x * cos: grad*cos", 1),
            ("rotate_half(x) * sin: grad*sin", 1),
            ("neg", 1),
            ("slice_backward x2: zeros + copy", 2),
            ("slice_backward x1: zeros + copy", 2),
            ("three uses of x: two adds", 2),
        ];
        let sum = |n: &[(&str, u32)]| n.iter().map(|(_, k)| k).sum::<u32>();
        assert_eq!(sum(&rmsnorm), RMSNORM_BWD_KERNELS);
        assert_eq!(EagerRecipe::RmsNorm.bwd().0, RMSNORM_BWD_KERNELS);
        assert_eq!(2 * sum(&rope_per_tensor), ROPE_BWD_KERNELS);
        assert_eq!(EagerRecipe::Rope.bwd().0, ROPE_BWD_KERNELS);
        // Backward moves more bytes than forward for both (more passes over the data).
        for r in [EagerRecipe::RmsNorm, EagerRecipe::Rope] {
            assert!(r.bwd().1 > r.fwd().1, "{r:?}");
        }
    }
}
