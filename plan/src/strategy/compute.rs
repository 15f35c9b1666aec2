//! Compute stages: the model's forward compute profile turned into per-rank, per-micro-batch
//! compute ops, cut where model-parallel collectives sit.
//!
//! - A stage is one piece of [`crate::model::ModelIr::compute_profile`]: the embedding, each
//!   decoder layer (MTP layers included), and the head (final norm, `lm_head`, loss).
//! - Each rank computes `micro_batch * seq_len / (cp * tp)` tokens' worth of every op per
//!   micro-batch (TP and CP split the work; MoE counts only activated experts, as the profile
//!   does; the router and norms are counted split too, a small overestimate of the saving).
//! - Backward costs 2x forward FLOPs, 2x HBM bytes and 2x kernels (data and weight gradients).
//!   A layer covered by the recompute spec repeats its forward (and its forward collectives)
//!   just before its backward.
//! - HBM bytes are the profile's activation bytes plus one read of the stage's local (gathered)
//!   weights in forward.
//! - Saved activations: half of the forward activation traffic (each op's output is saved for
//!   backward); a recomputed layer keeps only its input (`tokens * hidden * 2` bytes) and
//!   re-materializes the rest during recompute.

use super::parallel::{self, ParColl, ParDims, Side};
use super::{StrategyError, StrategyOptions};
use crate::fsdp::FsdpPlan;
use crate::kernel::KernelWork;
use crate::model::{ComputeKind, ComputeOp, LayerCompute};
use crate::planner::{BoundarySpec, ShardingPlan};
use crate::program::ComputeWork;
use crate::scenario::Scenario;

/// Forward kernels of one profile op (an eager PyTorch-style count).
///
/// - embedding lookup, dense GEMM, grouped expert GEMM, fused flash attention: 1 each;
/// - RMSNorm: 4 (square-mean, rsqrt, scale, weight multiply);
/// - RoPE: 6 (q and k: multiply, rotate-half, multiply-add);
/// - SwiGLU activation: 2 (silu, multiply); residual add: 1;
/// - MoE top-k combine: 3 (weight multiply, scatter-add, sum);
/// - router: 8 (gate GEMM, softmax, top-k, renormalize, token sort/permute/unpermute indexing);
/// - loss: 4 (log-softmax, gather, negate, mean).
pub fn forward_kernels(op: &ComputeOp) -> u32 {
    match op.kind {
        ComputeKind::Embedding
        | ComputeKind::Matmul
        | ComputeKind::ExpertMatmul
        | ComputeKind::Attention => 1,
        ComputeKind::Norm => 4,
        ComputeKind::Router => 8,
        ComputeKind::Loss => 4,
        ComputeKind::Elementwise => {
            if op.name.ends_with("rotary_emb") {
                6
            } else if op.name.ends_with("act_fn") {
                2
            } else if op.name.ends_with("combine") {
                3
            } else {
                1
            }
        }
    }
}

/// Kernel work of a compute segment: the kernels it launches, by cost class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Readable name (`layers.3` or `layers.3.self_attn` when the layer is cut).
    pub name: String,
    /// Forward kernels per micro-batch, in launch order.
    pub fwd: Vec<KernelWork>,
    /// Backward kernels per micro-batch, in launch order.
    pub bwd: Vec<KernelWork>,
}

impl Segment {
    /// Forward FLOPs per micro-batch.
    pub fn fwd_flops(&self) -> u64 {
        crate::kernel::totals(&self.fwd).0
    }
}

/// Transitional: one kernel entry standing for the totals of `work` (the simulator costs it
/// exactly like the old single roofline).
fn lump(work: ComputeWork) -> Vec<KernelWork> {
    vec![KernelWork::memory_bound(
        work.kernels,
        work.flops,
        work.hbm_bytes,
    )]
}

/// One step of a stage: compute, or a model-parallel collective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// Kernels on the compute stream.
    Compute(Segment),
    /// A TP/CP/EP collective.
    Coll(ParColl),
}

/// One piece of the model in forward order, per rank and micro-batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Readable name (`embed_tokens`, `layers.3`, `lm_head`).
    pub name: String,
    /// Decoder layer, if any.
    pub layer: Option<usize>,
    /// Compute segments and collectives in forward order.
    pub items: Vec<Item>,
    /// Whether backward recomputes the forward.
    pub recompute: bool,
    /// Activation bytes held from forward to backward.
    pub saved_bytes: u64,
    /// Activation bytes of a full forward (what recompute re-materializes).
    pub full_act_bytes: u64,
}

impl Stage {
    /// Forward FLOPs of the stage per micro-batch on one rank.
    pub fn fwd_flops(&self) -> u64 {
        self.items
            .iter()
            .map(|i| match i {
                Item::Compute(s) => s.fwd_flops(),
                Item::Coll(_) => 0,
            })
            .sum()
    }
}

struct Acc {
    name: String,
    flops: f64,
    bytes: f64,
    kernels: u32,
}

