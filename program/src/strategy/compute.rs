//! Compute stages: the model's forward compute profile turned into per-rank, per-micro-batch
//! compute ops, cut where model-parallel collectives sit.
//!
//! - A stage is one piece of [`hpfsdp_plan::model::ModelIr::compute_profile`]: the embedding, each
//!   decoder layer (MTP layers included), and the head (final norm, `lm_head`, loss).
//! - Every op becomes the device kernels an eager step launches for it, with their shapes
//!   (GEMMs, grouped expert GEMMs on the busiest EP rank, fused attention, memory-bound eager
//!   kernels): see [`super::kernels`] for the dimensions and backward rules and
//!   [`hpfsdp_plan::model::EagerRecipe`] for the kernel-count table. A segment's kernel list keeps
//!   every projection a separate `Gemm` entry, in launch order.
//! - A layer covered by the recompute spec repeats its forward (and its forward collectives)
//!   just before its backward.
//! - Saved activations: what autograd keeps in the real modules ([`super::saved_activations`]);
//!   a recomputed layer keeps only its input and re-materializes the rest during recompute.
//! - Strategy TP lowering on top of the plan's boundary collectives: Megatron-LM's
//!   sequence-parallel column-parallel linears gather their input again in backward
//!   ([`super::megatron_sp`]), and a vocab-parallel loss (Megatron-LM always, HyperParallel
//!   with `loss_parallel`) all-reduces per-token scalars instead of gathering the logits
//!   ([`super::vocab_parallel_loss`]).

use super::eager_experts;
use super::host_events::{self, PassEvents};
use super::kernels::{KernelCtx, op_kernels};
use super::parallel::{self, ParColl, ParDims, Side};
use super::saved_activations;
use super::validation;
use super::{StrategyError, StrategyKind, StrategyOptions};
use super::{megatron_sp, vocab_parallel_loss};
use hpfsdp_plan::fsdp::FsdpPlan;
use hpfsdp_plan::kernel::KernelWork;
use hpfsdp_plan::model::{ComputeKind, ComputeOp, LayerCompute, ModelConfig};
use hpfsdp_plan::planner::boundary::BoundaryType;
use hpfsdp_plan::planner::{BoundarySpec, ShardingPlan};
use hpfsdp_plan::scenario::Scenario;

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
    /// Production host CPU operator events of one forward of this segment (both modes;
    /// [`super::host_events`]); a recompute re-runs them.
    pub fwd_host_events: u32,
    /// Production host CPU operator events of one backward of this segment.
    pub bwd_host_events: u32,
    /// Device -> host synchronisations of one forward of this segment (transformers'
    /// `eager` experts loop, [`super::eager_experts::fwd_syncs`]); a recompute repeats them.
    pub fwd_d2h_syncs: u32,
    /// Ops the segment is emitted as in each pass (1: one op). transformers' eager experts
    /// loop issues its work expert by expert: one piece per hit expert
    /// ([`super::eager_experts::loop_pieces`]), so the device starts on the first expert
    /// while the host issues the next ones, and the forward's syncs fall between pieces.
    pub pieces: u32,
}

impl Segment {
    /// Forward FLOPs per micro-batch.
    pub fn fwd_flops(&self) -> u64 {
        hpfsdp_plan::kernel::totals(&self.fwd).0
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
    /// Working bytes alive during the stage's last forward op beyond what it saves (the
    /// head's logits and their f32 upcast, [`saved_activations::head_working_bytes`]).
    pub fwd_working_bytes: u64,
    /// Working bytes alive during the stage's first backward op (the loss's gradients).
    pub bwd_working_bytes: u64,
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

/// The compute segment being filled: consecutive ops with no collective between them.
struct OpenSegment {
    name: String,
    fwd: Vec<KernelWork>,
    /// Backward kernels of each op, in forward op order (reversed when closed).
    bwd: Vec<Vec<KernelWork>>,
    /// Validation-mode CPU events of the forward ([`Segment::fwd_validation_events`]).
    validation_events: u32,
    /// Production host events of the forward and backward ([`Segment::fwd_host_events`]).
    host_events: PassEvents,
    /// Device -> host syncs of the forward ([`Segment::fwd_d2h_syncs`]).
    d2h_syncs: u32,
    /// Ops the segment is emitted as ([`Segment::pieces`]).
    pieces: u32,
}

impl OpenSegment {
    /// A segment with no op yet.
    fn named(name: String) -> Self {
        OpenSegment {
            name,
            fwd: Vec::new(),
            bwd: Vec::new(),
            validation_events: 0,
            host_events: PassEvents::default(),
            d2h_syncs: 0,
            pieces: 1,
        }
    }

    /// The finished segment (`None` when it launches no forward kernel): backward kernels
    /// run in reverse op order.
    fn close(self) -> Option<Segment> {
        (!self.fwd.is_empty()).then(|| Segment {
            name: self.name,
            fwd: self.fwd,
            bwd: self.bwd.into_iter().rev().flatten().collect(),
            fwd_validation_events: self.validation_events,
            fwd_host_events: self.host_events.fwd,
            bwd_host_events: self.host_events.bwd,
            fwd_d2h_syncs: self.d2h_syncs,
            pieces: self.pieces,
        })
    }
}

/// The innermost boundary of `bs` that holds op `op` (its module or an ancestor module).
fn boundary_of<'b>(bs: &[&'b BoundarySpec], op: &str) -> Option<&'b BoundarySpec> {
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

