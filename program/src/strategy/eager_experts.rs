//! transformers' `eager` routed experts (`[model] experts_implementation = "eager"`): the
//! Python loop of `Qwen3MoeExperts.forward` (transformers 5.17,
//! `models/qwen3_moe/modeling_qwen3_moe.py`, fused 3-D parameters `gate_up_proj [E, 2I, H]`
//! and `down_proj [E, H, I]`) as the kernels, host events, device -> host syncs and working
//! memory of one rank's layer. The census behind every count is
//! `tools/eager_experts_census_probe.py` (the real module under `torch.profiler`).
//!
//! Per layer, before the loop: `zeros_like(hidden_states)`, `one_hot(top_k_index, E)` (int64
//! zeros and a scatter), `permute`, `sum`, `greater`, `nonzero` of the hit experts (a
//! device -> host sync: the loop's trip count). Per hit expert, forward: `expert_idx ==
//! num_experts` read as a bool, `expert_mask[expert_idx]` (a 0-d index tensor is read back
//! as an int), `torch.where` (`nonzero`, which waits for its count), the hidden-state gather,
//! `gate_up_proj[expert_idx]` (read back), the gate/up GEMM, `silu`, `* up`,
//! `down_proj[expert_idx]` (read back), the down GEMM, the routing-weight gather, `*`,
//! `index_add_`: five syncs, nine kernels plus `nonzero`'s. Backward per hit expert: each
//! GEMM's data and weight gradient; `select_backward` of each 3-D parameter, which
//! materialises a zero tensor of the WHOLE parameter and copies the expert's slice in;
//! autograd's accumulation of those full-size gradients (`add_` of the whole parameter,
//! every expert after the first); the two index backwards (`zeros` of `[T, H]` and
//! `[T, top_k]`, `index_put_(accumulate=True)`) and their accumulations; `cat` of the chunk,
//! `silu_backward` and products, the `index_add_`'s `index_select`.
//!
//! Structure, not fitted figures: each GEMM runs at the GEMM table's rate of its real shape
//! (`rows_per_expert` rows, [`KernelClass::Gemm`] with `count` = experts hit); the
//! full-size gradient traffic is the parameter's bytes per expert. The layer's compute is
//! emitted as one op per hit expert ([`loop_pieces`]), as the loop issues it; the forward's
//! syncs ([`fwd_syncs`]) are host ops that wait for the piece before them (`super::emit`), so
//! the device drains at each and the forward runs host-then-device serial, expert by expert,
//! while the backward (no syncs) overlaps the host's issue of the next expert with the
//! device's work on the previous one.

use super::host_events::{self, PassEvents};
use super::routing::RoutedLoad;
use hpfsdp_plan::kernel::{KernelClass, KernelWork};
use hpfsdp_plan::model::{ComputeOp, EagerRecipe, ModelConfig, OpShape};

/// Kernels of `nonzero` over a 1-D tensor on CUDA (ATen `cuda/Nonzero.cu`): the count of
/// non-zero elements (a cub reduction), then the compaction of their indices (cub select:
/// its init and sweep kernels); the count's copy to the host between them is the sync.
pub const NONZERO_1D_KERNELS: u32 = 3;

/// Kernels of `nonzero` over a 2-D tensor (`torch.where(expert_mask[e])` on `[top_k, T]`):
/// [`NONZERO_1D_KERNELS`] plus the kernel that writes the flat indices out as coordinates.
pub const NONZERO_2D_KERNELS: u32 = 4;

/// Kernels of one `index_put_(accumulate=True)` with one index tensor on CUDA beyond its
/// `zeros` (a gather's backward: the hidden states' rows): ATen `cuda/Indexing.cu`'s
/// sort-based path, each call of which the grouped_mm run's kernel table
/// (`shared/calibration/h200/profiles/kernels-moe30b-4l-mbs1-grouped.csv`, three such calls
/// per layer) lists as `remainder`, `div_trunc`, `mul` of the linear index, `arange`, the
/// radix sort and `indexing_backward_kernel`. The grouped run sorts 32,768 keys (histogram,
/// exclusive sum and four onesweep passes); one expert's few hundred keys fit one tile, and
/// CUB sorts a single tile in one kernel (`DeviceRadixSortSingleTileKernel`): 6.
pub const INDEX_PUT_ACCUMULATE_KERNELS: u32 = 6;

