//! What-if faults and heterogeneity applied to a simulation (`[whatif]`, see
//! [`hpfsdp_plan::whatif`] for the scenario keys and their meaning).
//!
//! The engine asks this module two things, each through a one-line hook:
//! - [`WhatIfModel::compute_scale`]: the factor on one compute op's device time (the rank's
//!   slow-rank factor times its seeded jitter draw for that op);
//! - [`WhatIfModel::transfer_scale`]: the factor on a collective phase's transfer time on a
//!   tier (1 / the smallest bandwidth factor over the machines of the group's ranks).
//!
//! Folding: ranks whose factors differ must not share a class. [`WhatIfModel::fold_salt`] gives
//! every rank a digest of its own factors (0 for an unperturbed rank, so a scenario without
//! what-if folds exactly as before); the workload XORs it into the rank's program digest, and
//! colour refinement then also separates the peers of a perturbed rank. Jitter gives every
//! rank its own draws, so a jittered job is simulated unfolded.

use crate::error::SimError;
use hpfsdp_plan::Tier;
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_plan::whatif::WhatIf;
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// A validated `[whatif]` section, indexed for the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct WhatIfModel {
    /// Compute time factor per rank (1.0 for an unlisted rank).
    compute_factor: Vec<f64>,
    /// Per tier (index of [`Tier::ALL`]): bandwidth factor per global machine.
    link_factor: [Vec<f64>; 3],
    /// Jitter amplitude as a fraction.
    jitter_fraction: f64,
    /// Jitter seed.
    seed: u64,
    /// Ranks per machine (rank → machine).
    dies_per_machine: usize,
    /// True when some machine's link factor is below 1.
    any_degraded: bool,
}

fn tier_index(tier: Tier) -> usize {
    match tier {
        Tier::IntraMachine => 0,
        Tier::IntraSupernode => 1,
        Tier::InterSupernode => 2,
    }
}

impl WhatIfModel {
    /// Indexes `whatif` for a job of `world_size` ranks with `dies_per_machine` ranks per
    /// machine; `None` when it perturbs nothing (the engine then runs unchanged).
    pub fn new(whatif: &WhatIf, world_size: usize, dies_per_machine: usize) -> Option<Self> {
        if whatif.is_empty() {
            return None;
        }
        let dies_per_machine = dies_per_machine.max(1);
        let machines = world_size.div_ceil(dies_per_machine);
        let mut compute_factor = vec![1.0; world_size];
        for (&rank, &f) in &whatif.slow_ranks {
            if rank < world_size {
                compute_factor[rank] = f;
            }
        }
        let mut link_factor: [Vec<f64>; 3] = std::array::from_fn(|_| vec![1.0; machines]);
        for link in &whatif.degraded_links {
            let factors = &mut link_factor[tier_index(link.tier)];
            for &m in &link.machines {
                if m < machines {
                    // Two entries on one machine and tier: the worse one holds.
                    factors[m] = factors[m].min(link.bandwidth_factor);
                }
            }
        }
        let any_degraded = link_factor.iter().flatten().any(|&f| f != 1.0);
        Some(Self {
            any_degraded,
            compute_factor,
            link_factor,
            jitter_fraction: whatif.jitter_fraction,
            seed: whatif.seed,
            dies_per_machine,
        })
    }

    /// The model of a loaded scenario's `[whatif]` section (`None` without one or when it is
    /// empty).
    pub fn for_scenario(scenario: &Scenario) -> Result<Option<Self>, SimError> {
        let Some(section) = &scenario.file.whatif else {
            return Ok(None);
        };
        let world_size = scenario.world_size();
        let whatif = section
            .resolve(&scenario.topology, world_size)
            .map_err(|e| SimError::Workload(format!("[whatif] {}", e.message)))?;
        Ok(Self::new(
            &whatif,
            world_size,
            scenario.topology.dies_per_machine,
        ))
    }

    /// Factor on the device time of compute op number `op_index` (program order) of `rank`.
    pub fn compute_scale(&self, rank: usize, op_index: usize) -> f64 {
        let slow = self.compute_factor.get(rank).copied().unwrap_or(1.0);
        slow * self.jitter(rank, op_index)
    }

