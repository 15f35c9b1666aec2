//! Layouts: a global tensor shape plus one placement per mesh axis; which global elements
//! every rank holds, and how to cut a global tensor into local pieces and put it back.
//!
//! # Conventions
//!
//! - **Ceil-chunk rule** ([`chunk_range`]): a length `n` split over `k` ranks uses chunks of
//!   `ceil(n/k)`; leading ranks get full chunks, trailing ranks may get nothing
//!   (`n=4, k=3` gives sizes `[2, 2, 0]`), as `torch.chunk` / DTensor `Shard`.
//! - **Several axes on one dim** apply in mesh-axis order: axis 0 splits the global dim first,
//!   the next axis splits the piece that results (DTensor's default shard order).
//! - **`StridedShard{dim, split_factor: f}`** on an axis of size `k`: the current piece of the
//!   dim (length `n`) is cut into `f*k` ceil-chunks and rank `i` holds chunks `j*k + i` for
//!   `j` in `0..f`, concatenated in `j` order (torch `_StridedShard`, the FSDP-over-TP case).
//! - **`RaggedShard{dims, local_units}`** (exactly one per layout, `Replicate` elsewhere): the
//!   leading `dims` dims are flattened into `prefix_cells` cells; with
//!   `cells_per_unit = prefix_cells / sum(local_units)`, rank `r` of the axis owns the cells
//!   `[sum(units[..r]) * cells_per_unit, + units[r] * cells_per_unit)` with all trailing dims.
//! - **Index view.** Every per-dim result of this module (local index sets, local shapes,
//!   offsets, padded shapes) is expressed in the layout's *index view*
//!   ([`Layout::index_shape`]): the global shape itself, except for ragged layouts, whose
//!   leading `dims` dims are replaced by one cell dim of length `prefix_cells`. The row-major
//!   element order of the view is that of the global tensor, so flat buffers are unchanged.
//! - A local piece is the Cartesian product of its per-dim index lists, stored row-major in
//!   local order.

use crate::error::{PlanError, PlanResult};
use crate::mesh::DeviceMesh;
use crate::placement::Placement;
use serde::{Deserialize, Serialize};
use std::ops::{Add, Range};

/// The ceil-chunk share of rank `i` when a length `n` is split over `k` ranks: with
/// `chunk = ceil(n/k)`, rank `i` owns `[min(n, i*chunk), min(n, (i+1)*chunk))`. `k = 0` is
/// treated as `1`; ranks `i >= k` get an empty range at `n`.
pub fn chunk_range(n: u64, k: u64, i: u64) -> Range<u64> {
    if i >= k.max(1) {
        return n..n;
    }
    let chunk = n.div_ceil(k.max(1));
    let start = i.saturating_mul(chunk).min(n);
    let end = i.saturating_add(1).saturating_mul(chunk).min(n);
    start..end
}

/// A global tensor shape plus one placement per mesh axis.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    /// Global (logical) tensor shape.
    pub global_shape: Vec<u64>,
    /// One placement per mesh axis, in mesh-axis order.
    pub placements: Vec<Placement>,
}

/// The piece of one index-view dim a rank holds: global index ranges in local order, plus the
/// position an empty piece sits at (torch reports offset `n` for empty trailing shards).
#[derive(Debug, Clone)]
struct DimPiece {
    ranges: Vec<Range<u64>>,
    anchor: u64,
}

fn push_merged(out: &mut Vec<Range<u64>>, r: Range<u64>) {
    if r.start >= r.end {
        return;
    }
    if let Some(last) = out.last_mut()
        && last.end == r.start
    {
        last.end = r.end;
        return;
    }
    out.push(r);
}

impl DimPiece {
    fn full(n: u64) -> Self {
        let mut ranges = Vec::new();
        push_merged(&mut ranges, 0..n);
        DimPiece { ranges, anchor: 0 }
    }

