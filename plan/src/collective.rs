//! Collective kinds shared by the whole project (transitions, step programs, simulator,
//! executors), with their stable names and the byte conventions every component uses.
//!
//! **Byte convention.** Wherever a collective carries sizes, `bytes_in_per_rank` is the buffer
//! one rank hands to the collective and `bytes_out_per_rank` the buffer it gets back. Uneven
//! shards are padded to the largest shard of the group, as the real collectives require.

use serde::{Deserialize, Serialize};

/// The kind of a collective communication over one process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CollectiveKind {
    /// Every rank contributes one (padded) shard of `bytes_in` and receives the concatenation
    /// of all shards: `bytes_out = group_size * bytes_in`.
    AllGather,
    /// Every rank contributes a full buffer of `bytes_in = group_size * bytes_out` and receives
    /// its reduced (padded) shard of `bytes_out`.
    ReduceScatter,
    /// Every rank contributes and receives a buffer of the same size:
    /// `bytes_in = bytes_out`.
    AllReduce,
    /// The root sends a buffer and every other rank receives it: `bytes_in = bytes_out` = the
    /// buffer size.
    Broadcast,
    /// Every rank splits its `bytes_in` into `group_size` equal (padded) blocks, sends block
    /// `j` to rank `j` and receives one block from every rank: `bytes_in = bytes_out`.
    AllToAll,
    /// All-to-all with per-pair block sizes (ragged shards); `bytes_in` / `bytes_out` are the
    /// largest per-rank send / receive totals over the group.
    AllToAllV,
    /// A point-to-point transfer: the sender's `bytes_in` equals the receiver's `bytes_out`.
    SendRecv,
}

impl CollectiveKind {
    /// Every kind, in declaration order.
    pub const ALL: [CollectiveKind; 7] = [
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllReduce,
        CollectiveKind::Broadcast,
        CollectiveKind::AllToAll,
        CollectiveKind::AllToAllV,
        CollectiveKind::SendRecv,
    ];

    /// Stable kebab-case name used in tables, CSV, JSON and traces (same as the serde form).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllGather => "all-gather",
            CollectiveKind::ReduceScatter => "reduce-scatter",
            CollectiveKind::AllReduce => "all-reduce",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::AllToAll => "all-to-all",
            CollectiveKind::AllToAllV => "all-to-all-v",
            CollectiveKind::SendRecv => "send-recv",
        }
    }

    /// The kind called `name` (as returned by [`CollectiveKind::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// True for the kinds that reduce values (all-reduce, reduce-scatter).
    pub fn is_reduction(self) -> bool {
        matches!(
            self,
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
        )
    }

    /// Output bytes per rank implied by the input bytes per rank under the byte convention of
    /// this module (for `AllToAllV` the caller's own output size is authoritative; this returns
    /// the input size).
    pub fn output_bytes_per_rank(self, input_bytes_per_rank: u64, group_size: u64) -> u64 {
        let g = group_size.max(1);
        match self {
            CollectiveKind::AllGather => input_bytes_per_rank.saturating_mul(g),
            CollectiveKind::ReduceScatter => input_bytes_per_rank.div_ceil(g),
            _ => input_bytes_per_rank,
        }
    }
}

impl std::fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_match_serde() {
        for kind in CollectiveKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert_eq!(CollectiveKind::from_name(kind.name()), Some(kind));
            let back: CollectiveKind = serde_json::from_str(&json).unwrap();
            assert_eq!(back, kind);
        }
        assert_eq!(CollectiveKind::AllToAllV.name(), "all-to-all-v");
        assert_eq!(CollectiveKind::from_name("allgather"), None);
    }

    #[test]
    fn byte_conventions() {
        use CollectiveKind::*;
        assert_eq!(AllGather.output_bytes_per_rank(10, 4), 40);
        assert_eq!(ReduceScatter.output_bytes_per_rank(40, 4), 10);
        assert_eq!(AllReduce.output_bytes_per_rank(40, 4), 40);
        assert!(AllReduce.is_reduction() && ReduceScatter.is_reduction());
        assert!(!AllGather.is_reduction());
    }
}
