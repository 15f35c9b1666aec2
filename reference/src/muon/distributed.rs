//! The layout-driven distributed Muon engine. The algorithm stages ([`super::update`],
//! [`super::orthogonalize`]) only see local tensors; this engine replays the Muon plan's
//! communication through the [`Collective`] trait:
//!
//! 1. Batches in plan order (descending size). In each, a parameter with replicas is computed
//!    only on its replica owner (the plan's `replica_owner`, coordinates taken modulo the
//!    replica subgroup size); momentum state exists only there.
//! 2. Local path (no shard axis cuts the matrix plane, e.g. experts sharded on `E`): batched
//!    Newton-Schulz on the local matrices, no communication.
//! 3. Shard path, per NS memory batch: one fused bf16 all-gather per shard axis of every
//!    member's NS input (each segment padded to 512 bytes, uneven pieces allowed); only the
//!    shard owner (plan's `shard_owner`) assembles the full matrices and runs shape-fused
//!    batched Newton-Schulz; the owners' packed updates travel by relay broadcast one shard
//!    axis at a time; every rank slices its own piece and applies it. Momentum stays sharded.
//! 4. Replica broadcast of the updated local parameters from the owner, one replica axis at
//!    a time inside contiguous subgroups; the last hop stays in flight while the next batch
//!    computes, with at most one batch in flight.

use std::collections::{BTreeMap, VecDeque};

use hpfsdp_backends::{Buffer, Collective, Group, Handle, bf16};
use hpfsdp_plan::muon::{MuonBatch, MuonPlan, OptimizerRoute};

use super::domains::{MuonDomains, ParamDomain, padded_elems};
use super::error::{MuonError, MuonResult};
use super::orthogonalize::{NsKernel, OrthoJob, lr_pattern, lr_scale_at, orthogonalize};
use super::presets::MuonConfig;
use super::routing::{MatrixStack, RoutedParam};
use super::update::{LrScale, apply_update, momentum_step};
use crate::model::ParamSet;

/// What one rank did in one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Newton-Schulz matrices this rank ran.
    pub ns_matrices: usize,
    /// Bytes this rank received from Muon all-gathers.
    pub gather_bytes: u64,
    /// Bytes of relay broadcasts this rank took part in.
    pub relay_bytes: u64,
    /// Bytes of replica broadcasts this rank took part in.
    pub replica_bytes: u64,
    /// Collective calls issued.
    pub collectives: usize,
    /// Momentum elements this rank holds after the step.
    pub momentum_elems: usize,
    /// Most replica broadcast batches in flight at once.
    pub max_in_flight: usize,
}

/// Replica broadcasts whose last hop is still in flight.
struct InFlight {
    handles: Vec<(Vec<usize>, Handle)>,
    members: BTreeMap<Vec<usize>, Vec<usize>>,
}

fn to_bf16(xs: &[f32]) -> Vec<bf16> {
    xs.iter().map(|&x| bf16::from_f32(x)).collect()
}

fn from_bf16(xs: &[bf16]) -> Vec<f32> {
    xs.iter().map(|x| x.to_f32()).collect()
}

/// The layout-driven distributed Muon of one rank.
#[derive(Debug, Clone)]
pub struct DistributedMuon {
    cfg: MuonConfig,
    plan: MuonPlan,
    domains: MuonDomains,
    routed: Vec<RoutedParam>,
    rank: usize,
    momentum: BTreeMap<usize, Vec<f32>>,
}

impl DistributedMuon {
    /// The engine of `rank` for `plan` over `domains` (routes from [`super::route_params`]).
    pub fn new(
        cfg: MuonConfig,
        plan: MuonPlan,
        domains: MuonDomains,
        routed: Vec<RoutedParam>,
        rank: usize,
    ) -> MuonResult<DistributedMuon> {
        if routed.len() != plan.params.len() || domains.all().len() != plan.params.len() {
            return Err(MuonError::plan(
                "routes, domains and plan list different parameters",
            ));
        }
        if rank >= domains.world_size() {
            return Err(MuonError::plan(format!(
                "rank {rank} outside {} ranks",
                domains.world_size()
            )));
        }
        Ok(DistributedMuon {
            cfg,
            plan,
            domains,
            routed,
            rank,
            momentum: BTreeMap::new(),
        })
    }

    /// The momentum buffer (local piece) of plan parameter `index` on this rank, if it owns one.
    pub fn momentum(&self, index: usize) -> Option<&[f32]> {
        self.momentum.get(&index).map(Vec::as_slice)
    }

