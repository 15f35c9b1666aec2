//! The Muon plan: Muon vs AdamW routing, the matrix-plane predicate, HSDP batches with the
//! soft numel cap (per expert-parallel coordinate for per-expert weights, each coordinate's
//! batches sharing execution slots with the others'), NS memory batches under the 2^29 /
//! shard-group cap, greedy owners in the shard and replica domains, replica subgroups
//! ([`subgroups`]: the launcher rule or the rank-to-machine mapping, with a lint for
//! subgroups spanning supernodes), and each batch's communication (fused gathers per shard
//! axis, relay broadcasts, replica broadcasts).

pub mod subgroups;

pub use subgroups::{ReplicaSubgroupRule, ReplicaSubgroups, replica_subgroups};

use crate::fsdp::{DataDomain, FsdpPlan, ParamFsdp};
use crate::planner::lint::LintIssue;
use crate::planner::{ParamPlan, ShardingPlan};
use crate::scenario::Scenario;
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

fn muon_param(
    p: &ParamPlan,
    f: Option<&ParamFsdp>,
    scenario: &Scenario,
    kind_is_muon: bool,
) -> MuonParam {
    let (route, route_reason) = route(&p.name, p.shape.len(), kind_is_muon);
    let domain = f.map_or(DataDomain::Dense, |f| f.domain);
    let m = &scenario.file.mesh;
    let mut shard_axes = Vec::new();
    let mut replicate_axes = Vec::new();
    let mut push = |axis: &str, size: usize, dim: Option<usize>| {
        if size > 1 {
            match dim {
                Some(d) => shard_axes.push(ShardAxis {
                    axis: axis.into(),
                    tensor_dim: d,
                    size,
                }),
                None => replicate_axes.push((axis.to_string(), size)),
            }
        }
    };
    let fsdp_dim = f.map(|f| f.shard_dim);
    let plan_dim = |axis: &str| p.placements.get(axis).and_then(|pl| pl.shard_dim());
    match domain {
        DataDomain::Dense => {
            push("dp_replicate", m.dp_replicate, None);
            push("dp_shard", m.dp_shard, fsdp_dim);
            push("cp", m.cp, fsdp_dim);
            push("tp", m.tp, plan_dim("tp"));
        }
        DataDomain::Expert => {
            let e = &scenario.expert_mesh;
            push("edp_replicate", e.axis_size("edp_replicate"), None);
            push("edp_shard", e.axis_size("edp_shard"), fsdp_dim);
            // Per-expert weights live whole on their owning EP rank: ep neither shards nor
            // replicates them, so it is no Muon domain axis.
            if p.ep_owner.is_none() {
                push("ep", m.ep, plan_dim("ep"));
            }
            push("etp", m.etp, plan_dim("etp"));
        }
    }
    let ndim = p.shape.len();
    let needs_gather =
        route == OptimizerRoute::Muon && shard_axes.iter().any(|a| a.tensor_dim + 2 >= ndim);
    let matrices = if ndim >= 3 {
        p.shape[..ndim - 2].iter().product()
    } else {
        1
    };
    MuonParam {
        name: p.name.clone(),
        route,
        route_reason,
        shape: p.shape.clone(),
        core_shape: if route == OptimizerRoute::Muon {
            core_shape(&p.shape)
        } else {
            None
        },
        matrices,
        shard_axes,
        replicate_axes,
        needs_gather,
        ep_owner: p.ep_owner,
    }
}

/// Builds the Muon plan of a scenario.
pub fn build_muon_plan(scenario: &Scenario, plan: &ShardingPlan, fsdp: &FsdpPlan) -> MuonPlan {
    let kind_is_muon = scenario.file.optimizer.kind == "muon+adamw";
    let fsdp_by_name: BTreeMap<&str, &ParamFsdp> =
        fsdp.params.iter().map(|f| (f.name.as_str(), f)).collect();
    let params: Vec<MuonParam> = plan
        .params
        .iter()
        .filter(|p| p.trainable)
        .map(|p| {
            muon_param(
                p,
                fsdp_by_name.get(p.name.as_str()).copied(),
                scenario,
                kind_is_muon,
            )
        })
        .collect();
    let dpm = scenario.topology.dies_per_machine;
    let fill_owners = scenario
        .file
        .optimizer
        .muon
        .ns_batch_fill_owners
        .unwrap_or(true);
    let subgroups = replica_subgroups(scenario, &params);
    let replica_count = subgroups.count;

    // HSDP groups by domain key.
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, p) in params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.route == OptimizerRoute::Muon)
    {
        let shard: Vec<String> = p
            .shard_axes
            .iter()
            .map(|a| format!("{}:{}", a.axis, a.tensor_dim))
            .collect();
        let rep: Vec<&str> = p.replicate_axes.iter().map(|(a, _)| a.as_str()).collect();
        let key = format!(
            "ndim={} shard=[{}] replicate=[{}] gather={}",
            p.shape.len(),
            shard.join(","),
            rep.join(","),
            p.needs_gather
        );
        groups.entry(key).or_default().push(i);
    }
    let mut ordered: Vec<(String, Vec<usize>)> = groups.into_iter().collect();
    ordered.sort_by_key(|(k, v)| {
        (
            std::cmp::Reverse(v.iter().map(|&i| params[i].numel()).sum::<u64>()),
            k.clone(),
        )
    });
    let cap = HSDP_BATCH_NUMEL * replica_count.unwrap_or(1) as u64;
    let mut subs = sub_batches(&ordered, &params, cap);
    subs.sort_by_key(|s| (s.key, s.ep_owner));
    let mut batches: Vec<MuonBatch> = Vec::with_capacity(subs.len());
    let mut slot = 0;
    let mut prev_key: Option<SlotKey> = None;
    for sub in subs {
        if prev_key.is_some_and(|k| k != sub.key) {
            slot += 1;
        }
        prev_key = Some(sub.key);
        let mut b = make_batch(
            sub.domain,
            sub.members,
            sub.numel,
            &params,
            &subgroups.sizes,
            fill_owners,
        );
        b.ep_owner = sub.ep_owner;
        b.slot = slot;
        batches.push(b);
    }
    MuonPlan {
        params,
        batches,
        replica_count,
        devices_per_machine: dpm,
        replica_subgroups: subgroups.rule,
        replica_subgroup_sizes: subgroups.sizes,
        lints: subgroups.lints,
    }
}

