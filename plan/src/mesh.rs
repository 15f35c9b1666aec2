//! Named device meshes: ordered axes over ranks in row-major order, and the process groups
//! along any subset of axes.

use crate::error::{PlanError, PlanResult};
use serde::{Deserialize, Serialize};

/// One named axis of a device mesh (`dp_replicate`, `dp_shard`, `tp`, `ep`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MeshAxis {
    /// Axis name as used in scenario files and placements.
    pub name: String,
    /// Number of ranks along this axis (>= 1).
    pub size: usize,
}

/// An ordered list of named axes; rank `r` has coordinates given by row-major decomposition
/// (the last axis varies fastest).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceMesh {
    axes: Vec<MeshAxis>,
}

impl DeviceMesh {
    /// Builds a mesh from `(name, size)` pairs in rank-major order. Names must be unique and
    /// sizes at least 1.
    pub fn new<S: Into<String>>(axes: impl IntoIterator<Item = (S, usize)>) -> PlanResult<Self> {
        let axes: Vec<MeshAxis> = axes
            .into_iter()
            .map(|(name, size)| MeshAxis {
                name: name.into(),
                size,
            })
            .collect();
        for (i, axis) in axes.iter().enumerate() {
            if axis.size == 0 {
                return Err(PlanError::Mesh(format!(
                    "axis '{}' has size 0; every mesh axis needs size >= 1",
                    axis.name
                )));
            }
            if axes[..i].iter().any(|a| a.name == axis.name) {
                return Err(PlanError::Mesh(format!(
                    "axis '{}' appears twice; axis names must be unique",
                    axis.name
                )));
            }
        }
        Ok(Self { axes })
    }

    /// The axes in rank-major order.
    pub fn axes(&self) -> &[MeshAxis] {
        &self.axes
    }

    /// Number of axes.
    pub fn ndim(&self) -> usize {
        self.axes.len()
    }

    /// Total number of ranks (product of axis sizes).
    pub fn world_size(&self) -> usize {
        self.axes.iter().map(|a| a.size).product()
    }

    /// Index of the axis called `name`.
    pub fn axis_index(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|a| a.name == name)
    }

    /// Size of the axis called `name`, 1 when the mesh has no such axis.
    pub fn axis_size(&self, name: &str) -> usize {
        self.axis_index(name).map_or(1, |i| self.axes[i].size)
    }

    /// Names of all axes, in order.
    pub fn axis_names(&self) -> Vec<&str> {
        self.axes.iter().map(|a| a.name.as_str()).collect()
    }

    /// Coordinates of `rank` along every axis.
    pub fn coords_of(&self, rank: usize) -> Vec<usize> {
        let mut coords = vec![0; self.axes.len()];
        let mut rest = rank;
        for (i, axis) in self.axes.iter().enumerate().rev() {
            coords[i] = rest % axis.size;
            rest /= axis.size;
        }
        coords
    }

    /// The rank at the given coordinates.
    pub fn rank_of(&self, coords: &[usize]) -> usize {
        coords
            .iter()
            .zip(&self.axes)
            .fold(0, |acc, (&c, axis)| acc * axis.size + c)
    }

    /// Ranks of the process group along `axes` that contains `rank`: every rank that shares
    /// `rank`'s coordinates on all other axes, in row-major order of the group axes.
    pub fn group_of(&self, rank: usize, axes: &[usize]) -> Vec<usize> {
        let base = self.coords_of(rank);
        let sizes: Vec<usize> = axes.iter().map(|&a| self.axes[a].size).collect();
        let count: usize = sizes.iter().product();
        (0..count)
            .map(|mut idx| {
                let mut coords = base.clone();
                for (k, &a) in axes.iter().enumerate().rev() {
                    coords[a] = idx % sizes[k];
                    idx /= sizes[k];
                }
                self.rank_of(&coords)
            })
            .collect()
    }

    /// All process groups along `axes`, each in row-major order, ordered by their first rank.
    pub fn groups(&self, axes: &[usize]) -> Vec<Vec<usize>> {
        let mut seen = vec![false; self.world_size()];
        let mut out = Vec::new();
        for rank in 0..self.world_size() {
            if !seen[rank] {
                let group = self.group_of(rank, axes);
                for &r in &group {
                    seen[r] = true;
                }
                out.push(group);
            }
        }
        out
    }

    /// Resolves axis names to indices; unknown names give an error that lists the legal axes.
    pub fn resolve_axes(&self, names: &[&str]) -> PlanResult<Vec<usize>> {
        names
            .iter()
            .map(|n| {
                self.axis_index(n).ok_or_else(|| {
                    PlanError::Mesh(format!(
                        "unknown mesh axis '{n}'; the mesh has axes [{}]",
                        self.axis_names().join(", ")
                    ))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_coords_round_trip() {
        let mesh = DeviceMesh::new([("dp", 2), ("tp", 3)]).unwrap();
        assert_eq!(mesh.world_size(), 6);
        assert_eq!(mesh.coords_of(4), vec![1, 1]);
        for r in 0..6 {
            assert_eq!(mesh.rank_of(&mesh.coords_of(r)), r);
        }
    }

    #[test]
    fn groups_along_axes() {
        let mesh = DeviceMesh::new([("dp_replicate", 2), ("dp_shard", 2), ("tp", 2)]).unwrap();
        assert_eq!(mesh.group_of(0, &[2]), vec![0, 1]);
        assert_eq!(mesh.group_of(3, &[1]), vec![1, 3]);
        assert_eq!(mesh.group_of(5, &[0]), vec![1, 5]);
        assert_eq!(mesh.group_of(0, &[0, 1]), vec![0, 2, 4, 6]);
        assert_eq!(mesh.groups(&[2]).len(), 4);
        assert_eq!(mesh.groups(&[]).len(), 8);
    }

    #[test]
    fn bad_meshes_are_rejected() {
        assert!(DeviceMesh::new([("dp", 0)]).is_err());
        let err = DeviceMesh::new([("dp", 2), ("dp", 2)]).unwrap_err();
        assert!(err.to_string().contains("appears twice"));
        let mesh = DeviceMesh::new([("dp", 2)]).unwrap();
        assert!(
            mesh.resolve_axes(&["tq"])
                .unwrap_err()
                .to_string()
                .contains("[dp]")
        );
    }
}