    fn len(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    /// Appends the global ranges at local positions `pos` to `out`.
    fn select_into(&self, pos: &Range<u64>, out: &mut Vec<Range<u64>>) {
        let mut at = 0u64;
        for r in &self.ranges {
            let len = r.end - r.start;
            let lo = pos.start.max(at);
            let hi = pos.end.min(at + len);
            if lo < hi {
                push_merged(out, r.start + (lo - at)..r.start + (hi - at));
            }
            at += len;
            if at >= pos.end {
                break;
            }
        }
    }

    /// The global index at local position `p`, or the end of the piece when `p` is past it.
    fn anchor_at(&self, p: u64) -> u64 {
        let mut at = 0u64;
        for r in &self.ranges {
            let len = r.end - r.start;
            if p < at + len {
                return r.start + (p - at);
            }
            at += len;
        }
        self.ranges.last().map_or(self.anchor, |r| r.end)
    }

    fn shard(&mut self, k: u64, i: u64) {
        let pos = chunk_range(self.len(), k, i);
        let mut out = Vec::new();
        self.select_into(&pos, &mut out);
        self.anchor = out
            .first()
            .map_or_else(|| self.anchor_at(pos.start), |r| r.start);
        self.ranges = out;
    }

    fn strided_shard(&mut self, f: u64, k: u64, i: u64) {
        let n = self.len();
        let parts = f.max(1).saturating_mul(k.max(1));
        let mut out = Vec::new();
        let first = chunk_range(n, parts, i);
        for j in 0..f.max(1) {
            let pos = chunk_range(n, parts, j.saturating_mul(k.max(1)).saturating_add(i));
            if pos.start >= n {
                break;
            }
            self.select_into(&pos, &mut out);
        }
        self.anchor = out
            .first()
            .map_or_else(|| self.anchor_at(first.start), |r| r.start);
        self.ranges = out;
    }
}

/// Calls `f(global_flat_start, len)` for every contiguous run of a local piece, in local
/// order (adjacent runs are merged).
fn for_each_run(sets: &[Vec<Range<u64>>], view: &[u64], mut f: impl FnMut(u64, u64)) {
    let nd = view.len();
    if nd == 0 {
        f(0, 1);
        return;
    }
    if sets.len() != nd || sets.iter().any(|s| s.is_empty()) {
        return;
    }
    let mut strides = vec![1u64; nd];
    for d in (0..nd - 1).rev() {
        strides[d] = strides[d + 1].saturating_mul(view[d + 1]);
    }
    let outer: Vec<Vec<u64>> = sets[..nd - 1]
        .iter()
        .map(|s| s.iter().flat_map(|r| r.clone()).collect())
        .collect();
    let last = &sets[nd - 1];
    let mut pending: Option<(u64, u64)> = None;
    let mut emit = |start: u64, len: u64, f: &mut dyn FnMut(u64, u64)| match pending {
        Some((s, l)) if s + l == start => pending = Some((s, l + len)),
        Some((s, l)) => {
            f(s, l);
            pending = Some((start, len));
        }
        None => pending = Some((start, len)),
    };
    let mut idx = vec![0usize; nd - 1];
    'outer: loop {
        let base: u64 = (0..nd - 1).map(|d| outer[d][idx[d]] * strides[d]).sum();
        for r in last {
            emit(base + r.start, r.end - r.start, &mut f);
        }
        let mut d = nd - 1;
        loop {
            if d == 0 {
                break 'outer;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < outer[d].len() {
                break;
            }
            idx[d] = 0;
        }
    }
    if let Some((s, l)) = pending {
        f(s, l);
    }
}

fn product(xs: &[u64]) -> u64 {
    xs.iter().fold(1u64, |a, &b| a.saturating_mul(b))
}

impl Layout {
    /// Builds and validates a layout for `mesh` (see [`Layout::validate`]).
    pub fn new(
        global_shape: Vec<u64>,
        placements: Vec<Placement>,
        mesh: &DeviceMesh,
    ) -> PlanResult<Layout> {
        let layout = Layout {
            global_shape,
            placements,
        };
        layout.validate(mesh)?;
        Ok(layout)
    }

    /// A layout that replicates `global_shape` on every axis of `mesh`.
    pub fn replicated(global_shape: Vec<u64>, mesh: &DeviceMesh) -> Layout {
        Layout {
            global_shape,
            placements: vec![Placement::Replicate; mesh.ndim()],
        }
    }

