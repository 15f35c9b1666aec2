//! Symmetry folding on a mesh: the classes [`crate::fold`] finds, with every rank's group
//! table given by arithmetic ([`MeshGroups`]) instead of listed per rank.
//!
//! [`crate::fold::classes_of_views`] takes each rank's groups as rank lists, so a job whose
//! data-parallel group spans `G` ranks lists `G` ranks for each of its members: about
//! `ranks x G` work, quadratic when the replicas grow with the job (1.1 ns x ranks^2 on
//! exp-d scaled out). Here a family of groups (one position of the group table) answers
//! "which group holds this rank" from the rank's coordinates, each group's members are listed
//! once (one counting sort of the ranks per family), and colour refinement reads a group's
//! class composition from that list: linear in ranks per family and refinement round.
//!
//! The partition is the one [`crate::fold::classes_of_views`] computes from the same
//! programs' group tables, numbered the same way (by smallest rank); `sim/tests/fold_mesh.rs`
//! and this module's tests check it against that reference.

use crate::error::SimError;
use crate::fold::Classes;
use crate::shape::GroupShape;
use hpfsdp_plan::Topology;
use hpfsdp_plan::mesh_groups::MeshGroups;
use rayon::prelude::*;
use std::collections::HashMap;

/// One position of every rank's group table: its label and its groups.
#[derive(Debug, Clone)]
pub struct GroupFamilyTable {
    /// Communicator label of the position.
    pub label: String,
    /// Which group holds each rank.
    pub groups: MeshGroups,
}

/// One family's groups, listed once: `ranks[starts[g]..starts[g + 1]]` are group `g`'s
/// members, ascending; `group[r]` is the group of rank `r`.
struct Listed {
    group: Vec<u32>,
    starts: Vec<u32>,
    ranks: Vec<u32>,
}

impl Listed {
    /// Lists `fam`'s groups over `world_size` ranks (a counting sort by group index).
    fn new(fam: &MeshGroups, world_size: usize) -> Self {
        let group: Vec<u32> = (0..world_size)
            .into_par_iter()
            .with_min_len(4096)
            .map(|r| fam.group_index(r) as u32)
            .collect();
        let count = fam.group_count();
        let mut starts = vec![0u32; count + 1];
        for &g in &group {
            starts[g as usize + 1] += 1;
        }
        for g in 0..count {
            starts[g + 1] += starts[g];
        }
        let mut next = starts.clone();
        let mut ranks = vec![0u32; world_size];
        for (r, &g) in group.iter().enumerate() {
            ranks[next[g as usize] as usize] = r as u32;
            next[g as usize] += 1;
        }
        Self {
            group,
            starts,
            ranks,
        }
    }

    fn members(&self, g: usize) -> &[u32] {
        &self.ranks[self.starts[g] as usize..self.starts[g + 1] as usize]
    }

    fn count(&self) -> usize {
        self.starts.len() - 1
    }
}

/// Interns slices into dense ids in order of first appearance (allocating only for new ones).
#[derive(Default)]
struct SliceInterner {
    ids: HashMap<Vec<u32>, u32>,
}

impl SliceInterner {
    fn id(&mut self, key: &[u32]) -> u32 {
        if let Some(&id) = self.ids.get(key) {
            return id;
        }
        let id = self.ids.len() as u32;
        self.ids.insert(key.to_vec(), id);
        id
    }
}

/// The classes of `world_size` ranks whose programs, group tables left out, have digest
/// `local[r]`, and whose group table is `families` (one entry per table position, in table
/// order). Errors when a family's mesh does not span the job.
pub fn classes_on_mesh(
    world_size: usize,
    topology: &Topology,
    local: &[u128],
    families: &[GroupFamilyTable],
) -> Result<Classes, SimError> {
    if local.len() != world_size || world_size >= u32::MAX as usize {
        return Err(SimError::Workload(format!(
            "internal: {} program digests for {world_size} ranks",
            local.len()
        )));
    }
    for f in families {
        if f.groups.world_size() != world_size {
            return Err(SimError::Workload(format!(
                "group family '{}' lies on a mesh of {} ranks, but the job has {world_size}",
                f.label,
                f.groups.world_size()
            )));
        }
    }
    let listed: Vec<Listed> = families
        .iter()
        .map(|f| Listed::new(&f.groups, world_size))
        .collect();
    let mut class = initial_classes(topology, local, &listed);
    let mut count = class.iter().map(|&c| c as usize + 1).max().unwrap_or(0);
    let mut key: Vec<u32> = Vec::with_capacity(1 + families.len());
    let mut members: Vec<u32> = Vec::new();
    loop {
        // Composition of every group: sorted (class, multiplicity) pairs, interned.
        let mut compositions = SliceInterner::default();
        let group_comp: Vec<Vec<u32>> = listed
            .iter()
            .map(|l| {
                (0..l.count())
                    .map(|g| {
                        members.clear();
                        members.extend(l.members(g).iter().map(|&r| class[r as usize]));
                        members.sort_unstable();
                        key.clear();
                        for &c in &members {
                            match key.len() {
                                n if n >= 2 && key[n - 2] == c => key[n - 1] += 1,
                                _ => key.extend([c, 1]),
                            }
                        }
                        compositions.id(&key)
                    })
                    .collect()
            })
            .collect();
        let mut refined = SliceInterner::default();
        let next: Vec<u32> = (0..world_size)
            .map(|r| {
                key.clear();
                key.push(class[r]);
                key.extend(
                    listed
                        .iter()
                        .zip(&group_comp)
                        .map(|(l, comp)| comp[l.group[r] as usize]),
                );
                refined.id(&key)
            })
            .collect();
        let n = refined.ids.len();
        class = next;
        if n == count {
            break;
        }
        count = n;
    }
    let mut members = vec![Vec::new(); count];
    for (r, &c) in class.iter().enumerate() {
        members[c as usize].push(r);
    }
    Ok(Classes {
        rank_class: class,
        members,
    })
}

