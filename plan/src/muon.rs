//! The Muon plan: Muon vs AdamW routing, the matrix-plane predicate, HSDP batches with the
//! soft numel cap (per expert-parallel coordinate for per-expert weights, each coordinate's
//! batches sharing execution slots with the others'), NS memory batches under the 2^29 /
//! shard-group cap, greedy owners in the shard and replica domains, replica subgroups
//! ([`subgroups`]: the launcher rule or the rank-to-machine mapping, with a lint for
//! subgroups spanning supernodes), and each batch's communication (fused gathers per shard
//! axis, relay broadcasts, replica broadcasts).

mod build;
pub mod subgroups;

pub use build::build_muon_plan;
pub use subgroups::{ReplicaSubgroupRule, ReplicaSubgroups, replica_subgroups};

use crate::planner::lint::LintIssue;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Which optimizer updates a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerRoute {
    /// Orthogonalized update.
    Muon,
    /// Element-wise AdamW (1-D, embeddings, heads).
    Adamw,
}

/// Name keywords that send a matrix to AdamW.
pub const ADAMW_KEYWORDS: &[&str] = &[
    "embed",
    "lm_head",
    "out_head",
    "out_proj.bias",
    "shared_head.head",
];

/// Routes a parameter: Muon iff it has >= 2 dims and its name has no AdamW keyword.
pub fn route(name: &str, ndim: usize, kind_is_muon: bool) -> (OptimizerRoute, String) {
    if !kind_is_muon {
        return (OptimizerRoute::Adamw, "optimizer kind is adamw".into());
    }
    if ndim < 2 {
        return (OptimizerRoute::Adamw, format!("{ndim}-D parameter"));
    }
    let lower = name.to_lowercase();
    if let Some(k) = ADAMW_KEYWORDS.iter().find(|k| lower.contains(*k)) {
        return (OptimizerRoute::Adamw, format!("name contains '{k}'"));
    }
    (OptimizerRoute::Muon, format!("{ndim}-D matrix"))
}

/// The matrix core shape Muon batches by: 2-D `(s0,s1)`; 3-D with `s1 == 1` `(s0,s2)`;
/// otherwise the last two dims.
pub fn core_shape(shape: &[u64]) -> Option<(u64, u64)> {
    match shape {
        [] | [_] => None,
        [a, b] => Some((*a, *b)),
        [a, 1, c] => Some((*a, *c)),
        _ => Some((shape[shape.len() - 2], shape[shape.len() - 1])),
    }
}

/// One mesh axis that shards a parameter, with the tensor dim it cuts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardAxis {
    /// Mesh axis name.
    pub axis: String,
    /// Tensor dim.
    pub tensor_dim: usize,
    /// Axis size.
    pub size: usize,
}

/// The Muon view of one parameter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MuonParam {
    /// FQN.
    pub name: String,
    /// Muon or AdamW.
    pub route: OptimizerRoute,
    /// Why.
    pub route_reason: String,
    /// Global shape.
    pub shape: Vec<u64>,
    /// Core matrix shape (Muon only).
    pub core_shape: Option<(u64, u64)>,
    /// Independent matrices (leading dims; an expert `[E,M,N]` is E matrices).
    pub matrices: u64,
    /// Axes that shard it, in mesh order (data-parallel and plan axes).
    pub shard_axes: Vec<ShardAxis>,
    /// Axes of size > 1 it is replicated on (name, size).
    pub replicate_axes: Vec<(String, usize)>,
    /// Matrix-plane predicate: some shard axis cuts one of the last two dims, so Newton-Schulz
    /// needs the gathered matrix.
    pub needs_gather: bool,
    /// Expert-parallel coordinate holding a per-expert weight (`None`: every rank holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ep_owner: Option<usize>,
}

impl MuonParam {
    /// Elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Elements of this parameter on one rank of its shard group (ceil-chunk): what the
    /// production-mode runtime holds as a plain local tensor and what HyperParallel's HSDP
    /// batch cap counts.
    pub fn local_numel(&self) -> u64 {
        self.numel().div_ceil(self.shard_size().max(1) as u64)
    }

    /// Product of the shard axis sizes.
    pub fn shard_size(&self) -> usize {
        self.shard_axes.iter().map(|a| a.size).product()
    }
}

