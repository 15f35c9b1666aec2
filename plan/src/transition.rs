//! Lowering a layout change to a sequence of per-mesh-axis steps (collectives or local
//! operations), each with its group size, tier, bytes and the layout it leaves behind.
//!
//! # One-step rules (one mesh axis changes)
//!
//! | from → to | action |
//! |---|---|
//! | `Shard`/`StridedShard`/`RaggedShard` → `Replicate` | all-gather |
//! | `Partial` → `Replicate` | all-reduce |
//! | `Partial` → `Shard`/`StridedShard`/`RaggedShard` | reduce-scatter |
//! | `Shard(a)` → `Shard(b)` | all-to-all |
//! | `RaggedShard(u)` → `RaggedShard(v)` (same axis, same dims) | all-to-all-v |
//! | `Replicate` → any shard | local slice (no communication) |
//! | `Replicate` → `Partial` | local: for `sum` the rank at coordinate 0 of the axis keeps its values and the others zero theirs; for `avg`/`max`/`min` every rank keeps its values |
//!
//! Strided shards are gathered by an all-gather followed by a local reorder (torch
//! `_StridedShard`); the step records only the all-gather.
//!
//! # Axis order and the generic fallback
//!
//! For every tensor dim, the mesh axes sharding it form a *chain* in mesh-axis order (axis 0
//! splits first). Axes whose placement is unchanged **and** lie in the common prefix of the
//! source and destination chains of their dim keep their data. All other axes are moved in
//! four phases, which keeps every intermediate layout valid and every step a one-axis rule:
//!
//! 0. when the source pieces are not larger than the destination pieces, `Partial` axes that
//!    end `Replicate` (or another reduce op) are all-reduced first (cheaper on smaller data);
//! 1. from the last mesh axis to the first, every sharded axis that must change is
//!    all-gathered to `Replicate` (DTensor's inner-to-outer unsharding), except
//!    `Shard(a)→Shard(b)`, which becomes one all-to-all when no earlier changing axis touches
//!    dim `b`;
//! 2. from the first mesh axis to the last, `Replicate` axes are sliced (or made `Partial`)
//!    and `Partial` axes are reduce-scattered into their destination shard;
//! 3. remaining `Partial` axes are all-reduced (then made `Partial` again when the
//!    destination asks for another reduce op).
//!
//! Anything outside the one-step table (`Shard→Partial`, strided changes, nested re-splits)
//! therefore becomes "all-gather to `Replicate`, then local slice / local partial".
//! Ragged layouts (which need `Replicate` on every other axis) go through an all-`Replicate`
//! layout, except ragged→ragged on the same axis (one all-to-all-v) and `Partial`→ragged
//! (reduce-scatter after the other axes are made `Replicate`).
//!
//! Mesh axes of size 1 move data nowhere: their changes are folded into the layouts without
//! a step (DTensor skips them too).

use crate::collective::CollectiveKind;
use crate::error::{PlanError, PlanResult};
use crate::layout::Layout;
use crate::mesh::DeviceMesh;
use crate::placement::{Placement, ReduceOp};
use crate::topology::{Tier, Topology};
use serde::{Deserialize, Serialize};

/// What one transition step does on its mesh axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransitionAction {
    /// A collective over every process group along the step's mesh axis.
    Collective(CollectiveKind),
    /// `Replicate` → shard: every rank keeps its slice of its local piece; no communication.
    LocalSlice,
    /// `Replicate` → `Partial`: local; for `sum` the rank at coordinate 0 of the axis keeps its
    /// values and the others set theirs to zero; for `avg`/`max`/`min` all ranks keep theirs.
    LocalPartial,
}

impl TransitionAction {
    /// Stable kebab-case name: the collective's name, `local-slice` or `local-partial`.
    pub fn name(self) -> &'static str {
        match self {
            TransitionAction::Collective(kind) => kind.name(),
            TransitionAction::LocalSlice => "local-slice",
            TransitionAction::LocalPartial => "local-partial",
        }
    }

    /// The collective, when the step communicates.
    pub fn collective(self) -> Option<CollectiveKind> {
        match self {
            TransitionAction::Collective(kind) => Some(kind),
            _ => None,
        }
    }
}

