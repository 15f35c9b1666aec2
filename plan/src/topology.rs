//! Physical topology: which supernode, machine and die every rank sits on, and the tier
//! (slowest link) each process group crosses.

use crate::error::{PlanError, PlanResult};
use crate::mesh::DeviceMesh;
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

    /// The slowest tier crossed by any of `mesh`'s groups along `axes` (indices into the
    /// mesh's axes), what [`Topology::tier_of`] gives at most over `mesh.groups(axes)`,
    /// found by arithmetic without listing a group's members. A group is its base rank (zero
    /// coordinates on `axes`) plus offsets of the axes' row-major strides, so its members
    /// all lie between the base and the base plus the largest offset; as machines and
    /// supernodes are contiguous rank blocks, the group crosses a block boundary exactly when
    /// those two ranks are in different blocks. Cost: one step per group base, stopping at
    /// the first group that crosses supernodes.
    pub fn widest_tier_along(&self, mesh: &DeviceMesh, axes: &[usize]) -> Tier {
        let sizes: Vec<usize> = mesh.axes().iter().map(|a| a.size.max(1)).collect();
        let mut strides = vec![1; sizes.len()];
        for i in (0..sizes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * sizes[i + 1];
        }
        let on_axes = |i: usize| axes.contains(&i);
        let span: usize = (0..sizes.len())
            .filter(|&i| on_axes(i))
            .map(|i| (sizes[i] - 1) * strides[i])
            .sum();
        let rest: Vec<usize> = (0..sizes.len()).filter(|&i| !on_axes(i)).collect();
        let mut coords = vec![0usize; rest.len()];
        let mut widest = Tier::IntraMachine;
        let mut base = 0usize;
        loop {
            widest = widest.max(self.tier_of_span(base, base + span));
            if widest == Tier::InterSupernode {
                return widest;
            }
            // Next base: a mixed-radix counter over the other axes, last axis fastest.
            let mut k = rest.len();
            loop {
                if k == 0 {
                    return widest;
                }
                k -= 1;
                let axis = rest[k];
                coords[k] += 1;
                base += strides[axis];
                if coords[k] < sizes[axis] {
                    break;
                }
                base -= coords[k] * strides[axis];
                coords[k] = 0;
            }
        }
    }

    /// The slowest tier between rank `lo` and rank `hi` (`lo <= hi`) when a group's members
    /// all lie between them and include both.
    fn tier_of_span(&self, lo: usize, hi: usize) -> Tier {
        if lo / self.dies_per_supernode() != hi / self.dies_per_supernode() {
            Tier::InterSupernode
        } else if lo / self.dies_per_machine != hi / self.dies_per_machine {
            Tier::IntraSupernode
        } else {
            Tier::IntraMachine
        }
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

    /// The arithmetic widest tier equals the maximum of `tier_of` over every listed group,
    /// on meshes of two to four axes, every axis subset and several topologies.
    #[test]
    fn widest_tier_along_equals_the_listed_groups() {
        let meshes: [&[usize]; 5] = [&[2, 8], &[4, 2, 2], &[3, 4, 2], &[2, 2, 2, 4], &[16]];
        for dims in meshes {
            let mesh = DeviceMesh::new(dims.iter().enumerate().map(|(i, &n)| (format!("a{i}"), n)))
                .unwrap();
            let world = mesh.world_size();
            for (dpm, mps) in [(1, 1), (2, 2), (4, 2), (8, 1), (2, 4), (3, 1)] {
                if world % (dpm * mps) != 0 {
                    continue;
                }
                let topo = Topology::new(dpm, mps, world / (dpm * mps)).unwrap();
                for subset in 0u32..(1 << dims.len()) {
                    let axes: Vec<usize> =
                        (0..dims.len()).filter(|&i| subset >> i & 1 == 1).collect();
                    let listed = mesh
                        .groups(&axes)
                        .iter()
                        .map(|g| topo.tier_of(g))
                        .max()
                        .unwrap();
                    assert_eq!(
                        topo.widest_tier_along(&mesh, &axes),
                        listed,
                        "{dims:?} axes {axes:?} topology {topo:?}"
                    );
                }
            }
        }
    }

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
