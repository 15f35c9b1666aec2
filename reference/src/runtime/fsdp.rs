//! The FSDP/HSDP runtime of one rank, driven by the plan's [`FsdpPlan`]:
//!
//! - **Shards.** Each parameter's plan-local tensor (after TP/EP) is split along the plan's
//!   shard dim with ceil-chunk semantics over the domain's shard group; the master shard is
//!   f32, communication uses the padded chunk 0 size.
//! - **Unshard.** Per-parameter all-gather (in the gathered-parameter dtype: f32, or bf16 by
//!   round-to-nearest-even) into a per-parameter buffer. For dim-0 shards the full parameter is
//!   a view of that buffer (the padded output truncated in place, no copy); other dims are
//!   reordered into a new buffer (the plan's copy fallback). Reshard drops the storage while
//!   the parameter slot persists.
//! - **Root and blocks** (the plan's [`FsdpUnit::is_root`]): the root units (embedding,
//!   final norm + `lm_head`) are gathered together before any block, in the root's
//!   pre-forward, are never resharded after forward (no backward all-gather); the root's
//!   post-backward fires after every block's (reshard, then the pipeline below for the root
//!   units in unit order). Prefetch links the blocks only: a block's hook issues the
//!   all-gathers of the next `prefetch_depth` blocks (forward order in forward, reverse in
//!   backward) after its own. The step program of the `hyperparallel` strategy follows the
//!   same schedule, so the two collective traces match one for one.
//! - **Post-backward pipeline** (notes §5.4, `comm_fusion=False`): step 1 waits the previous
//!   unit's reduce-scatters that feed a fused all-reduce and writes them into views of the
//!   fused replica buffer; step 2 waits the previous reduce-scatters that do not; step 3
//!   issues the current unit's reduce-scatters; step 4 issues the previous unit's fused
//!   all-reduce. One settlement at the end of backward drains the last reduce-scatter, issues
//!   the last all-reduce and waits every pending all-reduce.
//! - **Fused replica buffer.** One per (unit, domain) with replicas: parameters back to back at
//!   the plan's `ar_offset_elems`, each taking its padded shard size, total rounded up to 512
//!   bytes, zero padding; all-reduce (sum) over the replicate group.
//! - **Gradient accumulation.** Reduce-scatter every micro-step; the all-reduce only on the
//!   last micro-step: earlier results are summed into `reduce_partial_output` and added into
//!   the buffer view before the all-reduce (notes §5.6). Without replicas the reduce-scatter
//!   results are summed into the shard gradient directly.
//! - Reductions are sums in f32 (ascending rank order, from the backend); the one division by
//!   the number of micro-batches happens in [`FsdpRuntime::take_grads`].

use std::collections::{BTreeMap, HashMap};

use hpfsdp_backends::{Buffer, Collective, Handle, ReduceOp, bf16};
use hpfsdp_plan::chunk_range;
use hpfsdp_plan::fsdp::{DataDomain, FsdpPlan, FsdpUnit};

use super::error::{RtResult, RuntimeError};
use super::topo::{MyGroup, RankTopo};
use crate::bf16::quantize_bf16;
use crate::tensor::Tensor;

/// One parameter's FSDP state on this rank.
#[derive(Debug, Clone)]
pub struct FsdpParam {
    /// Parameter FQN.
    pub name: String,
    /// Unit index.
    pub unit: usize,
    /// Dense or expert domain.
    pub domain: DataDomain,
    /// Plan-local shape (after TP/EP), the tensor FSDP shards.
    pub full_shape: Vec<usize>,
    /// Dim FSDP shards.
    pub shard_dim: usize,
    /// This rank's rows of `shard_dim`.
    pub rows: std::ops::Range<usize>,
    /// Chunk size along `shard_dim` (ceil).
    pub chunk: usize,
    /// Elements of the padded shard (the communication size).
    pub padded_numel: usize,
    /// Whether the full parameter is a view of the all-gather output.
    pub zero_copy: bool,
    /// Offset in the fused all-reduce buffer (HSDP).
    pub ar_offset: Option<usize>,
    /// The f32 master shard (unpadded local shape).
    pub shard: Tensor<f32>,
    /// The reduced shard gradient (sum over micro-batches; unpadded local numel).
    grad: Option<Vec<f32>>,
    /// Partial shard gradients of micro-steps that skipped the all-reduce.
    partial: Option<Vec<f32>>,
    /// The unsharded parameter (storage present only between unshard and reshard).
    gathered: Option<Tensor<f32>>,
}