    /// Checks the layout against `mesh`: one placement per mesh axis, shard dims inside the
    /// tensor, strided split factors >= 1, and the ragged rules (at most one `RaggedShard`,
    /// `Replicate` on every other axis, `1 <= dims <= ndim`, one unit count per rank of the
    /// axis, `sum(local_units) > 0` dividing the product of the leading `dims` dims).
    pub fn validate(&self, mesh: &DeviceMesh) -> PlanResult<()> {
        let ndim = self.global_shape.len();
        let shape = &self.global_shape;
        if self.placements.len() != mesh.ndim() {
            return Err(PlanError::Layout(format!(
                "layout of tensor {shape:?} has {} placements but the mesh has {} axes [{}]; \
                 give one placement per mesh axis (Replicate for axes that do not split it)",
                self.placements.len(),
                mesh.ndim(),
                mesh.axis_names().join(", ")
            )));
        }
        if self
            .global_shape
            .iter()
            .try_fold(1u64, |a, &b| a.checked_mul(b))
            .is_none()
        {
            return Err(PlanError::Layout(format!(
                "tensor {shape:?} has more than 2^64 elements; use a smaller shape"
            )));
        }
        let ragged: Vec<usize> = (0..self.placements.len())
            .filter(|&a| matches!(self.placements[a], Placement::RaggedShard { .. }))
            .collect();
        if ragged.len() > 1 {
            return Err(PlanError::Layout(format!(
                "tensor {shape:?} has RaggedShard on axes '{}' and '{}'; a layout may hold only \
                 one RaggedShard (use Replicate on the other axes)",
                mesh.axes()[ragged[0]].name,
                mesh.axes()[ragged[1]].name
            )));
        }
        for (a, (p, axis)) in self.placements.iter().zip(mesh.axes()).enumerate() {
            let name = &axis.name;
            match p {
                Placement::Shard { dim } | Placement::StridedShard { dim, .. } => {
                    if *dim >= ndim {
                        return Err(PlanError::Layout(format!(
                            "axis '{name}' places {p} on dim {dim} but tensor {shape:?} has {ndim} \
                             dims; use a dim in 0..{ndim}"
                        )));
                    }
                    if let Placement::StridedShard {
                        split_factor: 0, ..
                    } = p
                    {
                        return Err(PlanError::Placement(format!(
                            "axis '{name}': strided shard of dim {dim} has split factor 0; \
                             use a split factor >= 1"
                        )));
                    }
                }
                Placement::RaggedShard { dims, local_units } => {
                    if *dims == 0 || *dims > ndim {
                        return Err(PlanError::Layout(format!(
                            "axis '{name}': RaggedShard flattens {dims} leading dims but tensor \
                             {shape:?} has {ndim} dims; use dims in 1..={ndim}"
                        )));
                    }
                    if local_units.len() != axis.size {
                        return Err(PlanError::Layout(format!(
                            "axis '{name}' has {} ranks but its RaggedShard lists {} unit counts \
                             {local_units:?}; give one count per rank of the axis",
                            axis.size,
                            local_units.len()
                        )));
                    }
                    let total = local_units
                        .iter()
                        .try_fold(0u64, |acc, &u| acc.checked_add(u))
                        .unwrap_or(0);
                    let prefix = product(&self.global_shape[..*dims]);
                    if total == 0 || !prefix.is_multiple_of(total) {
                        return Err(PlanError::Layout(format!(
                            "axis '{name}': RaggedShard units {local_units:?} sum to {total}, which \
                             does not divide the {prefix} cells of dims 0..{dims} of tensor \
                             {shape:?}; choose unit counts whose (non-zero) sum divides {prefix}"
                        )));
                    }
                    if let Some(other) = (0..self.placements.len())
                        .find(|&b| b != a && !self.placements[b].is_replicate())
                    {
                        return Err(PlanError::Layout(format!(
                            "axis '{}' is {} but axis '{name}' holds a RaggedShard of tensor \
                             {shape:?}; a ragged layout needs Replicate on every other axis",
                            mesh.axes()[other].name,
                            self.placements[other]
                        )));
                    }
                }
                Placement::Replicate | Placement::Partial { .. } => {}
            }
        }
        Ok(())
    }

    /// The mesh axis holding a `RaggedShard`, if any.
    pub fn ragged_axis(&self) -> Option<usize> {
        self.placements
            .iter()
            .position(|p| matches!(p, Placement::RaggedShard { .. }))
    }

    /// True when some axis holds a `RaggedShard`.
    pub fn is_ragged(&self) -> bool {
        self.ragged_axis().is_some()
    }

    /// True when some axis holds a `Partial`.
    pub fn has_partial(&self) -> bool {
        self.placements.iter().any(Placement::is_partial)
    }

    /// Number of elements of the global tensor.
    pub fn global_numel(&self) -> u64 {
        product(&self.global_shape)
    }

    /// The index view every per-dim result is expressed in: the global shape, or for a
    /// ragged layout `[prefix_cells, shape[dims..]...]`.
    pub fn index_shape(&self) -> Vec<u64> {
        match self.ragged_axis().map(|a| &self.placements[a]) {
            Some(Placement::RaggedShard { dims, .. }) => {
                let m = (*dims).min(self.global_shape.len());
                let mut view = vec![product(&self.global_shape[..m])];
                view.extend_from_slice(&self.global_shape[m..]);
                view
            }
            _ => self.global_shape.clone(),
        }
    }

    /// A copy with axis `axis` set to `placement` (not validated).
    pub fn with_placement(&self, axis: usize, placement: Placement) -> Layout {
        let mut out = self.clone();
        if let Some(p) = out.placements.get_mut(axis) {
            *p = placement;
        }
        out
    }

    /// A copy with every `Partial` axis replaced by `Replicate` (the layout of the values
    /// returned by [`combine_partials`]).
    pub fn without_partials(&self) -> Layout {
        let mut out = self.clone();
        for p in &mut out.placements {
            if p.is_partial() {
                *p = Placement::Replicate;
            }
        }
        out
    }