/// Execution order of a sub-batch: descending size, then domain order, then whether it
/// belongs to one EP coordinate, then its position in its coordinate's own list. Sub-batches
/// of different EP coordinates with equal keys share a slot.
type SlotKey = (std::cmp::Reverse<u64>, usize, bool, usize);

/// One HSDP sub-batch before owners are assigned.
struct SubBatch<'a> {
    /// Execution order.
    key: SlotKey,
    /// EP coordinate holding its parameters (`None`: every rank).
    ep_owner: Option<usize>,
    /// Domain key.
    domain: &'a str,
    /// Parameter indices, numel-descending.
    members: Vec<usize>,
    /// Total elements.
    numel: u64,
}

/// Greedy HSDP sub-batches under the soft `cap` of local-shard elements (a batch closes once
/// the sum of its members' [`MuonParam::local_numel`] reaches the cap),
/// per domain (in `ordered` order) and per EP coordinate: each coordinate batches its own
/// per-expert weights, as HyperParallel's per-process optimizer does.
fn sub_batches<'a>(
    ordered: &'a [(String, Vec<usize>)],
    params: &[MuonParam],
    cap: u64,
) -> Vec<SubBatch<'a>> {
    let mut subs = Vec::new();
    for (rank, (domain, members)) in ordered.iter().enumerate() {
        let mut per_owner: BTreeMap<Option<usize>, Vec<usize>> = BTreeMap::new();
        for &i in members {
            per_owner.entry(params[i].ep_owner).or_default().push(i);
        }
        for (ep_owner, mut members) in per_owner {
            members.sort_by_key(|&i| (std::cmp::Reverse(params[i].numel()), i));
            let mut current: Vec<usize> = Vec::new();
            let mut numel = 0;
            let mut local = 0;
            let mut list = Vec::new();
            for i in members {
                current.push(i);
                numel += params[i].numel();
                local += params[i].local_numel();
                if local >= cap {
                    list.push((std::mem::take(&mut current), numel));
                    numel = 0;
                    local = 0;
                }
            }
            if !current.is_empty() {
                list.push((current, numel));
            }
            for (k, (members, numel)) in list.into_iter().enumerate() {
                subs.push(SubBatch {
                    key: (std::cmp::Reverse(numel), rank, ep_owner.is_some(), k),
                    ep_owner,
                    domain: domain.as_str(),
                    members,
                    numel,
                });
            }
        }
    }
    subs
}

/// Shard-domain owners computed separately over each replica owner's records (all records
/// when the batch has no replica owners).
fn shard_owners_per_replica(
    records: &[(usize, u64)],
    sizes: &[usize],
    replica_owner: &BTreeMap<usize, Vec<usize>>,
) -> BTreeMap<usize, Vec<usize>> {
    let mut subsets: BTreeMap<Option<&Vec<usize>>, Vec<(usize, u64)>> = BTreeMap::new();
    for &(i, n) in records {
        subsets
            .entry(replica_owner.get(&i))
            .or_default()
            .push((i, n));
    }
    subsets
        .values()
        .flat_map(|subset| build_owner_by_size(subset, sizes))
        .collect()
}