/// One HSDP assignment (sub-batch) of Muon parameters sharing a communication domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MuonBatch {
    /// Domain key (mesh, shard axes with tensor dims, replicate axes).
    pub domain: String,
    /// Shard path (gather, owner NS, relay broadcast) or local path.
    pub shard_path: bool,
    /// Parameter indices into [`MuonPlan::params`], numel-descending.
    pub params: Vec<usize>,
    /// Total elements.
    pub numel: u64,
    /// NS memory sub-batches (indices), each under the 2^29 / shard-size cap once it holds
    /// `S` matrices (shard path) or one (local path).
    pub memory_batches: Vec<Vec<usize>>,
    /// Shard-domain owner coordinate of each parameter (shard path only), balanced inside the
    /// subset of records of the parameter's replica owner (notes 6.4/6.5).
    pub shard_owner: BTreeMap<usize, Vec<usize>>,
    /// Replica-domain owner coordinate of each parameter (when replicated).
    pub replica_owner: BTreeMap<usize, Vec<usize>>,
    /// Fused all-gather output bytes per rank, per memory batch and shard axis (bf16, 512-B padded).
    pub gather_bytes: Vec<Vec<(String, u64)>>,
    /// Relay bytes of the whole assignment: (axis, bytes) per compute coordinate relayed in
    /// rank 0's view, summed over the memory batches. The runtime does not send them as one
    /// broadcast per coordinate: see [`MuonBatch::memory_relays`].
    pub relay_broadcasts: Vec<(String, u64)>,
    /// The relay broadcasts as HyperParallel issues them (`_process_shard_params` at 3ad2a77:
    /// `for sub_batch in safe_batches:` gather, NS, then `_fused_broadcast_and_apply`): per
    /// NS memory batch, (axis, bytes) per broadcast of rank 0's view, one per compute
    /// coordinate owning a matrix of that memory batch, each carrying that owner's packed
    /// bf16 updates (512-B padded per matrix). Empty on the local path. Derived from
    /// `memory_batches` and `shard_owner`, so it is left out of the serialized plan (and of
    /// its digest).
    #[serde(skip)]
    pub memory_relays: Vec<Vec<(String, u64)>>,
    /// Replica broadcasts: (axis, bytes) per hop.
    pub replica_broadcasts: Vec<(String, u64)>,
    /// Expert-parallel coordinate holding every parameter of the batch (`None`: every rank).
    /// Per-expert weights live on one EP rank each, and, as HyperParallel's per-process
    /// optimizer does, each EP coordinate batches its own weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ep_owner: Option<usize>,
    /// Execution slot: a rank runs the batches of its own EP coordinate (or of every rank) in
    /// ascending slot order; the batches sharing a slot are the same position of different
    /// EP coordinates' batch lists, so ranks of different coordinates step through the same
    /// sequence of slots.
    #[serde(default)]
    pub slot: usize,
}

/// The Muon plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MuonPlan {
    /// Every trainable parameter with its route.
    pub params: Vec<MuonParam>,
    /// HSDP assignments in execution order.
    pub batches: Vec<MuonBatch>,
    /// Replica subgroup size, one for every replicate axis (`size.min(count)`); `None`: no
    /// split, or (`topology` rule only) sizes that differ per axis: see
    /// [`MuonPlan::replica_subgroup_sizes`].
    pub replica_count: Option<usize>,
    /// Devices per machine used to size replica subgroups.
    pub devices_per_machine: usize,
    /// The rule that sized the replica subgroups.
    #[serde(default)]
    pub replica_subgroups: ReplicaSubgroupRule,
    /// Subgroup size per replicate axis of a Muon parameter (the axis size when not split).
    #[serde(default)]
    pub replica_subgroup_sizes: BTreeMap<String, usize>,
    /// Warnings about the Muon plan (replica subgroups spanning supernodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lints: Vec<LintIssue>,
}

impl MuonPlan {
    /// The replica subgroup size along replicate axis `axis` of `size` ranks: the plan's
    /// per-axis size, else `size.min(replica_count)`; at least 1 and at most `size`.
    pub fn replica_subgroup_size(&self, axis: &str, size: usize) -> usize {
        self.replica_subgroup_sizes
            .get(axis)
            .copied()
            .unwrap_or_else(|| self.replica_count.map_or(size, |c| c.min(size)))
            .clamp(1, size.max(1))
    }