impl FsdpParam {
    /// Numel of this rank's (unpadded) shard.
    pub fn local_numel(&self) -> usize {
        self.shard.len()
    }
}

struct PendingRs {
    unit: usize,
    /// (param index, handle or ready local result).
    items: Vec<(usize, RsResult)>,
    requires_all_reduce: bool,
}

enum RsResult {
    Handle(Handle),
    Ready(Vec<f32>),
}

struct FusedBuffer {
    unit: usize,
    domain: DataDomain,
    data: Vec<f32>,
}

/// FSDP collectives and unshards issued by one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FsdpCounts {
    /// Parameter all-gathers issued.
    pub all_gathers: u64,
    /// Gradient reduce-scatters issued.
    pub reduce_scatters: u64,
    /// Fused all-reduces issued.
    pub all_reduces: u64,
    /// Unshards that made a copy (non-dim-0 shards or dtype casts).
    pub copy_unshards: u64,
    /// Unshards served as a view of the all-gather output.
    pub view_unshards: u64,
}

/// The FSDP/HSDP runtime of one rank.
pub struct FsdpRuntime {
    /// Parameters in plan order.
    pub params: Vec<FsdpParam>,
    by_name: HashMap<String, usize>,
    units: Vec<Vec<usize>>,
    /// Per unit: part of the root `fully_shard(model)`.
    root: Vec<bool>,
    /// The non-root units (decoder blocks) in forward order: the prefetch chain.
    blocks: Vec<usize>,
    param_bf16: bool,
    /// Reshard after forward.
    pub reshard_after_forward: bool,
    /// Units prefetched ahead.
    pub prefetch_depth: usize,
    pending_ag: BTreeMap<usize, Vec<(usize, Handle)>>,
    pending_rs: Option<PendingRs>,
    pending_ar: Vec<(usize, DataDomain, Handle)>,
    fused: Vec<FusedBuffer>,
    fused_len: HashMap<(usize, DataDomain), usize>,
    /// Collectives issued so far.
    pub counts: FsdpCounts,
}

fn rows_of(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    (
        shape[..dim].iter().product(),
        shape.get(dim).copied().unwrap_or(1),
        shape.get(dim + 1..).map_or(1, |s| s.iter().product()),
    )
}

/// Elements `[a, b)` of dim `dim` of a `[outer, n, inner]` buffer, zero-padded to `pad` rows.
fn take_rows(
    data: &[f32],
    (outer, n, inner): (usize, usize, usize),
    a: usize,
    b: usize,
    pad: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(outer * pad * inner);
    for o in 0..outer {
        let base = o * n * inner;
        out.extend_from_slice(&data[base + a * inner..base + b * inner]);
        out.resize(out.len() + (pad - (b - a)) * inner, 0.0);
    }
    out
}

