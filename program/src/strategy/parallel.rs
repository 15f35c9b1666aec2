//! Model-parallel (TP, CP, EP) collectives at module boundaries, derived from the sharding
//! plan's layout contracts.
//!
//! Per boundary and per plan axis (`tp`, `cp`), the input transition `in_src -> in_dst` and the
//! output transition `out_src -> out_dst` of every activation tensor lower as in Megatron:
//!
//! | transition | forward | backward |
//! |---|---|---|
//! | `S -> R` (SP gather, lm_head input) | all-gather | reduce-scatter |
//! | `P -> S` (SP row-parallel output) | reduce-scatter | all-gather |
//! | `P -> R` (row-parallel output, no SP) | all-reduce | none |
//! | `R -> R` on the input of a body with a `P` output (Megatron's `f`) | none | all-reduce |
//! | `S(a) -> S(b)` | all-to-all | all-to-all |
//! | `R -> S` | local slice | none |
//!
//! An attention boundary flagged `needs_cp_attn` gathers K/V over `cp` in forward and
//! reduce-scatters their gradients in backward (all-gather context parallelism). An MoE boundary
//! run as a local map with `ep > 1` dispatches tokens to experts with an all-to-all after the
//! router and combines them with a second all-to-all (both repeated in backward).
//!
//! Sizes are per rank per micro-batch: an activation of width `w` over the micro-batch holds
//! `micro_batch * seq_len * w * act_wire_bytes` bytes (the compute dtype), divided by every other axis it is sharded on.

use crate::step::Category;
use hpfsdp_plan::collective::CollectiveKind;
use hpfsdp_plan::model::DType;
use hpfsdp_plan::placement::Placement;
use hpfsdp_plan::planner::BoundarySpec;
use hpfsdp_plan::planner::templates::Contract;

/// The group a model-parallel collective runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParAxis {
    /// Tensor parallel group.
    Tp,
    /// Context parallel group.
    Cp,
    /// Expert parallel group.
    Ep,
}

impl ParAxis {
    /// Report category of the collective.
    pub fn category(self) -> Category {
        match self {
            ParAxis::Tp => Category::Tp,
            ParAxis::Cp => Category::Cp,
            ParAxis::Ep => Category::Ep,
        }
    }
}

/// How HyperParallel's runtime issues a model-parallel collective: which list-based
/// collective API (and which Python wrapper around it) it goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CallPath {
    /// A single-tensor collective: nothing runs around it.
    #[default]
    Direct,
    /// `differentiable_all_gather_concat` of a tensor sharded on `dim` (a boundary's
    /// `S(dim) -> R`).
    GatherConcat {
        /// Tensor dim gathered (0 batch, 1 sequence, 2 features of a `[B, S, W]` activation).
        dim: usize,
        /// Ranks in the group.
        ranks: u64,
    },
    /// `differentiable_reduce_scatter` of a partial tensor onto `dim` (a boundary's
    /// `P -> S(dim)`).
    ChunkReduceScatter {
        /// Tensor dim scattered.
        dim: usize,
        /// Ranks in the group.
        ranks: u64,
    },
    /// `_EPAllToAllUneven`: the list `dist.all_to_all` of the expert-parallel token exchange.
    ListAllToAll {
        /// Ranks in the group.
        ranks: u64,
    },
}

/// One collective call's kind and per-rank sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CollSpec {
    /// Collective kind.
    pub kind: CollectiveKind,
    /// This rank's send-buffer bytes.
    pub input_bytes: u64,
    /// This rank's receive-buffer bytes.
    pub output_bytes: u64,
}

/// A model-parallel collective at a boundary, with its forward and backward forms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParColl {
    /// Readable name (`layers.3.self_attn.in.hidden_states.tp`).
    pub name: String,
    /// The group.
    pub axis: ParAxis,
    /// Forward collective, if any.
    pub fwd: Option<CollSpec>,
    /// Backward collective, if any.
    pub bwd: Option<CollSpec>,
    /// Element type on the wire when it is not the compute dtype (the expert-parallel token
    /// counts travel as exact f32 whatever the activations are).
    pub wire_dtype: Option<DType>,
    /// The host reads the result back before issuing more work (a device -> host
    /// synchronisation: the EP token counts that size the following all-to-all-v).
    pub host_sync: bool,
    /// How HyperParallel's runtime issues it, which decides the kernels launched around it
    /// ([`super::collective_staging`]).
    pub call: CallPath,
}