/// [`INDEX_PUT_ACCUMULATE_KERNELS`] for two index tensors (the routing weights'
/// `top_k_weights[token_idx, top_k_pos, None]`): the linear index takes a `remainder` and a
/// `mul` per index tensor and an `add` (`computeLinearIndex`): 9.
pub const INDEX_PUT_ACCUMULATE_2D_KERNELS: u32 = 9;

/// Device -> host syncs per hit expert up to its gate/up GEMM: `expert_idx == num_experts`
/// read as a bool, `expert_mask[expert_idx]` and `gate_up_proj[expert_idx]` (a 0-d index
/// tensor read back as an int: `_local_scalar_dense`), and `torch.where`'s `nonzero`
/// (which copies its count to the host). With [`DOWN_SYNCS_PER_EXPERT`] the census's 4
/// `_local_scalar_dense` and 1 `nonzero` per expert.
pub const GATE_UP_SYNCS_PER_EXPERT: u32 = 4;

/// Device -> host syncs per hit expert before its down GEMM: `down_proj[expert_idx]`.
pub const DOWN_SYNCS_PER_EXPERT: u32 = 1;

/// Device -> host syncs per layer: `expert_hit`'s `nonzero` (the loop's trip count).
/// `one_hot`'s range check reads back twice on the CPU backend only (ATen `Onehot.cpp`: on
/// CUDA it relies on scatter's device assert).
pub const LAYER_SYNCS: u32 = 1;

/// Bytes of one `one_hot` element (int64).
const MASK_ELEM_BYTES: f64 = 8.0;

/// The loop on one rank: how many experts it visits and the rows each one gathers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EagerLoop {
    /// Experts hit by at least one routed copy (the loop's trip count).
    pub hits: u64,
    /// Rows each hit expert gathers (routed copies / hits).
    pub rows_per_expert: u64,
    /// Routed copies on the rank.
    pub copies: f64,
    /// Experts in the 3-D parameters (the rank's experts).
    pub experts: u64,
    /// Tokens on the rank (`T`).
    pub tokens: f64,
    /// Bytes per activation and gradient element.
    pub act_bytes: u64,
    /// Hidden size (`H`).
    pub hidden: u64,
}

impl EagerLoop {
    /// The loop over the rank's routed load `r`: `tokens` tokens of `hidden` features,
    /// `act_bytes` per activation element (`KernelCtx::eager_loop` builds it for a rank whose
    /// experts run the eager path).
    pub fn new(r: &RoutedLoad, tokens: f64, act_bytes: u64, hidden: u64) -> Self {
        let hits = experts_hit(r.busiest_copies, r.local_experts);
        Self {
            hits,
            rows_per_expert: (r.busiest_copies / hits as f64).round().max(1.0) as u64,
            copies: r.busiest_copies,
            experts: r.local_experts,
            tokens,
            act_bytes,
            hidden,
        }
    }

    fn eb(&self) -> f64 {
        self.act_bytes as f64
    }

    fn count(&self) -> u32 {
        u32::try_from(self.hits).unwrap_or(u32::MAX)
    }

    /// Bytes of one whole 3-D parameter `[E, output, input]` in the gradient dtype.
    pub fn param_bytes(&self, input: u64, output: u64) -> f64 {
        (self.experts * input * output) as f64 * self.eb()
    }
}

/// Experts that `copies` uniformly routed copies hit, in expectation: `E (1 - (1 - 1/E)^n)`,
/// rounded, at least 1 (all 128 of Qwen3-30B-A3B at 32,768 copies).
pub fn experts_hit(copies: f64, experts: u64) -> u64 {
    let e = experts.max(1) as f64;
    let hit = e * (1.0 - (1.0 - 1.0 / e).powf(copies.max(0.0)));
    (hit.round() as u64).clamp(1, experts.max(1))
}

fn kernel(class: KernelClass, count: u32, flops: u64, bytes: f64) -> KernelWork {
    KernelWork {
        class,
        count,
        flops,
        hbm_bytes: bytes.round().max(0.0) as u64,
    }
}

fn streaming(count: u32, bytes: f64) -> KernelWork {
    kernel(KernelClass::MemoryBound, count, 0, bytes)
}

fn indexed(count: u32, bytes: f64) -> KernelWork {
    kernel(KernelClass::IndexedElementwise, count, 0, bytes)
}

