//! Compute stages: the model's forward compute profile turned into per-rank, per-micro-batch
//! compute ops, cut where model-parallel collectives sit.
//!
//! - A stage is one piece of [`crate::model::ModelIr::compute_profile`]: the embedding, each
//!   decoder layer (MTP layers included), and the head (final norm, `lm_head`, loss).
//! - Every op becomes the device kernels an eager step launches for it, with their shapes
//!   (GEMMs, grouped expert GEMMs on the busiest EP rank, fused attention, memory-bound eager
//!   kernels): see [`super::kernels`] for the dimensions and backward rules and
//!   [`crate::model::EagerRecipe`] for the kernel-count table. A segment's kernel list keeps
//!   every projection a separate `Gemm` entry, in launch order.
//! - A layer covered by the recompute spec repeats its forward (and its forward collectives)
//!   just before its backward.
//! - Saved activations: half of the forward activation traffic (each op's output is saved for
//!   backward); a recomputed layer keeps only its input (`tokens * hidden * 2` bytes) and
//!   re-materializes the rest during recompute.

use super::kernels::{KernelCtx, op_kernels};
use super::parallel::{self, ParColl, ParDims, Side};
use super::validation;
use super::{StrategyError, StrategyOptions};
use crate::fsdp::FsdpPlan;
use crate::kernel::KernelWork;
use crate::model::{ComputeKind, LayerCompute};
use crate::planner::{BoundarySpec, ShardingPlan};
use crate::scenario::Scenario;

/// Kernel work of a compute segment: the kernels it launches, by cost class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Readable name (`layers.3` or `layers.3.self_attn` when the layer is cut).
    pub name: String,
    /// Forward kernels per micro-batch, in launch order.
    pub fwd: Vec<KernelWork>,
    /// Backward kernels per micro-batch, in launch order.
    pub bwd: Vec<KernelWork>,
    /// Extra CPU operator events of one forward of this segment in HyperParallel's
    /// validation mode (DTensor dispatch and boundary contract checks,
    /// [`super::validation`]); backward adds none.
    pub fwd_validation_events: u32,
}

impl Segment {
    /// Forward FLOPs per micro-batch.
    pub fn fwd_flops(&self) -> u64 {
        crate::kernel::totals(&self.fwd).0
    }
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
    fwd: Vec<KernelWork>,
    /// Backward kernels of each op, in forward op order (reversed when flushed).
    bwd: Vec<Vec<KernelWork>>,
    /// Validation-mode CPU events of the forward ([`Segment::fwd_validation_events`]).
    validation_events: u32,
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

/// Adds validation-mode events to the open segment, or keeps them for the next one.
fn add_events(acc: &mut Option<Acc>, pending: &mut u32, events: u32) {
    match acc {
        Some(a) => a.validation_events += events,
        None => *pending += events,
    }
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
        routed_imbalance: 1.0,
    };
    let rank_tokens = tokens as f64 / (tp * cp) as f64;
    let kctx = KernelCtx::new(scenario, opts, rank_tokens);
    let dims = ParDims {
        routed_imbalance: kctx.routed.map_or(1.0, |r| r.imbalance()),
        ..dims
    };
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
        let mut items: Vec<Item> = Vec::new();
        let mut acc: Option<Acc> = None;
        // Open boundaries, outermost first (a nested boundary sits inside its parent).
        let mut stack: Vec<&BoundarySpec> = Vec::new();
        // Validation-mode contract-check events not yet attached to a segment.
        let mut pending_events = 0u32;
        let flush = |acc: &mut Option<Acc>, items: &mut Vec<Item>| {
            if let Some(a) = acc.take()
                && !a.fwd.is_empty()
            {
                items.push(Item::Compute(Segment {
                    name: a.name,
                    fwd: a.fwd,
                    bwd: a.bwd.into_iter().rev().flatten().collect(),
                    fwd_validation_events: a.validation_events,
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
                add_events(
                    &mut acc,
                    &mut pending_events,
                    validation::out_check_events(top),
                );
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
                pending_events += validation::in_check_events(n);
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
                fwd: Vec::new(),
                bwd: Vec::new(),
                validation_events: 0,
            });
            let (f, b) = op_kernels(op, &kctx);
            a.validation_events +=
                std::mem::take(&mut pending_events) + validation::dispatch_events(&bs, op, cfg, &f);
            a.fwd.extend(f);
            a.bwd.push(b);
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
            add_events(
                &mut acc,
                &mut pending_events,
                validation::out_check_events(top),
            );
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
                    fwd_validation_events: 0,
                }),
            );
        }
        // Checks after the stage's last segment (a closing boundary's out_plan) belong to it.
        if let Some(Item::Compute(s)) = items
            .iter_mut()
            .rev()
            .find(|i| matches!(i, Item::Compute(_)))
        {
            s.fwd_validation_events += std::mem::take(&mut pending_events);
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