/// Sizes the boundary collectives need.
#[derive(Debug, Clone, Copy)]
pub struct ParDims {
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Context-parallel degree.
    pub cp: u64,
    /// Expert-parallel degree.
    pub ep: u64,
    /// Sequence parallelism between TP regions.
    pub sequence_parallel: bool,
    /// Tokens per micro-batch per data-parallel rank (`micro_batch * seq_len`).
    pub tokens: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Routed experts (0 for dense models).
    pub experts: u64,
    /// Experts per token.
    pub top_k: u64,
    /// Width of the K/V exchanged by context parallelism, before TP sharding.
    pub kv_width: u64,
    /// Bytes per activation element on the wire: the compute (gathered-parameter) dtype's,
    /// so a bf16 run moves bf16 activations and an f32 run (the verify scenarios) f32 ones.
    pub act_wire_bytes: u64,
    /// Routed tokens of the busiest expert-parallel rank over the load-balanced figure (>= 1;
    /// see [`super::routing`]): the all-to-all-v sizes of that rank.
    pub routed_imbalance: f64,
}

impl ParDims {
    fn size(&self, axis: &str) -> u64 {
        match axis {
            "tp" => self.tp,
            "cp" => self.cp,
            "ep" => self.ep,
            _ => 1,
        }
    }

    fn width(&self, tensor: &str) -> Option<u64> {
        match tensor {
            "input_ids" => None,
            "logits" => Some(self.vocab),
            "router_logits" => Some(self.experts.max(1)),
            _ => Some(self.hidden),
        }
    }

    /// Tokens each rank dispatches to experts: split over `tp` first when SP is on.
    pub fn dispatch_tokens(&self) -> u64 {
        let tp_split = if self.sequence_parallel { self.tp } else { 1 };
        (self.tokens / self.cp.max(1)).div_ceil(tp_split.max(1))
    }
}

fn placement<'a>(c: &'a Contract, tensor: &str, axis: &str) -> Option<&'a Placement> {
    c.get(tensor).and_then(|p| p.get(axis))
}

fn is_shard(p: Option<&Placement>) -> bool {
    p.is_some_and(|p| p.is_shard())
}

fn is_partial(p: Option<&Placement>) -> bool {
    p.is_some_and(|p| p.is_partial())
}

fn gather(full: u64, p: u64) -> CollSpec {
    let shard = full.div_ceil(p);
    CollSpec {
        kind: CollectiveKind::AllGather,
        input_bytes: shard,
        output_bytes: shard * p,
    }
}

fn scatter(full: u64, p: u64) -> CollSpec {
    let shard = full.div_ceil(p);
    CollSpec {
        kind: CollectiveKind::ReduceScatter,
        input_bytes: shard * p,
        output_bytes: shard,
    }
}

fn reduce(full: u64) -> CollSpec {
    CollSpec {
        kind: CollectiveKind::AllReduce,
        input_bytes: full,
        output_bytes: full,
    }
}

fn all_to_all(bytes: u64) -> CollSpec {
    CollSpec {
        kind: CollectiveKind::AllToAll,
        input_bytes: bytes,
        output_bytes: bytes,
    }
}

/// A variable-size all-to-all with its expected (load-balanced) sizes: the real sizes are
/// data dependent and known only after the count exchange.
fn all_to_all_v(expected_bytes: u64) -> CollSpec {
    CollSpec {
        kind: CollectiveKind::AllToAllV,
        input_bytes: expected_bytes,
        output_bytes: expected_bytes,
    }
}

/// How HyperParallel gathers a tensor sharded as `a` over `ranks` ranks
/// (`differentiable_all_gather_concat` along the shard dim).
fn gather_call(a: &Placement, ranks: u64) -> CallPath {
    a.shard_dim()
        .map_or(CallPath::Direct, |dim| CallPath::GatherConcat {
            dim,
            ranks,
        })
}

/// Which side of the boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The input transition (`in_src -> in_dst`).
    In,
    /// The output transition (`out_src -> out_dst`).
    Out,
}

