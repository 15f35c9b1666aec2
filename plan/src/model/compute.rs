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

use super::op_shape::{EagerRecipe, OpShape};
use super::{ComputeKind, ComputeOp, LayerCompute, ModelIr};

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
    use super::super::op_shape::{RMSNORM_BWD_KERNELS, ROPE_BWD_KERNELS};
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