impl FsdpRuntime {
    /// Build the runtime of `topo.rank`: `full_params` gives each parameter's plan-local
    /// tensor (this rank's TP/EP piece, whole along the FSDP dims); the rank keeps its shard.
    pub fn new(
        plan: &FsdpPlan,
        topo: &RankTopo,
        full_params: &mut dyn FnMut(&str) -> RtResult<Tensor<f32>>,
        param_bf16: bool,
    ) -> RtResult<FsdpRuntime> {
        let mut params = Vec::new();
        let mut by_name = HashMap::new();
        let mut units = vec![Vec::new(); plan.units.len()];
        for p in &plan.params {
            let full = full_params(&p.name)?;
            let shape = full.shape().to_vec();
            let shard_group = Self::shard_group_of(topo, p.domain);
            let s = shard_group.size();
            let dim = if shape.is_empty() { 0 } else { p.shard_dim };
            let dims = rows_of(&shape, dim);
            let r = chunk_range(dims.1 as u64, s as u64, shard_group.index as u64);
            let rows = r.start as usize..r.end as usize;
            let chunk = dims.1.div_ceil(s.max(1));
            let mut local_shape = shape.clone();
            if !local_shape.is_empty() {
                local_shape[dim] = rows.len();
            }
            let data = take_rows(full.as_slice(), dims, rows.start, rows.end, rows.len());
            let padded_numel = dims.0 * chunk * dims.2;
            if s > 1 && padded_numel as u64 != p.padded_shard_numel {
                return Err(RuntimeError::plan(format!(
                    "FSDP plan gives {} a padded shard of {} elements, its plan-local shape {shape:?} \
                     over {s} ranks gives {padded_numel}",
                    p.name, p.padded_shard_numel
                )));
            }
            by_name.insert(p.name.clone(), params.len());
            units[p.unit].push(params.len());
            params.push(FsdpParam {
                name: p.name.clone(),
                unit: p.unit,
                domain: p.domain,
                full_shape: shape,
                shard_dim: dim,
                rows,
                chunk,
                padded_numel,
                zero_copy: p.zero_copy,
                ar_offset: p.ar_offset_elems.map(|o| o as usize),
                shard: Tensor::from_vec(&local_shape, data)?,
                grad: None,
                partial: None,
                gathered: None,
            });
        }
        let mut fused_len = HashMap::new();
        for ar in &plan.all_reduces {
            let elem = ar.dtype.bytes().max(1);
            fused_len.insert((ar.unit, ar.domain), (ar.buffer_bytes / elem) as usize);
        }
        let root: Vec<bool> = plan.units.iter().map(FsdpUnit::is_root).collect();
        let blocks = (0..root.len()).filter(|&u| !root[u]).collect();
        Ok(FsdpRuntime {
            params,
            by_name,
            units,
            root,
            blocks,
            param_bf16,
            reshard_after_forward: plan.reshard_after_forward,
            prefetch_depth: plan.prefetch_depth,
            pending_ag: BTreeMap::new(),
            pending_rs: None,
            pending_ar: Vec::new(),
            fused: Vec::new(),
            fused_len,
            counts: FsdpCounts::default(),
        })
    }

    fn shard_group_of(topo: &RankTopo, d: DataDomain) -> &MyGroup {
        match d {
            DataDomain::Dense => &topo.dense_shard,
            DataDomain::Expert => &topo.expert_shard,
        }
    }

    fn replicate_group_of(topo: &RankTopo, d: DataDomain) -> &MyGroup {
        match d {
            DataDomain::Dense => &topo.dense_replicate,
            DataDomain::Expert => &topo.expert_replicate,
        }
    }

    /// Number of units.
    pub fn unit_count(&self) -> usize {
        self.units.len()
    }

    /// The unsharded parameter `name` (between unshard and reshard of its unit).
    pub fn full(&self, name: &str) -> RtResult<&Tensor<f32>> {
        let i = *self.by_name.get(name).ok_or_else(|| {
            RuntimeError::plan(format!("parameter {name} is not in the FSDP plan"))
        })?;
        self.params[i].gathered.as_ref().ok_or_else(|| {
            RuntimeError::plan(format!("parameter {name} used while its unit is resharded"))
        })
    }

    /// The FSDP state of `name`.
    pub fn param(&self, name: &str) -> Option<&FsdpParam> {
        self.by_name.get(name).map(|&i| &self.params[i])
    }

    fn wire(&self, v: Vec<f32>) -> Buffer {
        if self.param_bf16 {
            Buffer::Bf16(v.into_iter().map(bf16::from_f32).collect())
        } else {
            Buffer::F32(v)
        }
    }

    /// Issue the all-gathers of `unit` (no-op if gathered or in flight).
    pub fn issue_unshard(
        &mut self,
        comm: &dyn Collective,
        topo: &RankTopo,
        unit: usize,
    ) -> RtResult<()> {
        if unit >= self.units.len() || self.pending_ag.contains_key(&unit) {
            return Ok(());
        }
        let mut handles = Vec::new();
        for &i in &self.units[unit] {
            if self.params[i].gathered.is_some() {
                continue;
            }
            let g = Self::shard_group_of(topo, self.params[i].domain);
            let p = &self.params[i];
            if g.size() == 1 {
                let t = if self.param_bf16 {
                    p.shard.quantize_bf16()
                } else {
                    p.shard.clone()
                };
                self.counts.copy_unshards += 1;
                self.params[i].gathered = Some(t);
                continue;
            }
            let dims = rows_of(&p.full_shape, p.shard_dim);
            let mut padded = p.shard.as_slice().to_vec();
            if p.shard_dim != 0 {
                padded = take_rows(
                    &padded,
                    (dims.0, p.rows.len(), dims.2),
                    0,
                    p.rows.len(),
                    p.chunk,
                );
            } else {
                padded.resize(p.padded_numel, 0.0);
            }
            let h = comm.all_gather(&g.group, self.wire(padded))?;
            self.counts.all_gathers += 1;
            handles.push((i, h));
        }
        self.pending_ag.insert(unit, handles);
        Ok(())
    }