    /// Momentum elements held on this rank.
    pub fn momentum_elems(&self) -> usize {
        self.momentum.values().map(Vec::len).sum()
    }

    fn domain(&self, i: usize) -> MuonResult<&ParamDomain> {
        self.domains.get(i)
    }

    fn core(&self, i: usize) -> MuonResult<(usize, usize)> {
        self.routed[i].core.ok_or_else(|| {
            MuonError::plan(format!("{} is not a Muon parameter", self.routed[i].name))
        })
    }

    fn is_replica_owner(&self, batch: &MuonBatch, i: usize) -> MuonResult<bool> {
        let d = self.domain(i)?;
        if d.replicate_axes.is_empty() {
            return Ok(true);
        }
        let owner = batch
            .replica_owner
            .get(&i)
            .ok_or_else(|| MuonError::plan(format!("{}: no replica owner in its batch", d.name)))?;
        Ok(*owner == d.replica_coord(self.rank))
    }

    /// One Muon step on this rank's local pieces: `params` and `grads` hold every parameter
    /// this rank holds, under its layout (AdamW parameters are left alone).
    pub fn step(
        &mut self,
        comm: &dyn Collective,
        params: &mut ParamSet<f32>,
        grads: &ParamSet<f32>,
    ) -> MuonResult<StepReport> {
        if comm.rank() != self.rank {
            return Err(MuonError::plan(format!(
                "engine of rank {} called by rank {}",
                self.rank,
                comm.rank()
            )));
        }
        let mut report = StepReport::default();
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        let batches = self.plan.batches.clone();
        for batch in &batches {
            let mut held = Vec::new();
            for &i in &batch.params {
                if self.routed[i].route != OptimizerRoute::Muon {
                    return Err(MuonError::plan(format!(
                        "{} is in a Muon batch but routed to AdamW",
                        self.routed[i].name
                    )));
                }
                if self.domain(i)?.holds(self.rank) {
                    held.push(i);
                }
            }
            let mut inputs: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
            for &i in &held {
                if !self.is_replica_owner(batch, i)? {
                    continue;
                }
                let name = &self.routed[i].name;
                let g = grads.get(name)?;
                let want = self.domain(i)?.local_shape(self.rank);
                if g.shape() != want.as_slice() || params.get(name)?.shape() != want.as_slice() {
                    return Err(MuonError::plan(format!(
                        "{name}: local gradient {:?} / parameter {:?}, layout gives {want:?}",
                        g.shape(),
                        params.get(name)?.shape()
                    )));
                }
                let buf = self.momentum.entry(i).or_insert_with(|| vec![0.0; g.len()]);
                inputs.insert(i, momentum_step(&self.cfg, g.as_slice(), buf));
            }
            for mb in &batch.memory_batches {
                let members: Vec<usize> = mb
                    .iter()
                    .copied()
                    .filter(|i| inputs.contains_key(i))
                    .collect();
                if members.is_empty() {
                    continue;
                }
                if batch.shard_path {
                    self.shard_dedup(comm, batch, &members, &inputs, params, &mut report)?;
                } else {
                    self.local_update(&members, &inputs, params, &mut report)?;
                }
            }
            if let Some(flight) = self.replica_broadcast(comm, batch, &held, params, &mut report)? {
                in_flight.push_back(flight);
                report.max_in_flight = report.max_in_flight.max(in_flight.len());
                while in_flight.len() > 1 {
                    if let Some(f) = in_flight.pop_front() {
                        self.land(f, params)?;
                    }
                }
            }
        }
        while let Some(f) = in_flight.pop_front() {
            self.land(f, params)?;
        }
        report.momentum_elems = self.momentum_elems();
        Ok(report)
    }