/// A module name without the `model.` prefix, as stages and segments are named.
fn short(name: &str) -> &str {
    name.strip_prefix("model.").unwrap_or(name)
}

/// What every stage of one scenario shares: the sizes of its model-parallel collectives,
/// the kernel shapes of its ops and the tokens one rank computes per micro-batch.
struct StageEnv<'s> {
    scenario: &'s Scenario,
    /// Sizes of the TP/CP/EP collectives at the boundaries.
    dims: ParDims,
    /// Shapes of each op's kernels on one rank.
    kernels: KernelCtx,
    /// What the rank's saved activations depend on ([`saved_activations`]).
    saved: saved_activations::SavedLayout,
    /// How the strategy lowers TP around the linears and the loss.
    tp_lowering: TpLowering,
}

/// Strategy-specific TP lowering on top of the plan's boundary collectives.
#[derive(Debug, Clone, Copy)]
struct TpLowering {
    /// The strategy whose stages these are.
    kind: StrategyKind,
    /// Column-parallel linears keep their sequence-parallel input un-gathered and gather
    /// it again in backward ([`megatron_sp`]).
    sp_regather: bool,
    /// The loss runs on vocabulary-sharded logits ([`vocab_parallel_loss`]).
    vocab_parallel_loss: bool,
}

impl<'s> StageEnv<'s> {
    /// The environment of `scenario`'s ranks under `opts`; `sequence_parallel` asks for
    /// sequence-parallel TP regions (effective only with TP > 1).
    fn new(scenario: &'s Scenario, opts: &StrategyOptions, sequence_parallel: bool) -> Self {
        let cfg = &scenario.model.config;
        let m = &scenario.file.mesh;
        let tp = m.tp.max(1) as u64;
        let cp = m.cp.max(1) as u64;
        let tokens = opts.micro_batch * opts.seq_len;
        let kv_width = match &cfg.mla {
            Some(mla) => mla.kv_lora_rank + mla.qk_rope_head_dim,
            None => 2 * cfg.num_key_value_heads * cfg.head_dim,
        };
        let rank_tokens = tokens as f64 / (tp * cp) as f64;
        let kernels = KernelCtx::new(scenario, opts, rank_tokens);
        let sequence_parallel = sequence_parallel && tp > 1;
        let tp_lowering = TpLowering {
            kind: opts.kind,
            sp_regather: megatron_sp::saves_local_input(opts.kind, sequence_parallel),
            vocab_parallel_loss: vocab_parallel_loss::runs(
                opts.kind,
                scenario.file.train.loss_parallel,
            ),
        };
        let sequence_tokens = tokens as f64 / cp as f64;
        let dims = ParDims {
            tp,
            cp,
            ep: m.ep.max(1) as u64,
            sequence_parallel,
            tokens,
            hidden: cfg.hidden_size,
            vocab: cfg.vocab_size,
            experts: cfg.moe.as_ref().map_or(0, |x| x.num_experts),
            top_k: cfg.moe.as_ref().map_or(0, |x| x.experts_per_token),
            kv_width,
            act_wire_bytes: opts.param_dtype.bytes(),
            routed_imbalance: kernels.routed.map_or(1.0, |r| r.imbalance()),
        };
        let saved = saved_activations::SavedLayout {
            local_tokens: rank_tokens,
            sequence_tokens,
            linear_input_tokens: if tp_lowering.sp_regather {
                rank_tokens
            } else {
                sequence_tokens
            },
            tp,
            act_bytes: kernels.act_bytes,
            routed: kernels.routed,
            loss_parallel: tp_lowering.vocab_parallel_loss,
            positions: opts.seq_len as f64 / cp as f64,
        };
        StageEnv {
            scenario,
            dims,
            kernels,
            saved,
            tp_lowering,
        }
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
    let env = StageEnv::new(scenario, opts, sequence_parallel);
    let profile: Vec<LayerCompute> = scenario.model.compute_profile(opts.seq_len);
    let unit_stage = unit_stages(fsdp, &profile)?;
    let weight_bytes = stage_weight_bytes(plan, fsdp, opts, &unit_stage, profile.len());
    let stages = profile
        .iter()
        .zip(weight_bytes)
        .map(|(piece, bytes)| build_stage(&env, plan, piece, bytes))
        .collect();
    Ok((stages, unit_stage))
}

/// The compute stage (index into `profile`) of every FSDP unit: a layer unit's decoder
/// layer, the embedding unit's embedding, any other unit the head. A unit with no stage
/// means the FSDP plan and the model disagree.
fn unit_stages(fsdp: &FsdpPlan, profile: &[LayerCompute]) -> Result<Vec<usize>, StrategyError> {
    fsdp.units
        .iter()
        .map(|u| {
            let s = match u.layer {
                Some(l) => profile.iter().position(|p| p.layer == Some(l)),
                None if u.name == "model.embed_tokens" => {
                    profile.iter().position(|p| p.name == "model.embed_tokens")
                }
                None => profile.iter().position(|p| p.name == "lm_head"),
            };
            s.ok_or_else(|| StrategyError::PlanMismatch {
                detail: format!("FSDP unit '{}' has no compute stage in the model", u.name),
            })
        })
        .collect()
}

/// Local (sharded) weight bytes of each of the `stages` stages, counted on EP class 0
/// (every class holds the same sizes): what a stage with no compute op of its own touches.
fn stage_weight_bytes(
    plan: &ShardingPlan,
    fsdp: &FsdpPlan,
    opts: &StrategyOptions,
    unit_stage: &[usize],
    stages: usize,
) -> Vec<u64> {
    let mut weight_bytes = vec![0u64; stages];
    for (pp, fp) in plan.params.iter().filter(|p| p.trainable).zip(&fsdp.params) {
        if pp.ep_owner.is_some_and(|o| o != 0) {
            continue;
        }
        if let Some(&s) = unit_stage.get(fp.unit) {
            let numel: u64 = fp.plan_local_shape.iter().product();
            weight_bytes[s] += numel * opts.param_dtype.bytes();
        }
    }
    weight_bytes
}

/// One stage of the model: its ops walked in forward order into compute segments and
/// model-parallel collectives, with the activation bytes it keeps for backward.
/// `weight_bytes` sizes the stand-in segment of a stage that launches no kernel.
fn build_stage(
    env: &StageEnv,
    plan: &ShardingPlan,
    piece: &LayerCompute,
    weight_bytes: u64,
) -> Stage {
    let stage_name = short(&piece.name).to_string();
    let mut walk = StageWalk::new(
        &env.dims,
        env.tp_lowering,
        stage_boundaries(plan, piece),
        &stage_name,
    );
    for op in &piece.ops {
        walk.add_op(op, &env.kernels, &env.scenario.model.config);
    }
    let (mut items, trailing_events) = walk.finish();
    ensure_compute_segment(&mut items, &stage_name, weight_bytes);
    // Checks after the stage's last segment (a closing boundary's out_plan) belong to it.
    if let Some(Item::Compute(s)) = items
        .iter_mut()
        .rev()
        .find(|i| matches!(i, Item::Compute(_)))
    {
        s.fwd_validation_events += trailing_events;
    }
    let recompute = piece
        .layer
        .is_some_and(|l| env.scenario.recompute.covers(l));
    let cfg = &env.scenario.model.config;
    let full_act_bytes = saved_activations::stage_bytes(cfg, piece, &env.saved);
    let checkpoint_bytes = saved_activations::checkpoint_bytes(cfg, &env.saved).round() as u64;
    let is_head = piece.layer.is_none() && piece.name != "model.embed_tokens";
    let whole_f32_loss = env.scenario.file.train.loss_logits == "whole_f32";
    let (fwd_working, bwd_working) = if is_head && whole_f32_loss {
        saved_activations::head_working_bytes(cfg, &env.saved)
    } else {
        eager_experts::working_bytes(&piece.ops, env.kernels.eager_loop())
    };
    Stage {
        name: stage_name,
        layer: piece.layer,
        items,
        recompute,
        saved_bytes: if recompute {
            checkpoint_bytes.min(full_act_bytes)
        } else {
            full_act_bytes
        },
        full_act_bytes,
        fwd_working_bytes: fwd_working.round() as u64,
        bwd_working_bytes: bwd_working.round() as u64,
    }
}

/// The plan boundaries inside `piece`: a layer's sub-modules, the embedding's own
/// boundary, or (for the head) every boundary outside the layers and the embedding.
fn stage_boundaries<'p>(plan: &'p ShardingPlan, piece: &LayerCompute) -> Vec<&'p BoundarySpec> {
    let prefix = &piece.name;
    plan.boundaries
        .iter()
        .filter(|b| match piece.layer {
            Some(_) => b.module.starts_with(&format!("{prefix}.")),
            None if prefix == "model.embed_tokens" => b.module == "model.embed_tokens",
            None => !b.module.starts_with("model.layers.") && b.module != "model.embed_tokens",
        })
        .collect()
}