    /// Wait for `unit`'s all-gathers (issuing them first if needed) and materialise the full
    /// parameters.
    pub fn wait_unshard(
        &mut self,
        comm: &dyn Collective,
        topo: &RankTopo,
        unit: usize,
    ) -> RtResult<()> {
        self.issue_unshard(comm, topo, unit)?;
        let Some(handles) = self.pending_ag.remove(&unit) else {
            return Ok(());
        };
        for (i, h) in handles {
            let buf = h.wait()?;
            let p = &self.params[i];
            let s = Self::shard_group_of(topo, p.domain).size();
            let mut v: Vec<f32> = match buf {
                Buffer::F32(v) => v,
                Buffer::Bf16(v) => v.into_iter().map(|x| x.to_f32()).collect(),
                other => {
                    return Err(hpfsdp_backends::CommError::DTypeMismatch {
                        expected: hpfsdp_backends::DType::F32,
                        actual: other.dtype(),
                    }
                    .into());
                }
            };
            let numel: usize = p.full_shape.iter().product();
            let full = if p.shard_dim == 0 {
                // Chunk j sits at row j*chunk: rows 0..n are the first numel elements.
                v.truncate(numel);
                self.counts.view_unshards += u64::from(!self.param_bf16);
                self.counts.copy_unshards += u64::from(self.param_bf16);
                Tensor::from_vec(&p.full_shape, v)?
            } else {
                let (outer, n, inner) = rows_of(&p.full_shape, p.shard_dim);
                let mut out = Vec::with_capacity(numel);
                for o in 0..outer {
                    for j in 0..s {
                        let r = chunk_range(n as u64, s as u64, j as u64);
                        let len = (r.end - r.start) as usize;
                        let base = j * outer * p.chunk * inner + o * p.chunk * inner;
                        out.extend_from_slice(&v[base..base + len * inner]);
                    }
                }
                self.counts.copy_unshards += 1;
                Tensor::from_vec(&p.full_shape, out)?
            };
            self.params[i].gathered = Some(full);
        }
        Ok(())
    }

    /// Drop the unsharded storage of `unit`.
    pub fn reshard(&mut self, unit: usize) {
        if let Some(ids) = self.units.get(unit) {
            for &i in ids {
                self.params[i].gathered = None;
            }
        }
    }

    /// Whether `unit` belongs to the root `fully_shard(model)` (never resharded after forward,
    /// outside the prefetch chain).
    pub fn is_root(&self, unit: usize) -> bool {
        self.root.get(unit).copied().unwrap_or(false)
    }

    /// The root's pre-forward: issue the all-gathers of every root unit, in unit order,
    /// before any block's.
    pub fn issue_root_unshards(&mut self, comm: &dyn Collective, topo: &RankTopo) -> RtResult<()> {
        for u in 0..self.root.len() {
            if self.root[u] {
                self.issue_unshard(comm, topo, u)?;
            }
        }
        Ok(())
    }

    /// A block's prefetch, after its own unshard: issue the all-gathers of the
    /// `prefetch_depth` blocks after `unit` in forward order (`backward`: before it, nearest
    /// first). Nothing for a root unit.
    pub fn prefetch(
        &mut self,
        comm: &dyn Collective,
        topo: &RankTopo,
        unit: usize,
        backward: bool,
    ) -> RtResult<()> {
        let Some(k) = self.blocks.iter().position(|&b| b == unit) else {
            return Ok(());
        };
        for d in 1..=self.prefetch_depth {
            let target = if backward {
                k.checked_sub(d).map(|j| self.blocks[j])
            } else {
                self.blocks.get(k + d).copied()
            };
            if let Some(t) = target {
                self.issue_unshard(comm, topo, t)?;
            }
        }
        Ok(())
    }

    /// The root's post-backward, after every block's: drop the root units' storage.
    pub fn reshard_root(&mut self) {
        for u in 0..self.root.len() {
            if self.root[u] {
                self.reshard(u);
            }
        }
    }