/// `hits` launches of one `[m, k] x [k, n]` GEMM (one per expert, its real shape).
fn gemms(l: &EagerLoop, m: u64, n: u64, k: u64) -> KernelWork {
    let one = KernelWork::gemm(m, n, k, 1, l.act_bytes);
    KernelWork {
        count: l.count(),
        flops: one.flops.saturating_mul(l.hits),
        hbm_bytes: one.hbm_bytes.saturating_mul(l.hits),
        ..one
    }
}

/// The router's mask work before the loop (replaces the token permutation): the output's
/// `zeros_like` `[T, H]`, `one_hot`'s int64 `[T, top_k, E]` zeros and scatter, the sum over
/// tokens and slots, `greater` and the hit experts' `nonzero`. Nothing runs backward (it
/// is under `torch.no_grad()`).
pub fn mask(l: &EagerLoop, top_k: u64) -> (Vec<KernelWork>, Vec<KernelWork>) {
    let mask_elems = l.tokens * (top_k * l.experts) as f64;
    let slots = l.tokens * top_k as f64;
    let fwd = vec![
        streaming(1, l.tokens * l.hidden as f64 * l.eb()),
        streaming(1, mask_elems * MASK_ELEM_BYTES),
        indexed(1, slots * 2.0 * MASK_ELEM_BYTES),
        streaming(1, mask_elems * MASK_ELEM_BYTES),
        streaming(1 + NONZERO_1D_KERNELS, 0.0),
    ];
    (fwd, Vec::new())
}

/// The full-size gradient of one 3-D parameter `[E, output, input]`, every hit expert:
/// `select_backward`'s zeros of the whole parameter and the copy of the expert's slice into
/// it, then autograd's in-place accumulation (`add_`: read both, write one) of every
/// expert's after the first.
fn full_size_grads(l: &EagerLoop, input: u64, output: u64) -> [KernelWork; 3] {
    let p = l.param_bytes(input, output);
    let h = l.hits as f64;
    let slice = (input * output) as f64 * l.eb();
    [
        streaming(l.count(), h * p),
        streaming(l.count(), h * 2.0 * slice),
        streaming(l.count().saturating_sub(1), (h - 1.0).max(0.0) * 3.0 * p),
    ]
}

/// The backward of a gather of `width`-wide rows out of a `[T, width]` tensor, every hit
/// expert: `zeros` of the whole source, `index_put_(accumulate=True)` of the expert's rows
/// (`put_kernels` launches), then the accumulation of every expert's gradient after the
/// first (`[T, width]` each).
fn gather_backward(l: &EagerLoop, width: u64, put_kernels: u32) -> [KernelWork; 3] {
    let h = l.hits as f64;
    let whole = l.tokens * width as f64 * l.eb();
    let rows = l.copies * width as f64 * l.eb();
    [
        streaming(l.count(), h * whole),
        indexed(l.count().saturating_mul(put_kernels), 3.0 * rows),
        streaming(
            l.count().saturating_sub(1),
            (h - 1.0).max(0.0) * 3.0 * whole,
        ),
    ]
}

/// One projection `input -> output` of the loop: the gate/up projection (`input` = hidden)
/// with the loop's test, `torch.where` and the hidden-state gather before its GEMMs, or the
/// down projection; backward the data and weight gradient GEMMs, the full-size parameter
/// gradients ([`full_size_grads`]) and, for gate/up, the chunk's `cat` and the gather's
/// backward.
pub fn projection(
    l: &EagerLoop,
    input: u64,
    output: u64,
    top_k: u64,
) -> (Vec<KernelWork>, Vec<KernelWork>) {
    let rows = l.rows_per_expert;
    let gate_up = input == l.hidden;
    let mut fwd = Vec::new();
    let mut bwd = Vec::new();
    if gate_up {
        let mask_row = l.tokens * top_k as f64 * MASK_ELEM_BYTES;
        fwd.push(streaming(
            l.count().saturating_mul(1 + NONZERO_2D_KERNELS),
            l.hits as f64 * mask_row,
        ));
        fwd.push(indexed(l.count(), 2.0 * l.copies * input as f64 * l.eb()));
        bwd.push(streaming(
            l.count(),
            2.0 * l.copies * output as f64 * l.eb(),
        ));
    }
    fwd.push(gemms(l, rows, output, input));
    bwd.push(gemms(l, rows, input, output));
    bwd.push(gemms(l, output, input, rows));
    bwd.extend(full_size_grads(l, input, output));
    if gate_up {
        bwd.extend(gather_backward(l, input, INDEX_PUT_ACCUMULATE_KERNELS));
    }
    (fwd, bwd)
}