    /// Local path: the rank holds whole matrices; batched NS with no communication.
    fn local_update(
        &self,
        members: &[usize],
        inputs: &BTreeMap<usize, Vec<f32>>,
        params: &mut ParamSet<f32>,
        report: &mut StepReport,
    ) -> MuonResult<()> {
        let mut stacks = Vec::new();
        for &i in members {
            let shape = self.domain(i)?.local_shape(self.rank);
            stacks.push(MatrixStack::of_local(&shape, self.core(i)?)?);
        }
        let jobs: Vec<OrthoJob<'_>> = members
            .iter()
            .zip(&stacks)
            .map(|(i, s)| OrthoJob {
                input: &inputs[i],
                count: s.count,
                rows: s.rows,
                cols: s.cols,
                split: &self.routed[*i].split,
            })
            .collect();
        let out = orthogonalize(&self.cfg, &jobs, NsKernel::Batched)?;
        report.ns_matrices += out.ns_matrices;
        for ((&i, s), u) in members.iter().zip(&stacks).zip(&out.updates) {
            let pattern = lr_pattern(&self.cfg, s.rows, s.cols, &self.routed[i].split)?;
            let scale = lr_scale_at(&pattern, 0..u.len());
            let p = params.get_mut(&self.routed[i].name)?;
            apply_update(&self.cfg, p.as_mut_slice(), u, &scale);
        }
        Ok(())
    }

    /// Shard path for one memory batch: fused gathers, owner NS, relay broadcast, slice-apply.
    fn shard_dedup(
        &self,
        comm: &dyn Collective,
        batch: &MuonBatch,
        members: &[usize],
        inputs: &BTreeMap<usize, Vec<f32>>,
        params: &mut ParamSet<f32>,
        report: &mut StepReport,
    ) -> MuonResult<()> {
        let d0 = self.domain(members[0])?.clone();
        let holdings = self.fused_gather(comm, &d0, members, inputs, report)?;
        let mut by_owner: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
        for &i in members {
            let owner = batch.shard_owner.get(&i).ok_or_else(|| {
                MuonError::plan(format!("{}: no shard owner", self.routed[i].name))
            })?;
            by_owner.entry(owner.clone()).or_default().push(i);
        }
        let my_coord = d0.shard_coord(self.rank);
        let mine: Vec<usize> = by_owner.get(&my_coord).cloned().unwrap_or_default();
        let updates = self.owner_ns(&d0, members, &mine, &holdings, report)?;
        let bufs = self.relay(comm, &d0, &by_owner, &mine, &updates, report)?;
        self.slice_apply(&by_owner, &bufs, params)
    }

    /// Step 1: one fused bf16 all-gather per shard axis (each member padded to the largest
    /// holding in the domain): every rank ends with every piece of its domain, per member in
    /// the order of [`ParamDomain::holding_ranks`].
    fn fused_gather(
        &self,
        comm: &dyn Collective,
        d0: &ParamDomain,
        members: &[usize],
        inputs: &BTreeMap<usize, Vec<f32>>,
        report: &mut StepReport,
    ) -> MuonResult<Vec<Vec<Vec<f32>>>> {
        let rank = self.rank;
        let domain_ranks = d0.shard_domain(rank);
        let mut holdings: Vec<Vec<Vec<f32>>> =
            members.iter().map(|i| vec![inputs[i].clone()]).collect();
        for k in 0..d0.shard_axes.len() {
            let group = d0.shard_group(rank, k)?;
            let mut pad = Vec::with_capacity(members.len());
            for &i in members {
                let d = self.domain(i)?;
                let most = domain_ranks
                    .iter()
                    .map(|&r| {
                        d.holding_ranks(r, k)
                            .iter()
                            .map(|&s| d.local_numel(s))
                            .sum::<usize>()
                    })
                    .max()
                    .unwrap_or(0);
                pad.push(padded_elems(most, 2));
            }
            let mut packed = Vec::with_capacity(pad.iter().sum());
            for (h, &p) in holdings.iter().zip(&pad) {
                let start = packed.len();
                for piece in h {
                    packed.extend(to_bf16(piece));
                }
                packed.resize(start + p, bf16::ZERO);
            }
            let seg: usize = pad.iter().sum();
            let out: Vec<bf16> = comm.all_gather(&group, Buffer::Bf16(packed))?.wait_vec()?;
            report.collectives += 1;
            report.gather_bytes += (out.len() * 2) as u64;
            let mut next: Vec<Vec<Vec<f32>>> = vec![Vec::new(); members.len()];
            for (j, &member) in group.ranks().iter().enumerate() {
                let mut at = j * seg;
                for (m, (&i, &p)) in members.iter().zip(&pad).enumerate() {
                    let d = self.domain(i)?;
                    let mut off = at;
                    for src in d.holding_ranks(member, k) {
                        let n = d.local_numel(src);
                        next[m].push(from_bf16(&out[off..off + n]));
                        off += n;
                    }
                    at += p;
                }
            }
            holdings = next;
        }
        Ok(holdings)
    }

