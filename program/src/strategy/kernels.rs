//! Kernel lists of one profile op on one rank and micro-batch: the [`OpShape`] of the op
//! scaled by the rank's tokens and parallel degrees, forward and backward, in launch order.
//!
//! Dimensions per rank (`T` = micro_batch x seq_len tokens, `tp`, `cp` the degrees):
//! - linear layers: `m = T / cp` rows (every TP rank sees the whole CP-local sequence), the
//!   output features split by `tp` (column-parallel) or the input features (row-parallel:
//!   `o_proj`, `down_proj`); backward: data gradient `dX [m, in] = dY [m, out] W` (m = tokens,
//!   n = in, k = out) and weight gradient `dW [out, in] = dY^T X` (m = out, n = in, k = tokens);
//! - router gate and the memory-bound ops: the rank's share of tokens, `T / (cp tp)` (with
//!   sequence parallelism the MoE block and norms are sequence-sharded; without it this
//!   slightly undercounts replicated norms, as the profile convention always did);
//! - routed experts: the busiest EP rank's routed copies ([`super::routing`]), one grouped GEMM
//!   over its `experts / ep` local experts with `copies / local_experts` rows each; backward a
//!   grouped data-gradient and a grouped weight-gradient GEMM (the latter reduces over the
//!   tokens per expert, costed at the same (tokens per expert, n, k) point); with expert
//!   parallelism and more than one local expert, the received tokens (ordered by source rank)
//!   are regrouped by local expert before the first expert GEMM and put back in source order
//!   after the last one ([`ep_regroup`]);
//! - transformers' `eager` experts loop (`[model] experts_implementation = "eager"`): per hit
//!   expert GEMMs of their real shape, the loop's element-wise and index kernels and the
//!   full-size parameter gradients of `select_backward` ([`super::eager_experts`]);
//! - attention: one fused kernel over `micro_batch` sequences of `seq_len / cp` tokens and
//!   `heads / tp` heads, FLOPs from the profile (causal triangle); backward 2.5x the forward
//!   FLOPs (FlashAttention-2, Dao 2023, section 3.1: five matmuls against two) and 2x bytes;
//!   plus the copy of the output to token-major layout each way;
//! - memory-bound ops: the [`EagerRecipe`] kernel counts and bytes per element (bf16 figures,
//!   scaled to the compute dtype).
//!
//! GEMM HBM bytes read both operands and write the output once ([`KernelWork::gemm`]): the
//! weight read of every projection is included.

use super::StrategyOptions;
use super::eager_experts::{self, EagerLoop};
use super::routing::{RoutedLoad, busiest_rank_load};
use hpfsdp_plan::kernel::{GroupedTiling, KernelClass, KernelWork};
use hpfsdp_plan::model::{ComputeOp, EagerRecipe, OpShape};
use hpfsdp_plan::scenario::Scenario;

/// Flash-attention backward FLOPs over forward (Dao 2023, FlashAttention-2 section 3.1).
pub const ATTENTION_BWD_FLOPS_FACTOR: f64 = 2.5;

/// What the kernels of one rank depend on.
#[derive(Debug, Clone, Copy)]
pub struct KernelCtx {
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Context-parallel degree.
    pub cp: u64,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// The rank's share of the micro-batch's tokens, `T / (cp tp)`.
    pub rank_tokens: f64,
    /// Bytes per activation element (the compute dtype).
    pub act_bytes: u64,
    /// The busiest EP rank's routed load (MoE models only).
    pub routed: Option<RoutedLoad>,
    /// Expert-parallel degree.
    pub ep: u64,
    /// Model hidden size (the token width entering and leaving the experts).
    pub hidden: u64,
    /// The routed experts run transformers' `grouped_mm` path (`[model]
    /// experts_implementation = "grouped_mm"`): its dispatch and combine recipes.
    pub hf_grouped_mm: bool,
    /// The routed experts run transformers' `eager` per-expert loop (`[model]
    /// experts_implementation = "eager"`): [`super::eager_experts`] gives their kernels.
    pub hf_eager_experts: bool,
    /// The step runs PyTorch eager on CUDA (`[train] kernel_library = "torch_cuda"`): cuDNN
    /// SDPA's backward helpers ([`sdpa_cudnn_backward_helpers`]) and the element-wise
    /// recipes' strided kernels as a class of their own ([`memory_bound`]).
    pub torch_cuda: bool,
    /// Key/value heads of the attention (GQA when fewer than the query heads), whole model.
    pub kv_heads: u64,
}