/// One step of a lowered transition: one mesh axis changes its placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionStep {
    /// What the step does.
    pub action: TransitionAction,
    /// Index of the mesh axis whose placement changes.
    pub mesh_axis: usize,
    /// Name of that mesh axis.
    pub axis_name: String,
    /// Placement of the axis before the step.
    pub from: Placement,
    /// Placement of the axis after the step.
    pub to: Placement,
    /// Ranks per process group along the axis.
    pub group_size: usize,
    /// Slowest tier crossed by any group along the axis.
    pub tier: Tier,
    /// Bytes one rank hands to the step (padded to the largest local piece for uneven shards;
    /// for local steps the local buffer read).
    pub bytes_in_per_rank: u64,
    /// Bytes one rank holds after the step (padded likewise; for local steps the buffer kept).
    pub bytes_out_per_rank: u64,
    /// The layout after this step (size-1 axes folded in, see the module docs).
    pub layout: Layout,
}

/// A layout change lowered to steps; `steps` is empty when no data moves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionPlan {
    /// The source layout.
    pub src: Layout,
    /// The destination layout (what every rank holds after the last step).
    pub dst: Layout,
    /// The steps, in execution order.
    pub steps: Vec<TransitionStep>,
}

impl TransitionPlan {
    /// True when no step is needed.
    pub fn is_identity(&self) -> bool {
        self.steps.is_empty()
    }

    /// The collectives of the plan, in order (local steps left out).
    pub fn collectives(&self) -> Vec<CollectiveKind> {
        self.steps
            .iter()
            .filter_map(|s| s.action.collective())
            .collect()
    }

    /// Sum over communicating steps of the bytes one rank hands to them.
    pub fn comm_bytes_in_per_rank(&self) -> u64 {
        self.steps
            .iter()
            .filter(|s| s.action.collective().is_some())
            .map(|s| s.bytes_in_per_rank)
            .sum()
    }

    /// The debugging label of the whole change ([`classify_transition`]).
    pub fn label(&self) -> &'static str {
        classify_transition(&self.src.placements, &self.dst.placements)
    }
}

/// Debugging / profiling label of a placement change, comparing only the axes that differ
/// (as HyperParallel's `_classify_collective`): `identity`, `reduce_scatter` (some partial
/// source, some shard destination), `all_reduce` (partial sources, replicate destinations),
/// `all_gather` (shard sources, replicate destinations), `all_to_all` (every differing axis
/// shard → shard), `local_slice` (every differing axis replicate → shard), else
/// `redistribute`.
pub fn classify_transition(src: &[Placement], dst: &[Placement]) -> &'static str {
    if src == dst {
        return "identity";
    }
    let diff: Vec<(&Placement, &Placement)> = src.iter().zip(dst).filter(|(s, d)| s != d).collect();
    let has_partial_src = diff.iter().any(|(s, _)| s.is_partial());
    let has_shard_src = diff.iter().any(|(s, _)| s.is_shard());
    let has_shard_dst = diff.iter().any(|(_, d)| d.is_shard());
    let all_replicate_dst = diff.iter().all(|(_, d)| d.is_replicate());
    if has_partial_src && has_shard_dst {
        "reduce_scatter"
    } else if has_partial_src && all_replicate_dst {
        "all_reduce"
    } else if has_shard_src && all_replicate_dst {
        "all_gather"
    } else if !diff.is_empty() && diff.iter().all(|(s, d)| s.is_shard() && d.is_shard()) {
        "all_to_all"
    } else if !diff.is_empty() && diff.iter().all(|(s, d)| s.is_replicate() && d.is_shard()) {
        "local_slice"
    } else {
        "redistribute"
    }
}