    /// The rank holding the same piece as `rank` with coordinate 0 on every axis that does not
    /// split the tensor (`Replicate`, `Partial`): the canonical owner of that shard coordinate.
    pub fn canonical_rank(&self, mesh: &DeviceMesh, rank: usize) -> usize {
        let mut coords = mesh.coords_of(rank);
        for (c, p) in coords.iter_mut().zip(&self.placements) {
            if !p.is_shard() {
                *c = 0;
            }
        }
        mesh.rank_of(&coords)
    }

    /// Per index-view dim, what `rank` holds. Never panics; for layouts that do not validate
    /// against `mesh` the result is unspecified.
    fn pieces(&self, mesh: &DeviceMesh, rank: usize) -> Vec<DimPiece> {
        let view = self.index_shape();
        let mut pieces: Vec<DimPiece> = view.iter().map(|&n| DimPiece::full(n)).collect();
        let coords = mesh.coords_of(rank);
        for (a, p) in self.placements.iter().enumerate() {
            let k = mesh.axes().get(a).map_or(1, |x| x.size) as u64;
            let i = coords.get(a).copied().unwrap_or(0) as u64;
            match p {
                Placement::Shard { dim } => {
                    if let Some(piece) = pieces.get_mut(*dim) {
                        piece.shard(k, i);
                    }
                }
                Placement::StridedShard { dim, split_factor } => {
                    if let Some(piece) = pieces.get_mut(*dim) {
                        piece.strided_shard(*split_factor as u64, k, i);
                    }
                }
                Placement::RaggedShard { local_units, .. } => {
                    let Some(piece) = pieces.get_mut(0) else {
                        continue;
                    };
                    let cells = view[0];
                    let total: u64 = local_units.iter().fold(0u64, |s, &u| s.saturating_add(u));
                    let per_unit = cells.checked_div(total).unwrap_or(0);
                    let i = i as usize;
                    let before: u64 = local_units
                        .iter()
                        .take(i)
                        .fold(0u64, |s, &u| s.saturating_add(u));
                    let mine = local_units.get(i).copied().unwrap_or(0);
                    let start = before.saturating_mul(per_unit).min(cells);
                    let end = before
                        .saturating_add(mine)
                        .saturating_mul(per_unit)
                        .min(cells);
                    let mut ranges = Vec::new();
                    push_merged(&mut ranges, start..end);
                    *piece = DimPiece {
                        ranges,
                        anchor: start,
                    };
                }
                Placement::Replicate | Placement::Partial { .. } => {}
            }
        }
        pieces
    }

    /// Per index-view dim, the global index ranges `rank` holds, in local order (adjacent
    /// ranges merged; a dim of which the rank holds nothing gives an empty list). For ragged
    /// layouts dim 0 is the flattened cell dim (see the module docs).
    pub fn local_index_sets(&self, mesh: &DeviceMesh, rank: usize) -> Vec<Vec<Range<u64>>> {
        self.pieces(mesh, rank)
            .into_iter()
            .map(|p| p.ranges)
            .collect()
    }

    /// Shape of `rank`'s local piece in the index view.
    pub fn local_shape(&self, mesh: &DeviceMesh, rank: usize) -> Vec<u64> {
        self.pieces(mesh, rank).iter().map(DimPiece::len).collect()
    }

    /// Number of elements `rank` holds.
    pub fn local_numel(&self, mesh: &DeviceMesh, rank: usize) -> u64 {
        product(&self.local_shape(mesh, rank))
    }

    /// Global offset (index view) of `rank`'s piece when it is one contiguous box, `None`
    /// otherwise (e.g. a strided shard holding several separate chunks). Empty pieces report
    /// the ceil-chunk position (`n` for an empty trailing shard, as torch does).
    pub fn local_offset(&self, mesh: &DeviceMesh, rank: usize) -> Option<Vec<u64>> {
        self.pieces(mesh, rank)
            .iter()
            .map(|p| match p.ranges.as_slice() {
                [] => Some(p.anchor),
                [r] => Some(r.start),
                _ => None,
            })
            .collect()
    }

    /// Element-wise maximum of the local shapes over all ranks: the padded shape uneven
    /// collectives use.
    pub fn max_local_shape(&self, mesh: &DeviceMesh) -> Vec<u64> {
        let mut out = vec![0u64; self.index_shape().len()];
        for rank in self.canonical_ranks(mesh) {
            for (m, s) in out.iter_mut().zip(self.local_shape(mesh, rank)) {
                *m = (*m).max(s);
            }
        }
        out
    }

