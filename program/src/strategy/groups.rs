//! The process-group families a program can use ([`GroupKind`], [`GroupFamily`]).

use hpfsdp_plan::fsdp::DataDomain;
use hpfsdp_plan::mesh::DeviceMesh;
use hpfsdp_plan::mesh_groups::MeshGroups;

/// The process-group families a program can use, in group-table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum GroupKind {
    /// FSDP shard group of dense parameters (`dp_shard` x `cp`).
    DenseShard,
    /// HSDP replicate group of dense parameters (`dp_replicate`).
    DenseReplicate,
    /// FSDP shard group of routed experts (`edp_shard`).
    ExpertShard,
    /// HSDP replicate group of routed experts (`edp_replicate`).
    ExpertReplicate,
    /// Megatron data-parallel group (`dp_replicate` x `dp_shard` x `cp`).
    DataParallel,
    /// Megatron expert data-parallel group (`edp_replicate` x `edp_shard`).
    ExpertDataParallel,
    /// Tensor parallel.
    Tp,
    /// Context parallel.
    Cp,
    /// Expert parallel.
    Ep,
}

pub(crate) const GROUP_KINDS: usize = 9;

impl GroupKind {
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// One group family: which mesh, which axes, its label and size. With `block`, the group is
/// the contiguous block of `block` ranks of the sorted axis group that holds the rank (the
/// Muon replica subgroups, notes `hyper-parallel.md` 6.5).
#[derive(Debug, Clone)]
pub(crate) struct GroupFamily {
    pub(crate) kind: Option<GroupKind>,
    pub(crate) expert_mesh: bool,
    pub(crate) axes: Vec<usize>,
    pub(crate) label: String,
    pub(crate) size: usize,
    pub(crate) block: Option<usize>,
}

impl GroupFamily {
    /// The family's groups by arithmetic on its mesh.
    pub(crate) fn mesh_groups(&self, meshes: [&DeviceMesh; 2]) -> MeshGroups {
        MeshGroups::new(
            meshes[usize::from(self.expert_mesh)],
            &self.axes,
            self.block,
        )
    }

    /// Mesh axes of size > 1 (what decides the ranks, with `block`).
    pub(crate) fn key(&self, meshes: [&DeviceMesh; 2]) -> (bool, Vec<usize>, Option<usize>) {
        let mesh = meshes[usize::from(self.expert_mesh)];
        let axes = self
            .axes
            .iter()
            .copied()
            .filter(|&a| mesh.axes()[a].size > 1)
            .collect();
        (self.expert_mesh, axes, self.block)
    }
}

/// Domain index (0 dense, 1 expert).
pub(crate) fn domain_index(d: DataDomain) -> usize {
    match d {
        DataDomain::Dense => 0,
        DataDomain::Expert => 1,
    }
}
