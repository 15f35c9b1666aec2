//! Pass 4: templates. A boundary type gives each role a placement per plan axis and gives the
//! boundary its input/output layout contracts, with and without sequence parallelism.
//!
//! Plan axes are the non-data-parallel axes of size > 1: `tp`, `cp`, `ep` and `etp` (expert
//! tensor parallelism; equal to `tp` unless experts use a different TP degree). Missing axes
//! mean `Replicate`. Activations are `[batch, seq, hidden]`: `S(1)` is the sequence dim.

use super::boundary::BoundaryType;
use super::roles::{Role, lowercase};
use crate::placement::Placement;
use indexmap::IndexMap;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// Placement per plan axis (axis name → placement); absent axes are `Replicate`.
pub type AxisPlacements = IndexMap<String, Placement>;

/// A layout contract: tensor name → placement per plan axis.
pub type Contract = IndexMap<String, AxisPlacements>;

/// Sizes and switches of the plan axes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanAxes {
    /// Tensor-parallel degree of dense layers.
    pub tp: usize,
    /// Context-parallel degree.
    pub cp: usize,
    /// Expert-parallel degree.
    pub ep: usize,
    /// Tensor-parallel degree inside experts.
    pub etp: usize,
    /// Sequence parallelism between TP regions.
    pub sequence_parallel: bool,
    /// Keep logits vocab-sharded for a parallel loss.
    pub loss_parallel: bool,
}

impl PlanAxes {
    /// Active axes (size > 1) in canonical order.
    pub fn active(&self) -> Vec<(&'static str, usize)> {
        [
            ("tp", self.tp),
            ("cp", self.cp),
            ("ep", self.ep),
            ("etp", self.etp),
        ]
        .into_iter()
        .filter(|(_, s)| *s > 1)
        .collect()
    }

    /// Size of a plan axis by name (1 if unknown or inactive).
    pub fn size(&self, axis: &str) -> usize {
        match axis {
            "tp" => self.tp,
            "cp" => self.cp,
            "ep" => self.ep,
            "etp" => self.etp,
            _ => 1,
        }
    }

    fn put(&self, map: &mut AxisPlacements, axis: &str, p: Placement) {
        if self.size(axis) > 1 && !p.is_replicate() {
            map.insert(axis.to_string(), p);
        }
    }
}

/// True for expert/shared-expert weights that are row-parallel (down projections).
pub fn is_rowwise_expert_name(fqn: &str) -> bool {
    let lower = lowercase(fqn);
    ["w2", "down_proj", "down."]
        .iter()
        .any(|p| lower.contains(p))
}

/// [`placement_for_role`] remembered per (role, ndim, row-wise expert name): the only things
/// of a parameter it reads. A planner of 55k per-expert weights builds a handful of maps and
/// clones them (exact-sized) instead of building 55k.
#[derive(Debug, Clone)]
pub struct PlacementCache<'a> {
    axes: &'a PlanAxes,
    memo: FxHashMap<(Role, usize, bool), AxisPlacements>,
}

impl<'a> PlacementCache<'a> {
    /// An empty cache over `axes`.
    pub fn new(axes: &'a PlanAxes) -> Self {
        Self {
            axes,
            memo: FxHashMap::default(),
        }
    }

    /// What `placement_for_role(role, fqn, ndim, axes)` gives.
    pub fn get(&mut self, role: Role, fqn: &str, ndim: usize) -> AxisPlacements {
        let rowwise =
            matches!(role, Role::SharedExpert | Role::MoeExpert) && is_rowwise_expert_name(fqn);
        let axes = self.axes;
        self.memo
            .entry((role, ndim, rowwise))
            .or_insert_with(|| placement_for_role(role, fqn, ndim, axes))
            .clone()
    }
}