/// One HSDP assignment with its owners, NS memory batches and communication sizes;
/// `fill_owners`: shard-path memory batches take `S` matrices before the cap applies.
fn make_batch(
    domain: &str,
    members: Vec<usize>,
    numel: u64,
    params: &[MuonParam],
    subgroup_sizes: &BTreeMap<String, usize>,
    fill_owners: bool,
) -> MuonBatch {
    let first = &params[members[0]];
    let shard_path = first.needs_gather;
    let records: Vec<(usize, u64)> = members.iter().map(|&i| (i, params[i].numel())).collect();
    let bf16 = 2u64;
    let pad = |elems: u64| (elems * bf16).div_ceil(512) * 512;
    let mut replica_owner = BTreeMap::new();
    let mut replica_broadcasts = Vec::new();
    if !first.replicate_axes.is_empty() {
        let sizes: Vec<usize> = first
            .replicate_axes
            .iter()
            .map(|(a, s)| subgroup_sizes.get(a).copied().unwrap_or(*s))
            .collect();
        replica_owner = build_owner_by_size(&records, &sizes);
        let local_bytes: u64 = members
            .iter()
            .map(|&i| pad(params[i].numel().div_ceil(first.shard_size().max(1) as u64)))
            .sum();
        for (a, _) in &first.replicate_axes {
            replica_broadcasts.push((a.clone(), local_bytes));
        }
    }
    let (shard_owner, memory_batches, gather_bytes, relay, memory_relays) = if shard_path {
        let sizes: Vec<usize> = first.shard_axes.iter().map(|a| a.size).collect();
        // Shard owners are balanced inside each replica owner's subset (notes 6.5: each
        // rank keeps only its replica coordinate's `owned_records`, and the shard-domain
        // `build_owner_by_size` runs over those): with replicas, the subsets are disjoint and
        // each shard group balances its own.
        let owners = shard_owners_per_replica(&records, &sizes, &replica_owner);
        // `min_batch_size = total_shard_size` (HyperParallel `_process_shard_params`, commit
        // 3ad2a77; `[optimizer.muon] ns_batch_fill_owners`, default on): a memory batch first
        // fills every compute-owner coordinate of the shard group, then the soft 2^29 / S cap
        // applies; without it every matrix above the cap is a batch of one, orthogonalized by
        // one owner while the others wait.
        let s_size = first.shard_size().max(1);
        let min = if fill_owners { s_size } else { 1 };
        let mem = split_memory_batches(&records, NS_BATCH_NUMEL / s_size as u64, min);
        let mut gathers = Vec::new();
        for mb in &mem {
            let mut per_axis = Vec::new();
            let mut remaining: usize = first.shard_size();
            for a in &first.shard_axes {
                let bytes: u64 = mb
                    .iter()
                    .map(|&i| pad(params[i].numel().div_ceil(remaining as u64)))
                    .sum::<u64>()
                    * a.size as u64;
                per_axis.push((a.axis.clone(), bytes));
                remaining /= a.size;
            }
            gathers.push(per_axis);
        }
        // Relay: per shard dim, one broadcast per compute coordinate aligned with rank 0 on
        // later dims (rank 0's view: only the records of its replica coordinate, all zeros,
        // are relayed in its shard group); per memory batch as the runtime issues them, and
        // summed over the assignment.
        let relay_of = |members: &mut dyn Iterator<Item = usize>| {
            let mut by_coord: BTreeMap<Vec<usize>, u64> = BTreeMap::new();
            for i in members {
                let rank0 = replica_owner
                    .get(&i)
                    .is_none_or(|r: &Vec<usize>| r.iter().all(|&x| x == 0));
                if let (true, Some(c)) = (rank0, owners.get(&i)) {
                    *by_coord.entry(c.clone()).or_default() += pad(params[i].numel());
                }
            }
            let mut relay = Vec::new();
            for (d, a) in first.shard_axes.iter().enumerate() {
                for (coord, bytes) in &by_coord {
                    if coord[d + 1..].iter().all(|&x| x == 0) {
                        relay.push((a.axis.clone(), *bytes));
                    }
                }
            }
            relay
        };
        let relay = relay_of(&mut owners.keys().copied());
        let per_mem = mem
            .iter()
            .map(|mb| relay_of(&mut mb.iter().copied()))
            .collect();
        (owners, mem, gathers, relay, per_mem)
    } else {
        let mut by_shape: BTreeMap<(u64, u64), Vec<(usize, u64)>> = BTreeMap::new();
        for &(i, n) in &records {
            by_shape
                .entry(params[i].core_shape.unwrap_or((0, 0)))
                .or_default()
                .push((i, n));
        }
        let mem = by_shape
            .values()
            .flat_map(|v| split_memory_batches(v, NS_BATCH_NUMEL, 1))
            .collect();
        (BTreeMap::new(), mem, Vec::new(), Vec::new(), Vec::new())
    };
    MuonBatch {
        domain: domain.to_string(),
        shard_path,
        params: members,
        numel,
        memory_batches,
        shard_owner,
        replica_owner,
        gather_bytes,
        relay_broadcasts: relay,
        memory_relays,
        replica_broadcasts,
        ep_owner: None,
        slot: 0,
    }
}

#[cfg(test)]
mod tests {
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
