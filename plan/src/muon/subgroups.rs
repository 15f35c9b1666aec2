//! Replica subgroups of the Muon replica domain (notes `hyper-parallel.md` 6.5) and the lint
//! that flags subgroups crossing the slow tier.
//!
//! A replica group of `R` ranks along a replicate axis is cut into subgroups: contiguous
//! blocks of its sorted ranks, all of one size. Each subgroup dedups on its own (owners per
//! subgroup coordinate, replica broadcasts inside the subgroup); different subgroups
//! recompute the same work. Two rules size them ([`ReplicaSubgroupRule`],
//! `[optimizer.muon] replica_subgroups`):
//! - `launcher` (default): the paper's rule, HyperParallel's `_auto_deduce_replica_count`:
//!   the largest divisor of `R` not above the devices per machine, no split when `R` fits;
//!   one size for every axis (the smallest over the axes that need a split), or
//!   `[optimizer.muon] replica_count`. It is a launcher premise: it assumes the replicas of a
//!   group sit on one machine when `R` fits, which the canonical mapping (shard axes inside
//!   a supernode, replicas across supernodes) breaks, so the replica broadcasts cross the
//!   inter-supernode tier; [`ReplicaSubgroups::lints`] then carries a warning.
//! - `topology`: per replicate axis, the replica-group members that share a machine, read
//!   from the scenario's rank-to-machine mapping: the largest block size dividing `R` such
//!   that every block of every group along the axis lies on one machine (the machine's
//!   members themselves when they form equal contiguous blocks). No subgroup ever leaves a
//!   machine, so no replica broadcast crosses machines (nor supernodes).

use super::{MuonParam, OptimizerRoute, replica_subgroup_size};
use crate::mesh::DeviceMesh;
use crate::planner::lint::LintIssue;
pub use crate::replica_subgroup_rule::ReplicaSubgroupRule;
use crate::scenario::Scenario;
use crate::topology::{Tier, Topology};
use std::collections::BTreeMap;

/// The rule a scenario asks for (`launcher` when the key is absent; the scenario loader has
/// already rejected unknown names).
pub fn rule_of(scenario: &Scenario) -> ReplicaSubgroupRule {
    scenario
        .file
        .optimizer
        .muon
        .replica_subgroups
        .as_deref()
        .and_then(ReplicaSubgroupRule::parse)
        .unwrap_or_default()
}

/// The replica subgroups of a Muon plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaSubgroups {
    /// The rule used.
    pub rule: ReplicaSubgroupRule,
    /// One subgroup size for every replicate axis (`size.min(count)`), when one describes
    /// them all; `None`: no split (or, under `topology`, sizes that differ per axis).
    pub count: Option<usize>,
    /// Subgroup size per replicate axis of a Muon parameter (the axis size when not split).
    pub sizes: BTreeMap<String, usize>,
    /// Warnings: launcher subgroups that span more than one supernode.
    pub lints: Vec<LintIssue>,
}

/// The mesh holding a Muon axis and its index there (dense axes first).
fn axis_on<'a>(scenario: &'a Scenario, name: &str) -> Option<(&'a DeviceMesh, usize)> {
    [&scenario.dense_mesh, &scenario.expert_mesh]
        .into_iter()
        .find_map(|m| m.axis_index(name).map(|i| (m, i)))
}

/// The blocks of `block` consecutive members of every group along `axis`.
fn blocks(mesh: &DeviceMesh, axis: usize, block: usize) -> impl Iterator<Item = Vec<usize>> {
    let block = block.max(1);
    mesh.groups(&[axis])
        .into_iter()
        .flat_map(move |g| g.chunks(block).map(<[usize]>::to_vec).collect::<Vec<_>>())
}

/// The largest divisor of the axis size whose blocks all lie on one machine (1 at worst).
fn machine_block(mesh: &DeviceMesh, axis: usize, topology: &Topology) -> usize {
    let size = mesh.axes()[axis].size;
    (1..=size)
        .rev()
        .filter(|d| size.is_multiple_of(*d))
        .find(|&d| {
            d == 1 || blocks(mesh, axis, d).all(|b| topology.tier_of(&b) == Tier::IntraMachine)
        })
        .unwrap_or(1)
}