    fn fused_buffer(&mut self, unit: usize, domain: DataDomain) -> RtResult<&mut Vec<f32>> {
        let pos = match self
            .fused
            .iter()
            .position(|f| f.unit == unit && f.domain == domain)
        {
            Some(p) => p,
            None => {
                let len = *self.fused_len.get(&(unit, domain)).ok_or_else(|| {
                    RuntimeError::plan(format!(
                        "no fused all-reduce buffer for unit {unit} ({domain:?})"
                    ))
                })?;
                self.fused.push(FusedBuffer {
                    unit,
                    domain,
                    data: vec![0.0; len],
                });
                self.fused.len() - 1
            }
        };
        Ok(&mut self.fused[pos].data)
    }

    fn has_replicas(&self, topo: &RankTopo, i: usize) -> bool {
        Self::replicate_group_of(topo, self.params[i].domain).size() > 1
    }

    /// Steps 1 and 2: wait the previous unit's reduce-scatters and route each result into the
    /// fused buffer view, the partial accumulator, or the shard gradient. Returns the unit
    /// whose fused all-reduce is now due (if any).
    fn drain_previous(&mut self, topo: &RankTopo) -> RtResult<Option<(usize, bool)>> {
        let Some(prev) = self.pending_rs.take() else {
            return Ok(None);
        };
        let mut wants_ar = false;
        // Step 1 (results feeding a fused all-reduce) first, then step 2 (the others).
        let (to_ar, direct): (Vec<_>, Vec<_>) = prev
            .items
            .into_iter()
            .partition(|(i, _)| self.has_replicas(topo, *i));
        for (i, r) in to_ar.into_iter().chain(direct) {
            let mut out = match r {
                RsResult::Handle(h) => h.wait_vec::<f32>()?,
                RsResult::Ready(v) => v,
            };
            let n = self.params[i].local_numel();
            out.truncate(self.params[i].padded_numel);
            if self.has_replicas(topo, i) {
                if prev.requires_all_reduce {
                    let off = self.params[i].ar_offset.ok_or_else(|| {
                        RuntimeError::plan(format!(
                            "{} has replicas but no all-reduce offset",
                            self.params[i].name
                        ))
                    })?;
                    let (unit, domain) = (self.params[i].unit, self.params[i].domain);
                    let buf = self.fused_buffer(unit, domain)?;
                    buf[off..off + out.len()].copy_from_slice(&out);
                    wants_ar = true;
                } else {
                    out.truncate(n);
                    accumulate(&mut self.params[i].partial, out);
                }
            } else {
                out.truncate(n);
                accumulate(&mut self.params[i].grad, out);
            }
        }
        Ok(wants_ar.then_some((prev.unit, true)))
    }

    /// Step 4: before the all-reduce add the partial outputs of earlier micro-steps into the
    /// views, then issue one all-reduce per fused buffer of `unit`.
    fn issue_all_reduce(
        &mut self,
        comm: &dyn Collective,
        topo: &RankTopo,
        unit: usize,
    ) -> RtResult<()> {
        for domain in [DataDomain::Dense, DataDomain::Expert] {
            let Some(pos) = self
                .fused
                .iter()
                .position(|f| f.unit == unit && f.domain == domain)
            else {
                continue;
            };
            let ids: Vec<usize> = self.units[unit]
                .iter()
                .copied()
                .filter(|&i| self.params[i].domain == domain)
                .collect();
            for i in ids {
                if let (Some(part), Some(off)) =
                    (self.params[i].partial.take(), self.params[i].ar_offset)
                {
                    for (k, x) in part.into_iter().enumerate() {
                        self.fused[pos].data[off + k] += x;
                    }
                }
            }
            let data = std::mem::take(&mut self.fused[pos].data);
            let g = Self::replicate_group_of(topo, domain);
            let h = comm.all_reduce(&g.group, Buffer::F32(data), ReduceOp::Sum)?;
            self.counts.all_reduces += 1;
            self.pending_ar.push((unit, domain, h));
        }
        Ok(())
    }