    /// One rank per distinct local piece: the ranks with coordinate 0 on every axis that does
    /// not split the tensor (see [`Layout::canonical_rank`]), in rank order.
    pub fn canonical_ranks(&self, mesh: &DeviceMesh) -> Vec<usize> {
        let axes: Vec<usize> = (0..mesh.ndim())
            .filter(|&a| self.placements.get(a).is_some_and(Placement::is_shard))
            .collect();
        mesh.group_of(0, &axes)
    }

    /// Number of elements of [`Layout::max_local_shape`] (the padded local buffer).
    pub fn max_local_numel(&self, mesh: &DeviceMesh) -> u64 {
        product(&self.max_local_shape(mesh))
    }

    /// True when every rank holds a piece of the same shape (no collective needs padding).
    pub fn is_even(&self, mesh: &DeviceMesh) -> bool {
        let first = self.local_shape(mesh, 0);
        self.canonical_ranks(mesh)
            .into_iter()
            .all(|r| self.local_shape(mesh, r) == first)
    }

    /// Flat (row-major) global indices of `rank`'s local elements, in local order. Costs
    /// O(local numel); meant for tests and reference execution.
    pub fn local_element_indices(&self, mesh: &DeviceMesh, rank: usize) -> Vec<u64> {
        let sets = self.local_index_sets(mesh, rank);
        let mut out = Vec::new();
        for_each_run(&sets, &self.index_shape(), |s, l| out.extend(s..s + l));
        out
    }
}

impl std::fmt::Display for Layout {
    /// `[4, 6] (S(0), R)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ps: Vec<String> = self.placements.iter().map(Placement::to_string).collect();
        write!(f, "{:?} ({})", self.global_shape, ps.join(", "))
    }
}

fn check_rank(mesh: &DeviceMesh, rank: usize) -> PlanResult<()> {
    if rank >= mesh.world_size() {
        return Err(PlanError::Layout(format!(
            "rank {rank} is outside the mesh of {} ranks; use a rank in 0..{}",
            mesh.world_size(),
            mesh.world_size()
        )));
    }
    Ok(())
}

fn check_locals<T>(locals: &[Vec<T>], layout: &Layout, mesh: &DeviceMesh) -> PlanResult<()> {
    if locals.len() != mesh.world_size() {
        return Err(PlanError::Layout(format!(
            "got {} local buffers for a mesh of {} ranks; pass one buffer per rank, in rank order",
            locals.len(),
            mesh.world_size()
        )));
    }
    for (rank, local) in locals.iter().enumerate() {
        let want = layout.local_numel(mesh, rank);
        if local.len() as u64 != want {
            return Err(PlanError::Layout(format!(
                "rank {rank} holds {} elements but layout {layout} gives it {want} (local shape \
                 {:?}); pass the buffers produced for this layout",
                local.len(),
                layout.local_shape(mesh, rank)
            )));
        }
    }
    Ok(())
}

/// `rank`'s local piece of the row-major `global` tensor under `layout`, row-major in local
/// order. `Partial` axes are treated like `Replicate` (every rank gets the whole value).
pub fn shard_tensor<T: Copy>(
    global: &[T],
    layout: &Layout,
    mesh: &DeviceMesh,
    rank: usize,
) -> PlanResult<Vec<T>> {
    layout.validate(mesh)?;
    check_rank(mesh, rank)?;
    if global.len() as u64 != layout.global_numel() {
        return Err(PlanError::Layout(format!(
            "global buffer has {} elements but tensor {:?} has {}; pass the whole tensor",
            global.len(),
            layout.global_shape,
            layout.global_numel()
        )));
    }
    let sets = layout.local_index_sets(mesh, rank);
    let mut out = Vec::with_capacity(layout.local_numel(mesh, rank) as usize);
    for_each_run(&sets, &layout.index_shape(), |s, l| {
        out.extend_from_slice(&global[s as usize..(s + l) as usize]);
    });
    Ok(out)
}

/// Rebuilds the global tensor from one local buffer per rank (in rank order). Every shard
/// coordinate is read from its [`Layout::canonical_rank`]; replicas are not compared. Layouts
/// with `Partial` axes are refused: reduce them first with [`sum_partials`] or
/// [`combine_partials`] and gather under [`Layout::without_partials`].
pub fn gather_tensor<T: Copy + Default>(
    locals: &[Vec<T>],
    layout: &Layout,
    mesh: &DeviceMesh,
) -> PlanResult<Vec<T>> {
    layout.validate(mesh)?;
    if let Some(a) = layout.placements.iter().position(Placement::is_partial) {
        return Err(PlanError::Layout(format!(
            "axis '{}' of layout {layout} is {}; gather_tensor cannot combine partial values: \
             reduce them with sum_partials/combine_partials and gather under \
             layout.without_partials()",
            mesh.axes()[a].name,
            layout.placements[a]
        )));
    }
    check_locals(locals, layout, mesh)?;
    let mut global = vec![T::default(); layout.global_numel() as usize];
    let view = layout.index_shape();
    for rank in layout.canonical_ranks(mesh) {
        let local = &locals[rank];
        let sets = layout.local_index_sets(mesh, rank);
        let mut at = 0usize;
        for_each_run(&sets, &view, |s, l| {
            let l = l as usize;
            global[s as usize..s as usize + l].copy_from_slice(&local[at..at + l]);
            at += l;
        });
    }
    Ok(global)
}