/// Lowers the change `src` → `dst` (same global shape, both valid on `mesh`) to steps, with
/// tiers read from `topo` and bytes for elements of `elem_bytes` bytes. See the module docs
/// for the rules and the order of the steps.
pub fn lower_transition(
    src: &Layout,
    dst: &Layout,
    mesh: &DeviceMesh,
    topo: &Topology,
    elem_bytes: u64,
) -> PlanResult<TransitionPlan> {
    src.validate(mesh)?;
    dst.validate(mesh)?;
    if src.global_shape != dst.global_shape {
        return Err(PlanError::Layout(format!(
            "cannot redistribute tensor {:?} into layout of tensor {:?}; a transition keeps the \
             global shape (reshape outside the transition)",
            src.global_shape, dst.global_shape
        )));
    }
    let mut lw = Lowerer {
        mesh,
        topo,
        elem_bytes,
        cur: src.clone(),
        steps: Vec::new(),
    };
    if src.placements != dst.placements {
        if src.is_ragged() || dst.is_ragged() {
            lw.lower_ragged(dst);
        } else {
            lw.lower_plain(&dst.placements);
        }
    }
    if lw.cur != *dst {
        return Err(PlanError::Layout(format!(
            "internal: lowering {src} to {dst} stopped at {}; please report this",
            lw.cur
        )));
    }
    Ok(TransitionPlan {
        src: src.clone(),
        dst: dst.clone(),
        steps: lw.steps,
    })
}

struct Lowerer<'a> {
    mesh: &'a DeviceMesh,
    topo: &'a Topology,
    elem_bytes: u64,
    cur: Layout,
    steps: Vec<TransitionStep>,
}

fn shards_dim(p: &Placement, dim: usize) -> bool {
    matches!(p, Placement::Shard { dim: d } | Placement::StridedShard { dim: d, .. } if *d == dim)
}

/// Axes that keep their data: unchanged placement, and for shards, inside the common prefix of
/// the source and destination chains of their dim.
fn keep_mask(src: &[Placement], dst: &[Placement]) -> Vec<bool> {
    let chain = |ps: &[Placement], dim: usize| -> Vec<(usize, Placement)> {
        ps.iter()
            .enumerate()
            .filter(|(_, p)| shards_dim(p, dim))
            .map(|(a, p)| (a, p.clone()))
            .collect()
    };
    (0..src.len())
        .map(|a| {
            if src[a] != dst[a] {
                return false;
            }
            let Some(dim) = src[a].shard_dim() else {
                return true;
            };
            let (cs, cd) = (chain(src, dim), chain(dst, dim));
            let prefix = cs.iter().zip(&cd).take_while(|(x, y)| x == y).count();
            cs.iter()
                .position(|(b, _)| *b == a)
                .is_some_and(|i| i < prefix)
        })
        .collect()
}