impl KernelCtx {
    /// The context of a scenario's ranks under `opts`, `rank_tokens` tokens per rank.
    pub fn new(scenario: &Scenario, opts: &StrategyOptions, rank_tokens: f64) -> Self {
        let m = &scenario.file.mesh;
        let cfg = &scenario.model.config;
        let routed = cfg.moe.as_ref().map(|moe| {
            busiest_rank_load(
                rank_tokens,
                moe.num_experts,
                moe.experts_per_token,
                m.ep.max(1) as u64,
                scenario.file.train.routing_skew,
            )
        });
        Self {
            tp: m.tp.max(1) as u64,
            cp: m.cp.max(1) as u64,
            micro_batch: opts.micro_batch,
            seq_len: opts.seq_len,
            rank_tokens,
            act_bytes: opts.param_dtype.bytes(),
            routed,
            ep: m.ep.max(1) as u64,
            hidden: cfg.hidden_size,
            hf_grouped_mm: scenario.file.model.experts_implementation.as_deref()
                == Some("grouped_mm"),
            hf_eager_experts: scenario.file.model.experts_implementation.as_deref()
                == Some("eager"),
            torch_cuda: scenario.file.train.kernel_library.as_deref() == Some("torch_cuda"),
            kv_heads: cfg.num_key_value_heads,
        }
    }

    /// transformers' eager experts loop of this rank (`None` unless its experts run it).
    pub fn eager_loop(&self) -> Option<EagerLoop> {
        let r = self.routed.filter(|_| self.hf_eager_experts)?;
        Some(EagerLoop::new(
            &r,
            self.rank_tokens,
            self.act_bytes,
            self.hidden,
        ))
    }

    /// The recipe an op runs on this rank's path: with expert parallelism the token permutation
    /// and the combine are HyperParallel's `ep_routed_forward` bookkeeping
    /// ([`EagerRecipe::EpDispatch`], [`EagerRecipe::EpCombine`]); everything else as given.
    pub fn path_recipe(&self, recipe: EagerRecipe) -> EagerRecipe {
        match recipe {
            EagerRecipe::TokenPermute if self.ep > 1 => EagerRecipe::EpDispatch,
            EagerRecipe::ExpertCombine if self.ep > 1 => EagerRecipe::EpCombine,
            EagerRecipe::TokenPermute if self.hf_grouped_mm => EagerRecipe::GroupedMmDispatch,
            EagerRecipe::ExpertCombine if self.hf_grouped_mm => EagerRecipe::GroupedMmCombine,
            r => r,
        }
    }

    /// [`Self::path_recipe`] of a memory-bound op, `routed` when it runs on the routed copies:
    /// with expert parallelism the routed experts' activation is the fused `npu_swiglu` of
    /// HyperParallel's grouped-GEMM expert forward (`npu_grouped_swiglu`:
    /// `torch_npu.npu_swiglu(gate_up, dim=-1)` between the two `npu_grouped_matmul` calls,
    /// hyper-parallel `components/functional/npu_grouped_swiglu.py`, called from
    /// `_local_swiglu_expert_forward` when `use_grouped_gemm`), not the eager `silu` and `mul`.
    pub fn memory_bound_recipe(&self, recipe: EagerRecipe, routed: bool) -> EagerRecipe {
        match recipe {
            EagerRecipe::SwiGlu if routed && self.ep > 1 => EagerRecipe::NpuSwiGlu,
            r => self.path_recipe(r),
        }
    }

    fn gemm_rows(&self) -> u64 {
        (self.micro_batch * self.seq_len / self.cp).max(1)
    }

    fn split(&self, features: u64) -> u64 {
        features.div_ceil(self.tp).max(1)
    }
}