/// The classes before refinement: equal program digest and, at every table position, a group
/// of the same shape on the topology. Numbered by smallest rank.
fn initial_classes(topology: &Topology, local: &[u128], listed: &[Listed]) -> Vec<u32> {
    let mut shapes: HashMap<GroupShape, u32> = HashMap::new();
    let shape_of: Vec<Vec<u32>> = listed
        .iter()
        .map(|l| {
            let of: Vec<GroupShape> = (0..l.count())
                .into_par_iter()
                .with_min_len(64)
                .map(|g| {
                    let ranks: Vec<usize> = l.members(g).iter().map(|&r| r as usize).collect();
                    GroupShape::of(&ranks, topology)
                })
                .collect();
            of.into_iter()
                .map(|s| {
                    let next = shapes.len() as u32;
                    *shapes.entry(s).or_insert(next)
                })
                .collect()
        })
        .collect();
    let mut digests: HashMap<u128, u32> = HashMap::new();
    let mut keys = SliceInterner::default();
    let mut key: Vec<u32> = Vec::with_capacity(1 + listed.len());
    (0..local.len())
        .map(|r| {
            let next = digests.len() as u32;
            key.clear();
            key.push(*digests.entry(local[r]).or_insert(next));
            key.extend(
                listed
                    .iter()
                    .zip(&shape_of)
                    .map(|(l, s)| s[l.group[r] as usize]),
            );
            keys.id(&key)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::{RankView, classes_of_views};
    use hpfsdp_plan::mesh::DeviceMesh;
    use hpfsdp_program::step::Group;
    use std::borrow::Cow;

    /// The reference: the same job with every rank's groups listed.
    fn listed_classes(
        topology: &Topology,
        local: &[u128],
        families: &[GroupFamilyTable],
    ) -> Classes {
        classes_of_views(local.len(), topology, |r| {
            let groups: Vec<Group> = families
                .iter()
                .map(|f| Group::new(f.label.clone(), f.groups.group_of(r)).unwrap())
                .collect();
            Ok(RankView {
                ops_digest: local[r],
                groups: Cow::Owned(groups),
            })
        })
        .unwrap()
    }

    #[test]
    fn a_straggler_splits_its_groups_as_listed_folding_does() {
        let mesh = DeviceMesh::new([("rep", 4usize), ("shard", 4), ("tp", 2)]).unwrap();
        let topology = Topology {
            dies_per_machine: 8,
            machines_per_supernode: 2,
            supernodes: 2,
        };
        let families = vec![
            GroupFamilyTable {
                label: "shard".into(),
                groups: MeshGroups::new(&mesh, &[1], None),
            },
            GroupFamilyTable {
                label: "rep/2".into(),
                groups: MeshGroups::new(&mesh, &[0], Some(2)),
            },
            GroupFamilyTable {
                label: "tp".into(),
                groups: MeshGroups::new(&mesh, &[2], None),
            },
        ];
        let mut local = vec![7u128; 32];
        local[5] = 8;
        let got = classes_on_mesh(32, &topology, &local, &families).unwrap();
        assert_eq!(got, listed_classes(&topology, &local, &families));
        assert!(got.members.len() > 2 && got.members.len() < 32);
    }

    #[test]
    fn a_family_on_another_mesh_size_is_an_error() {
        let mesh = DeviceMesh::new([("shard", 4usize)]).unwrap();
        let topology = Topology {
            dies_per_machine: 8,
            machines_per_supernode: 1,
            supernodes: 1,
        };
        let families = vec![GroupFamilyTable {
            label: "shard".into(),
            groups: MeshGroups::new(&mesh, &[0], None),
        }];
        let err = classes_on_mesh(8, &topology, &[0; 8], &families).unwrap_err();
        assert!(err.to_string().contains("'shard'"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn mesh_folding_equals_listed_folding(
            sizes in proptest::collection::vec(1usize..4, 1..4),
            picks in proptest::collection::vec((0u32..8, proptest::option::of(1usize..4)), 0..4),
            stragglers in proptest::collection::vec(0usize..64, 0..3),
            machine in 1usize..5,
        ) {
            let mesh = DeviceMesh::new(
                sizes.iter().enumerate().map(|(i, &s)| (format!("a{i}"), s)),
            )
            .unwrap();
            let world = mesh.world_size();
            let topology = Topology {
                dies_per_machine: machine,
                machines_per_supernode: 2,
                supernodes: world.div_ceil(2 * machine),
            };
            let families: Vec<GroupFamilyTable> = picks
                .iter()
                .enumerate()
                .map(|(i, &(bits, block))| {
                    let axes: Vec<usize> =
                        (0..sizes.len()).filter(|a| bits >> a & 1 == 1).collect();
                    GroupFamilyTable {
                        label: format!("f{i}"),
                        groups: MeshGroups::new(&mesh, &axes, block),
                    }
                })
                .collect();
            let mut local = vec![1u128; world];
            for s in stragglers {
                local[s % world] = 2 + (s % 3) as u128;
            }
            let got = classes_on_mesh(world, &topology, &local, &families).unwrap();
            proptest::prop_assert_eq!(got, listed_classes(&topology, &local, &families));
        }
    }
}