/// The activation `silu(gate) * up` per hit expert: the [`EagerRecipe::SwiGlu`] kernels and
/// bytes over the routed copies, launched once per expert.
pub fn activation(l: &EagerLoop, width: u64, flops: u64) -> (Vec<KernelWork>, Vec<KernelWork>) {
    let elems = l.copies * width as f64;
    let scale = l.eb() / 2.0;
    let pass = |(kernels, bytes): (u32, f64), flops: u64| {
        vec![kernel(
            KernelClass::MemoryBound,
            kernels.saturating_mul(l.count()),
            flops,
            elems * bytes * scale,
        )]
    };
    (
        pass(EagerRecipe::SwiGlu.fwd(), flops),
        pass(EagerRecipe::SwiGlu.bwd(), 2 * flops),
    )
}

/// The loop's tail per hit expert (replaces the combine): the routing-weight gather, the
/// `[rows, H] x [rows, 1]` product and `index_add_` into the output; backward the
/// `index_add_`'s `index_select`, the product's two gradients and the weight gradient's
/// sum over `H`, and the routing-weight gather's backward (`zeros` of `[T, top_k]`, the
/// two-index `index_put_`, the accumulation).
pub fn combine(l: &EagerLoop, top_k: u64, flops: u64) -> (Vec<KernelWork>, Vec<KernelWork>) {
    let n = l.count();
    let rows = l.copies * l.hidden as f64 * l.eb();
    let fwd = vec![
        indexed(n, 2.0 * l.copies * l.eb()),
        kernel(KernelClass::IndexedElementwise, n, flops, 2.0 * rows),
        indexed(n, 3.0 * rows),
    ];
    let mut bwd = vec![
        indexed(n, 2.0 * rows),
        kernel(KernelClass::IndexedElementwise, n, 2 * flops, 2.0 * rows),
        indexed(n, 3.0 * rows),
        streaming(n, rows),
    ];
    bwd.extend(gather_backward(l, top_k, INDEX_PUT_ACCUMULATE_2D_KERNELS));
    (fwd, bwd)
}

/// Device -> host syncs of `op`'s forward on this rank's eager loop: the router's
/// [`LAYER_SYNCS`], [`GATE_UP_SYNCS_PER_EXPERT`] and [`DOWN_SYNCS_PER_EXPERT`] per hit
/// expert on the two projections; 0 off the eager path.
pub fn fwd_syncs(op: &ComputeOp, eager: Option<EagerLoop>) -> u32 {
    let Some(l) = eager else {
        return 0;
    };
    match op.shape {
        OpShape::Router { .. } => LAYER_SYNCS,
        OpShape::Experts { input, .. } if input == l.hidden => {
            l.count().saturating_mul(GATE_UP_SYNCS_PER_EXPERT)
        }
        OpShape::Experts { .. } => l.count().saturating_mul(DOWN_SYNCS_PER_EXPERT),
        _ => 0,
    }
}

/// Pieces the segment holding `op` is emitted as ([`super::compute::Segment::pieces`]):
/// one per hit expert for the loop's ops (router, projections, activation, combine) on the
/// eager path, 1 otherwise.
pub fn loop_pieces(op: &ComputeOp, eager: Option<EagerLoop>) -> u32 {
    let Some(l) = eager else {
        return 1;
    };
    match op.shape {
        OpShape::Router { .. } | OpShape::Experts { .. } => l.count(),
        OpShape::MemoryBound {
            recipe: EagerRecipe::SwiGlu,
            routed: true,
            ..
        }
        | OpShape::MemoryBound {
            recipe: EagerRecipe::ExpertCombine,
            ..
        } => l.count(),
        _ => 1,
    }
}

/// Production host CPU operator events of `op` on this rank: on the eager loop, the
/// census's events per hit expert of the op's part of the loop
/// ([`host_events::eager_experts`]) and, on the router, the loop's per-layer events on top
/// of the router's own; otherwise [`host_events::op_events`].
pub fn op_host_events(
    op: &ComputeOp,
    cfg: &ModelConfig,
    eager: Option<EagerLoop>,
    fwd: &[KernelWork],
    bwd: &[KernelWork],
) -> PassEvents {
    let base = || host_events::op_events(op, cfg, fwd, bwd);
    let Some(l) = eager else {
        return base();
    };
    match op.shape {
        OpShape::Router { .. } if host_events::census(op, cfg).is_some() => {
            let (r, layer) = (base(), host_events::EAGER_EXPERTS_PER_LAYER);
            PassEvents {
                fwd: r.fwd + layer.fwd,
                bwd: r.bwd + layer.bwd,
            }
        }
        _ => host_events::eager_experts(op, l.hidden, l.hits).unwrap_or_else(base),
    }
}