impl Lowerer<'_> {
    fn emit(&mut self, axis: usize, action: TransitionAction, to: Placement) {
        let before = self.cur.clone();
        let from = std::mem::replace(&mut self.cur.placements[axis], to.clone());
        let size = self.mesh.axes()[axis].size;
        if size == 1 {
            return;
        }
        let eb = self.elem_bytes;
        let bytes_before = before.max_local_numel(self.mesh).saturating_mul(eb);
        let bytes_after = self.cur.max_local_numel(self.mesh).saturating_mul(eb);
        let g = size as u64;
        let (bytes_in, bytes_out) = match action {
            TransitionAction::Collective(CollectiveKind::AllGather) => {
                (bytes_before, bytes_before.saturating_mul(g))
            }
            TransitionAction::Collective(CollectiveKind::ReduceScatter) => {
                (bytes_after.saturating_mul(g), bytes_after)
            }
            TransitionAction::Collective(CollectiveKind::AllReduce) => (bytes_before, bytes_before),
            _ => (bytes_before, bytes_after),
        };
        let tier = self.topo.widest_tier_along(&self.mesh, &[axis]);
        self.steps.push(TransitionStep {
            action,
            mesh_axis: axis,
            axis_name: self.mesh.axes()[axis].name.clone(),
            from,
            to,
            group_size: size,
            tier,
            bytes_in_per_rank: bytes_in,
            bytes_out_per_rank: bytes_out,
            layout: self.cur.clone(),
        });
    }

    fn collective(&mut self, axis: usize, kind: CollectiveKind, to: Placement) {
        self.emit(axis, TransitionAction::Collective(kind), to);
    }

    /// Non-ragged `cur` → non-ragged `dst` (the four phases of the module docs).
    fn lower_plain(&mut self, dst: &[Placement]) {
        let n = dst.len();
        let src = self.cur.placements.clone();
        let keep = keep_mask(&src, dst);
        let dst_layout = Layout {
            global_shape: self.cur.global_shape.clone(),
            placements: dst.to_vec(),
        };
        // No earlier changing axis shards `dim` in the source or the destination.
        let earlier_ok = |a: usize, dim: usize| {
            (0..a).all(|c| keep[c] || (!shards_dim(&src[c], dim) && !shards_dim(&dst[c], dim)))
        };
        // Phase 0: all-reduce early when the data only grows from here.
        if self.cur.max_local_numel(self.mesh) <= dst_layout.max_local_numel(self.mesh) {
            for a in (0..n).rev() {
                if !keep[a] && self.cur.placements[a].is_partial() && !dst[a].is_shard() {
                    self.collective(a, CollectiveKind::AllReduce, Placement::Replicate);
                }
            }
        }
        // Phase 1: unshard inner-to-outer.
        for a in (0..n).rev() {
            if keep[a] {
                continue;
            }
            match (&self.cur.placements[a], &dst[a]) {
                (Placement::Shard { dim: d }, Placement::Shard { dim: e })
                    if d != e && earlier_ok(a, *e) =>
                {
                    self.collective(a, CollectiveKind::AllToAll, dst[a].clone());
                }
                (p, _) if p.is_shard() => {
                    self.collective(a, CollectiveKind::AllGather, Placement::Replicate);
                }
                _ => {}
            }
        }
        // Phase 2: shard outer-to-inner.
        for a in 0..n {
            if keep[a] || self.cur.placements[a] == dst[a] {
                continue;
            }
            match (&self.cur.placements[a], &dst[a]) {
                (Placement::Replicate, q) if q.is_shard() => {
                    self.emit(a, TransitionAction::LocalSlice, q.clone());
                }
                (Placement::Replicate, q @ Placement::Partial { .. }) => {
                    self.emit(a, TransitionAction::LocalPartial, q.clone());
                }
                (Placement::Partial { .. }, q) if q.is_shard() => {
                    self.collective(a, CollectiveKind::ReduceScatter, q.clone());
                }
                _ => {}
            }
        }
        // Phase 3: remaining reductions.
        for a in (0..n).rev() {
            if self.cur.placements[a] != dst[a] && self.cur.placements[a].is_partial() {
                self.collective(a, CollectiveKind::AllReduce, Placement::Replicate);
                if dst[a].is_partial() {
                    self.emit(a, TransitionAction::LocalPartial, dst[a].clone());
                }
            }
        }
    }

    /// Transitions where `cur` or `dst` holds a `RaggedShard`.
    fn lower_ragged(&mut self, dst: &Layout) {
        let n = dst.placements.len();
        let src_axis = self.cur.ragged_axis();
        let dst_axis = dst.ragged_axis();
        if let (Some(a), Some(b)) = (src_axis, dst_axis)
            && a == b
            && matches!(
                (&self.cur.placements[a], &dst.placements[b]),
                (Placement::RaggedShard { dims: x, .. }, Placement::RaggedShard { dims: y, .. })
                    if x == y
            )
        {
            self.collective(a, CollectiveKind::AllToAllV, dst.placements[a].clone());
            return;
        }
        match src_axis {
            // Every other axis is Replicate already.
            Some(a) => self.collective(a, CollectiveKind::AllGather, Placement::Replicate),
            None => {
                let mut mid = vec![Placement::Replicate; n];
                if let Some(b) = dst_axis
                    && self.cur.placements[b].is_partial()
                {
                    mid[b] = self.cur.placements[b].clone();
                }
                self.lower_plain(&mid);
            }
        }
        match dst_axis {
            Some(b) => {
                let to = dst.placements[b].clone();
                if self.cur.placements[b].is_partial() {
                    self.collective(b, CollectiveKind::ReduceScatter, to);
                } else {
                    self.emit(b, TransitionAction::LocalSlice, to);
                }
            }
            None => self.lower_plain(&dst.placements),
        }
    }
}