    /// The four-step post-backward pipeline for `unit` with its full (plan-local) gradients.
    pub fn post_backward(
        &mut self,
        comm: &dyn Collective,
        topo: &RankTopo,
        unit: usize,
        grads: Vec<(String, Tensor<f32>)>,
        requires_all_reduce: bool,
    ) -> RtResult<()> {
        // Steps 1 + 2.
        let due = self.drain_previous(topo)?;
        // Step 3: reduce-scatters of this unit, in the plan's parameter order.
        let mut by_index: BTreeMap<usize, (String, Tensor<f32>)> = BTreeMap::new();
        for (name, g) in grads {
            let i = *self.by_name.get(&name).ok_or_else(|| {
                RuntimeError::plan(format!("gradient for unknown parameter {name}"))
            })?;
            if self.params[i].unit != unit {
                return Err(RuntimeError::plan(format!(
                    "gradient of {name} handed to unit {unit}"
                )));
            }
            by_index.insert(i, (name, g));
        }
        if by_index.len() != self.units[unit].len() {
            return Err(RuntimeError::plan(format!(
                "unit {unit} produced {} gradients for {} parameters",
                by_index.len(),
                self.units[unit].len()
            )));
        }
        let mut items = Vec::new();
        for (i, (name, g)) in by_index {
            let p = &self.params[i];
            if g.shape() != p.full_shape.as_slice() {
                return Err(RuntimeError::plan(format!(
                    "gradient of {name} has shape {:?}, the parameter {:?}",
                    g.shape(),
                    p.full_shape
                )));
            }
            let sg = Self::shard_group_of(topo, p.domain);
            let dims = rows_of(&p.full_shape, p.shard_dim);
            if sg.size() == 1 {
                items.push((i, RsResult::Ready(g.into_vec())));
                continue;
            }
            let s = sg.size();
            let mut input = Vec::with_capacity(p.padded_numel * s);
            for j in 0..s {
                let r = chunk_range(dims.1 as u64, s as u64, j as u64);
                input.extend(take_rows(
                    g.as_slice(),
                    dims,
                    r.start as usize,
                    r.end as usize,
                    p.chunk,
                ));
            }
            let h = comm.reduce_scatter(&sg.group, Buffer::F32(input), ReduceOp::Sum)?;
            self.counts.reduce_scatters += 1;
            items.push((i, RsResult::Handle(h)));
        }
        self.pending_rs = Some(PendingRs {
            unit,
            items,
            requires_all_reduce,
        });
        // Step 4: the previous unit's fused all-reduce, after this unit's reduce-scatters.
        if let Some((u, _)) = due {
            self.issue_all_reduce(comm, topo, u)?;
        }
        Ok(())
    }

    /// End-of-backward settlement: drain the last reduce-scatter, issue the last all-reduce,
    /// wait every pending all-reduce and split the buffers into shard gradients.
    pub fn finish_backward(&mut self, comm: &dyn Collective, topo: &RankTopo) -> RtResult<()> {
        if let Some((u, _)) = self.drain_previous(topo)? {
            self.issue_all_reduce(comm, topo, u)?;
        }
        for (unit, domain, h) in std::mem::take(&mut self.pending_ar) {
            let data = h.wait_vec::<f32>()?;
            let ids: Vec<usize> = self.units[unit]
                .iter()
                .copied()
                .filter(|&i| self.params[i].domain == domain)
                .collect();
            for i in ids {
                let (off, n) = (
                    self.params[i].ar_offset.unwrap_or(0),
                    self.params[i].local_numel(),
                );
                let view = data[off..off + n].to_vec();
                accumulate(&mut self.params[i].grad, view);
            }
        }
        self.fused.clear();
        Ok(())
    }

    /// Take every shard gradient divided once by `micro_batches` (the average over all
    /// micro-batches of the step), in plan order.
    pub fn take_grads(&mut self, micro_batches: usize) -> RtResult<Vec<Vec<f32>>> {
        let m = micro_batches as f32;
        self.params
            .iter_mut()
            .map(|p| {
                let g = p.grad.take().ok_or_else(|| {
                    RuntimeError::plan(format!("no gradient was reduced for {}", p.name))
                })?;
                Ok(g.into_iter().map(|x| x / m).collect())
            })
            .collect()
    }
}

/// `acc = v` the first time, then `acc += v` element-wise (so a lone `-0.0` stays `-0.0`).
fn accumulate(acc: &mut Option<Vec<f32>>, v: Vec<f32>) {
    match acc {
        None => *acc = Some(v),
        Some(a) => {
            for (x, y) in a.iter_mut().zip(v) {
                *x += y;
            }
        }
    }
}

/// Round every element through bf16 (the gathered-parameter cast of mixed precision).
pub fn cast_param_bf16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| quantize_bf16(x)).collect()
}