/// Forward and backward kernels of `op` on one rank and micro-batch, each in launch order.
pub fn op_kernels(op: &ComputeOp, c: &KernelCtx) -> (Vec<KernelWork>, Vec<KernelWork>) {
    match op.shape {
        OpShape::Linear {
            input,
            output,
            row_parallel,
        } => {
            let (n, k) = if row_parallel {
                (output, c.split(input))
            } else {
                (c.split(output), input)
            };
            linear(c.gemm_rows(), n, k, c.act_bytes)
        }
        OpShape::Router {
            hidden,
            experts,
            top_k,
        } => router(c, hidden, experts, top_k),
        OpShape::Experts {
            input,
            output,
            top_k,
            ..
        } => match c.eager_loop() {
            Some(l) => eager_experts::projection(&l, input, output, top_k),
            None => experts(c, input, output),
        },
        OpShape::Attention {
            heads,
            qk_dim,
            v_dim,
        } => {
            let (mut fwd, mut bwd) = attention(op, c, heads, qk_dim);
            // The output back to token-major layout (`transpose(1, 2).contiguous()`); its
            // gradient copy runs before the attention backward.
            let elems = c.rank_tokens * (heads * v_dim) as f64;
            let (lf, lb) = memory_bound(c, EagerRecipe::AttentionLayout, elems, 0.0);
            fwd.extend(lf);
            let mut b = lb;
            b.append(&mut bwd);
            (fwd, b)
        }
        OpShape::MemoryBound {
            recipe,
            width,
            routed,
        } => {
            let elems = if routed {
                c.routed.map_or(0.0, |r| r.busiest_copies) * width as f64
            } else {
                c.rank_tokens * width as f64
            };
            let flops = op.fwd_flops_per_token * c.rank_tokens * routed_scale(c, routed);
            match (c.eager_loop(), recipe) {
                (Some(l), EagerRecipe::SwiGlu) if routed => {
                    eager_experts::activation(&l, width, flops.round() as u64)
                }
                (Some(l), EagerRecipe::ExpertCombine) => {
                    let top_k = width / c.hidden.max(1);
                    eager_experts::combine(&l, top_k, flops.round() as u64)
                }
                _ => memory_bound(c, c.memory_bound_recipe(recipe, routed), elems, flops),
            }
        }
        OpShape::Opaque => {
            let flops = (op.fwd_flops_per_token * c.rank_tokens).round() as u64;
            let bytes = (op.fwd_bytes_per_token * c.rank_tokens).round() as u64;
            (
                vec![KernelWork::memory_bound(1, flops, bytes)],
                vec![KernelWork::memory_bound(2, 2 * flops, 2 * bytes)],
            )
        }
    }
}

/// Busiest-rank routed copies over the balanced figure for routed ops (1 otherwise).
fn routed_scale(c: &KernelCtx, routed: bool) -> f64 {
    match (routed, c.routed) {
        (true, Some(r)) => r.imbalance(),
        _ => 1.0,
    }
}

/// One GEMM `[m, k] x [k, n]` forward; backward dX (m, k, n) then dW (n, k, m).
fn linear(m: u64, n: u64, k: u64, eb: u64) -> (Vec<KernelWork>, Vec<KernelWork>) {
    (
        vec![KernelWork::gemm(m, n, k, 1, eb)],
        vec![
            KernelWork::gemm(m, k, n, 1, eb),
            KernelWork::gemm(n, k, m, 1, eb),
        ],
    )
}

fn memory_bound(
    c: &KernelCtx,
    recipe: EagerRecipe,
    elems: f64,
    flops: f64,
) -> (Vec<KernelWork>, Vec<KernelWork>) {
    let scale = c.act_bytes as f64 / 2.0;
    let flops = flops.round() as u64;
    let class = if recipe.is_indexed() {
        KernelClass::IndexedElementwise
    } else {
        KernelClass::MemoryBound
    };
    // The recipe's vectorized kernels (with its FLOPs), then its strided ones; the bytes of
    // the two parts add up to the recipe's rounded total exactly.
    let pass = |(count, bytes): (u32, f64), (strided, strided_bytes): (u32, f64), flops| {
        let total = (elems * bytes * scale).round() as u64;
        let strided_total = ((elems * strided_bytes * scale).round() as u64).min(total);
        let work = |class, count, flops, hbm_bytes| KernelWork {
            class,
            count,
            flops,
            hbm_bytes,
        };
        let mut kernels = Vec::with_capacity(2);
        if strided < count {
            kernels.push(work(class, count - strided, flops, total - strided_total));
        }
        if strided > 0 {
            let f = if strided < count { 0 } else { flops };
            kernels.push(work(
                KernelClass::StridedElementwise,
                strided,
                f,
                strided_total,
            ));
        }
        kernels
    };
    // Only PyTorch's CUDA kernels are known to split this way; elsewhere every kernel of the
    // recipe is one memory-bound class.
    let (strided_fwd, strided_bwd) = if c.torch_cuda {
        (recipe.strided_fwd(), recipe.strided_bwd())
    } else {
        ((0, 0.0), (0, 0.0))
    };
    (
        pass(recipe.fwd(), strided_fwd, flops),
        pass(recipe.bwd(), strided_bwd, 2 * flops),
    )
}

