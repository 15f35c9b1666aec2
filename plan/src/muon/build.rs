//! Building the Muon plan of a scenario ([`build_muon_plan`]): every parameter's route and
//! shard axes, its replica subgroups ([`super::subgroups`]), and the owner batches.

use super::*;
use crate::fsdp::{DataDomain, FsdpPlan, ParamFsdp};
use crate::planner::{ParamPlan, ShardingPlan};
use crate::scenario::Scenario;
use std::collections::BTreeMap;

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
    let trainable: Vec<&ParamPlan> = plan.params.iter().filter(|p| p.trainable).collect();
    let fsdp_of = fsdp_lookup(&trainable, fsdp);
    let params: Vec<MuonParam> = trainable
        .iter()
        .enumerate()
        .map(|(k, p)| muon_param(p, fsdp_of(k, p), scenario, kind_is_muon))
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

    // HSDP groups by domain key (formatted again only when a parameter's axes differ from
    // the previous Muon parameter's: tens of thousands of per-expert weights share a few).
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut prev: Option<&MuonParam> = None;
    let mut key = String::new();
    for (i, p) in params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.route == OptimizerRoute::Muon)
    {
        let same = prev.is_some_and(|q| {
            q.shape.len() == p.shape.len()
                && q.shard_axes == p.shard_axes
                && q.replicate_axes == p.replicate_axes
                && q.needs_gather == p.needs_gather
        });
        if !same {
            key = domain_key(p);
        }
        prev = Some(p);
        match groups.get_mut(key.as_str()) {
            Some(members) => members.push(i),
            None => {
                groups.insert(key.clone(), vec![i]);
            }
        }
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

/// The FSDP entry of each trainable parameter (`k`: its position among them): the entry at
/// the same position when the two plans list the same names in the same order (as
/// `build_fsdp_plan` does), else the entry of that name.
fn fsdp_lookup<'a>(
    trainable: &[&ParamPlan],
    fsdp: &'a FsdpPlan,
) -> impl Fn(usize, &ParamPlan) -> Option<&'a ParamFsdp> {
    let aligned = trainable.len() == fsdp.params.len()
        && trainable
            .iter()
            .zip(&fsdp.params)
            .all(|(p, f)| p.name == f.name);
    let by_name: BTreeMap<&str, &ParamFsdp> = if aligned {
        BTreeMap::new()
    } else {
        fsdp.params.iter().map(|f| (f.name.as_str(), f)).collect()
    };
    move |k, p| {
        if aligned {
            fsdp.params.get(k)
        } else {
            by_name.get(p.name.as_str()).copied()
        }
    }
}

/// The HSDP domain key of a Muon parameter: its rank, shard axes with tensor dims,
/// replicate axes and whether it needs the gathered matrix.
fn domain_key(p: &MuonParam) -> String {
    let shard: Vec<String> = p
        .shard_axes
        .iter()
        .map(|a| format!("{}:{}", a.axis, a.tensor_dim))
        .collect();
    let rep: Vec<&str> = p.replicate_axes.iter().map(|(a, _)| a.as_str()).collect();
    format!(
        "ndim={} shard=[{}] replicate=[{}] gather={}",
        p.shape.len(),
        shard.join(","),
        rep.join(","),
        p.needs_gather
    )
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
pub(super) fn shard_owners_per_replica(
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
