//! One rank's view of the meshes: its coordinates, its process groups (labelled like the step
//! programs' groups: `dp_shard+cp`, `dp_replicate`, `tp`, `edp_shard`, `edp_replicate`, `ep`)
//! and its coordinate on the plan mesh the layouts live on.

use hpfsdp_backends::Group;
use hpfsdp_plan::DeviceMesh;

use super::error::{RtResult, RuntimeError};

/// Axes of the plan mesh, in order: the non-data-parallel axes contracts and parameter
/// placements are written in. Axes of size 1 are kept so that any placement is representable.
pub const PLAN_AXES: [&str; 4] = ["tp", "cp", "ep", "etp"];

/// Group labels, as used in traces and step programs.
pub mod labels {
    /// Dense FSDP shard group.
    pub const DENSE_SHARD: &str = "dp_shard+cp";
    /// Dense HSDP replicate group.
    pub const DENSE_REPLICATE: &str = "dp_replicate";
    /// Expert FSDP shard group.
    pub const EXPERT_SHARD: &str = "edp_shard";
    /// Expert HSDP replicate group.
    pub const EXPERT_REPLICATE: &str = "edp_replicate";
    /// Tensor-parallel group.
    pub const TP: &str = "tp";
    /// Expert-parallel group.
    pub const EP: &str = "ep";
}

/// A process group and this rank's index inside it.
#[derive(Debug, Clone)]
pub struct MyGroup {
    /// The group.
    pub group: Group,
    /// This rank's position in it.
    pub index: usize,
}

impl MyGroup {
    fn along(mesh: &DeviceMesh, rank: usize, label: &str, names: &[&str]) -> RtResult<MyGroup> {
        let axes: Vec<usize> = names.iter().filter_map(|n| mesh.axis_index(n)).collect();
        let ranks = mesh.group_of(rank, &axes);
        let group = Group::new(label, ranks).map_err(|e| RuntimeError::plan(e.to_string()))?;
        let index = group
            .position(rank)
            .ok_or_else(|| RuntimeError::plan(format!("rank {rank} not in its {label} group")))?;
        Ok(MyGroup { group, index })
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.group.size()
    }
}

/// Everything a rank knows about where it sits.
#[derive(Debug, Clone)]
pub struct RankTopo {
    /// Global rank.
    pub rank: usize,
    /// World size.
    pub world: usize,
    /// Dense mesh `dp_replicate x dp_shard x cp x tp`.
    pub dense_mesh: DeviceMesh,
    /// Expert mesh `edp_replicate x edp_shard x ep x etp`.
    pub expert_mesh: DeviceMesh,
    /// Plan mesh [`PLAN_AXES`] (sizes from the scenario).
    pub plan_mesh: DeviceMesh,
    /// This rank's index on the plan mesh.
    pub plan_rank: usize,
    /// Dense shard group.
    pub dense_shard: MyGroup,
    /// Dense replicate group.
    pub dense_replicate: MyGroup,
    /// Expert shard group.
    pub expert_shard: MyGroup,
    /// Expert replicate group.
    pub expert_replicate: MyGroup,
    /// Tensor-parallel group.
    pub tp: MyGroup,
    /// Expert-parallel group.
    pub ep: MyGroup,
}

impl RankTopo {
    /// The view of `rank` given both meshes (same world size).
    pub fn new(rank: usize, dense_mesh: &DeviceMesh, expert_mesh: &DeviceMesh) -> RtResult<Self> {
        let world = dense_mesh.world_size();
        if expert_mesh.world_size() != world || rank >= world {
            return Err(RuntimeError::plan(format!(
                "rank {rank}: dense mesh has {world} ranks, expert mesh {}",
                expert_mesh.world_size()
            )));
        }
        let size = |m: &DeviceMesh, a: &str| m.axis_size(a);
        let plan_mesh = DeviceMesh::new([
            ("tp", size(dense_mesh, "tp")),
            ("cp", size(dense_mesh, "cp")),
            ("ep", size(expert_mesh, "ep")),
            ("etp", size(expert_mesh, "etp")),
        ])
        .map_err(|e| RuntimeError::plan(e.to_string()))?;
        let coord = |m: &DeviceMesh, a: &str| m.axis_index(a).map_or(0, |i| m.coords_of(rank)[i]);
        let plan_rank = plan_mesh.rank_of(&[
            coord(dense_mesh, "tp"),
            coord(dense_mesh, "cp"),
            coord(expert_mesh, "ep"),
            coord(expert_mesh, "etp"),
        ]);
        Ok(RankTopo {
            rank,
            world,
            plan_rank,
            dense_shard: MyGroup::along(
                dense_mesh,
                rank,
                labels::DENSE_SHARD,
                &["dp_shard", "cp"],
            )?,
            dense_replicate: MyGroup::along(
                dense_mesh,
                rank,
                labels::DENSE_REPLICATE,
                &["dp_replicate"],
            )?,
            expert_shard: MyGroup::along(expert_mesh, rank, labels::EXPERT_SHARD, &["edp_shard"])?,
            expert_replicate: MyGroup::along(
                expert_mesh,
                rank,
                labels::EXPERT_REPLICATE,
                &["edp_replicate"],
            )?,
            tp: MyGroup::along(dense_mesh, rank, labels::TP, &["tp"])?,
            ep: MyGroup::along(expert_mesh, rank, labels::EP, &["ep"])?,
            dense_mesh: dense_mesh.clone(),
            expert_mesh: expert_mesh.clone(),
            plan_mesh,
        })
    }

    /// The data-parallel index of this rank's micro-batch stream: its position on
    /// `dp_replicate x dp_shard` (TP/CP peers share a stream).
    pub fn dp_index(&self) -> usize {
        dp_index_of(&self.dense_mesh, self.rank)
    }

    /// The group of a plan axis (`tp` on the dense mesh, `ep` on the expert mesh); `None` for
    /// axes this runtime does not execute (`cp`, `etp`).
    pub fn plan_axis_group(&self, axis: &str) -> Option<&MyGroup> {
        match axis {
            "tp" => Some(&self.tp),
            "ep" => Some(&self.ep),
            _ => None,
        }
    }
}

/// The data-parallel index of `rank` on a dense mesh (`dp_replicate * dp_shard_size + dp_shard`).
pub fn dp_index_of(dense_mesh: &DeviceMesh, rank: usize) -> usize {
    let c = dense_mesh.coords_of(rank);
    let get = |a: &str| dense_mesh.axis_index(a).map_or(0, |i| c[i]);
    get("dp_replicate") * dense_mesh.axis_size("dp_shard") + get("dp_shard")
}