/// Router: gate GEMM on the rank's tokens, softmax/top-k over the experts, token permute
/// (with expert parallelism the dispatch bookkeeping, [`KernelCtx::path_recipe`]).
fn router(
    c: &KernelCtx,
    hidden: u64,
    experts: u64,
    top_k: u64,
) -> (Vec<KernelWork>, Vec<KernelWork>) {
    let m = c.rank_tokens.round().max(1.0) as u64;
    let (mut fwd, mut bwd_gemm) = linear(m, experts, hidden, c.act_bytes);
    let (sf, sb) = memory_bound(
        c,
        EagerRecipe::RouterSoftmaxTopk,
        c.rank_tokens * experts as f64,
        0.0,
    );
    let (pf, pb) = match c.eager_loop() {
        Some(l) => eager_experts::mask(&l, top_k),
        None => memory_bound(
            c,
            c.path_recipe(EagerRecipe::TokenPermute),
            c.rank_tokens * (top_k * hidden) as f64,
            0.0,
        ),
    };
    fwd.extend(sf);
    fwd.extend(pf);
    // Backward runs in reverse: permute, softmax, then the gate GEMM's gradients.
    let mut bwd = pb;
    bwd.extend(sb);
    bwd.append(&mut bwd_gemm);
    (fwd, bwd)
}

/// One routed-expert projection on the busiest rank: a grouped GEMM forward, grouped dX and
/// dW backward.
fn experts(c: &KernelCtx, input: u64, output: u64) -> (Vec<KernelWork>, Vec<KernelWork>) {
    let Some(r) = c.routed else {
        return (Vec::new(), Vec::new());
    };
    let groups = r.local_experts;
    let tokens_per_group = r.tokens_per_expert().round().max(1.0) as u64;
    let copies = r.busiest_copies;
    let flops = (2.0 * copies * (input * output) as f64).round() as u64;
    let act = copies * (input + output) as f64;
    let weights = (groups * input * output) as f64;
    let eb = c.act_bytes as f64;
    // PyTorch's `torch._grouped_mm` tiles each expert's rows and runs the weight gradient
    // with tokens as a short reduction ([`GroupedTiling`]); other libraries keep the dense
    // rate.
    let tiling = |n: u64, weight_grad: bool| {
        if c.torch_cuda {
            GroupedTiling::torch_sm90(tokens_per_group, n, weight_grad)
        } else {
            GroupedTiling::default()
        }
    };
    let work = |n: u64, k: u64, tiling: GroupedTiling| KernelWork {
        class: KernelClass::GroupedGemm {
            groups,
            tokens_per_group,
            n,
            k,
            tiling,
        },
        count: 1,
        flops,
        hbm_bytes: ((act + weights) * eb).round() as u64,
    };
    let mut fwd = vec![work(output, input, tiling(output, false))];
    let mut bwd = vec![
        work(input, output, tiling(input, false)),
        work(input, output, tiling(input, true)),
    ];
    if c.ep > 1 {
        // HyperParallel's grouped path multiplies by the transposed weight view
        // (`gate_up_weight.transpose(1, 2)`, `down_weight.transpose(1, 2)`,
        // `npu_grouped_swiglu`), so the weight gradient reaches the parameter transposed; it
        // does not obey the parameter's layout and autograd's `AccumulateGrad` stores a
        // contiguous clone of it (`clone_obey_contract`, torch
        // `csrc/autograd/functions/accumulate_grad.h`): one copy of the local experts'
        // weight gradient after the weight-gradient GEMM.
        bwd.push(KernelWork::memory_bound(
            1,
            0,
            (2.0 * weights * eb).round() as u64,
        ));
    }
    if let Some([in_f, in_b, out_f, out_b]) = ep_regroup(c) {
        // The first projection reads the regrouped tokens (its gradient flows back through
        // the regroup last); the last one's output goes back to source order.
        if input == c.hidden {
            fwd.insert(0, in_f);
            bwd.push(in_b);
        }
        if output == c.hidden {
            fwd.push(out_f);
            bwd.insert(0, out_b);
        }
    }
    (fwd, bwd)
}