/// `true` when `Replicate → Partial(op)` zeroes the values of the non-root ranks (only `sum`).
pub fn local_partial_zeroes_non_root(op: ReduceOp) -> bool {
    op == ReduceOp::Sum
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Placement = Placement::Replicate;

    fn s(dim: usize) -> Placement {
        Placement::shard(dim)
    }

    fn p() -> Placement {
        Placement::partial_sum()
    }

    fn setup(sizes: &[usize]) -> (DeviceMesh, Topology) {
        let mesh =
            DeviceMesh::new(sizes.iter().enumerate().map(|(i, &s)| (format!("a{i}"), s))).unwrap();
        let world = mesh.world_size();
        (mesh, Topology::new(world, 1, 1).unwrap())
    }

    fn lower(
        sizes: &[usize],
        shape: &[u64],
        src: Vec<Placement>,
        dst: Vec<Placement>,
    ) -> TransitionPlan {
        let (mesh, topo) = setup(sizes);
        let src = Layout::new(shape.to_vec(), src, &mesh).unwrap();
        let dst = Layout::new(shape.to_vec(), dst, &mesh).unwrap();
        lower_transition(&src, &dst, &mesh, &topo, 2).unwrap()
    }

    fn summary(plan: &TransitionPlan) -> Vec<(&'static str, usize)> {
        plan.steps
            .iter()
            .map(|s| (s.action.name(), s.mesh_axis))
            .collect()
    }

    #[test]
    fn single_axis_rules() {
        let cases = [
            (s(0), R, "all-gather"),
            (p(), R, "all-reduce"),
            (p(), s(1), "reduce-scatter"),
            (s(0), s(1), "all-to-all"),
            (R, s(0), "local-slice"),
            (R, p(), "local-partial"),
        ];
        for (from, to, want) in cases {
            let plan = lower(&[4], &[8, 4], vec![from.clone()], vec![to.clone()]);
            assert_eq!(summary(&plan), vec![(want, 0)], "{from} -> {to}");
        }
        assert!(lower(&[4], &[8, 4], vec![s(0)], vec![s(0)]).is_identity());
    }

    #[test]
    fn bytes_per_step() {
        // [8, 4] f16 over 4 ranks: shard = 8 elements = 16 bytes.
        let ag = lower(&[4], &[8, 4], vec![s(0)], vec![R]);
        assert_eq!(
            (
                ag.steps[0].bytes_in_per_rank,
                ag.steps[0].bytes_out_per_rank
            ),
            (16, 64)
        );
        let rs = lower(&[4], &[8, 4], vec![p()], vec![s(0)]);
        assert_eq!(
            (
                rs.steps[0].bytes_in_per_rank,
                rs.steps[0].bytes_out_per_rank
            ),
            (64, 16)
        );
        let ar = lower(&[4], &[8, 4], vec![p()], vec![R]);
        assert_eq!(
            (
                ar.steps[0].bytes_in_per_rank,
                ar.steps[0].bytes_out_per_rank
            ),
            (64, 64)
        );
        let a2a = lower(&[4], &[8, 4], vec![s(0)], vec![s(1)]);
        assert_eq!(
            (
                a2a.steps[0].bytes_in_per_rank,
                a2a.steps[0].bytes_out_per_rank
            ),
            (16, 16)
        );
        // Uneven: 5 rows over 4 ranks pad to 2 rows.
        let uneven = lower(&[4], &[5, 4], vec![s(0)], vec![R]);
        assert_eq!(uneven.steps[0].bytes_in_per_rank, 16);
        assert_eq!(uneven.steps[0].bytes_out_per_rank, 64);
        assert_eq!(uneven.comm_bytes_in_per_rank(), 16);
        let empty = lower(&[4], &[0, 4], vec![s(0)], vec![R]);
        assert_eq!(empty.steps[0].bytes_out_per_rank, 0);
    }

    #[test]
    fn nested_shards_unshard_inner_first() {
        let plan = lower(&[2, 2], &[8], vec![s(0), s(0)], vec![R, R]);
        assert_eq!(summary(&plan), vec![("all-gather", 1), ("all-gather", 0)]);
        assert_eq!(plan.steps[0].layout.placements, vec![s(0), R]);
        // Changing only the outer split of a nested dim re-gathers the inner one.
        let plan = lower(&[2, 2], &[8], vec![s(0), s(0)], vec![R, s(0)]);
        assert_eq!(
            summary(&plan),
            vec![("all-gather", 1), ("all-gather", 0), ("local-slice", 1)]
        );
        // An unchanged outer split stays.
        let plan = lower(&[2, 2], &[8], vec![s(0), s(0)], vec![s(0), R]);
        assert_eq!(summary(&plan), vec![("all-gather", 1)]);
    }

    #[test]
    fn hsdp_gradient_reduce_scatter_then_all_reduce() {
        let plan = lower(&[2, 4], &[8, 4], vec![p(), p()], vec![R, s(0)]);
        assert_eq!(
            summary(&plan),
            vec![("reduce-scatter", 1), ("all-reduce", 0)]
        );
        assert_eq!(plan.steps[1].bytes_in_per_rank, 16);
        // Two FSDP axes on one dim reduce-scatter outer first.
        let plan = lower(&[2, 2], &[8, 4], vec![p(), p()], vec![s(0), s(0)]);
        assert_eq!(
            summary(&plan),
            vec![("reduce-scatter", 0), ("reduce-scatter", 1)]
        );
        // Partial next to a shard: all-reduce the small pieces before gathering.
        let plan = lower(&[2, 2], &[8, 4], vec![s(0), p()], vec![R, R]);
        assert_eq!(summary(&plan), vec![("all-reduce", 1), ("all-gather", 0)]);
    }

    #[test]
    fn generic_fallbacks() {
        let plan = lower(&[4], &[8], vec![s(0)], vec![p()]);
        assert_eq!(
            summary(&plan),
            vec![("all-gather", 0), ("local-partial", 0)]
        );
        let ss = Placement::StridedShard {
            dim: 0,
            split_factor: 2,
        };
        let plan = lower(&[4], &[8], vec![ss.clone()], vec![s(0)]);
        assert_eq!(summary(&plan), vec![("all-gather", 0), ("local-slice", 0)]);
        let plan = lower(&[2, 2], &[4, 4], vec![s(0), s(1)], vec![s(1), s(0)]);
        assert_eq!(
            summary(&plan),
            vec![("all-gather", 1), ("all-to-all", 0), ("local-slice", 1)]
        );
        let max = Placement::Partial { op: ReduceOp::Max };
        let plan = lower(&[2], &[4], vec![p()], vec![max]);
        assert_eq!(
            summary(&plan),
            vec![("all-reduce", 0), ("local-partial", 0)]
        );
    }

    #[test]
    fn ragged_transitions() {
        let rs = |units: Vec<u64>| Placement::RaggedShard {
            dims: 1,
            local_units: units,
        };
        let plan = lower(
            &[2, 3],
            &[6, 2],
            vec![R, rs(vec![1, 1, 1])],
            vec![R, rs(vec![3, 2, 1])],
        );
        assert_eq!(summary(&plan), vec![("all-to-all-v", 1)]);
        assert_eq!(plan.steps[0].bytes_in_per_rank, 2 * 2 * 2);
        assert_eq!(plan.steps[0].bytes_out_per_rank, 3 * 2 * 2);
        let plan = lower(&[2, 3], &[6, 2], vec![p(), p()], vec![R, rs(vec![1, 2, 3])]);
        assert_eq!(
            summary(&plan),
            vec![("all-reduce", 0), ("reduce-scatter", 1)]
        );
        let plan = lower(&[2, 3], &[6, 2], vec![R, rs(vec![1, 2, 3])], vec![s(1), R]);
        assert_eq!(summary(&plan), vec![("all-gather", 1), ("local-slice", 0)]);
        let plan = lower(
            &[2, 3],
            &[6, 2],
            vec![s(0), s(1)],
            vec![R, rs(vec![1, 2, 3])],
        );
        assert_eq!(
            summary(&plan),
            vec![("all-gather", 1), ("all-gather", 0), ("local-slice", 1)]
        );
    }

    #[test]
    fn size_one_axes_are_folded() {
        let plan = lower(&[1, 4], &[8], vec![s(0), p()], vec![R, s(0)]);
        assert_eq!(summary(&plan), vec![("reduce-scatter", 1)]);
        assert_eq!(plan.steps[0].layout.placements, vec![R, s(0)]);
        assert!(lower(&[1], &[8], vec![s(0)], vec![p()]).is_identity());
    }

    #[test]
    fn tiers_on_two_tier_topology() {
        // 8 ranks, 4 per machine: axis 0 (size 2) crosses machines, axis 1 (size 4) does not.
        let mesh = DeviceMesh::new([("dp_replicate", 2), ("dp_shard", 4)]).unwrap();
        let topo = Topology::new(4, 2, 1).unwrap();
        let src = Layout::new(vec![8, 8], vec![p(), p()], &mesh).unwrap();
        let dst = Layout::new(vec![8, 8], vec![R, s(0)], &mesh).unwrap();
        let plan = lower_transition(&src, &dst, &mesh, &topo, 4).unwrap();
        assert_eq!(plan.steps[0].axis_name, "dp_shard");
        assert_eq!(plan.steps[0].tier, Tier::IntraMachine);
        assert_eq!(plan.steps[0].group_size, 4);
        assert_eq!(plan.steps[1].axis_name, "dp_replicate");
        assert_eq!(plan.steps[1].tier, Tier::IntraSupernode);
        let topo2 = Topology::new(2, 2, 2).unwrap();
        let plan = lower_transition(&src, &dst, &mesh, &topo2, 4).unwrap();
        assert_eq!(plan.steps[0].tier, Tier::IntraSupernode);
        assert_eq!(plan.steps[1].tier, Tier::InterSupernode);
        let json = serde_json::to_string(&plan).unwrap();
        let back: TransitionPlan = serde_json::from_str(&json).unwrap();
        assert_eq!(back, plan);
    }

    #[test]
    fn errors() {
        let (mesh, topo) = setup(&[2]);
        let a = Layout::new(vec![4], vec![s(0)], &mesh).unwrap();
        let b = Layout::new(vec![6], vec![R], &mesh).unwrap();
        let e = lower_transition(&a, &b, &mesh, &topo, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("global shape"), "{e}");
        let bad = Layout {
            global_shape: vec![4],
            placements: vec![s(3)],
        };
        let e = lower_transition(&a, &bad, &mesh, &topo, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dim 3"), "{e}");
    }

    #[test]
    fn classify_labels() {
        let ss = Placement::StridedShard {
            dim: 0,
            split_factor: 2,
        };
        assert_eq!(
            classify_transition(&[s(1), s(0)], &[s(1), s(0)]),
            "identity"
        );
        assert_eq!(classify_transition(&[s(1), s(0)], &[s(1), R]), "all_gather");
        assert_eq!(classify_transition(&[p(), s(0)], &[R, s(0)]), "all_reduce");
        assert_eq!(
            classify_transition(&[p(), p()], &[R, s(0)]),
            "reduce_scatter"
        );
        assert_eq!(classify_transition(&[s(0)], &[s(1)]), "all_to_all");
        assert_eq!(classify_transition(&[R, R], &[ss, s(0)]), "local_slice");
        assert_eq!(classify_transition(&[s(0)], &[p()]), "redistribute");
        assert_eq!(classify_transition(&[R], &[p()]), "redistribute");
        let plan = lower(&[2], &[4], vec![p()], vec![s(0)]);
        assert_eq!(plan.label(), "reduce_scatter");
    }
}