/// The placement of a parameter with `role` and `ndim` dims, per plan axis.
pub fn placement_for_role(role: Role, fqn: &str, ndim: usize, axes: &PlanAxes) -> AxisPlacements {
    let mut m = AxisPlacements::new();
    match role {
        Role::Colwise
        | Role::Embed
        | Role::LmHead
        | Role::FusedQkv
        | Role::FusedGateUp
        | Role::Special => axes.put(&mut m, "tp", Placement::shard(0)),
        Role::Rowwise => axes.put(
            &mut m,
            "tp",
            Placement::shard(ndim.saturating_sub(1).min(1)),
        ),
        Role::SharedExpert => {
            let dim = if is_rowwise_expert_name(fqn) { 1 } else { 0 };
            axes.put(&mut m, "tp", Placement::shard(dim));
        }
        Role::MoeExpert => {
            let rowwise = is_rowwise_expert_name(fqn);
            if ndim >= 3 {
                axes.put(&mut m, "ep", Placement::shard(0));
                axes.put(&mut m, "etp", Placement::shard(if rowwise { 2 } else { 1 }));
            } else {
                // Per-expert 2-D weights: EP ownership is recorded separately (whole matrices).
                axes.put(&mut m, "etp", Placement::shard(if rowwise { 1 } else { 0 }));
            }
        }
        Role::Norm | Role::MoeGate | Role::Bias | Role::Replicated | Role::Skip => {}
    }
    m
}

/// Boundary flags carried by templates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundaryFlags {
    /// Attention needs a context-parallel wrapper (cp > 1).
    pub needs_cp_attn: bool,
    /// Region runs as a local map (MoE token dispatch), contracts are declarative.
    pub use_local_map: bool,
}

/// The four contracts of a boundary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contracts {
    /// Layouts the inputs arrive in.
    pub in_src: Contract,
    /// Layouts the module body needs (in_src → in_dst is the input transition).
    pub in_dst: Contract,
    /// Layouts the module body produces.
    pub out_src: Contract,
    /// Layouts handed to the next module (out_src → out_dst is the output transition).
    pub out_dst: Contract,
}

fn act(axes: &PlanAxes, tp: Placement, cp: Placement, ep: Option<Placement>) -> AxisPlacements {
    let mut m = AxisPlacements::new();
    if axes.tp > 1 {
        m.insert("tp".into(), tp);
    }
    if axes.cp > 1 {
        m.insert("cp".into(), cp);
    }
    if let Some(e) = ep
        && axes.ep > 1
    {
        m.insert("ep".into(), e);
    }
    m
}

fn one(name: &str, p: AxisPlacements) -> Contract {
    let mut c = Contract::new();
    c.insert(name.to_string(), p);
    c
}

/// The template contracts and flags of a boundary type.
pub fn template(ty: BoundaryType, axes: &PlanAxes) -> (Contracts, BoundaryFlags) {
    use Placement as P;
    let s1 = || P::shard(1);
    let r = || P::Replicate;
    let part = P::partial_sum;
    let sp = axes.sequence_parallel && axes.tp > 1;
    // Sequence-sharded over tp between regions with SP, replicated without; always S(1) on cp.
    let between = || if sp { s1() } else { r() };
    let hs = "hidden_states";
    let mut flags = BoundaryFlags::default();
    let c = match ty {
        BoundaryType::Attention | BoundaryType::Mlp | BoundaryType::MoeMlp => {
            if ty == BoundaryType::Attention {
                flags.needs_cp_attn = axes.cp > 1;
            }
            if ty == BoundaryType::MoeMlp {
                flags.use_local_map = true;
            }
            let ep = (ty == BoundaryType::MoeMlp).then(r);
            Contracts {
                in_src: one(hs, act(axes, between(), s1(), ep.clone())),
                in_dst: one(hs, act(axes, r(), s1(), ep)),
                out_src: one(hs, act(axes, part(), s1(), None)),
                out_dst: one(hs, act(axes, between(), s1(), None)),
            }
        }
        BoundaryType::Norm => {
            let c = one(hs, act(axes, between(), s1(), None));
            Contracts {
                in_src: c.clone(),
                in_dst: c.clone(),
                out_src: c.clone(),
                out_dst: c,
            }
        }
        BoundaryType::Embed => Contracts {
            in_src: one("input_ids", act(axes, r(), s1(), None)),
            in_dst: one("input_ids", act(axes, r(), s1(), None)),
            out_src: one(hs, act(axes, part(), s1(), None)),
            out_dst: one(hs, act(axes, between(), s1(), None)),
        },
        BoundaryType::LmHead => Contracts {
            in_src: one(hs, act(axes, between(), s1(), None)),
            in_dst: one(hs, act(axes, r(), s1(), None)),
            out_src: one("logits", act(axes, P::shard(2), s1(), None)),
            out_dst: one(
                "logits",
                act(
                    axes,
                    if axes.loss_parallel { P::shard(2) } else { r() },
                    s1(),
                    None,
                ),
            ),
        },
        BoundaryType::MoeGate => Contracts {
            in_src: one(hs, act(axes, between(), s1(), None)),
            in_dst: one(hs, act(axes, r(), r(), None)),
            out_src: one("router_logits", act(axes, r(), r(), None)),
            out_dst: one("router_logits", act(axes, r(), r(), Some(P::shard(0)))),
        },
        BoundaryType::Replicated | BoundaryType::Unknown => Contracts::default(),
    };
    (c, flags)
}