/// Expert-parallel regrouping on the busiest rank: the all-to-all-v delivers its routed
/// copies ordered by source rank, then by expert; a grouped GEMM needs them contiguous per
/// local expert, so eager runtimes sort them before the first expert GEMM and restore the
/// source order after the last one (Megatron-Core `MoEAlltoAllTokenDispatcher`:
/// `sort_chunks_by_idxs` when `num_local_experts > 1`, and the inverse before the combine;
/// torchtitan expert parallelism: `generate_permute_indices` then the inverse index). Nothing
/// with one local expert or without expert parallelism (the router's token permutation
/// already orders them). Returns the regroup's forward and backward, then the restore's:
/// the regroup runs the [`EagerRecipe::EpRegroup`] kernels over the copies (HyperParallel
/// `_local_swiglu_expert_forward`: `argsort` of the local expert ids, the gather, `bincount`
/// and the `cumsum` group list of the grouped GEMM), the restore one `index_put` each way
/// (`output[token_order] = sorted_output`; its backward gathers).
fn ep_regroup(c: &KernelCtx) -> Option<[KernelWork; 4]> {
    let r = c.routed.filter(|r| c.ep > 1 && r.local_experts > 1)?;
    let elems = r.busiest_copies * c.hidden as f64;
    let (mut rf, mut rb) = memory_bound(c, EagerRecipe::EpRegroup, elems, 0.0);
    // The restore reads and writes every copy once each way.
    let bytes = (elems * 2.0 * c.act_bytes as f64).round() as u64;
    Some([
        rf.pop()?,
        rb.pop()?,
        KernelWork::memory_bound(1, 0, bytes),
        KernelWork::memory_bound(1, 0, bytes),
    ])
}

/// The attention core: FLOPs of the profile (causal triangle), one fused kernel each way,
/// plus the cuDNN backend's backward helpers when the scenario runs it.
fn attention(
    op: &ComputeOp,
    c: &KernelCtx,
    heads: u64,
    head_dim: u64,
) -> (Vec<KernelWork>, Vec<KernelWork>) {
    let class = KernelClass::Attention {
        batch: c.micro_batch,
        seq: (c.seq_len / c.cp).max(1),
        heads: c.split(heads),
        head_dim,
    };
    let flops = op.fwd_flops_per_token * c.rank_tokens;
    let bytes = op.fwd_bytes_per_token * c.rank_tokens;
    let k = |f: f64, b: f64| KernelWork {
        class,
        count: 1,
        flops: f.round() as u64,
        hbm_bytes: b.round() as u64,
    };
    let mut bwd = vec![k(ATTENTION_BWD_FLOPS_FACTOR * flops, 2.0 * bytes)];
    if c.torch_cuda {
        bwd.extend(sdpa_cudnn_backward_helpers(c, heads, head_dim));
    }
    (vec![k(flops, bytes)], bwd)
}