    /// The jitter draw of one op: uniform in `[1 - p, 1 + p]`, a pure function of
    /// `(seed, rank, op_index)` (ChaCha8 keyed by the seed, the rank as stream, the op as
    /// word position).
    fn jitter(&self, rank: usize, op_index: usize) -> f64 {
        if self.jitter_fraction == 0.0 {
            return 1.0;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(rank as u64);
        rng.set_word_pos(op_index as u128 * 2);
        // 53 random bits → u in [0, 1).
        let u = (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        1.0 + self.jitter_fraction * (2.0 * u - 1.0)
    }

    /// True when some link is degraded ([`Self::transfer_scale`] is 1 otherwise).
    pub fn has_degraded_links(&self) -> bool {
        self.any_degraded
    }

    /// Factor on the transfer time of a collective phase on `tier` among `ranks`: the phase
    /// runs at the speed of its slowest member link.
    pub fn transfer_scale(&self, tier: Tier, ranks: &[usize]) -> f64 {
        if !self.any_degraded {
            return 1.0;
        }
        let factors = &self.link_factor[tier_index(tier)];
        let slowest = ranks
            .iter()
            .filter_map(|&r| factors.get(r / self.dies_per_machine))
            .fold(1.0f64, |a, &f| a.min(f));
        1.0 / slowest
    }

    /// A digest of `rank`'s own factors, 0 when the rank is unperturbed: ranks with different
    /// salts never fold together.
    pub fn fold_salt(&self, rank: usize) -> u128 {
        let slow = self.compute_factor.get(rank).copied().unwrap_or(1.0);
        let machine = rank / self.dies_per_machine;
        let links: Vec<f64> = self
            .link_factor
            .iter()
            .map(|f| f.get(machine).copied().unwrap_or(1.0))
            .collect();
        let jittered = self.jitter_fraction != 0.0;
        if slow == 1.0 && links.iter().all(|&f| f == 1.0) && !jittered {
            return 0;
        }
        let mut h = blake3::Hasher::new();
        h.update(b"hpfsdp-whatif-salt");
        h.update(&slow.to_le_bytes());
        for f in links {
            h.update(&f.to_le_bytes());
        }
        if jittered {
            // Every rank draws its own noise: no two jittered ranks are alike.
            h.update(&(rank as u64).to_le_bytes());
        }
        let mut b = [0u8; 16];
        b.copy_from_slice(&h.finalize().as_bytes()[..16]);
        u128::from_le_bytes(b).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_plan::whatif::DegradedLink;
    use std::collections::BTreeMap;

    fn model(jitter_pct: f64, seed: u64) -> WhatIfModel {
        let w = WhatIf {
            slow_ranks: BTreeMap::from([(3, 1.5)]),
            degraded_links: vec![DegradedLink {
                tier: Tier::IntraSupernode,
                machines: vec![1],
                bandwidth_factor: 0.25,
            }],
            jitter_fraction: jitter_pct / 100.0,
            seed,
        };
        WhatIfModel::new(&w, 16, 4).unwrap()
    }

    #[test]
    fn empty_whatif_has_no_model() {
        assert!(WhatIfModel::new(&WhatIf::default(), 8, 4).is_none());
    }

    #[test]
    fn slow_rank_and_links() {
        let m = model(0.0, 0);
        assert_eq!(m.compute_scale(3, 10), 1.5);
        assert_eq!(m.compute_scale(2, 10), 1.0);
        assert_eq!(m.transfer_scale(Tier::IntraSupernode, &[0, 4, 8]), 4.0);
        assert_eq!(m.transfer_scale(Tier::IntraSupernode, &[0, 8, 12]), 1.0);
        assert_eq!(m.transfer_scale(Tier::InterSupernode, &[0, 4]), 1.0);
        assert_eq!(m.fold_salt(0), 0);
        assert_ne!(m.fold_salt(3), 0);
        assert_ne!(m.fold_salt(5), 0);
        assert_eq!(m.fold_salt(5), m.fold_salt(6));
    }

    #[test]
    fn jitter_is_seeded_and_bounded() {
        let a = model(10.0, 1);
        let b = model(10.0, 1);
        let c = model(10.0, 2);
        let draws = |m: &WhatIfModel| (0..64).map(|i| m.compute_scale(0, i)).collect::<Vec<_>>();
        assert_eq!(draws(&a), draws(&b));
        assert_ne!(draws(&a), draws(&c));
        assert!(draws(&a).iter().all(|&x| (0.9..=1.1).contains(&x)));
        assert_ne!(a.compute_scale(0, 5), a.compute_scale(1, 5));
        assert_ne!(a.fold_salt(0), a.fold_salt(1));
    }
}
