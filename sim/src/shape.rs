//! Group shapes: how a process group sits on the topology, which decides between a flat and a
//! two-level (intra then inter) collective.

use hpfsdp_plan::{Tier, Topology};
use serde::{Deserialize, Serialize};

/// A group's decomposition into equal domains one level below its tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Split {
    /// Tier of the sub-group inside one domain.
    pub inner_tier: Tier,
    /// Ranks of the group in each domain (`a`, at least 2).
    pub per_domain: usize,
    /// Number of domains (`b`, at least 2).
    pub domains: usize,
}

/// How a process group sits on the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupShape {
    /// Number of ranks (`p`).
    pub ranks: usize,
    /// Slowest tier crossed.
    pub tier: Tier,
    /// Two-level decomposition, when the group has the same number (>= 2) of ranks in each of
    /// its domains (machines for an intra-supernode group, supernodes for an inter-supernode
    /// group). `None` for intra-machine groups, one rank per domain, or uneven groups.
    pub split: Option<Split>,
}

impl GroupShape {
    /// The shape of a group given its ascending ranks.
    pub fn of(ranks: &[usize], topology: &Topology) -> Self {
        let tier = topology.tier_of(ranks);
        let flat = Self {
            ranks: ranks.len(),
            tier,
            split: None,
        };
        let domain_size = match tier {
            Tier::IntraMachine => return flat,
            Tier::IntraSupernode => topology.dies_per_machine,
            Tier::InterSupernode => topology.dies_per_supernode(),
        };
        let mut runs: Vec<&[usize]> = Vec::new();
        let mut start = 0;
        for i in 1..=ranks.len() {
            if i == ranks.len() || ranks[i] / domain_size != ranks[start] / domain_size {
                runs.push(&ranks[start..i]);
                start = i;
            }
        }
        let a = runs.first().map_or(0, |r| r.len());
        if a < 2 || runs.len() < 2 || runs.iter().any(|r| r.len() != a) {
            return flat;
        }
        let inner_tier = runs
            .iter()
            .map(|r| topology.tier_of(r))
            .max()
            .unwrap_or(Tier::IntraMachine);
        Self {
            split: Some(Split {
                inner_tier,
                per_domain: a,
                domains: runs.len(),
            }),
            ..flat
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_on_a_small_topology() {
        // 2 supernodes x 2 machines x 4 dies.
        let t = Topology::new(4, 2, 2).unwrap();
        let s = GroupShape::of(&[0, 1, 2, 3], &t);
        assert_eq!((s.tier, s.split), (Tier::IntraMachine, None));
        let s = GroupShape::of(&[0, 1, 4, 5], &t);
        assert_eq!(
            s.split,
            Some(Split {
                inner_tier: Tier::IntraMachine,
                per_domain: 2,
                domains: 2
            })
        );
        let s = GroupShape::of(&[0, 4, 8, 12], &t);
        assert_eq!(s.tier, Tier::InterSupernode);
        assert_eq!(
            s.split,
            Some(Split {
                inner_tier: Tier::IntraSupernode,
                per_domain: 2,
                domains: 2
            })
        );
        // One rank per domain, or uneven: flat.
        assert_eq!(GroupShape::of(&[0, 8], &t).split, None);
        assert_eq!(GroupShape::of(&[0, 1, 4], &t).split, None);
    }
}
