//! Process groups: explicit sorted rank lists with a stable id and a human label.

use std::fmt;
use std::sync::Arc;

use crate::error::{CommError, CommResult};

/// A stable 64-bit group identifier: FNV-1a over the label and the rank list.
///
/// It is the same in every process and every run, so backends that must agree on a group
/// without talking (e.g. to derive an NCCL unique-id exchange key or a tag space) can use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub u64);

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A process group: a non-empty, strictly ascending list of global ranks plus a label.
///
/// Two groups with the same ranks but different labels are different communicators (their calls
/// are matched separately), as two NCCL communicators over the same devices would be.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Group {
    id: GroupId,
    label: Arc<str>,
    ranks: Arc<[usize]>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

impl Group {
    /// A group over `ranks` (must be non-empty and strictly ascending) named `label`.
    pub fn new(label: impl Into<String>, ranks: Vec<usize>) -> CommResult<Group> {
        let label: String = label.into();
        if ranks.is_empty() {
            return Err(CommError::InvalidGroup {
                label,
                reason: "no ranks".into(),
            });
        }
        if let Some(w) = ranks.windows(2).find(|w| w[0] >= w[1]) {
            return Err(CommError::InvalidGroup {
                label,
                reason: format!(
                    "ranks must be strictly ascending, found {} before {}",
                    w[0], w[1]
                ),
            });
        }
        let mut h = fnv1a(FNV_OFFSET, label.as_bytes());
        h = fnv1a(h, &[0xff]);
        for r in &ranks {
            h = fnv1a(h, &(*r as u64).to_le_bytes());
        }
        Ok(Group {
            id: GroupId(h),
            label: label.into(),
            ranks: ranks.into(),
        })
    }

    /// A group over `ranks` labelled by the ranks themselves (e.g. `g[0,2]`).
    pub fn from_ranks(ranks: Vec<usize>) -> CommResult<Group> {
        let label = format!(
            "g[{}]",
            ranks
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        Group::new(label, ranks)
    }

    /// The group of all ranks `0..world_size`, labelled `world`.
    pub fn world(world_size: usize) -> CommResult<Group> {
        Group::new("world", (0..world_size).collect())
    }

    /// The stable id.
    pub fn id(&self) -> GroupId {
        self.id
    }

    /// The label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The member ranks, ascending.
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// Position of a global rank inside the group (its group-local rank), if it is a member.
    pub fn position(&self, rank: usize) -> Option<usize> {
        self.ranks.binary_search(&rank).ok()
    }

    /// Whether a global rank is a member.
    pub fn contains(&self, rank: usize) -> bool {
        self.position(rank).is_some()
    }

    /// Check that every member is below `world_size`.
    pub fn check_world(&self, world_size: usize) -> CommResult<()> {
        match self.ranks.last() {
            Some(&r) if r >= world_size => Err(CommError::InvalidGroup {
                label: self.label.to_string(),
                reason: format!("rank {r} is outside a world of {world_size} ranks"),
            }),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.label, self.ranks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(Group::new("x", vec![]).is_err());
        assert!(Group::new("x", vec![1, 0]).is_err());
        assert!(Group::new("x", vec![1, 1]).is_err());
        let g = Group::new("tp", vec![0, 2, 5]).unwrap();
        assert_eq!(g.position(2), Some(1));
        assert_eq!(g.position(3), None);
        assert!(g.check_world(6).is_ok());
        assert!(g.check_world(5).is_err());
    }

    #[test]
    fn ids_are_stable_and_label_sensitive() {
        let a = Group::new("tp", vec![0, 1]).unwrap();
        let b = Group::new("tp", vec![0, 1]).unwrap();
        let c = Group::new("ep", vec![0, 1]).unwrap();
        assert_eq!(a.id(), b.id());
        assert_ne!(a.id(), c.id());
        // Pinned value: the id must never change between releases (other processes rely on it).
        assert_eq!(
            Group::world(2).unwrap().id(),
            GroupId(0x64db_a72c_e8cf_d585)
        );
        assert_eq!(Group::from_ranks(vec![0, 3]).unwrap().label(), "g[0,3]");
    }
}