/// The TP/CP collectives of one side of a boundary.
///
/// An MoE boundary run as a local map with expert parallelism (`use_local_map`, `ep > 1`:
/// HyperParallel's TP-extend-EP routed pipeline) is the identity on `tp`
/// ([`routed_pipeline_owns_tp`]): no TP collective enters or leaves it.
pub fn boundary_collectives(b: &BoundarySpec, side: Side, d: &ParDims) -> Vec<ParColl> {
    let (src, dst) = match side {
        Side::In => (&b.in_src, &b.in_dst),
        Side::Out => (&b.out_src, &b.out_dst),
    };
    let mut out = match (src, dst) {
        (Some(src), Some(dst)) => transitions(b, src, dst, side, false, d),
        _ => Vec::new(),
    };
    if routed_pipeline_owns_tp(b, d) {
        out.retain(|c| c.axis != ParAxis::Tp);
    }
    out
}

/// Whether `b` is an MoE block whose expert-parallel routed pipeline takes the place of its TP
/// boundary transitions. HyperParallel runs the MoE block under expert parallelism as a local
/// region (`ep_utils.ep_routed_forward`, installed by the `when: ep` `local_compute_fn`
/// override of the Qwen3-MoE recipe): its input is the rank's local sequence chunk
/// `[B, S/tp, H]` and its output the complete values of that chunk, both "boundary identity"
/// (docstring of `ep_routed_forward`); the experts are whole on each rank (Shard(0) over the
/// extended EP group that spans the TP ranks), "so there is no all_gather/reduce_scatter
/// pair". The template's `S(1) -> R` input gather and `P -> S(1)` output reduce-scatter on
/// `tp` therefore do not run (four TP collectives per MoE layer and micro-batch).
pub fn routed_pipeline_owns_tp(b: &BoundarySpec, d: &ParDims) -> bool {
    b.flags.use_local_map && d.ep > 1 && d.tp > 1
}

/// The TP/CP collectives entering (`Side::In`) or leaving (`Side::Out`) a boundary nested in
/// `parent` (e.g. shared experts inside an MoE block): the nested body starts from the
/// parent's body layout (`parent.in_dst`) and hands its output back in the parent's body
/// output layout (`parent.out_src`).
pub fn nested_collectives(
    b: &BoundarySpec,
    parent: &BoundarySpec,
    side: Side,
    d: &ParDims,
) -> Vec<ParColl> {
    let (src, dst) = match side {
        Side::In => (&parent.in_dst, &b.in_dst),
        Side::Out => (&b.out_src, &parent.out_src),
    };
    match (src, dst) {
        (Some(src), Some(dst)) => transitions(b, src, dst, side, true, d),
        _ => Vec::new(),
    }
}

fn transitions(
    b: &BoundarySpec,
    src: &Contract,
    dst: &Contract,
    side: Side,
    nested: bool,
    d: &ParDims,
) -> Vec<ParColl> {
    // A body whose output is partial (row-parallel) or sharded (column-parallel) on `axis`
    // receives a partial input gradient: backward all-reduces it (Megatron's `f`).
    let body_partial = |axis: &str| {
        !nested
            && b.out_src.as_ref().is_some_and(|c| {
                c.values()
                    .any(|p| is_partial(p.get(axis)) || p.get(axis).is_some_and(|x| x.is_shard()))
            })
    };
    let module = b.module.strip_prefix("model.").unwrap_or(&b.module);
    let side_name = if side == Side::In { "in" } else { "out" };
    let mut out = Vec::new();
    for tensor in src.keys() {
        let Some(width) = d.width(tensor) else {
            continue;
        };
        for (axis_name, axis) in [("tp", ParAxis::Tp), ("cp", ParAxis::Cp)] {
            let p = d.size(axis_name);
            if p <= 1 {
                continue;
            }
            let s = placement(src, tensor, axis_name);
            let t = placement(dst, tensor, axis_name);
            // Bytes of the tensor replicated on `axis`, sharded on the other axes as in `src`.
            let mut full = d.tokens * width * d.act_wire_bytes;
            for other in ["tp", "cp"] {
                if other != axis_name && is_shard(placement(src, tensor, other)) {
                    full /= d.size(other).max(1);
                }
            }
            let (fwd, bwd, call) =
                match (s, t) {
                    (Some(a), Some(b)) if a.is_shard() && b.is_shard() && a != b => {
                        let shard = full.div_ceil(p);
                        (
                            Some(all_to_all(shard)),
                            Some(all_to_all(shard)),
                            CallPath::Direct,
                        )
                    }
                    // Logits gathered for a replicated loss: every rank computes the same loss,
                    // so their gradient is replicated and backward is a local slice.
                    (Some(a), t)
                        if a.is_shard()
                            && t.is_none_or(|t| t.is_replicate())
                            && side == Side::Out
                            && tensor == "logits" =>
                    {
                        (Some(gather(full, p)), None, gather_call(a, p))
                    }
                    (Some(a), t) if a.is_shard() && t.is_none_or(|t| t.is_replicate()) => (
                        Some(gather(full, p)),
                        Some(scatter(full, p)),
                        gather_call(a, p),
                    ),
                    (Some(a), Some(b)) if a.is_partial() && b.is_shard() => (
                        Some(scatter(full, p)),
                        Some(gather(full, p)),
                        b.shard_dim().map_or(CallPath::Direct, |dim| {
                            CallPath::ChunkReduceScatter { dim, ranks: p }
                        }),
                    ),
                    (Some(a), t) if a.is_partial() && t.is_none_or(|t| t.is_replicate()) => {
                        (Some(reduce(full)), None, CallPath::Direct)
                    }
                    (s, t)
                        if side == Side::In
                            && s.is_none_or(|s| s.is_replicate())
                            && t.is_none_or(|t| t.is_replicate())
                            && tensor == "hidden_states"
                            && body_partial(axis_name) =>
                    {
                        (None, Some(reduce(full)), CallPath::Direct)
                    }
                    _ => (None, None, CallPath::Direct),
                };
            if fwd.is_some() || bwd.is_some() {
                out.push(ParColl {
                    name: format!("{module}.{side_name}.{tensor}.{axis_name}"),
                    axis,
                    fwd,
                    bwd,
                    wire_dtype: None,
                    host_sync: false,
                    call,
                });
            }
        }
    }
    out
}