    /// Step 2: this rank assembles the members it owns (`mine`) from the gathered pieces and
    /// runs one batched Newton-Schulz over them; the updates in `mine`'s order.
    fn owner_ns(
        &self,
        d0: &ParamDomain,
        members: &[usize],
        mine: &[usize],
        holdings: &[Vec<Vec<f32>>],
        report: &mut StepReport,
    ) -> MuonResult<Vec<Vec<f32>>> {
        let order = d0.holding_ranks(self.rank, d0.shard_axes.len());
        let mut fulls = Vec::with_capacity(mine.len());
        for &i in mine {
            let m = members.iter().position(|&x| x == i).unwrap_or(0);
            let d = self.domain(i)?;
            let mut full = vec![0.0f32; d.numel()];
            for (src, piece) in order.iter().zip(&holdings[m]) {
                for (idx, &v) in d.local_indices(*src).into_iter().zip(piece) {
                    full[idx] = v;
                }
            }
            fulls.push(full);
        }
        let mut stacks = Vec::new();
        for &i in mine {
            stacks.push(MatrixStack::of_local(&self.routed[i].shape, self.core(i)?)?);
        }
        let jobs: Vec<OrthoJob<'_>> = mine
            .iter()
            .zip(&stacks)
            .zip(&fulls)
            .map(|((&i, s), f)| OrthoJob {
                input: f,
                count: s.count,
                rows: s.rows,
                cols: s.cols,
                split: &self.routed[i].split,
            })
            .collect();
        let out = orthogonalize(&self.cfg, &jobs, NsKernel::Batched)?;
        report.ns_matrices += out.ns_matrices;
        Ok(out.updates)
    }

    /// Step 3: relay broadcast, one shard axis at a time: every owner coordinate aligned with
    /// this rank on the later axes broadcasts its packed bf16 updates (all issued, then
    /// waited); returns every owner's packed buffer.
    fn relay(
        &self,
        comm: &dyn Collective,
        d0: &ParamDomain,
        by_owner: &BTreeMap<Vec<usize>, Vec<usize>>,
        mine: &[usize],
        updates: &[Vec<f32>],
        report: &mut StepReport,
    ) -> MuonResult<BTreeMap<Vec<usize>, Vec<bf16>>> {
        let rank = self.rank;
        let axes = d0.shard_axes.len();
        let my_coord = d0.shard_coord(rank);
        let len_of = |ms: &[usize]| -> MuonResult<usize> {
            ms.iter()
                .map(|&i| Ok(padded_elems(self.domain(i)?.numel(), 2)))
                .sum()
        };
        let mut bufs: BTreeMap<Vec<usize>, Vec<bf16>> = BTreeMap::new();
        if !mine.is_empty() {
            let mut packed = Vec::new();
            for (&i, u) in mine.iter().zip(updates) {
                let start = packed.len();
                packed.extend(to_bf16(u));
                packed.resize(start + padded_elems(self.domain(i)?.numel(), 2), bf16::ZERO);
            }
            bufs.insert(my_coord.clone(), packed);
        }
        for k in 0..axes {
            let group = d0.shard_group(rank, k)?;
            let mut handles = Vec::new();
            for (coord, ms) in by_owner {
                if (k + 1..axes).all(|j| my_coord[j] == coord[j]) {
                    let root = d0.shard_neighbor(rank, k, coord[k]);
                    let buf = match bufs.remove(coord) {
                        Some(b) => b,
                        None => vec![bf16::ZERO; len_of(ms)?],
                    };
                    report.relay_bytes += (buf.len() * 2) as u64;
                    report.collectives += 1;
                    handles.push((
                        coord.clone(),
                        comm.broadcast(&group, Buffer::Bf16(buf), root)?,
                    ));
                }
            }
            for (coord, h) in handles {
                bufs.insert(coord, h.wait_vec()?);
            }
        }
        Ok(bufs)
    }

