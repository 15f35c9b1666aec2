//! Communication domains of every plan parameter: its mesh, its layout, the mesh axes that
//! shard it (in plan order), the replica axes with their subgroup sizes, and the process
//! groups the Muon step uses. Local pieces follow [`hpfsdp_plan::Layout`] (ceil-chunk splits;
//! several axes on one dim apply in mesh order); a runtime that shards differently (e.g.
//! `StridedShard` for FSDP over TP) passes its own layout with [`MuonDomains::with_layout`].

use hpfsdp_backends::Group;
use hpfsdp_plan::muon::MuonPlan;
use hpfsdp_plan::planner::ShardingPlan;
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_plan::{DeviceMesh, Layout, Placement};

use super::error::{MuonError, MuonResult};

/// Bytes every packed communication segment is padded to.
pub const PACK_ALIGN_BYTES: usize = 512;

/// `n` elements of `elem_bytes` rounded up to whole [`PACK_ALIGN_BYTES`] blocks, in elements.
pub fn padded_elems(n: usize, elem_bytes: usize) -> usize {
    let per = PACK_ALIGN_BYTES / elem_bytes;
    n.div_ceil(per) * per
}

/// The communication domain of one parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamDomain {
    /// Index into [`MuonPlan::params`].
    pub index: usize,
    /// FQN.
    pub name: String,
    /// The mesh its placements refer to (dense or expert).
    pub mesh: DeviceMesh,
    /// Global shape and placements.
    pub layout: Layout,
    /// Mesh axes that shard it, in plan order.
    pub shard_axes: Vec<usize>,
    /// Mesh axes that replicate it, each with its replica subgroup size.
    pub replicate_axes: Vec<(usize, usize)>,
    /// `(mesh axis, coordinate)`: only ranks at that coordinate hold it (per-expert weights
    /// living on their EP owner).
    pub holder: Option<(usize, usize)>,
}

impl ParamDomain {
    /// Whether `rank` holds a piece of the parameter.
    pub fn holds(&self, rank: usize) -> bool {
        self.holder
            .is_none_or(|(axis, c)| self.mesh.coords_of(rank)[axis] == c)
    }

    /// Sizes of the shard axes.
    pub fn shard_sizes(&self) -> Vec<usize> {
        self.shard_axes
            .iter()
            .map(|&a| self.mesh.axes()[a].size)
            .collect()
    }

    /// `rank`'s coordinate in the shard domain (one entry per shard axis).
    pub fn shard_coord(&self, rank: usize) -> Vec<usize> {
        let c = self.mesh.coords_of(rank);
        self.shard_axes.iter().map(|&a| c[a]).collect()
    }

    /// `rank`'s coordinate inside its replica subgroups (axis coordinate modulo subgroup size).
    pub fn replica_coord(&self, rank: usize) -> Vec<usize> {
        let c = self.mesh.coords_of(rank);
        self.replicate_axes.iter().map(|&(a, s)| c[a] % s).collect()
    }

    /// The rank that differs from `rank` only in shard axis `k`, where it has coordinate `x`.
    pub fn shard_neighbor(&self, rank: usize, k: usize, x: usize) -> usize {
        let mut c = self.mesh.coords_of(rank);
        c[self.shard_axes[k]] = x;
        self.mesh.rank_of(&c)
    }

    /// The group along shard axis `k` that contains `rank`.
    pub fn shard_group(&self, rank: usize, k: usize) -> MuonResult<Group> {
        let axis = self.shard_axes[k];
        let ranks = self.mesh.group_of(rank, &[axis]);
        Ok(Group::new(
            format!("muon/{}", self.mesh.axes()[axis].name),
            ranks,
        )?)
    }

    /// Every rank of `rank`'s shard domain (all shard axes), ascending.
    pub fn shard_domain(&self, rank: usize) -> Vec<usize> {
        let mut axes = self.shard_axes.clone();
        axes.sort_unstable();
        self.mesh.group_of(rank, &axes)
    }

    /// The ranks whose pieces `rank` holds after the fused gathers over shard axes `0..k`,
    /// in packing order (the last gathered axis outermost).
    pub fn holding_ranks(&self, rank: usize, k: usize) -> Vec<usize> {
        if k == 0 {
            return vec![rank];
        }
        let axis = self.shard_axes[k - 1];
        self.mesh
            .group_of(rank, &[axis])
            .into_iter()
            .flat_map(|m| self.holding_ranks(m, k - 1))
            .collect()
    }