    /// One line saying how replica subgroups were sized: the rule and, per replicate axis,
    /// `axis group/subgroup` (`launcher rule: no split` when nothing is split).
    pub fn replica_subgroup_summary(&self) -> String {
        let mut axes: BTreeMap<&str, usize> = BTreeMap::new();
        for p in self.params.iter().filter(|p| p.core_shape.is_some()) {
            for (axis, size) in &p.replicate_axes {
                axes.insert(axis, *size);
            }
        }
        let parts: Vec<String> = axes
            .iter()
            .filter(|(_, size)| **size > 1)
            .map(|(axis, size)| {
                format!("{axis} {size}/{}", self.replica_subgroup_size(axis, *size))
            })
            .collect();
        let split = axes
            .iter()
            .any(|(axis, size)| self.replica_subgroup_size(axis, *size) < *size);
        format!(
            "{} rule: {}",
            self.replica_subgroups.name(),
            match (parts.is_empty(), split) {
                (true, _) => "no replicated Muon matrices".to_string(),
                (false, false) => format!("{} (no split)", parts.join(", ")),
                (false, true) => parts.join(", "),
            }
        )
    }
}

/// The HSDP batch soft cap in elements per replica-count unit (HyperParallel compares the
/// 512 MiB byte constant against a numel). In production mode the runtime's parameters are
/// plain local shards, so the numel it compares is the **local** one: a batch closes once the
/// sum of its members' local-shard elements reaches the cap (whole-matrix elements up to the
/// cap times the shard-group size).
pub const HSDP_BATCH_NUMEL: u64 = 512 * 1024 * 1024;
/// Newton-Schulz memory cap: 2^29 elements divided by the shard-group size `S`, compared with
/// the whole-matrix numel (the optimizer's parameters are DTensors, so `p.numel()` is global:
/// HyperParallel's `_process_shard_params` reads their placements and `to_local()` next to
/// the split). On the shard path a memory batch takes at least `S` matrices before the cap
/// closes it ([`split_memory_batches`]).
pub const NS_BATCH_NUMEL: u64 = 1 << 29;

/// Greedy owner assignment: records sorted by (-numel, index); each picks the least-loaded
/// coordinate with lexicographic tie-break. Returns index → coordinate.
pub fn build_owner_by_size(
    records: &[(usize, u64)],
    sizes: &[usize],
) -> BTreeMap<usize, Vec<usize>> {
    let mut coords: Vec<Vec<usize>> = vec![Vec::new()];
    for &s in sizes {
        coords = coords
            .into_iter()
            .flat_map(|c| (0..s).map(move |i| [c.clone(), vec![i]].concat()))
            .collect();
    }
    let mut load = vec![0u64; coords.len()];
    let mut order: Vec<(usize, u64)> = records.to_vec();
    order.sort_by_key(|&(i, n)| (std::cmp::Reverse(n), i));
    let mut out = BTreeMap::new();
    for (idx, numel) in order {
        let best = (0..coords.len())
            .min_by(|&a, &b| (load[a], &coords[a]).cmp(&(load[b], &coords[b])))
            .unwrap_or(0);
        load[best] += numel;
        out.insert(idx, coords[best].clone());
    }
    out
}

/// Sequential greedy split under `cap` elements (`_split_into_memory_safe_batches`): a new
/// batch starts when the current one holds at least `min_batch` items and the next item would
/// take it over the cap, so a batch takes its first `min_batch` items whatever their size.
pub fn split_memory_batches(items: &[(usize, u64)], cap: u64, min_batch: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut current = 0u64;
    for &(i, n) in items {
        match out.last_mut() {
            Some(b) if b.len() < min_batch.max(1) || current + n <= cap => {
                b.push(i);
                current += n;
            }
            _ => {
                out.push(vec![i]);
                current = n;
            }
        }
    }
    out
}

/// Replica subgroup size: the largest divisor of `group_size` not above `devices_per_machine`
/// when the group is larger than a machine; None (no split) otherwise.
pub fn replica_subgroup_size(group_size: usize, devices_per_machine: usize) -> Option<usize> {
    if group_size <= devices_per_machine || devices_per_machine == 0 {
        return None;
    }
    (1..=devices_per_machine.min(group_size))
        .rev()
        .find(|d| group_size.is_multiple_of(*d))
}