/// Every stage has at least one compute op to hang memory effects on: a stage made only
/// of collectives (or of nothing) gets a memory-bound segment reading its weights.
fn ensure_compute_segment(items: &mut Vec<Item>, stage_name: &str, weight_bytes: u64) {
    if items.iter().any(|i| matches!(i, Item::Compute(_))) {
        return;
    }
    items.insert(
        0,
        Item::Compute(Segment {
            name: stage_name.to_string(),
            fwd: vec![KernelWork::memory_bound(1, 0, weight_bytes)],
            bwd: vec![KernelWork::memory_bound(2, 0, 2 * weight_bytes)],
            fwd_validation_events: 0,
            fwd_host_events: 0,
            bwd_host_events: 0,
            fwd_d2h_syncs: 0,
            pieces: 1,
        }),
    );
}

/// The walk over one stage's ops in forward order: the boundaries open around the current
/// op decide where model-parallel collectives cut the compute into segments.
struct StageWalk<'p> {
    /// Sizes of the collectives the boundaries issue.
    dims: &'p ParDims,
    /// The strategy's TP lowering around linears and the loss.
    tp_lowering: TpLowering,
    /// The plan boundaries of this stage.
    boundaries: Vec<&'p BoundarySpec>,
    /// Whether an expert boundary runs a local map (EP dispatch/combine exchanges).
    has_local_map: bool,
    /// Name of the stage's first segment.
    stage_name: &'p str,
    /// Finished segments and collectives, in forward order.
    items: Vec<Item>,
    /// The segment ops are being added to (none right after a collective).
    open_segment: Option<OpenSegment>,
    /// Open boundaries, outermost first (a nested boundary sits inside its parent).
    open_boundaries: Vec<&'p BoundarySpec>,
    /// The backward re-gather of each open boundary's input ([`megatron_sp`]), issued
    /// when the boundary closes.
    open_regathers: Vec<Option<ParColl>>,
    /// Validation-mode contract-check events not yet attached to a segment.
    pending_events: u32,
}