/// Bytes of the replica broadcasts along `axis` per rank and step: every Muon parameter
/// replicated on it ships its local master shard once (each segment padded to 512 bytes).
fn broadcast_bytes(params: &[MuonParam], axis: &str, master_bytes: u64) -> u64 {
    params
        .iter()
        .filter(|p| p.route == OptimizerRoute::Muon)
        .filter(|p| p.replicate_axes.iter().any(|(a, _)| a == axis))
        .map(|p| {
            let local = p.numel().div_ceil(p.shard_size().max(1) as u64);
            (local * master_bytes).div_ceil(512) * 512
        })
        .sum()
}

/// Sizes the replica subgroups of `params` under the scenario's rule, and lints launcher
/// subgroups that span supernodes.
pub fn replica_subgroups(scenario: &Scenario, params: &[MuonParam]) -> ReplicaSubgroups {
    let rule = rule_of(scenario);
    let dpm = scenario.topology.dies_per_machine;
    // Replicate axes of Muon parameters, with their sizes.
    let mut axes: BTreeMap<String, usize> = BTreeMap::new();
    for p in params.iter().filter(|p| p.route == OptimizerRoute::Muon) {
        for (a, s) in &p.replicate_axes {
            axes.insert(a.clone(), *s);
        }
    }
    let (count, sizes) = match rule {
        ReplicaSubgroupRule::Launcher => {
            let count = scenario.file.optimizer.muon.replica_count.or_else(|| {
                params
                    .iter()
                    .flat_map(|p| p.replicate_axes.iter().map(|(_, s)| *s))
                    .filter_map(|s| replica_subgroup_size(s, dpm))
                    .min()
            });
            let sizes = axes
                .iter()
                .map(|(a, &s)| (a.clone(), count.map_or(s, |c| c.min(s))))
                .collect();
            (count, sizes)
        }
        ReplicaSubgroupRule::Topology => {
            let sizes: BTreeMap<String, usize> = axes
                .iter()
                .map(|(a, &s)| {
                    let sub = axis_on(scenario, a)
                        .map_or(s, |(m, i)| machine_block(m, i, &scenario.topology));
                    (a.clone(), sub)
                })
                .collect();
            (uniform_count(&axes, &sizes), sizes)
        }
    };
    let lints = match rule {
        ReplicaSubgroupRule::Launcher => launcher_lints(scenario, params, &axes, &sizes, count),
        ReplicaSubgroupRule::Topology => Vec::new(),
    };
    ReplicaSubgroups {
        rule,
        count,
        sizes,
        lints,
    }
}

/// One count `c` with `sizes[a] == axes[a].min(c)` on every axis, when some axis is split.
fn uniform_count(axes: &BTreeMap<String, usize>, sizes: &BTreeMap<String, usize>) -> Option<usize> {
    if axes.iter().all(|(a, s)| sizes.get(a) == Some(s)) {
        return None;
    }
    sizes
        .values()
        .copied()
        .filter(|&c| axes.iter().all(|(a, &s)| sizes.get(a) == Some(&s.min(c))))
        .min()
}

