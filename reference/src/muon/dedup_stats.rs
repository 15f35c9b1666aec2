//! Per-rank Muon state memory and Newton-Schulz work predicted from the plan, for the
//! deduplicated engine and for naive distributed Muon.
//!
//! - Momentum: naive keeps a buffer for every local piece; the engine keeps one only on the
//!   replica owner, so for replicated matrices the summed state is `1/R_s` of naive's, `R_s`
//!   being the product of the replica subgroup sizes.
//! - Newton-Schulz: the engine runs each matrix (each adapter part) once per shard group and
//!   replica subgroup; naive runs every gathered matrix on every rank of the shard domain and
//!   every replica.

use hpfsdp_plan::muon::{MuonPlan, OptimizerRoute};

use super::domains::MuonDomains;
use super::error::{MuonError, MuonResult};
use super::routing::{MatrixStack, RoutedParam};

/// The predicted load of one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankLoad {
    /// Momentum elements held by the deduplicated engine.
    pub momentum_elems_dedup: u64,
    /// Momentum elements held by naive distributed Muon.
    pub momentum_elems_naive: u64,
    /// Newton-Schulz matrices per step, deduplicated engine.
    pub ns_matrices_dedup: u64,
    /// Newton-Schulz matrices per step, naive distributed Muon.
    pub ns_matrices_naive: u64,
}

/// Dedup statistics of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DedupStats {
    /// One entry per rank.
    pub per_rank: Vec<RankLoad>,
    /// Newton-Schulz matrices of one single-device step.
    pub ns_matrices_single: u64,
    /// Momentum elements of single-device Muon (every Muon parameter once).
    pub momentum_elems_single: u64,
}

impl DedupStats {
    /// Sum over ranks.
    pub fn total(&self) -> RankLoad {
        self.per_rank
            .iter()
            .fold(RankLoad::default(), |a, r| RankLoad {
                momentum_elems_dedup: a.momentum_elems_dedup + r.momentum_elems_dedup,
                momentum_elems_naive: a.momentum_elems_naive + r.momentum_elems_naive,
                ns_matrices_dedup: a.ns_matrices_dedup + r.ns_matrices_dedup,
                ns_matrices_naive: a.ns_matrices_naive + r.ns_matrices_naive,
            })
    }
}

/// Predicts per-rank momentum memory and Newton-Schulz work of `plan` over `domains`.
pub fn dedup_stats(
    plan: &MuonPlan,
    domains: &MuonDomains,
    routed: &[RoutedParam],
) -> MuonResult<DedupStats> {
    let world = domains.world_size();
    let mut per_rank = vec![RankLoad::default(); world];
    let mut single_ns = 0u64;
    let mut single_mom = 0u64;
    let mut replica_owner = std::collections::BTreeMap::new();
    let mut shard_owner = std::collections::BTreeMap::new();
    for b in &plan.batches {
        replica_owner.extend(b.replica_owner.iter().map(|(k, v)| (*k, v.clone())));
        shard_owner.extend(b.shard_owner.iter().map(|(k, v)| (*k, v.clone())));
    }
    for (i, r) in routed.iter().enumerate() {
        if r.route != OptimizerRoute::Muon {
            continue;
        }
        let (rows, cols) = r
            .core
            .ok_or_else(|| MuonError::plan(format!("{} has no core shape", r.name)))?;
        let parts = r.split.parts(rows, cols)?.len() as u64;
        let d = domains.get(i)?;
        let full = MatrixStack::of_local(&r.shape, (rows, cols))?;
        single_ns += full.count as u64 * parts;
        single_mom += d.numel() as u64;
        let gather = plan.params[i].needs_gather;
        for (rank, load) in per_rank.iter_mut().enumerate() {
            if !d.holds(rank) {
                continue;
            }
            let local = d.local_numel(rank) as u64;
            let owner = d.replicate_axes.is_empty()
                || replica_owner.get(&i) == Some(&d.replica_coord(rank));
            let local_ns = if gather {
                full.count as u64 * parts
            } else {
                MatrixStack::of_local(&d.local_shape(rank), (rows, cols))?.count as u64 * parts
            };
            load.momentum_elems_naive += local;
            load.ns_matrices_naive += local_ns;
            if owner {
                load.momentum_elems_dedup += local;
                let computes = !gather || shard_owner.get(&i) == Some(&d.shard_coord(rank));
                if computes {
                    load.ns_matrices_dedup += local_ns;
                }
            }
        }
    }
    Ok(DedupStats {
        per_rank,
        ns_matrices_single: single_ns,
        momentum_elems_single: single_mom,
    })
}