/// Human-readable one-line form of placements: `tp=S(0) ep=S(0)`, or `R` when empty.
pub fn format_axis_placements(p: &AxisPlacements) -> String {
    if p.is_empty() {
        return "R".into();
    }
    p.iter()
        .map(|(a, pl)| format!("{a}={pl}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(tp: usize, cp: usize, ep: usize, etp: usize) -> PlanAxes {
        PlanAxes {
            tp,
            cp,
            ep,
            etp,
            sequence_parallel: true,
            loss_parallel: false,
        }
    }

    #[test]
    fn role_placements_match_torchtitan() {
        let a = axes(4, 1, 4, 2);
        assert_eq!(
            format_axis_placements(&placement_for_role(Role::Colwise, "q_proj.weight", 2, &a)),
            "tp=S(0)"
        );
        assert_eq!(
            format_axis_placements(&placement_for_role(Role::Rowwise, "o_proj.weight", 2, &a)),
            "tp=S(1)"
        );
        assert_eq!(
            format_axis_placements(&placement_for_role(Role::Norm, "norm.weight", 1, &a)),
            "R"
        );
        assert_eq!(
            format_axis_placements(&placement_for_role(
                Role::MoeExpert,
                "experts.gate_up_proj",
                3,
                &a
            )),
            "ep=S(0) etp=S(1)"
        );
        assert_eq!(
            format_axis_placements(&placement_for_role(
                Role::MoeExpert,
                "experts.down_proj",
                3,
                &a
            )),
            "ep=S(0) etp=S(2)"
        );
        assert_eq!(
            format_axis_placements(&placement_for_role(
                Role::SharedExpert,
                "shared_experts.down_proj.weight",
                2,
                &a
            )),
            "tp=S(1)"
        );
        let none = axes(1, 1, 1, 1);
        assert!(placement_for_role(Role::Colwise, "q_proj.weight", 2, &none).is_empty());
    }

    #[test]
    fn sp_and_nosp_contracts() {
        let (c, _) = template(BoundaryType::Attention, &axes(2, 1, 1, 1));
        assert_eq!(
            format_axis_placements(&c.in_src["hidden_states"]),
            "tp=S(1)"
        );
        assert_eq!(format_axis_placements(&c.in_dst["hidden_states"]), "tp=R");
        assert_eq!(
            format_axis_placements(&c.out_src["hidden_states"]),
            "tp=P(sum)"
        );
        let mut nosp = axes(2, 1, 1, 1);
        nosp.sequence_parallel = false;
        let (c, _) = template(BoundaryType::Mlp, &nosp);
        assert_eq!(format_axis_placements(&c.out_dst["hidden_states"]), "tp=R");
        let (c, f) = template(BoundaryType::MoeMlp, &axes(1, 2, 4, 1));
        assert!(f.use_local_map);
        assert_eq!(
            format_axis_placements(&c.in_dst["hidden_states"]),
            "cp=S(1) ep=R"
        );
        let (c, _) = template(BoundaryType::MoeGate, &axes(2, 1, 4, 1));
        assert_eq!(
            format_axis_placements(&c.out_dst["router_logits"]),
            "tp=R ep=S(0)"
        );
    }
}