/// A warning per replicate axis whose launcher subgroups span more than one supernode.
fn launcher_lints(
    scenario: &Scenario,
    params: &[MuonParam],
    axes: &BTreeMap<String, usize>,
    sizes: &BTreeMap<String, usize>,
    count: Option<usize>,
) -> Vec<LintIssue> {
    let topo = &scenario.topology;
    let dpm = topo.dies_per_machine;
    let mut out = Vec::new();
    for (a, &size) in axes {
        let sub = sizes.get(a).copied().unwrap_or(size);
        let Some((mesh, i)) = axis_on(scenario, a).filter(|_| sub > 1) else {
            continue;
        };
        let (mut crossing, mut total, mut widest) = (0usize, 0usize, 1usize);
        for b in blocks(mesh, i, sub) {
            total += 1;
            if topo.tier_of(&b) == Tier::InterSupernode {
                crossing += 1;
                let mut sns: Vec<usize> = b.iter().map(|&r| topo.locate(r).supernode).collect();
                sns.sort_unstable();
                sns.dedup();
                widest = widest.max(sns.len());
            }
        }
        if crossing == 0 {
            continue;
        }
        let why = match (scenario.file.optimizer.muon.replica_count, count) {
            (Some(c), _) => format!("[optimizer.muon] replica_count = {c}"),
            (None, None) => format!(
                "launcher rule: {size} replicas fit the {dpm} devices per machine, so no split"
            ),
            (None, Some(c)) => format!(
                "launcher rule: largest divisor of the smallest split replica group not above \
                 {dpm} devices per machine = {c}"
            ),
        };
        let bytes = broadcast_bytes(params, a, scenario.master_dtype.bytes());
        out.push(
            LintIssue::warning(
                "muon-replica-subgroup-crosses-supernodes",
                format!(
                    "{crossing} of {total} Muon replica subgroups along '{a}' ({sub} of {size} \
                     replicas each, {why}) span up to {widest} supernodes: every Muon batch's \
                     replica broadcast crosses the inter-supernode tier, about {:.3} GB per \
                     rank per step ({bytes} bytes of local master shards)",
                    bytes as f64 / 1e9
                ),
                "set [optimizer.muon] replica_subgroups = \"topology\" to cut the subgroups \
                 along machines (the replicas of other machines then recompute the \
                 Newton-Schulz work instead of receiving it, and no replica broadcast leaves \
                 a machine), or map the replicas of a group inside one supernode",
            )
            .axis(a),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_round_trip() {
        for r in ReplicaSubgroupRule::ALL {
            assert_eq!(ReplicaSubgroupRule::parse(r.name()), Some(r));
        }
        assert_eq!(ReplicaSubgroupRule::parse("machine"), None);
        assert_eq!(
            ReplicaSubgroupRule::default(),
            ReplicaSubgroupRule::Launcher
        );
    }

    #[test]
    fn machine_blocks_follow_the_rank_layout() {
        // 2 replicas x 4 shards, 4 dies per machine: replicas 4 ranks apart, on two machines.
        let mesh = DeviceMesh::new([("dp_replicate", 2), ("dp_shard", 4)]).unwrap();
        let two_machines = Topology::new(4, 2, 1).unwrap();
        assert_eq!(machine_block(&mesh, 0, &two_machines), 1);
        // 8 dies per machine: both replicas share it.
        let one_machine = Topology::new(8, 1, 1).unwrap();
        assert_eq!(machine_block(&mesh, 0, &one_machine), 2);
        // 6 replicas of 2 ranks, 4 dies per machine: members pair up on machines.
        let mesh = DeviceMesh::new([("dp_replicate", 6), ("dp_shard", 2)]).unwrap();
        let t = Topology::new(4, 3, 1).unwrap();
        assert_eq!(machine_block(&mesh, 0, &t), 2);
        // 3 ranks per replica, 4 dies per machine: blocks of 2 would straddle machines.
        let mesh = DeviceMesh::new([("dp_replicate", 4), ("dp_shard", 3)]).unwrap();
        let t = Topology::new(4, 3, 1).unwrap();
        assert_eq!(machine_block(&mesh, 0, &t), 1);
    }

    #[test]
    fn uniform_count_when_one_describes_every_axis() {
        let axes: BTreeMap<String, usize> = [("a".to_string(), 6), ("b".to_string(), 4)].into();
        let sizes = |x: usize, y: usize| -> BTreeMap<String, usize> {
            [("a".to_string(), x), ("b".to_string(), y)].into()
        };
        assert_eq!(uniform_count(&axes, &sizes(6, 4)), None);
        assert_eq!(uniform_count(&axes, &sizes(2, 2)), Some(2));
        assert_eq!(uniform_count(&axes, &sizes(6, 2)), None);
        assert_eq!(uniform_count(&axes, &sizes(4, 4)), Some(4));
        assert_eq!(uniform_count(&axes, &sizes(1, 4)), None);
    }
}
