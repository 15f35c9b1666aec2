//! Physical topology: which supernode, machine and die every rank sits on, and the tier
//! (slowest link) each process group crosses.

use crate::error::{PlanError, PlanResult};
use serde::{Deserialize, Serialize};

/// The slowest link a process group crosses. Ordered from fastest to slowest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// All ranks on one machine (HCCS/SIO on Ascend, NVLink inside an HGX box).
    IntraMachine,
    /// Ranks on several machines of one supernode (UB fabric, NVLink switch domain).
    IntraSupernode,
    /// Ranks in several supernodes (RoCE / InfiniBand scale-out network).
    InterSupernode,
}

impl Tier {
    /// All tiers, fastest first.
    pub const ALL: [Tier; 3] = [
        Tier::IntraMachine,
        Tier::IntraSupernode,
        Tier::InterSupernode,
    ];

    /// Short stable name used in tables, CSV and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Tier::IntraMachine => "intra-machine",
            Tier::IntraSupernode => "intra-supernode",
            Tier::InterSupernode => "inter-supernode",
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where one rank sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceLocation {
    /// Supernode index.
    pub supernode: usize,
    /// Machine index inside the supernode.
    pub machine: usize,
    /// Die (device) index inside the machine.
    pub die: usize,
}

/// Ranks laid out in contiguous blocks: `dies_per_machine` consecutive ranks form a machine,
/// `machines_per_supernode` consecutive machines form a supernode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Topology {
    /// Ranks (dies) per machine.
    pub dies_per_machine: usize,
    /// Machines per supernode.
    pub machines_per_supernode: usize,
    /// Number of supernodes.
    pub supernodes: usize,
}

impl Topology {
    /// Builds a topology; every count must be at least 1.
    pub fn new(
        dies_per_machine: usize,
        machines_per_supernode: usize,
        supernodes: usize,
    ) -> PlanResult<Self> {
        for (name, v) in [
            ("dies_per_machine", dies_per_machine),
            ("machines_per_supernode", machines_per_supernode),
            ("supernodes", supernodes),
        ] {
            if v == 0 {
                return Err(PlanError::Mesh(format!(
                    "topology.{name} is 0; it must be at least 1"
                )));
            }
        }
        Ok(Self {
            dies_per_machine,
            machines_per_supernode,
            supernodes,
        })
    }

    /// Total number of dies.
    pub fn world_size(&self) -> usize {
        self.dies_per_machine * self.machines_per_supernode * self.supernodes
    }

    /// Dies per supernode.
    pub fn dies_per_supernode(&self) -> usize {
        self.dies_per_machine * self.machines_per_supernode
    }

    /// The location of `rank`.
    pub fn locate(&self, rank: usize) -> DeviceLocation {
        DeviceLocation {
            supernode: rank / self.dies_per_supernode(),
            machine: (rank / self.dies_per_machine) % self.machines_per_supernode,
            die: rank % self.dies_per_machine,
        }
    }

    /// The slowest tier crossed by a group of ranks. A group of one rank (or none) never
    /// leaves its die and reports [`Tier::IntraMachine`].
    pub fn tier_of(&self, ranks: &[usize]) -> Tier {
        let Some(&first) = ranks.first() else {
            return Tier::IntraMachine;
        };
        let first_sn = first / self.dies_per_supernode();
        let first_machine = first / self.dies_per_machine;
        let mut tier = Tier::IntraMachine;
        for &r in ranks {
            if r / self.dies_per_supernode() != first_sn {
                return Tier::InterSupernode;
            }
            if r / self.dies_per_machine != first_machine {
                tier = Tier::IntraSupernode;
            }
        }
        tier
    }

    /// Checks that the topology holds exactly `world_size` ranks.
    pub fn check_world_size(&self, world_size: usize) -> PlanResult<()> {
        if self.world_size() != world_size {
            return Err(PlanError::Mesh(format!(
                "topology has {} dies ({} per machine x {} machines per supernode x {} supernodes) \
                 but the mesh has {} ranks; make the products equal",
                self.world_size(),
                self.dies_per_machine,
                self.machines_per_supernode,
                self.supernodes,
                world_size
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_and_tiers() {
        // 2 supernodes x 2 machines x 4 dies.
        let topo = Topology::new(4, 2, 2).unwrap();
        assert_eq!(topo.world_size(), 16);
        assert_eq!(
            topo.locate(13),
            DeviceLocation {
                supernode: 1,
                machine: 1,
                die: 1
            }
        );
        assert_eq!(topo.tier_of(&[0, 1, 2, 3]), Tier::IntraMachine);
        assert_eq!(topo.tier_of(&[0, 4]), Tier::IntraSupernode);
        assert_eq!(topo.tier_of(&[3, 8]), Tier::InterSupernode);
        assert_eq!(topo.tier_of(&[5]), Tier::IntraMachine);
        assert!(
            topo.check_world_size(8)
                .unwrap_err()
                .to_string()
                .contains("16 dies")
        );
    }
}