/// The memory-bound kernels cuDNN's SDPA backward launches beside its flash kernel
/// (cudnn-frontend's SDPA backward graph, as the H200 kernel tables list them, one per layer
/// in every run: `compute_dot_do_o`, `convert_dq_to_16bits`, and two `fmha_reduce_head`
/// under GQA): the row sums `D = rowsum(dO * O)` (reads dO and O, writes one f32 per query
/// row and head), the dQ accumulator's conversion (reads f32, writes the activation dtype)
/// and, when query heads share key/value heads, the reduction of the per-query-head f32 dK
/// and dV onto the key/value heads (reads f32, writes the activation dtype).
fn sdpa_cudnn_backward_helpers(c: &KernelCtx, heads: u64, head_dim: u64) -> Vec<KernelWork> {
    let q_heads = c.split(heads);
    let kv_heads = c.split(c.kv_heads.max(1)).min(q_heads);
    // Every TP rank runs its heads over the whole CP-local sequence.
    let tokens = c.gemm_rows() as f64;
    let rows = tokens * q_heads as f64;
    let q_elems = rows * head_dim as f64;
    let kv_elems = tokens * (kv_heads * head_dim) as f64;
    let a = c.act_bytes as f64;
    let kernel = |bytes: f64| KernelWork::memory_bound(1, 0, bytes.round() as u64);
    let mut helpers = vec![
        kernel(2.0 * q_elems * a + rows * 4.0),
        kernel(q_elems * (4.0 + a)),
    ];
    if kv_heads < q_heads {
        let reduce = kernel(q_elems * 4.0 + kv_elems * a);
        helpers.extend([reduce, reduce]);
    }
    helpers
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_plan::model::ComputeKind;

    fn ctx(tp: u64) -> KernelCtx {
        KernelCtx {
            tp,
            cp: 1,
            micro_batch: 2,
            seq_len: 4096,
            rank_tokens: 8192.0 / tp as f64,
            act_bytes: 2,
            routed: Some(busiest_rank_load(8192.0 / tp as f64, 128, 8, 1, 1.0)),
            ep: 1,
            hidden: 2048,
            hf_grouped_mm: false,
            hf_eager_experts: false,
            torch_cuda: false,
            kv_heads: 4,
        }
    }

    fn op(shape: OpShape) -> ComputeOp {
        ComputeOp {
            name: "x".into(),
            kind: ComputeKind::Matmul,
            fwd_flops_per_token: 100.0,
            fwd_bytes_per_token: 10.0,
            shape,
        }
    }

    #[test]
    fn linear_backward_uses_the_gradient_shapes() {
        let (f, b) = op_kernels(
            &op(OpShape::Linear {
                input: 2048,
                output: 4096,
                row_parallel: false,
            }),
            &ctx(4),
        );
        assert_eq!(
            f[0].class,
            KernelClass::Gemm {
                m: 8192,
                n: 1024,
                k: 2048,
                batch: 1
            }
        );
        // dX: m = tokens, n = in, k = out; dW: m = out, n = in, k = tokens.
        assert_eq!(
            (b[0].class, b[1].class),
            (
                KernelClass::Gemm {
                    m: 8192,
                    n: 2048,
                    k: 1024,
                    batch: 1
                },
                KernelClass::Gemm {
                    m: 1024,
                    n: 2048,
                    k: 8192,
                    batch: 1
                }
            )
        );
        assert_eq!(b[0].flops + b[1].flops, 2 * f[0].flops);
        // Row-parallel splits the input features.
        let (f, _) = op_kernels(
            &op(OpShape::Linear {
                input: 4096,
                output: 2048,
                row_parallel: true,
            }),
            &ctx(4),
        );
        assert!(matches!(
            f[0].class,
            KernelClass::Gemm {
                n: 2048,
                k: 1024,
                ..
            }
        ));
    }

    #[test]
    fn memory_bound_ops_follow_the_recipe_table() {
        let (f, b) = op_kernels(
            &op(OpShape::MemoryBound {
                recipe: EagerRecipe::RmsNorm,
                width: 2048,
                routed: false,
            }),
            &ctx(1),
        );
        assert_eq!((f[0].count, b[0].count), (8, 16));
        assert_eq!(f[0].hbm_bytes, (8192.0 * 2048.0 * 36.0) as u64);
        assert_eq!(f[0].class, KernelClass::MemoryBound);
    }

    #[test]
    fn experts_are_grouped_by_tokens_per_expert_and_attention_backward_is_heavier() {
        let c = ctx(1);
        let (f, b) = op_kernels(
            &op(OpShape::Experts {
                experts: 128,
                top_k: 8,
                input: 2048,
                output: 1536,
            }),
            &c,
        );
        // 8,192 tokens x top-8 over 128 experts: 512 rows per expert.
        assert_eq!(
            f[0].class,
            KernelClass::GroupedGemm {
                groups: 128,
                tokens_per_group: 512,
                n: 1536,
                k: 2048,
                tiling: GroupedTiling::default(),
            }
        );
        assert_eq!(f[0].flops, 2 * 8192 * 8 * 2048 * 1536);
        assert_eq!(b.len(), 2);
        let (f, b) = op_kernels(
            &op(OpShape::Attention {
                heads: 32,
                qk_dim: 128,
                v_dim: 128,
            }),
            &c,
        );
        assert_eq!(b[1].flops, (2.5 * f[0].flops as f64) as u64);
        assert_eq!(
            (f[1].class, b[0].class),
            (KernelClass::MemoryBound, KernelClass::MemoryBound)
        );
        assert!(matches!(
            f[0].class,
            KernelClass::Attention {
                batch: 2,
                seq: 4096,
                heads: 32,
                head_dim: 128
            }
        ));
    }

    #[test]
    fn cudnn_sdpa_backward_adds_its_helpers_and_reduces_gqa_heads() {
        let attention = op(OpShape::Attention {
            heads: 32,
            qk_dim: 128,
            v_dim: 128,
        });
        let fused = op_kernels(&attention, &ctx(1)).1;
        let cudnn = |tp: u64, kv_heads: u64| {
            let c = KernelCtx {
                torch_cuda: true,
                kv_heads,
                ..ctx(tp)
            };
            op_kernels(&attention, &c).1
        };
        // Layout copy, flash backward, then dot(dO, O), the dQ conversion and two head
        // reductions under GQA (32 query heads on 4 key/value heads); none without GQA.
        let gqa = cudnn(1, 4);
        assert_eq!((fused.len(), gqa.len(), cudnn(1, 32).len()), (2, 6, 4));
        // (The layout copy is the same work, as a strided kernel on CUDA.)
        assert_eq!((gqa[0].hbm_bytes, gqa[1]), (fused[0].hbm_bytes, fused[1]));
        assert_eq!(gqa[0].class, KernelClass::StridedElementwise);
        // 2 x 4,096 tokens x 32 heads x 128: the f32 dQ accumulator read, bf16 written.
        let q_elems = 8192 * 32 * 128;
        assert_eq!(gqa[3].hbm_bytes, q_elems * 6);
        assert_eq!(gqa[4].hbm_bytes, q_elems * 4 + 8192 * 4 * 128 * 2);
        // TP splits the heads, not the sequence: half the bytes per rank.
        assert_eq!(cudnn(2, 4)[3].hbm_bytes, q_elems * 3);
    }

    /// Under `torch_cuda`, `torch._grouped_mm`'s tiling: the forward and dX launches pad
    /// each expert's rows, the dW launch runs tokens as its reduction; other libraries keep
    /// the dense rate.
    #[test]
    fn torch_cuda_experts_carry_grouped_mm_tiling() {
        let shape = op(OpShape::Experts {
            experts: 128,
            top_k: 8,
            input: 2048,
            output: 1536,
        });
        let tilings = |c: &KernelCtx| {
            let (f, b) = op_kernels(&shape, c);
            f.iter()
                .chain(&b)
                .map(|k| match k.class {
                    KernelClass::GroupedGemm { tiling, .. } => tiling,
                    _ => panic!("not grouped: {k:?}"),
                })
                .collect::<Vec<_>>()
        };
        let plain = ctx(1);
        assert!(tilings(&plain).iter().all(GroupedTiling::is_default));
        let cuda = KernelCtx {
            torch_cuda: true,
            ..ctx(1)
        };
        let t = tilings(&cuda);
        assert_eq!(t.len(), 3);
        assert_eq!((t[0].row_tile, t[0].weight_grad), (128, false));
        assert_eq!((t[1].row_tile, t[1].weight_grad), (128, false));
        assert!(t[2].weight_grad);
    }

    #[test]
    fn torch_cuda_splits_a_recipe_into_vectorized_and_strided_kernels() {
        let norm = op(OpShape::MemoryBound {
            recipe: EagerRecipe::RmsNorm,
            width: 2048,
            routed: false,
        });
        let fused = op_kernels(&norm, &ctx(1));
        let cuda = op_kernels(
            &norm,
            &KernelCtx {
                torch_cuda: true,
                ..ctx(1)
            },
        );
        // Elsewhere one memory-bound entry each way; on CUDA RMSNorm's upcast, `x * rsqrt`
        // and `weight * x` are strided (3 of 8 forward, 18 of 36 B per element).
        assert_eq!((fused.0.len(), fused.1.len()), (1, 1));
        let (f, b) = cuda;
        assert_eq!(
            (f[0].class, f[1].class),
            (KernelClass::MemoryBound, KernelClass::StridedElementwise)
        );
        assert_eq!((f[0].count, f[1].count), (5, 3));
        assert_eq!(f[0].hbm_bytes + f[1].hbm_bytes, fused.0[0].hbm_bytes);
        assert_eq!(f[1].hbm_bytes, 8192 * 2048 * 18);
        assert_eq!(f[0].flops, fused.0[0].flops);
        assert_eq!(b[0].count + b[1].count, fused.1[0].count);
        // Rotary embedding forward is strided throughout (q and k are transposed views).
        let rope = op(OpShape::MemoryBound {
            recipe: EagerRecipe::Rope,
            width: 4096,
            routed: false,
        });
        let c = KernelCtx {
            torch_cuda: true,
            ..ctx(1)
        };
        let f = op_kernels(&rope, &c).0;
        assert_eq!((f.len(), f[0].class), (1, KernelClass::StridedElementwise));
        assert!(f[0].flops > 0);
    }

    #[test]
    fn expert_parallel_regroups_received_tokens_around_the_expert_gemms() {
        let shape = |input, output| {
            op(OpShape::Experts {
                experts: 128,
                top_k: 8,
                input,
                output,
            })
        };
        let with_ep = |ep: u64, experts: u64| KernelCtx {
            ep,
            routed: Some(busiest_rank_load(2048.0, experts, 8, ep, 1.0)),
            ..ctx(4)
        };
        let gemm = |w: &KernelWork| matches!(w.class, KernelClass::GroupedGemm { .. });
        // EP 4, 32 local experts: regroup before gate_up, restore after down; backward
        // mirrors it.
        // (Backward also holds the weight gradient's layout clone after the dW GEMM, see
        // `expert_parallel_weight_gradients_are_cloned_and_the_activation_fused`.)
        let c = with_ep(4, 128);
        let (f, b) = op_kernels(&shape(2048, 1536), &c);
        assert_eq!((f.len(), f[0].count, gemm(&f[1])), (2, 4, true));
        assert_eq!((b.len(), b[3].count, gemm(&b[0])), (4, 2, true));
        let (f, b) = op_kernels(&shape(768, 2048), &c);
        assert_eq!((f.len(), gemm(&f[0]), f[1].count), (2, true, 1));
        assert_eq!((b.len(), b[0].count, gemm(&b[1])), (4, 1, true));
        let copies = c.routed.unwrap().busiest_copies;
        assert_eq!(f[1].hbm_bytes, (copies * 2048.0 * 4.0).round() as u64);
        // No expert parallelism, or one expert per rank: the router's permutation suffices.
        let (f, b) = op_kernels(&shape(2048, 1536), &with_ep(1, 128));
        assert_eq!((f.len(), b.len()), (1, 2));
        let (f, b) = op_kernels(&shape(2048, 1536), &with_ep(4, 4));
        assert_eq!((f.len(), b.len()), (1, 3));
    }

    #[test]
    fn expert_parallel_weight_gradients_are_cloned_and_the_activation_fused() {
        let with_ep = |ep: u64| KernelCtx {
            ep,
            routed: Some(busiest_rank_load(2048.0, 128, 8, ep, 1.0)),
            ..ctx(4)
        };
        let experts = op(OpShape::Experts {
            experts: 128,
            top_k: 8,
            input: 2048,
            output: 1536,
        });
        // EP 4: after the grouped dX and dW GEMMs, one copy of the 32 local experts'
        // transposed weight gradient (read and written once, bf16).
        let (_, b) = op_kernels(&experts, &with_ep(4));
        assert!(matches!(b[1].class, KernelClass::GroupedGemm { .. }));
        assert_eq!(
            (b[2].class, b[2].count, b[2].hbm_bytes),
            (KernelClass::MemoryBound, 1, 2 * 32 * 2048 * 1536 * 2)
        );
        // Without expert parallelism: the two gradient GEMMs only.
        let (_, b) = op_kernels(&experts, &with_ep(1));
        assert_eq!(b.len(), 2);
        // The routed activation: fused npu_swiglu (1 + 1) with EP, eager silu * up (2 + 3)
        // without; a dense (not routed) SwiGLU stays eager either way.
        let act = |routed| {
            op(OpShape::MemoryBound {
                recipe: EagerRecipe::SwiGlu,
                width: 768,
                routed,
            })
        };
        let counts = |(f, b): (Vec<KernelWork>, Vec<KernelWork>)| (f[0].count, b[0].count);
        assert_eq!(counts(op_kernels(&act(true), &with_ep(4))), (1, 1));
        assert_eq!(counts(op_kernels(&act(true), &with_ep(1))), (2, 3));
        assert_eq!(counts(op_kernels(&act(false), &with_ep(4))), (2, 3));
    }

    #[test]
    fn expert_parallel_runs_hyperparallel_dispatch_and_combine_bookkeeping() {
        // HyperParallel `ep_routed_forward` (ep > 1): the router's permutation becomes the
        // dispatch bookkeeping (11 kernels forward, 3 backward), the combine its weighted
        // `index_add_` (5 forward, 6 backward); without expert parallelism the HF-style
        // permutation and combine stay (3/2 and 3/4).
        let with_ep = |ep: u64| KernelCtx {
            ep,
            routed: Some(busiest_rank_load(2048.0, 128, 8, ep, 1.0)),
            ..ctx(4)
        };
        let router = op(OpShape::Router {
            hidden: 2048,
            experts: 128,
            top_k: 8,
        });
        let combine = op(OpShape::MemoryBound {
            recipe: EagerRecipe::ExpertCombine,
            width: 8 * 2048,
            routed: false,
        });
        let counts = |ws: &[KernelWork]| ws.iter().map(|w| w.count).collect::<Vec<_>>();
        let (f, b) = op_kernels(&router, &with_ep(4));
        // Gate GEMM, softmax/top-k, dispatch; backward in reverse.
        assert_eq!((counts(&f), counts(&b)), (vec![1, 6, 11], vec![3, 6, 1, 1]));
        let (f, b) = op_kernels(&router, &with_ep(1));
        assert_eq!((counts(&f), counts(&b)), (vec![1, 6, 3], vec![2, 6, 1, 1]));
        let (f, b) = op_kernels(&combine, &with_ep(4));
        assert_eq!((counts(&f), counts(&b)), (vec![5], vec![6]));
        let (f, b) = op_kernels(&combine, &with_ep(1));
        assert_eq!((counts(&f), counts(&b)), (vec![3], vec![4]));
        // The dispatch gathers every routed copy once (4 bytes per bf16 element: read + write).
        let (f, _) = op_kernels(&router, &with_ep(4));
        assert_eq!(f[2].hbm_bytes, (2048.0 * 8.0 * 2048.0 * 4.0) as u64);
    }
}