/// Reduces the values of every group along all `Partial` axes with `combine` (folded in
/// group rank order) and returns one buffer per rank laid out by
/// [`Layout::without_partials`]. The reduce op stored in the placements is not consulted:
/// pass the matching `combine` (for `Avg`, sum and divide by the group size afterwards).
pub fn combine_partials<T: Copy>(
    locals: &[Vec<T>],
    layout: &Layout,
    mesh: &DeviceMesh,
    mut combine: impl FnMut(T, T) -> T,
) -> PlanResult<Vec<Vec<T>>> {
    layout.validate(mesh)?;
    check_locals(locals, layout, mesh)?;
    let axes: Vec<usize> = (0..layout.placements.len())
        .filter(|&a| layout.placements[a].is_partial())
        .collect();
    let mut out: Vec<Vec<T>> = vec![Vec::new(); locals.len()];
    for group in mesh.groups(&axes) {
        let mut acc = locals[group[0]].clone();
        for &r in &group[1..] {
            for (x, &y) in acc.iter_mut().zip(&locals[r]) {
                *x = combine(*x, y);
            }
        }
        for &r in &group {
            out[r] = acc.clone();
        }
    }
    Ok(out)
}

/// [`combine_partials`] with `+`: the values of a `Partial(sum)` layout made whole.
pub fn sum_partials<T: Copy + Add<Output = T>>(
    locals: &[Vec<T>],
    layout: &Layout,
    mesh: &DeviceMesh,
) -> PlanResult<Vec<Vec<T>>> {
    combine_partials(locals, layout, mesh, |a, b| a + b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::ReduceOp;

    fn mesh(sizes: &[usize]) -> DeviceMesh {
        DeviceMesh::new(sizes.iter().enumerate().map(|(i, &s)| (format!("a{i}"), s))).unwrap()
    }

    fn s(dim: usize) -> Placement {
        Placement::shard(dim)
    }

    fn ss(dim: usize, split_factor: usize) -> Placement {
        Placement::StridedShard { dim, split_factor }
    }

    const R: Placement = Placement::Replicate;

    #[test]
    fn ceil_chunks() {
        let sizes = |n, k| {
            (0..k)
                .map(|i| {
                    let r = chunk_range(n, k, i);
                    r.end - r.start
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(4, 3), vec![2, 2, 0]);
        assert_eq!(sizes(5, 4), vec![2, 2, 1, 0]);
        assert_eq!(sizes(1, 4), vec![1, 0, 0, 0]);
        assert_eq!(sizes(8, 4), vec![2, 2, 2, 2]);
        assert_eq!(chunk_range(4, 3, 2), 4..4);
        assert_eq!(chunk_range(0, 3, 1), 0..0);
        assert_eq!(chunk_range(7, 0, 0), 0..7);
        assert_eq!(chunk_range(7, 2, 9), 7..7);
    }

    #[test]
    fn uneven_shard_shapes_and_offsets() {
        let m = mesh(&[3]);
        let l = Layout::new(vec![4, 5], vec![s(0)], &m).unwrap();
        let shapes: Vec<_> = (0..3).map(|r| l.local_shape(&m, r)).collect();
        assert_eq!(shapes, vec![vec![2, 5], vec![2, 5], vec![0, 5]]);
        assert_eq!(l.local_offset(&m, 1), Some(vec![2, 0]));
        assert_eq!(l.local_offset(&m, 2), Some(vec![4, 0]));
        assert_eq!(l.max_local_shape(&m), vec![2, 5]);
        assert!(!l.is_even(&m));
        assert_eq!(l.local_numel(&m, 2), 0);
        assert!(l.local_index_sets(&m, 2)[0].is_empty());
        let even = Layout::new(vec![6, 5], vec![s(0)], &m).unwrap();
        assert!(even.is_even(&m));
    }

    #[test]
    fn two_axes_on_one_dim_nest_in_mesh_order() {
        let m = mesh(&[2, 3]);
        let l = Layout::new(vec![10], vec![s(0), s(0)], &m).unwrap();
        // axis 0 gives [0,5) / [5,10); axis 1 cuts 5 into 2,2,1.
        assert_eq!(l.local_index_sets(&m, 4), vec![vec![7..9]]);
        assert_eq!(l.local_index_sets(&m, 5), vec![vec![9..10]]);
        assert_eq!(l.local_offset(&m, 2), Some(vec![4]));
        assert_eq!(l.max_local_shape(&m), vec![2]);
    }

    #[test]
    fn strided_shard_matches_torch_example() {
        // torch: [8,8] on mesh (dp=2, tp=2), [_StridedShard(0, 2), Shard(0)]:
        // rank 1 holds rows 4-5, rank 2 rows 2-3.
        let m = mesh(&[2, 2]);
        let l = Layout::new(vec![8, 8], vec![ss(0, 2), s(0)], &m).unwrap();
        assert_eq!(l.local_index_sets(&m, 1)[0], vec![4..6]);
        assert_eq!(l.local_index_sets(&m, 2)[0], vec![2..4]);
        assert_eq!(l.local_offset(&m, 2), Some(vec![2, 0]));
        // A strided shard alone holds two separate chunks: no single offset.
        let alone = Layout::new(vec![8, 8], vec![ss(0, 2), R], &m).unwrap();
        assert_eq!(alone.local_index_sets(&m, 2)[0], vec![2..4, 6..8]);
        assert_eq!(alone.local_offset(&m, 2), None);
        assert_eq!(alone.local_shape(&m, 2), vec![4, 8]);
        let g: Vec<u32> = (0..64).collect();
        let local = shard_tensor(&g, &alone, &m, 2).unwrap();
        assert_eq!(&local[..8], &(16..24).collect::<Vec<_>>()[..]);
        assert_eq!(&local[16..24], &(48..56).collect::<Vec<_>>()[..]);
    }

    #[test]
    fn strided_shard_uneven() {
        // n = 7 over f*k = 4 chunks of 2: [0,2) [2,4) [4,6) [6,7); rank 1 holds chunks 1 and 3.
        let m = mesh(&[2]);
        let l = Layout::new(vec![7], vec![ss(0, 2)], &m).unwrap();
        assert_eq!(l.local_index_sets(&m, 0), vec![vec![0..2, 4..6]]);
        assert_eq!(l.local_index_sets(&m, 1), vec![vec![2..4, 6..7]]);
        assert_eq!(l.max_local_shape(&m), vec![4]);
    }

    #[test]
    fn ragged_geometry() {
        // shape [6, 2, 3], dims = 2 -> 12 cells; units [2, 1, 3] sum 6 -> 2 cells per unit.
        let m = mesh(&[2, 3]);
        let rs = Placement::RaggedShard {
            dims: 2,
            local_units: vec![2, 1, 3],
        };
        let l = Layout::new(vec![6, 2, 3], vec![R, rs], &m).unwrap();
        assert_eq!(l.index_shape(), vec![12, 3]);
        assert_eq!(l.local_index_sets(&m, 0), vec![vec![0..4], vec![0..3]]);
        assert_eq!(l.local_index_sets(&m, 4), vec![vec![4..6], vec![0..3]]);
        assert_eq!(l.local_shape(&m, 5), vec![6, 3]);
        assert_eq!(l.local_offset(&m, 5), Some(vec![6, 0]));
        assert_eq!(l.max_local_shape(&m), vec![6, 3]);
        let g: Vec<u16> = (0..36).collect();
        // Rank 1 (coordinate 1 on the ragged axis) owns flat elements [12, 18).
        assert_eq!(
            shard_tensor(&g, &l, &m, 1).unwrap(),
            (12..18).collect::<Vec<_>>()
        );
        let locals: Vec<Vec<u16>> = (0..6)
            .map(|r| shard_tensor(&g, &l, &m, r).unwrap())
            .collect();
        assert_eq!(gather_tensor(&locals, &l, &m).unwrap(), g);
    }

    #[test]
    fn shard_and_gather_round_trip_2d() {
        let m = mesh(&[2, 3]);
        let l = Layout::new(vec![5, 7], vec![s(1), s(0)], &m).unwrap();
        let g: Vec<i64> = (0..35).collect();
        let locals: Vec<Vec<i64>> = (0..6)
            .map(|r| shard_tensor(&g, &l, &m, r).unwrap())
            .collect();
        // rank 4 = (1, 1): cols [4,7), rows [2,4).
        assert_eq!(locals[4], vec![18, 19, 20, 25, 26, 27]);
        assert_eq!(l.local_offset(&m, 4), Some(vec![2, 4]));
        assert_eq!(gather_tensor(&locals, &l, &m).unwrap(), g);
    }

    #[test]
    fn partial_sums_and_gather() {
        let m = mesh(&[2, 2]);
        let l = Layout::new(vec![4], vec![Placement::partial_sum(), s(0)], &m).unwrap();
        let locals = vec![
            vec![1.0, 2.0],
            vec![3.0, 4.0],
            vec![10.0, 20.0],
            vec![30.0, 40.0],
        ];
        let err = gather_tensor(&locals, &l, &m).unwrap_err().to_string();
        assert!(err.contains("a0") && err.contains("sum_partials"), "{err}");
        let whole = sum_partials(&locals, &l, &m).unwrap();
        assert_eq!(whole[0], vec![11.0, 22.0]);
        assert_eq!(whole[2], vec![11.0, 22.0]);
        let g = gather_tensor(&whole, &l.without_partials(), &m).unwrap();
        assert_eq!(g, vec![11.0, 22.0, 33.0, 44.0]);
        let maxed = combine_partials(&locals, &l, &m, f64::max).unwrap();
        assert_eq!(maxed[1], vec![30.0, 40.0]);
    }

    #[test]
    fn zero_dim_and_empty_tensors() {
        let m = mesh(&[2]);
        let scalar = Layout::new(vec![], vec![R], &m).unwrap();
        assert_eq!(shard_tensor(&[7u8], &scalar, &m, 1).unwrap(), vec![7]);
        let empty = Layout::new(vec![0, 3], vec![s(0)], &m).unwrap();
        assert_eq!(empty.local_shape(&m, 1), vec![0, 3]);
        assert!(shard_tensor::<u8>(&[], &empty, &m, 1).unwrap().is_empty());
        let locals: Vec<Vec<u8>> = vec![vec![], vec![]];
        assert!(gather_tensor::<u8>(&locals, &empty, &m).unwrap().is_empty());
    }

    #[test]
    fn bad_layouts_have_clear_errors() {
        let m = DeviceMesh::new([("dp", 2), ("tp", 4)]).unwrap();
        let err = |shape: Vec<u64>, ps: Vec<Placement>| {
            Layout::new(shape, ps, &m).unwrap_err().to_string()
        };
        let e = err(vec![4], vec![R]);
        assert!(e.contains("1 placements") && e.contains("[dp, tp]"), "{e}");
        let e = err(vec![4, 4], vec![R, s(2)]);
        assert!(
            e.contains("'tp'") && e.contains("dim 2") && e.contains("0..2"),
            "{e}"
        );
        let e = err(vec![4, 4], vec![ss(0, 0), R]);
        assert!(e.contains("'dp'") && e.contains("split factor"), "{e}");
        let rs = |dims, units: Vec<u64>| Placement::RaggedShard {
            dims,
            local_units: units,
        };
        let e = err(vec![6, 4], vec![R, rs(1, vec![1, 1, 1])]);
        assert!(
            e.contains("'tp' has 4 ranks") && e.contains("3 unit counts"),
            "{e}"
        );
        let e = err(vec![6, 4], vec![R, rs(1, vec![1, 1, 1, 1])]);
        assert!(
            e.contains("sum to 4") && e.contains("divide the 6 cells"),
            "{e}"
        );
        let e = err(vec![6, 4], vec![R, rs(1, vec![0, 0, 0, 0])]);
        assert!(e.contains("sum to 0"), "{e}");
        let e = err(vec![6, 4], vec![s(1), rs(1, vec![1, 1, 1, 0])]);
        assert!(e.contains("'dp' is S(1)") && e.contains("Replicate"), "{e}");
        let e = err(vec![6, 4], vec![rs(1, vec![1, 2]), rs(1, vec![1, 1, 1, 0])]);
        assert!(e.contains("only one RaggedShard"), "{e}");
        let e = err(vec![6, 4], vec![R, rs(3, vec![1, 1, 1, 0])]);
        assert!(e.contains("dims in 1..=2"), "{e}");
        let e = err(vec![u64::MAX, 4], vec![R, R]);
        assert!(e.contains("2^64"), "{e}");
        assert!(
            Layout::new(
                vec![4, 4],
                vec![Placement::Partial { op: ReduceOp::Max }, s(0)],
                &m
            )
            .is_ok()
        );
        let l = Layout::new(vec![4], vec![s(0), R], &m).unwrap();
        let e = shard_tensor(&[1, 2, 3], &l, &m, 0).unwrap_err().to_string();
        assert!(e.contains("3 elements"), "{e}");
        let e = shard_tensor(&[1, 2, 3, 4], &l, &m, 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 8"), "{e}");
        let e = gather_tensor(&[vec![1]], &l, &m).unwrap_err().to_string();
        assert!(e.contains("1 local buffers"), "{e}");
    }

    #[test]
    fn serde_round_trip() {
        let m = mesh(&[2]);
        let l = Layout::new(vec![4, 2], vec![ss(1, 2)], &m).unwrap();
        let json = serde_json::to_string(&l).unwrap();
        let back: Layout = serde_json::from_str(&json).unwrap();
        assert_eq!(back, l);
        assert_eq!(l.to_string(), "[4, 2] (SS(1,2))");
    }
}