    /// The replica subgroup along replicate axis `k` containing `rank`: a contiguous block of
    /// the replica group's ranks.
    pub fn replica_group(&self, rank: usize, k: usize) -> MuonResult<Group> {
        let (axis, sub) = self.replicate_axes[k];
        let mut c = self.mesh.coords_of(rank);
        let start = c[axis] / sub * sub;
        let ranks = (start..start + sub)
            .map(|x| {
                c[axis] = x;
                self.mesh.rank_of(&c)
            })
            .collect();
        Ok(Group::new(
            format!("muon-replica/{}", self.mesh.axes()[axis].name),
            ranks,
        )?)
    }

    /// The rank of `rank`'s replica subgroup along axis `k` at subgroup coordinate `x`.
    pub fn replica_neighbor(&self, rank: usize, k: usize, x: usize) -> usize {
        let (axis, sub) = self.replicate_axes[k];
        let mut c = self.mesh.coords_of(rank);
        c[axis] = c[axis] / sub * sub + x;
        self.mesh.rank_of(&c)
    }

    /// Shape of `rank`'s local piece.
    pub fn local_shape(&self, rank: usize) -> Vec<usize> {
        if !self.holds(rank) {
            let mut s: Vec<usize> = self
                .layout
                .global_shape
                .iter()
                .map(|&d| d as usize)
                .collect();
            if let Some(first) = s.first_mut() {
                *first = 0;
            }
            return s;
        }
        self.layout
            .local_shape(&self.mesh, rank)
            .into_iter()
            .map(|d| d as usize)
            .collect()
    }

    /// Elements of `rank`'s local piece.
    pub fn local_numel(&self, rank: usize) -> usize {
        self.local_shape(rank).iter().product()
    }

    /// Flat global indices of `rank`'s local elements, in local order.
    pub fn local_indices(&self, rank: usize) -> Vec<usize> {
        if !self.holds(rank) {
            return Vec::new();
        }
        self.layout
            .local_element_indices(&self.mesh, rank)
            .into_iter()
            .map(|i| i as usize)
            .collect()
    }

    /// Global element count.
    pub fn numel(&self) -> usize {
        self.layout.global_numel() as usize
    }
}

/// The domains of every plan parameter, by plan index.
#[derive(Debug, Clone, PartialEq)]
pub struct MuonDomains {
    params: Vec<ParamDomain>,
    world_size: usize,
}

fn resolve_axis(dense: &DeviceMesh, expert: &DeviceMesh, name: &str) -> Option<bool> {
    if dense.axis_index(name).is_some() {
        Some(false)
    } else if expert.axis_index(name).is_some() {
        Some(true)
    } else {
        None
    }
}

impl MuonDomains {
    /// Domains of a scenario's Muon plan (dense parameters on the dense mesh, expert
    /// parameters on the expert mesh; per-expert weights held by their EP owner only).
    pub fn from_scenario(
        scenario: &Scenario,
        sharding: &ShardingPlan,
        plan: &MuonPlan,
    ) -> MuonResult<MuonDomains> {
        MuonDomains::from_meshes(&scenario.dense_mesh, &scenario.expert_mesh, plan, |name| {
            sharding.param(name).and_then(|p| p.ep_owner)
        })
    }

    /// Domains from explicit meshes; `ep_owner(name)` gives the EP coordinate holding a
    /// per-expert weight (or None).
    pub fn from_meshes(
        dense: &DeviceMesh,
        expert: &DeviceMesh,
        plan: &MuonPlan,
        ep_owner: impl Fn(&str) -> Option<usize>,
    ) -> MuonResult<MuonDomains> {
        if dense.world_size() != expert.world_size() {
            return Err(MuonError::plan(format!(
                "dense mesh has {} ranks but expert mesh {}",
                dense.world_size(),
                expert.world_size()
            )));
        }
        let mut params = Vec::with_capacity(plan.params.len());
        for (index, p) in plan.params.iter().enumerate() {
            let names = p
                .shard_axes
                .iter()
                .map(|a| a.axis.as_str())
                .chain(p.replicate_axes.iter().map(|(a, _)| a.as_str()));
            let mut on_expert = None;
            for n in names {
                let e = resolve_axis(dense, expert, n).ok_or_else(|| {
                    MuonError::plan(format!("{}: axis '{n}' is on neither mesh", p.name))
                })?;
                if on_expert.is_some_and(|x| x != e) {
                    return Err(MuonError::plan(format!(
                        "{}: axes span both the dense and the expert mesh",
                        p.name
                    )));
                }
                on_expert = Some(e);
            }
            let holder = ep_owner(&p.name);
            let mesh = if on_expert.unwrap_or(holder.is_some()) {
                expert
            } else {
                dense
            };
            let axis_of = |n: &str| {
                mesh.axis_index(n)
                    .ok_or_else(|| MuonError::plan(format!("{}: unknown axis '{n}'", p.name)))
            };
            let mut placements = vec![Placement::Replicate; mesh.ndim()];
            let mut shard_axes = Vec::new();
            for a in &p.shard_axes {
                let i = axis_of(&a.axis)?;
                placements[i] = Placement::Shard { dim: a.tensor_dim };
                shard_axes.push(i);
            }
            let mut replicate_axes = Vec::new();
            for (a, size) in &p.replicate_axes {
                let i = axis_of(a)?;
                let sub = plan.replica_subgroup_size(a, *size);
                if sub == 0 || !size.is_multiple_of(sub) {
                    return Err(MuonError::config(
                        "optimizer.muon",
                        "replica_count",
                        format!(
                            "replica_count {sub} must evenly divide replicate group size {size} \
                             (axis {a})"
                        ),
                    ));
                }
                replicate_axes.push((i, sub));
            }
            let holder = match holder {
                Some(owner) => Some((
                    mesh.axis_index("ep").ok_or_else(|| {
                        MuonError::plan(format!("{}: EP owner without an ep axis", p.name))
                    })?,
                    owner,
                )),
                None => None,
            };
            let layout = Layout::new(p.shape.clone(), placements, mesh)?;
            params.push(ParamDomain {
                index,
                name: p.name.clone(),
                mesh: mesh.clone(),
                layout,
                shard_axes,
                replicate_axes,
                holder,
            });
        }
        Ok(MuonDomains {
            params,
            world_size: dense.world_size(),
        })
    }