fn boundary_of<'a>(bs: &'a [&'a BoundarySpec], op: &str) -> Option<&'a BoundarySpec> {
    bs.iter()
        .filter(|b| {
            op == b.module
                || (op.len() > b.module.len()
                    && op.starts_with(&b.module)
                    && op.as_bytes()[b.module.len()] == b'.')
        })
        .max_by_key(|b| b.module.len())
        .copied()
}

/// True when boundary `outer` is `inner` or one of its ancestors.
fn contains(outer: &BoundarySpec, inner: &BoundarySpec) -> bool {
    inner.module == outer.module
        || (inner.module.len() > outer.module.len()
            && inner.module.starts_with(&outer.module)
            && inner.module.as_bytes()[outer.module.len()] == b'.')
}

fn short(name: &str) -> &str {
    name.strip_prefix("model.").unwrap_or(name)
}

/// Builds the stages of a scenario and the stage of every FSDP unit.
pub(crate) fn build_stages(
    scenario: &Scenario,
    plan: &ShardingPlan,
    fsdp: &FsdpPlan,
    opts: &StrategyOptions,
    sequence_parallel: bool,
) -> Result<(Vec<Stage>, Vec<usize>), StrategyError> {
    let cfg = &scenario.model.config;
    let m = &scenario.file.mesh;
    let tp = m.tp.max(1) as u64;
    let cp = m.cp.max(1) as u64;
    let tokens = opts.micro_batch * opts.seq_len;
    let kv_width = match &cfg.mla {
        Some(mla) => mla.kv_lora_rank + mla.qk_rope_head_dim,
        None => 2 * cfg.num_key_value_heads * cfg.head_dim,
    };
    let dims = ParDims {
        tp,
        cp,
        ep: m.ep.max(1) as u64,
        sequence_parallel: sequence_parallel && tp > 1,
        tokens,
        hidden: cfg.hidden_size,
        vocab: cfg.vocab_size,
        experts: cfg.moe.as_ref().map_or(0, |x| x.num_experts),
        top_k: cfg.moe.as_ref().map_or(0, |x| x.experts_per_token),
        kv_width,
        act_wire_bytes: opts.param_dtype.bytes(),
    };
    let rank_tokens = tokens as f64 / (tp * cp) as f64;
    let profile: Vec<LayerCompute> = scenario.model.compute_profile(opts.seq_len);

    // Unit -> stage.
    let mut unit_stage = Vec::with_capacity(fsdp.units.len());
    for u in &fsdp.units {
        let s = match u.layer {
            Some(l) => profile.iter().position(|p| p.layer == Some(l)),
            None if u.name == "model.embed_tokens" => {
                profile.iter().position(|p| p.name == "model.embed_tokens")
            }
            None => profile.iter().position(|p| p.name == "lm_head"),
        };
        let s = s.ok_or_else(|| StrategyError::PlanMismatch {
            detail: format!("FSDP unit '{}' has no compute stage in the model", u.name),
        })?;
        unit_stage.push(s);
    }

    // Local weight bytes per stage (one EP class: every class holds the same sizes).
    let mut weight_bytes = vec![0u64; profile.len()];
    for (pp, fp) in plan.params.iter().filter(|p| p.trainable).zip(&fsdp.params) {
        if pp.ep_owner.is_some_and(|o| o != 0) {
            continue;
        }
        if let Some(&s) = unit_stage.get(fp.unit) {
            let numel: u64 = fp.plan_local_shape.iter().product();
            weight_bytes[s] += numel * opts.param_dtype.bytes();
        }
    }

    let mut stages = Vec::with_capacity(profile.len());
    for (si, piece) in profile.iter().enumerate() {
        let prefix = &piece.name;
        let bs: Vec<&BoundarySpec> = plan
            .boundaries
            .iter()
            .filter(|b| match piece.layer {
                Some(_) => b.module.starts_with(&format!("{prefix}.")),
                None if prefix == "model.embed_tokens" => b.module == "model.embed_tokens",
                None => !b.module.starts_with("model.layers.") && b.module != "model.embed_tokens",
            })
            .collect();
        let has_local_map = bs.iter().any(|b| b.flags.use_local_map);
        let stage_name = short(prefix).to_string();
        let total_flops: f64 = piece.fwd_flops_per_token().max(1.0);
        let mut items: Vec<Item> = Vec::new();
        let mut acc: Option<Acc> = None;
        // Open boundaries, outermost first (a nested boundary sits inside its parent).
        let mut stack: Vec<&BoundarySpec> = Vec::new();
        let flush = |acc: &mut Option<Acc>, items: &mut Vec<Item>| {
            if let Some(a) = acc.take() {
                let w = weight_bytes[si] as f64 * (a.flops / total_flops);
                let fwd = ComputeWork {
                    flops: (a.flops * rank_tokens).round() as u64,
                    hbm_bytes: (a.bytes * rank_tokens + w).round() as u64,
                    kernels: a.kernels.max(1),
                    mix: None,
                };
                items.push(Item::Compute(Segment {
                    name: a.name,
                    fwd: lump(fwd),
                    bwd: lump(ComputeWork {
                        flops: 2 * fwd.flops,
                        hbm_bytes: 2 * fwd.hbm_bytes,
                        kernels: 2 * fwd.kernels,
                        mix: None,
                    }),
                }));
            }
        };
        let push_colls = |colls: Vec<ParColl>, acc: &mut Option<Acc>, items: &mut Vec<Item>| {
            if colls.is_empty() {
                return;
            }
            flush(acc, items);
            items.extend(colls.into_iter().map(Item::Coll));
        };
        for op in &piece.ops {
            let b = boundary_of(&bs, &op.name);
            // Close the boundaries that do not contain this op's boundary.
            while let Some(&top) = stack.last() {
                if b.is_some_and(|b| contains(top, b)) {
                    break;
                }
                stack.pop();
                let colls = match stack.last() {
                    Some(parent) => parallel::nested_collectives(top, parent, Side::Out, &dims),
                    None => parallel::boundary_collectives(top, Side::Out, &dims),
                };
                push_colls(colls, &mut acc, &mut items);
            }
            if let Some(n) = b
                && stack.last().is_none_or(|t| t.module != n.module)
            {
                let mut colls = match stack.last() {
                    Some(parent) => parallel::nested_collectives(n, parent, Side::In, &dims),
                    None => parallel::boundary_collectives(n, Side::In, &dims),
                };
                colls.extend(parallel::cp_attention(n, &dims));
                push_colls(colls, &mut acc, &mut items);
                stack.push(n);
            }
            if has_local_map && op.name.ends_with(".combine") {
                let module = op.name.trim_end_matches(".combine");
                let module = module.strip_suffix(".experts").unwrap_or(module);
                push_colls(
                    parallel::ep_exchange(module, "combine", &dims),
                    &mut acc,
                    &mut items,
                );
            }
            let a = acc.get_or_insert_with(|| Acc {
                name: match (b, items.is_empty()) {
                    (_, true) => stage_name.clone(),
                    (Some(b), false) => short(&b.module).to_string(),
                    (None, false) => short(&op.name).to_string(),
                },
                flops: 0.0,
                bytes: 0.0,
                kernels: 0,
            });
            a.flops += op.fwd_flops_per_token;
            a.bytes += op.fwd_bytes_per_token;
            a.kernels += forward_kernels(op);
            if has_local_map && op.kind == ComputeKind::Router {
                let module = op.name.strip_suffix(".gate").unwrap_or(&op.name);
                push_colls(
                    parallel::ep_exchange(module, "dispatch", &dims),
                    &mut acc,
                    &mut items,
                );
            }
        }
        while let Some(top) = stack.pop() {
            let colls = match stack.last() {
                Some(parent) => parallel::nested_collectives(top, parent, Side::Out, &dims),
                None => parallel::boundary_collectives(top, Side::Out, &dims),
            };
            push_colls(colls, &mut acc, &mut items);
        }
        flush(&mut acc, &mut items);
        if !items.iter().any(|i| matches!(i, Item::Compute(_))) {
            // Every stage has at least one compute op to hang memory effects on.
            items.insert(
                0,
                Item::Compute(Segment {
                    name: stage_name.clone(),
                    fwd: vec![KernelWork::memory_bound(1, 0, weight_bytes[si])],
                    bwd: vec![KernelWork::memory_bound(2, 0, 2 * weight_bytes[si])],
                }),
            );
        }
        let recompute = piece.layer.is_some_and(|l| scenario.recompute.covers(l));
        let full_act_bytes = (piece.fwd_bytes_per_token() * rank_tokens / 2.0).round() as u64;
        let ckpt = (cfg.hidden_size as f64 * 2.0 * rank_tokens).round() as u64;
        stages.push(Stage {
            name: stage_name,
            layer: piece.layer,
            items,
            recompute,
            saved_bytes: if recompute {
                ckpt.min(full_act_bytes)
            } else {
                full_act_bytes
            },
            full_act_bytes,
        });
    }
    Ok((stages, unit_stage))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, kind: ComputeKind) -> ComputeOp {
        ComputeOp {
            name: name.into(),
            kind,
            fwd_flops_per_token: 1.0,
            fwd_bytes_per_token: 1.0,
        }
    }

    #[test]
    fn kernel_counts_follow_the_documented_table() {
        assert_eq!(forward_kernels(&op("a.q_proj", ComputeKind::Matmul)), 1);
        assert_eq!(
            forward_kernels(&op("a.input_layernorm", ComputeKind::Norm)),
            4
        );
        assert_eq!(
            forward_kernels(&op("a.rotary_emb", ComputeKind::Elementwise)),
            6
        );
        assert_eq!(
            forward_kernels(&op("a.mlp.act_fn", ComputeKind::Elementwise)),
            2
        );
        assert_eq!(
            forward_kernels(&op("a.attn_residual", ComputeKind::Elementwise)),
            1
        );
        assert_eq!(forward_kernels(&op("a.mlp.gate", ComputeKind::Router)), 8);
    }
}