#[cfg(test)]
mod tests {
    use super::build::shard_owners_per_replica;
    use super::*;

    #[test]
    fn routing_and_core_shapes() {
        assert_eq!(
            route("model.layers.0.self_attn.q_proj.weight", 2, true).0,
            OptimizerRoute::Muon
        );
        assert_eq!(
            route("model.embed_tokens.weight", 2, true).0,
            OptimizerRoute::Adamw
        );
        assert_eq!(route("lm_head.weight", 2, true).0, OptimizerRoute::Adamw);
        assert_eq!(route("model.norm.weight", 1, true).0, OptimizerRoute::Adamw);
        assert_eq!(
            route("model.layers.0.mlp.experts.gate_up_proj", 3, true).0,
            OptimizerRoute::Muon
        );
        assert_eq!(core_shape(&[128, 1536, 2048]), Some((1536, 2048)));
        assert_eq!(core_shape(&[64, 1, 3]), Some((64, 3)));
        assert_eq!(core_shape(&[5]), None);
    }

    #[test]
    fn greedy_owners_balance_and_break_ties_lexicographically() {
        let owners = build_owner_by_size(&[(0, 10), (1, 10), (2, 30), (3, 5)], &[2]);
        // 30 -> [0]; 10 (idx0) -> [1]; 10 (idx1) -> [1] (load 10 < 30); 5 -> [1]? loads [30, 20] -> [1].
        assert_eq!(owners[&2], vec![0]);
        assert_eq!(owners[&0], vec![1]);
        assert_eq!(owners[&1], vec![1]);
        assert_eq!(owners[&3], vec![1]);
        let two_d = build_owner_by_size(&[(0, 1), (1, 1), (2, 1), (3, 1)], &[2, 2]);
        assert_eq!(
            two_d.values().cloned().collect::<Vec<_>>(),
            vec![vec![0, 0], vec![0, 1], vec![1, 0], vec![1, 1]]
        );
        assert!(
            build_owner_by_size(&[(0, 1)], &[])
                .values()
                .all(|c| c.is_empty())
        );
    }

    #[test]
    fn shard_owners_balance_inside_each_replica_subset() {
        // Four equal matrices, 2 replica x 2 shard coordinates: each replica owner gets two,
        // and its two shard ranks one each (not 2 on shard 0 of replica 0 and 2 on shard 1
        // of replica 1, which independent greedy passes over all records would give).
        let records = [(0, 7), (1, 7), (2, 7), (3, 7)];
        let replica = build_owner_by_size(&records, &[2]);
        let shard = shard_owners_per_replica(&records, &[2], &replica);
        let mut pairs: Vec<(Vec<usize>, Vec<usize>)> = (0..4)
            .map(|i| (replica[&i].clone(), shard[&i].clone()))
            .collect();
        pairs.sort();
        assert_eq!(
            pairs,
            vec![
                (vec![0], vec![0]),
                (vec![0], vec![1]),
                (vec![1], vec![0]),
                (vec![1], vec![1])
            ]
        );
        // Without replica owners, one pass over all records.
        let all = shard_owners_per_replica(&records, &[2], &BTreeMap::new());
        assert_eq!(all, build_owner_by_size(&records, &[2]));
    }

    #[test]
    fn memory_batches_and_replica_subgroups() {
        assert_eq!(
            split_memory_batches(&[(0, 6), (1, 5), (2, 4), (3, 20)], 10, 1),
            vec![vec![0], vec![1, 2], vec![3]]
        );
        // A minimum batch of 2 takes the first two items over the cap, then closes at it.
        assert_eq!(
            split_memory_batches(&[(0, 6), (1, 5), (2, 4), (3, 20), (4, 1)], 10, 2),
            vec![vec![0, 1], vec![2, 3], vec![4]]
        );
        assert_eq!(replica_subgroup_size(6, 16), None);
        assert_eq!(replica_subgroup_size(24, 16), Some(12));
        assert_eq!(replica_subgroup_size(32, 16), Some(16));
        assert_eq!(replica_subgroup_size(34, 16), Some(2));
    }
}
