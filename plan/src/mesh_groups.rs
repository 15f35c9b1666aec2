//! Process-group families by arithmetic on a device mesh.
//!
//! A family partitions the ranks of a mesh into groups: the ranks that share every coordinate
//! except those on the family's axes, optionally cut into contiguous blocks (in ascending rank
//! order) of a fixed size. Which group a rank is in, its position there and a group's members
//! are computed from the coordinates, so answering for one rank costs O(mesh dims), not
//! O(group size), and no rank's group has to be listed to tell whether two ranks share one.

use crate::mesh::DeviceMesh;

/// One family of process groups on a mesh (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshGroups {
    /// Size of every mesh axis.
    sizes: Vec<usize>,
    /// Row-major stride of every mesh axis.
    strides: Vec<usize>,
    /// The family's axes, ascending (a group's ranks ascend in their row-major order).
    axes: Vec<usize>,
    /// The other axes, ascending.
    rest: Vec<usize>,
    /// Ranks of one whole axis group (product of the family's axis sizes).
    axis_group: usize,
    /// Block size (`axis_group` when the groups are not cut).
    block: usize,
    /// Blocks per axis group.
    blocks: usize,
}

impl MeshGroups {
    /// The family of `mesh`'s groups along `axes` (indices into the mesh's axes, any order;
    /// out-of-range indices are ignored), cut into blocks of `block` ranks when
    /// `0 < block < group size` (the last block of a group is shorter when `block` does not
    /// divide it).
    pub fn new(mesh: &DeviceMesh, axes: &[usize], block: Option<usize>) -> Self {
        let sizes: Vec<usize> = mesh.axes().iter().map(|a| a.size.max(1)).collect();
        let mut strides = vec![1; sizes.len()];
        for i in (0..sizes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * sizes[i + 1];
        }
        let mut axes: Vec<usize> = axes.iter().copied().filter(|&a| a < sizes.len()).collect();
        axes.sort_unstable();
        axes.dedup();
        let rest = (0..sizes.len()).filter(|a| !axes.contains(a)).collect();
        let axis_group: usize = axes.iter().map(|&a| sizes[a]).product();
        let block = block
            .filter(|&b| b > 0 && b < axis_group)
            .unwrap_or(axis_group);
        Self {
            sizes,
            strides,
            axes,
            rest,
            axis_group,
            block,
            blocks: axis_group.div_ceil(block),
        }
    }

    /// Ranks of the mesh.
    pub fn world_size(&self) -> usize {
        self.sizes.iter().product()
    }

    /// Number of groups in the family.
    pub fn group_count(&self) -> usize {
        self.world_size() / self.axis_group * self.blocks
    }

    /// The largest group's size.
    pub fn max_group_size(&self) -> usize {
        self.block
    }

    /// Coordinate of `rank` on mesh axis `a`.
    fn coord(&self, rank: usize, a: usize) -> usize {
        rank / self.strides[a] % self.sizes[a]
    }

    /// Position of `rank` in its whole axis group (ascending rank order).
    fn axis_position(&self, rank: usize) -> usize {
        self.axes
            .iter()
            .fold(0, |acc, &a| acc * self.sizes[a] + self.coord(rank, a))
    }

    /// Index of `rank`'s group, in `0..group_count()`: groups are numbered by their
    /// coordinates on the other axes (row-major), then by block.
    pub fn group_index(&self, rank: usize) -> usize {
        let base = self
            .rest
            .iter()
            .fold(0, |acc, &a| acc * self.sizes[a] + self.coord(rank, a));
        base * self.blocks + self.axis_position(rank) / self.block
    }

    /// Position of `rank` in its group (ascending rank order).
    pub fn position(&self, rank: usize) -> usize {
        self.axis_position(rank) % self.block
    }

    /// Members of group `index`, ascending (empty when `index` is out of range).
    pub fn members(&self, index: usize) -> Vec<usize> {
        if index >= self.group_count() {
            return Vec::new();
        }
        let (mut base, block) = (index / self.blocks, index % self.blocks);
        let mut origin = 0;
        for &a in self.rest.iter().rev() {
            origin += base % self.sizes[a] * self.strides[a];
            base /= self.sizes[a];
        }
        let start = block * self.block;
        let end = (start + self.block).min(self.axis_group);
        (start..end)
            .map(|mut pos| {
                let mut rank = origin;
                for &a in self.axes.iter().rev() {
                    rank += pos % self.sizes[a] * self.strides[a];
                    pos /= self.sizes[a];
                }
                rank
            })
            .collect()
    }

    /// Members of `rank`'s group, ascending.
    pub fn group_of(&self, rank: usize) -> Vec<usize> {
        self.members(self.group_index(rank))
    }

    /// The first and last member of `rank`'s group (what decides its tier on a topology whose
    /// machines and supernodes are contiguous rank blocks).
    pub fn bounds_of(&self, rank: usize) -> (usize, usize) {
        let pos = self.axis_position(rank);
        let start = pos / self.block * self.block;
        let end = (start + self.block).min(self.axis_group) - 1;
        let origin = rank
            - self
                .axes
                .iter()
                .map(|&a| self.coord(rank, a) * self.strides[a])
                .sum::<usize>();
        let at = |mut pos: usize| {
            let mut r = origin;
            for &a in self.axes.iter().rev() {
                r += pos % self.sizes[a] * self.strides[a];
                pos /= self.sizes[a];
            }
            r
        };
        (at(start), at(end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The listing definition: the mesh's axis group, sorted, cut into the rank's block.
    fn listed(mesh: &DeviceMesh, axes: &[usize], block: Option<usize>, rank: usize) -> Vec<usize> {
        let mut ranks = mesh.group_of(rank, axes);
        ranks.sort_unstable();
        if let Some(b) = block.filter(|&b| b > 0 && b < ranks.len()) {
            let pos = ranks.iter().position(|&r| r == rank).unwrap();
            let start = pos / b * b;
            ranks = ranks[start..(start + b).min(ranks.len())].to_vec();
        }
        ranks
    }

    proptest! {
        #[test]
        fn arithmetic_groups_equal_listed_groups(
            sizes in proptest::collection::vec(1usize..5, 1..5),
            axis_bits in 0u32..16,
            block in proptest::option::of(0usize..7),
        ) {
            let axes_named: Vec<(String, usize)> =
                sizes.iter().enumerate().map(|(i, &s)| (format!("a{i}"), s)).collect();
            let mesh = DeviceMesh::new(axes_named).unwrap();
            let axes: Vec<usize> = (0..sizes.len()).filter(|i| axis_bits >> i & 1 == 1).collect();
            let fam = MeshGroups::new(&mesh, &axes, block);
            let mut seen = vec![0usize; fam.group_count()];
            for rank in 0..mesh.world_size() {
                let want = listed(&mesh, &axes, block, rank);
                let g = fam.group_index(rank);
                prop_assert!(g < fam.group_count());
                seen[g] += 1;
                prop_assert_eq!(&fam.members(g), &want);
                prop_assert_eq!(fam.position(rank), want.iter().position(|&r| r == rank).unwrap());
                prop_assert_eq!(fam.bounds_of(rank), (want[0], *want.last().unwrap()));
            }
            // Every group index is used, and the groups partition the ranks.
            prop_assert!(seen.iter().all(|&n| n > 0));
            prop_assert_eq!(seen.iter().sum::<usize>(), mesh.world_size());
        }
    }
}
