//! The rank-independent context every strategy shares ([`Ctx`]), built once per
//! [`super::ProgramGenerator`].

use super::compute::Stage;
use super::groups::{GROUP_KINDS, GroupFamily, GroupKind};
use super::muon::opt_ctx::OptCtx;
use super::options::{StrategyError, StrategyOptions};
use super::trainer_tail::TrainerTail;
use crate::step::Group;
use hpfsdp_plan::fsdp::{DataDomain, FsdpPlan};
use hpfsdp_plan::mesh::DeviceMesh;
use hpfsdp_plan::mesh_groups::MeshGroups;
use hpfsdp_plan::topology::{Tier, Topology};

/// The parameters one expert-parallel coordinate holds (all ranks hold the same set unless
/// per-expert weights are owned by one EP rank each).
#[derive(Debug, Clone)]
pub(crate) struct ParamClass {
    /// Per FSDP unit: indices into `FsdpPlan::params` this class holds, in model order.
    pub units: Vec<Vec<u32>>,
}

/// Everything rank-independent a strategy needs, shared by all strategies.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub opts: StrategyOptions,
    pub fsdp: FsdpPlan,
    /// `plan_local` element count of every FSDP parameter (same order as `fsdp.params`).
    pub local_numel: Vec<u64>,
    /// Compute stages in forward order.
    pub stages: Vec<Stage>,
    /// Stage index of every FSDP unit.
    pub unit_stage: Vec<usize>,
    /// Parameter sets per EP class.
    pub classes: Vec<ParamClass>,
    /// Whether classes differ by the `ep` coordinate.
    pub per_expert_owner: bool,
    /// Per FSDP parameter: its gradient is a partial sum over `tp` that FSDP completes with
    /// its own TP all-reduce every micro-batch ([`super::tp_grad_sync`]).
    pub tp_partial_grad: Vec<bool>,
    /// The trainer's own work around the model (loss metrics, gradient clipping).
    pub trainer: TrainerTail,
    /// Shard / replicate group sizes per domain.
    pub shard_size: [usize; 2],
    pub replicate_size: [usize; 2],
    pub(crate) dense_mesh: DeviceMesh,
    pub(crate) expert_mesh: DeviceMesh,
    pub(crate) topology: Topology,
    pub(crate) families: Vec<GroupFamily>,
    /// Every family's groups by arithmetic on its mesh (same order as `families`).
    pub(crate) family_groups: Vec<MeshGroups>,
    pub(crate) slot: [Option<usize>; GROUP_KINDS],
    /// The optimizer strategy's rank-independent data.
    pub opt: OptCtx,
    /// The most ops any program generated so far has had: new programs reserve that many
    /// up front instead of growing (and copying) their op vector ~15 times. Capacity only;
    /// program contents never depend on it.
    pub ops_hint: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Ctx {
    /// Table position of a group family in every program, `None` when not used or of size 1.
    pub fn slot(&self, kind: GroupKind) -> Option<usize> {
        self.slot[kind.index()]
    }

    /// The EP class of a rank.
    pub fn class_of(&self, rank: usize) -> usize {
        if !self.per_expert_owner {
            return 0;
        }
        let i = self.expert_mesh.axis_index("ep").unwrap_or(0);
        self.expert_mesh.coords_of(rank)[i]
    }

    /// Members of `rank`'s group of the family at table position `f`, ascending.
    pub(crate) fn group_ranks(&self, f: usize, rank: usize) -> Vec<usize> {
        self.family_groups[f].group_of(rank)
    }

    /// Tier of `rank`'s group of the family at table position `f`, without listing the
    /// group: its first and last members decide it (machines and supernodes are contiguous
    /// rank blocks, and a group's ranks ascend). (Listing every group of every rank made
    /// planning exp-d at 100,608 ranks quadratic in the data-parallel group's size.)
    pub(crate) fn family_tier(&self, f: usize, rank: usize) -> Tier {
        let (low, high) = self.family_groups[f].bounds_of(rank);
        self.topology.tier_of(&[low, high])
    }

    /// Position of `rank` in its group of the family at table position `slot` (0 when the
    /// family is absent).
    pub fn position_in(&self, slot: Option<usize>, rank: usize) -> usize {
        slot.and_then(|s| self.family_groups.get(s))
            .map_or(0, |g| g.position(rank))
    }

    /// The group table of `rank` and the tier of each group.
    pub fn groups(&self, rank: usize) -> Result<Vec<(Group, Tier)>, StrategyError> {
        self.families
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let ranks = self.group_ranks(i, rank);
                let tier = self.topology.tier_of(&ranks);
                Ok((Group::new(f.label.clone(), ranks)?, tier))
            })
            .collect()
    }

    /// Domain index (0 dense, 1 expert).
    pub fn domain_index(d: DataDomain) -> usize {
        super::groups::domain_index(d)
    }
}