    /// Replaces the layout of parameter `name` (e.g. a `StridedShard` FSDP-over-TP layout); it
    /// must split the tensor on exactly the parameter's shard axes.
    pub fn with_layout(mut self, name: &str, layout: Layout) -> MuonResult<MuonDomains> {
        let d = self
            .params
            .iter_mut()
            .find(|d| d.name == name)
            .ok_or_else(|| MuonError::plan(format!("no parameter {name}")))?;
        layout.validate(&d.mesh)?;
        let mut want = d.shard_axes.clone();
        want.sort_unstable();
        let got: Vec<usize> = (0..layout.placements.len())
            .filter(|&a| layout.placements[a].is_shard())
            .collect();
        if got != want || layout.global_shape != d.layout.global_shape {
            return Err(MuonError::plan(format!(
                "layout {layout} of {name} must keep shape {:?} and shard exactly axes {want:?}",
                d.layout.global_shape
            )));
        }
        d.layout = layout;
        Ok(self)
    }

    /// The domain of plan parameter `index`.
    pub fn get(&self, index: usize) -> MuonResult<&ParamDomain> {
        self.params
            .get(index)
            .ok_or_else(|| MuonError::plan(format!("no parameter index {index}")))
    }

    /// All domains, by plan index.
    pub fn all(&self) -> &[ParamDomain] {
        &self.params
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// `rank`'s local piece of a global tensor of parameter `index`.
    pub fn shard(&self, index: usize, global: &[f32], rank: usize) -> MuonResult<Vec<f32>> {
        let d = self.get(index)?;
        if global.len() != d.numel() {
            return Err(MuonError::plan(format!(
                "{}: {} elements for a {:?} tensor",
                d.name,
                global.len(),
                d.layout.global_shape
            )));
        }
        Ok(d.local_indices(rank)
            .into_iter()
            .map(|i| global[i])
            .collect())
    }

    /// Rebuilds the global tensor of parameter `index` from every rank's local piece; fails
    /// if two ranks holding the same element disagree in any bit.
    pub fn gather(&self, index: usize, locals: &[Vec<f32>]) -> MuonResult<Vec<f32>> {
        let d = self.get(index)?;
        let mut out: Vec<Option<u32>> = vec![None; d.numel()];
        for (rank, local) in locals.iter().enumerate() {
            let idx = d.local_indices(rank);
            if idx.len() != local.len() {
                return Err(MuonError::plan(format!(
                    "{}: rank {rank} holds {} elements, its layout {}",
                    d.name,
                    local.len(),
                    idx.len()
                )));
            }
            for (&i, &v) in idx.iter().zip(local) {
                match out[i] {
                    Some(bits) if bits != v.to_bits() => {
                        return Err(MuonError::plan(format!(
                            "{}: element {i} differs between replicas (rank {rank})",
                            d.name
                        )));
                    }
                    _ => out[i] = Some(v.to_bits()),
                }
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(i, b)| {
                b.map(f32::from_bits).ok_or_else(|| {
                    MuonError::plan(format!("{}: element {i} is held by no rank", d.name))
                })
            })
            .collect()
    }
}