impl<'p> StageWalk<'p> {
    /// A walk of a stage named `stage_name` whose plan boundaries are `boundaries`, under
    /// `tp_lowering`.
    fn new(
        dims: &'p ParDims,
        tp_lowering: TpLowering,
        boundaries: Vec<&'p BoundarySpec>,
        stage_name: &'p str,
    ) -> Self {
        StageWalk {
            dims,
            tp_lowering,
            has_local_map: boundaries.iter().any(|b| b.flags.use_local_map),
            boundaries,
            stage_name,
            items: Vec::new(),
            open_segment: None,
            open_boundaries: Vec::new(),
            open_regathers: Vec::new(),
            pending_events: 0,
        }
    }

    /// Walks one op: closes the boundaries it leaves and opens the one it enters (their
    /// collectives cut the segment), adds its kernels to the open segment, and places the
    /// EP exchanges around expert compute under a local map. `cfg` is the model's config,
    /// which the validation census reads (head counts and the like).
    fn add_op(&mut self, op: &ComputeOp, kernels: &KernelCtx, cfg: &ModelConfig) {
        let boundary = boundary_of(&self.boundaries, &op.name);
        self.close_boundaries_outside(boundary);
        if let Some(b) = boundary
            && self
                .open_boundaries
                .last()
                .is_none_or(|t| t.module != b.module)
        {
            self.open_boundary(b);
        }
        if self.has_local_map && op.name.ends_with(".combine") {
            let module = op.name.trim_end_matches(".combine");
            let module = module.strip_suffix(".experts").unwrap_or(module);
            self.push_collectives(parallel::ep_exchange(module, "combine", self.dims));
        }
        let (items, stage_name) = (&self.items, self.stage_name);
        let segment = self.open_segment.get_or_insert_with(|| {
            OpenSegment::named(match (boundary, items.is_empty()) {
                (_, true) => stage_name.to_string(),
                (Some(b), false) => short(&b.module).to_string(),
                (None, false) => short(&op.name).to_string(),
            })
        });
        let (fwd, bwd) = op_kernels(op, kernels);
        segment.validation_events += std::mem::take(&mut self.pending_events)
            + validation::dispatch_events(&self.boundaries, op, cfg, &fwd);
        let grouped = (kernels.hf_grouped_mm && kernels.ep == 1)
            .then(|| host_events::grouped_mm_experts(op, cfg.hidden_size))
            .flatten();
        let host = grouped.unwrap_or_else(|| {
            eager_experts::op_host_events(op, cfg, kernels.eager_loop(), &fwd, &bwd)
        });
        segment.d2h_syncs += eager_experts::fwd_syncs(op, kernels.eager_loop());
        segment.pieces = segment
            .pieces
            .max(eager_experts::loop_pieces(op, kernels.eager_loop()));
        segment.host_events.fwd += host.fwd;
        segment.host_events.bwd += host.bwd;
        segment.fwd.extend(fwd);
        segment.bwd.push(bwd);
        if self.has_local_map && op.kind == ComputeKind::Router {
            let module = op.name.strip_suffix(".gate").unwrap_or(&op.name);
            self.push_collectives(parallel::ep_exchange(module, "dispatch", self.dims));
        }
    }