    /// Step 4: every rank slices its piece of every member out of the relayed buffers and
    /// applies it with the member's learning-rate pattern.
    fn slice_apply(
        &self,
        by_owner: &BTreeMap<Vec<usize>, Vec<usize>>,
        bufs: &BTreeMap<Vec<usize>, Vec<bf16>>,
        params: &mut ParamSet<f32>,
    ) -> MuonResult<()> {
        for (coord, ms) in by_owner {
            let buf = bufs.get(coord).ok_or_else(|| {
                MuonError::plan(format!("relay of owner {coord:?} did not arrive"))
            })?;
            let mut at = 0;
            for &i in ms {
                let d = self.domain(i)?;
                let n = d.numel();
                let idx = d.local_indices(self.rank);
                let local: Vec<f32> = idx.iter().map(|&g| buf[at + g].to_f32()).collect();
                at += padded_elems(n, 2);
                let (r, c) = self.core(i)?;
                let pattern = lr_pattern(&self.cfg, r, c, &self.routed[i].split)?;
                let scale: LrScale = lr_scale_at(&pattern, idx.into_iter());
                let p = params.get_mut(&self.routed[i].name)?;
                apply_update(&self.cfg, p.as_mut_slice(), &local, &scale);
            }
        }
        Ok(())
    }

    /// Issues the replica broadcasts of a batch's updated local parameters: every hop but the
    /// last is waited; the last hop is returned in flight.
    fn replica_broadcast(
        &self,
        comm: &dyn Collective,
        batch: &MuonBatch,
        held: &[usize],
        params: &ParamSet<f32>,
        report: &mut StepReport,
    ) -> MuonResult<Option<InFlight>> {
        let Some(&first) = held.first() else {
            return Ok(None);
        };
        let d0 = self.domain(first)?.clone();
        let axes = d0.replicate_axes.len();
        if axes == 0 {
            return Ok(None);
        }
        let my = d0.replica_coord(self.rank);
        let mut members: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
        for &i in held {
            let owner = batch.replica_owner.get(&i).ok_or_else(|| {
                MuonError::plan(format!("{}: no replica owner", self.routed[i].name))
            })?;
            members.entry(owner.clone()).or_default().push(i);
        }
        let len_of = |ms: &[usize]| -> MuonResult<usize> {
            ms.iter()
                .map(|&i| Ok(padded_elems(params.get(&self.routed[i].name)?.len(), 4)))
                .sum()
        };
        let mut bufs: BTreeMap<Vec<usize>, Vec<f32>> = BTreeMap::new();
        if let Some(ms) = members.get(&my) {
            let mut packed = Vec::new();
            for &i in ms {
                let p = params.get(&self.routed[i].name)?;
                let start = packed.len();
                packed.extend_from_slice(p.as_slice());
                packed.resize(start + padded_elems(p.len(), 4), 0.0);
            }
            bufs.insert(my.clone(), packed);
        }
        let mut last: Vec<(Vec<usize>, Handle)> = Vec::new();
        for k in 0..axes {
            let group: Group = d0.replica_group(self.rank, k)?;
            let mut handles = Vec::new();
            for (coord, ms) in &members {
                // A source whose parameters are all empty on this shard position (trailing
                // FSDP chunks of a dim that does not split evenly, e.g. 4 experts over 3)
                // has nothing to send: no call, on every member alike (they share the
                // position), as the program sizes it.
                if len_of(ms)? == 0 {
                    continue;
                }
                if (k + 1..axes).all(|j| my[j] == coord[j]) {
                    let root = d0.replica_neighbor(self.rank, k, coord[k]);
                    let buf = match bufs.remove(coord) {
                        Some(b) => b,
                        None => vec![0.0; len_of(ms)?],
                    };
                    report.replica_bytes += (buf.len() * 4) as u64;
                    report.collectives += 1;
                    handles.push((
                        coord.clone(),
                        comm.broadcast(&group, Buffer::F32(buf), root)?,
                    ));
                }
            }
            if k + 1 == axes {
                last = handles;
            } else {
                for (coord, h) in handles {
                    bufs.insert(coord, h.wait_vec()?);
                }
            }
        }
        let _ = my;
        Ok(Some(InFlight {
            handles: last,
            members,
        }))
    }

    /// Waits on a batch's last replica hop and writes the received parameters.
    fn land(&self, flight: InFlight, params: &mut ParamSet<f32>) -> MuonResult<()> {
        let Some(&first) = flight.members.values().flatten().next() else {
            return Ok(());
        };
        let my = self.domain(first)?.replica_coord(self.rank);
        for (coord, h) in flight.handles {
            let data: Vec<f32> = h.wait_vec()?;
            if coord == my {
                continue;
            }
            let mut at = 0;
            for &i in &flight.members[&coord] {
                let p = params.get_mut(&self.routed[i].name)?;
                let n = p.len();
                p.as_mut_slice().copy_from_slice(&data[at..at + n]);
                at += padded_elems(n, 4);
            }
        }
        Ok(())
    }
}