/// The context-parallel K/V exchange of an attention boundary (`needs_cp_attn`).
pub fn cp_attention(b: &BoundarySpec, d: &ParDims) -> Option<ParColl> {
    if !b.flags.needs_cp_attn || d.cp <= 1 {
        return None;
    }
    let module = b.module.strip_prefix("model.").unwrap_or(&b.module);
    // Local K and V of this rank: its tokens, K/V heads split over tp.
    let local = (d.tokens / d.cp) * d.kv_width.div_ceil(d.tp.max(1)) * d.act_wire_bytes;
    Some(ParColl {
        name: format!("{module}.kv.cp"),
        axis: ParAxis::Cp,
        fwd: Some(gather(local * d.cp, d.cp)),
        bwd: Some(scatter(local * d.cp, d.cp)),
        wire_dtype: None,
        host_sync: false,
        call: CallPath::Direct,
    })
}

/// Bytes per exchanged token count: counts travel as f32, exact for any realistic count.
const COUNT_WIRE_BYTES: u64 = 4;

/// Bytes per exchanged expert id: ids travel as f32, exact below 2^24 experts (HyperParallel
/// sends int64 ids; the 4 bytes per routed copy of the difference are under 0.1% of the
/// copy's hidden vector).
const EXPERT_ID_WIRE_BYTES: u64 = 4;