    /// Closes every open boundary (innermost first) until the top one contains `keep`
    /// (all of them when `keep` is `None`), issuing each one's output collectives.
    fn close_boundaries_outside(&mut self, keep: Option<&BoundarySpec>) {
        while let Some(&top) = self.open_boundaries.last() {
            if keep.is_some_and(|b| contains(top, b)) {
                break;
            }
            self.open_boundaries.pop();
            let regather = self.open_regathers.pop().flatten();
            self.add_events(validation::out_check_events(top));
            let mut colls = match self.open_boundaries.last() {
                Some(parent) => parallel::nested_collectives(top, parent, Side::Out, self.dims),
                None => parallel::boundary_collectives(top, Side::Out, self.dims),
            };
            if self.tp_lowering.vocab_parallel_loss && top.ty == BoundaryType::LmHead {
                // The loss reduces per-token scalars instead of gathering the logits.
                colls.retain(|c| !vocab_parallel_loss::is_logits_gather(c));
                colls.extend(vocab_parallel_loss::all_reduces(
                    short(&top.module),
                    self.dims,
                    self.tp_lowering.kind,
                ));
            }
            // After the body in forward order: issued before the body's backward.
            self.push_collectives(regather.into_iter().collect());
            self.push_collectives(colls);
        }
    }

    /// Opens boundary `b` inside the current top one: its input collectives (and context
    /// parallelism's attention exchange) cut the segment; its input checks wait for the
    /// next op.
    fn open_boundary(&mut self, b: &'p BoundarySpec) {
        let nested = !self.open_boundaries.is_empty();
        let mut colls = match self.open_boundaries.last() {
            Some(parent) => parallel::nested_collectives(b, parent, Side::In, self.dims),
            None => parallel::boundary_collectives(b, Side::In, self.dims),
        };
        let regather = (self.tp_lowering.sp_regather && !nested)
            .then(|| megatron_sp::backward_regather(b, &colls))
            .flatten();
        colls.extend(parallel::cp_attention(b, self.dims));
        self.push_collectives(colls);
        self.pending_events += validation::in_check_events(b);
        self.open_boundaries.push(b);
        self.open_regathers.push(regather);
    }

    /// Adds validation-mode events to the open segment, or keeps them for the next one.
    fn add_events(&mut self, events: u32) {
        match &mut self.open_segment {
            Some(s) => s.validation_events += events,
            None => self.pending_events += events,
        }
    }

    /// Closes the open segment (if it launched anything) into the items.
    fn close_segment(&mut self) {
        if let Some(segment) = self.open_segment.take().and_then(OpenSegment::close) {
            self.items.push(Item::Compute(segment));
        }
    }

    /// Appends collectives after the open segment, which they close.
    fn push_collectives(&mut self, colls: Vec<ParColl>) {
        if colls.is_empty() {
            return;
        }
        self.close_segment();
        self.items.extend(colls.into_iter().map(Item::Coll));
    }

    /// Closes the remaining boundaries and the last segment: the stage's items and the
    /// validation events no segment has taken yet.
    fn finish(mut self) -> (Vec<Item>, u32) {
        self.close_boundaries_outside(None);
        self.close_segment();
        (self.items, self.pending_events)
    }
}