/// Working bytes of a decoder layer on the eager loop beyond what it saves, (forward,
/// backward): the int64 `one_hot` mask `[T, top_k, E]` alive through the forward loop, and
/// in backward one full-size `select_backward` gradient of the larger 3-D parameter alive
/// beside the accumulated one while it is added. `(0, 0)` for other layers.
pub fn working_bytes(ops: &[ComputeOp], eager: Option<EagerLoop>) -> (f64, f64) {
    let Some(l) = eager else {
        return (0.0, 0.0);
    };
    let mut fwd = 0.0f64;
    let mut bwd = 0.0f64;
    for op in ops {
        if let OpShape::Experts {
            top_k,
            input,
            output,
            ..
        } = op.shape
        {
            fwd = fwd.max(l.tokens * (top_k * l.experts) as f64 * MASK_ELEM_BYTES);
            bwd = bwd.max(l.param_bytes(input, output));
        }
    }
    (fwd, bwd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::kernels::KernelCtx;
    use crate::strategy::routing::busiest_rank_load;

    /// Qwen3-30B-A3B's expert shapes on one rank: `tokens` tokens, `experts` experts, top-8.
    fn ctx(tokens: f64, experts: u64, eager: bool) -> KernelCtx {
        KernelCtx {
            tp: 1,
            cp: 1,
            micro_batch: 1,
            seq_len: tokens as u64,
            rank_tokens: tokens,
            act_bytes: 2,
            routed: Some(busiest_rank_load(tokens, experts, 8, 1, 1.0)),
            ep: 1,
            hidden: 2048,
            hf_grouped_mm: false,
            hf_eager_experts: eager,
            torch_cuda: true,
            kv_heads: 4,
        }
    }

    fn launches(k: &[KernelWork]) -> u64 {
        k.iter().map(|k| u64::from(k.count)).sum()
    }

    /// (forward, backward) launches of the layer's loop: mask, both projections, the
    /// activation and the combine.
    fn layer_launches(l: &EagerLoop) -> (u64, u64) {
        let parts = [
            mask(l, 8),
            projection(l, 2048, 1536, 8),
            activation(l, 768, 0),
            projection(l, 768, 2048, 8),
            combine(l, 8, 0),
        ];
        parts.iter().fold((0, 0), |(f, b), (pf, pb)| {
            (f + launches(pf), b + launches(pb))
        })
    }

    #[test]
    fn expected_hits_saturate_with_many_copies_and_stay_in_range() {
        assert_eq!(experts_hit(32768.0, 128), 128);
        assert_eq!(experts_hit(1.0, 128), 1);
        assert_eq!(experts_hit(0.0, 8), 1);
        // 16 copies over 64 experts hit about 14 distinct experts.
        assert_eq!(experts_hit(16.0, 64), 14);
    }

    #[test]
    fn only_the_eager_choice_builds_a_loop() {
        assert!(ctx(4096.0, 128, false).eager_loop().is_none());
        let l = ctx(4096.0, 128, true).eager_loop().unwrap();
        assert_eq!((l.hits, l.rows_per_expert, l.experts), (128, 256, 128));
    }

    #[test]
    fn launches_per_hit_expert_follow_the_census() {
        // All experts hit in both: the difference of 64 experts is 64 loop iterations.
        let a = ctx(4096.0, 64, true).eager_loop().unwrap();
        let b = ctx(4096.0, 128, true).eager_loop().unwrap();
        assert_eq!((a.hits, b.hits), (64, 128));
        let ((fa, ba), (fb, bb)) = (layer_launches(&a), layer_launches(&b));
        // Forward per expert: eq, nonzero (4), gather, 2 GEMMs, silu, mul, weight gather,
        // mul, index_add_ = 13; per layer zeros_like, one_hot (2), sum, gt, nonzero (3).
        assert_eq!((fb - fa) / 64, 13);
        assert_eq!(fb - 13 * 128, 8);
        // Backward per expert: 4 GEMMs, 2 select_backward zeros + 2 slice copies + 2
        // accumulations, cat, the hidden gather's zeros + index_put_ (6) + accumulation,
        // silu_backward + 2 products, index_select, 2 products + sum, the weights' zeros +
        // two-index index_put_ (9) + accumulation = 37; the first expert accumulates nothing
        // (4 tensors).
        assert_eq!((bb - ba) / 64, 37);
        assert_eq!(37 * 128 - bb, 4);
    }

    #[test]
    fn gemms_run_per_expert_at_their_real_shape() {
        let l = ctx(4096.0, 128, true).eager_loop().unwrap();
        let (fwd, bwd) = projection(&l, 2048, 1536, 8);
        let gemm = fwd.last().unwrap();
        assert_eq!(
            gemm.class,
            KernelClass::Gemm {
                m: 256,
                n: 1536,
                k: 2048,
                batch: 1
            }
        );
        assert_eq!(gemm.count, 128);
        assert_eq!(gemm.flops, 2 * 32768 * 2048 * 1536);
        let shapes: Vec<_> = bwd
            .iter()
            .filter(|k| matches!(k.class, KernelClass::Gemm { .. }))
            .map(|k| (k.class, k.count))
            .collect();
        let g = |m, n, k| KernelClass::Gemm { m, n, k, batch: 1 };
        assert_eq!(
            shapes,
            vec![(g(256, 2048, 1536), 128), (g(1536, 2048, 256), 128)]
        );
    }

    #[test]
    fn backward_streams_the_whole_parameter_per_expert() {
        let l = ctx(4096.0, 128, true).eager_loop().unwrap();
        // gate_up_proj [128, 1536, 2048] in bf16: 805 MB; every expert writes a zero copy of
        // it and all but the first add one into the accumulated gradient (read 2, write 1).
        let p = 128.0 * 1536.0 * 2048.0 * 2.0;
        assert_eq!(l.param_bytes(2048, 1536), p);
        let [zeros, slices, adds] = full_size_grads(&l, 2048, 1536);
        assert_eq!((zeros.count, slices.count, adds.count), (128, 128, 127));
        assert_eq!(zeros.hbm_bytes, (128.0 * p) as u64);
        assert_eq!(slices.hbm_bytes, (2.0 * p) as u64);
        assert_eq!(adds.hbm_bytes, (127.0 * 3.0 * p) as u64);
        let (_, bwd) = projection(&l, 2048, 1536, 8);
        let total: u64 = bwd.iter().map(|k| k.hbm_bytes).sum();
        assert!(total as f64 > 4.0 * 127.0 * p, "{total}");
        // The backward transient is one such gradient beside the accumulated one.
        let ops = [ComputeOp {
            name: "layers.0.mlp.experts.gate_up_proj".into(),
            kind: hpfsdp_plan::model::ComputeKind::ExpertMatmul,
            fwd_flops_per_token: 0.0,
            fwd_bytes_per_token: 0.0,
            shape: OpShape::Experts {
                experts: 128,
                top_k: 8,
                input: 2048,
                output: 1536,
            },
        }];
        let c = ctx(4096.0, 128, true);
        assert_eq!(
            working_bytes(&ops, c.eager_loop()),
            (4096.0 * 8.0 * 128.0 * 8.0, p)
        );
        assert_eq!(
            working_bytes(&ops, ctx(4096.0, 128, false).eager_loop()),
            (0.0, 0.0)
        );
    }

    #[test]
    fn forward_syncs_per_layer_and_per_hit_expert() {
        let c = ctx(4096.0, 128, true).eager_loop();
        let op = |shape| ComputeOp {
            name: "x".into(),
            kind: hpfsdp_plan::model::ComputeKind::ExpertMatmul,
            fwd_flops_per_token: 0.0,
            fwd_bytes_per_token: 0.0,
            shape,
        };
        let experts = |input, output| {
            op(OpShape::Experts {
                experts: 128,
                top_k: 8,
                input,
                output,
            })
        };
        let router = op(OpShape::Router {
            hidden: 2048,
            experts: 128,
            top_k: 8,
        });
        assert_eq!(fwd_syncs(&router, c), 1);
        assert_eq!(fwd_syncs(&experts(2048, 1536), c), 4 * 128);
        assert_eq!(fwd_syncs(&experts(768, 2048), c), 128);
        assert_eq!(
            fwd_syncs(&experts(2048, 1536), ctx(4096.0, 128, false).eager_loop()),
            0
        );
    }
}