/// The expert-parallel exchanges of a MoE layer at its token `dispatch` (after the router) or
/// `combine` (before the weighted sum), as HyperParallel's `ep_utils.ep_routed_forward`
/// issues them:
///
/// 1. dispatch, step 2: the routed copies per destination EP rank (`bincount` of the
///    destination ranks, `minlength = ep_size`) with a fixed all-to-all of `ep` counts,
///    forward only (backward reuses them); eager PyTorch reads them back to the host to size
///    the all-to-all-v (`.tolist()`), so this exchange carries `host_sync`;
/// 2. dispatch, step 3: the routed copies' hidden vectors with an all-to-all-v (repeated in
///    backward for their gradients);
/// 3. dispatch, step 3: every routed copy's global expert id with a second all-to-all-v over
///    the same counts, forward only (integer ids carry no gradient): the expert side groups
///    the received copies by local expert from them;
/// 4. combine, step 5: the expert outputs back with an all-to-all-v (repeated in backward).
///
/// The token sizes are those of the busiest rank: `dispatch_tokens * top_k` hidden vectors
/// per rank times the routing imbalance (expected maximum over EP ranks under top-k routing,
/// times `routing_skew`). The reference executor's EP dispatch (`reference::runtime::ep`)
/// issues the same calls in the same order, so `hpfsdp verify` compares them one for one.
pub fn ep_exchange(module: &str, what: &str, d: &ParDims) -> Vec<ParColl> {
    if d.ep <= 1 {
        return Vec::new();
    }
    let module = module.strip_prefix("model.").unwrap_or(module);
    let copies = d.dispatch_tokens() * d.top_k.max(1);
    let imbalance = d.routed_imbalance.max(1.0);
    let token_bytes = ((copies * d.hidden * d.act_wire_bytes) as f64 * imbalance).round() as u64;
    let mut out = Vec::with_capacity(3);
    if what == "dispatch" {
        out.push(ParColl {
            name: format!("{module}.{what}.counts.ep"),
            axis: ParAxis::Ep,
            fwd: Some(all_to_all(d.ep * COUNT_WIRE_BYTES)),
            bwd: None,
            wire_dtype: Some(DType::F32),
            host_sync: true,
            call: CallPath::Direct,
        });
    }
    out.push(ParColl {
        name: format!("{module}.{what}.ep"),
        axis: ParAxis::Ep,
        fwd: Some(all_to_all_v(token_bytes)),
        bwd: Some(all_to_all_v(token_bytes)),
        wire_dtype: None,
        host_sync: false,
        call: CallPath::ListAllToAll { ranks: d.ep },
    });
    if what == "dispatch" {
        let id_bytes = ((copies * EXPERT_ID_WIRE_BYTES) as f64 * imbalance).round() as u64;
        out.push(ParColl {
            name: format!("{module}.{what}.expert_ids.ep"),
            axis: ParAxis::Ep,
            fwd: Some(all_to_all_v(id_bytes)),
            bwd: None,
            wire_dtype: Some(DType::F32),
            host_sync: false,
            call: CallPath::ListAllToAll { ranks: d.ep },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_plan::planner::plan;
    use hpfsdp_plan::scenario::Scenario;

    #[test]
    fn sequence_parallel_attention_gathers_in_and_scatters_out() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios/verify/dense-tp2-fsdp2.toml");
        let s = Scenario::load(&path).unwrap();
        let p = plan(&s.model, &s.planner_input());
        let b = p
            .boundaries
            .iter()
            .find(|b| b.module == "model.layers.0.self_attn")
            .unwrap();
        let d = ParDims {
            tp: 2,
            cp: 1,
            ep: 1,
            sequence_parallel: true,
            tokens: 64,
            hidden: 16,
            vocab: 100,
            experts: 0,
            top_k: 0,
            kv_width: 8,
            act_wire_bytes: 2,
            routed_imbalance: 1.0,
        };
        // Between regions: sequence-sharded on tp with SP, replicated without.
        let with = |between: Placement| {
            let mut x = b.clone();
            for c in [&mut x.in_src, &mut x.out_dst].into_iter().flatten() {
                for v in c.values_mut() {
                    v.insert("tp".into(), between.clone());
                }
            }
            x
        };
        let sp = with(Placement::shard(1));
        let i = boundary_collectives(&sp, Side::In, &d);
        let o = boundary_collectives(&sp, Side::Out, &d);
        assert_eq!(i.len(), 1);
        assert_eq!(i[0].fwd.unwrap().kind, CollectiveKind::AllGather);
        assert_eq!(i[0].bwd.unwrap().kind, CollectiveKind::ReduceScatter);
        assert_eq!(i[0].fwd.unwrap().output_bytes, 64 * 16 * 2);
        assert_eq!(o[0].fwd.unwrap().kind, CollectiveKind::ReduceScatter);
        assert_eq!(o[0].bwd.unwrap().kind, CollectiveKind::AllGather);
        // Without SP: Megatron's g (all-reduce forward) and f (all-reduce backward).
        let mut plain = b.clone();
        let r = || Placement::Replicate;
        for c in [&mut plain.in_src, &mut plain.out_dst]
            .into_iter()
            .flatten()
        {
            for v in c.values_mut() {
                v.insert("tp".into(), r());
            }
        }
        let i = boundary_collectives(&plain, Side::In, &d);
        let o = boundary_collectives(&plain, Side::Out, &d);
        assert!(i[0].fwd.is_none());
        assert_eq!(i[0].bwd.unwrap().kind, CollectiveKind::AllReduce);
        assert_eq!(o[0].fwd.unwrap().kind, CollectiveKind::AllReduce);
        assert!(o[0].bwd.is_none());
        assert!(ep_exchange("model.layers.0.mlp", "dispatch", &d).is_empty());
        let ep = ParDims {
            ep: 2,
            experts: 8,
            top_k: 2,
            ..d
        };
        let dispatch = ep_exchange("model.layers.0.mlp", "dispatch", &ep);
        assert_eq!(dispatch.len(), 3, "count exchange, tokens, expert ids");
        // One f32 count per destination EP rank (bincount of the destination ranks).
        let counts = dispatch[0].fwd.unwrap();
        assert_eq!(
            (counts.kind, counts.input_bytes),
            (CollectiveKind::AllToAll, 2 * 4)
        );
        // The expert ids follow the tokens forward only: one id per routed copy (32
        // sequence-parallel tokens per rank x top-2), f32 on the wire.
        let ids = dispatch[2].fwd.unwrap();
        assert_eq!(
            (ids.kind, ids.input_bytes),
            (CollectiveKind::AllToAllV, 32 * 2 * 4)
        );
        assert!(dispatch[2].bwd.is_none() && !dispatch[2].host_sync);
        assert_eq!(dispatch[2].wire_dtype, Some(DType::F32));
        assert!(dispatch[0].bwd.is_none());
        assert_eq!(dispatch[0].wire_dtype, Some(DType::F32));
        assert_eq!(dispatch[1].fwd.unwrap().kind, CollectiveKind::AllToAllV);
        assert_eq!(dispatch[1].bwd.unwrap().kind, CollectiveKind::AllToAllV);
        let combine = ep_exchange("model.layers.0.mlp", "combine", &ep);
        assert_eq!(combine.len(), 1);
        assert_eq!(combine[0].fwd.unwrap().kind, CollectiveKind::AllToAllV);
        // The host reads the counts back before sizing the token exchange; nothing else syncs.
        assert!(dispatch[0].host_sync && !dispatch[1].host_sync && !combine[0].host_sync);
        assert_eq!(combine[0].bwd.unwrap().kind, CollectiveKind::AllToAllV);
        // The busiest rank's token exchange grows with the routing imbalance.
        let skewed = ParDims {
            routed_imbalance: 1.25,
            ..ep
        };
        let balanced_bytes = dispatch[1].fwd.unwrap().input_bytes;
        let skewed_bytes = ep_exchange("model.layers.0.mlp", "dispatch", &skewed)[1]
            .fwd
            .unwrap()
            .input_bytes;
        assert_eq!(skewed_bytes, (balanced_bytes as f64 * 1.25).round() as u64);
    }

    #[test]
    fn expert_parallel_routed_pipeline_replaces_the_moe_tp_transitions() {
        // A sequence-parallel MoE block: S(1) -> R gather in, P -> S(1) reduce-scatter out.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios/verify/dense-tp2-fsdp2.toml");
        let s = Scenario::load(&path).unwrap();
        let p = plan(&s.model, &s.planner_input());
        let mut b = p
            .boundaries
            .iter()
            .find(|b| b.module == "model.layers.0.mlp")
            .unwrap()
            .clone();
        let hs = |p: Placement| {
            let mut c = Contract::new();
            c.insert(
                "hidden_states".into(),
                [("tp".to_string(), p)].into_iter().collect(),
            );
            Some(c)
        };
        b.in_src = hs(Placement::shard(1));
        b.in_dst = hs(Placement::Replicate);
        b.out_src = hs(Placement::partial_sum());
        b.out_dst = hs(Placement::shard(1));
        b.flags.use_local_map = true;
        let d = |ep: u64| ParDims {
            tp: 4,
            cp: 1,
            ep,
            sequence_parallel: true,
            tokens: 64,
            hidden: 16,
            vocab: 100,
            experts: 8,
            top_k: 2,
            kv_width: 8,
            act_wire_bytes: 2,
            routed_imbalance: 1.0,
        };
        // Without expert parallelism the block gathers and scatters on tp as the template says.
        for side in [Side::In, Side::Out] {
            assert_eq!(boundary_collectives(&b, side, &d(1)).len(), 1, "{side:?}");
        }
        // ep_routed_forward takes the local chunk and returns it complete: no TP collective.
        for side in [Side::In, Side::Out] {
            assert!(boundary_collectives(&b, side, &d(4)).is_empty(), "{side:?}");
        }
        // Only the local-map MoE block: an attention boundary keeps its TP transitions.
        b.flags.use_local_map = false;
        assert_eq!(boundary_collectives(&b, Side::In, &d(4)).len(), 1);
    }
}
