//! What kernels one forward op launches: its [`OpShape`] (the GEMMs, attention and
//! memory-bound kernels of an eager PyTorch step, with the dimensions their rates depend on)
//! and, for memory-bound ops, the [`EagerRecipe`] of their kernel counts and HBM bytes. The
//! compute profile ([`super::compute`]) gives every op its shape.

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
///
/// transformers' `eager` experts loop (`[model] experts_implementation = "eager"`) has no
/// recipe here: its launches scale with the experts hit and its backward with the whole 3-D
/// expert parameters, so the step program builds its kernels itself (`hpfsdp-program`'s
/// `strategy::eager_experts`).
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
