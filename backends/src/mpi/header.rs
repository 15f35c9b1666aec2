//! The per-call header that deterministic mode exchanges before any payload moves.
//!
//! Every member sends every other member of the group a small record of its call (kind, dtype,
//! element count, reduction, root, per-group call number, group id, and for all-to-all-v both
//! count vectors). Because every member then holds every header, every member finds the same
//! disagreement and reports the same [`CommError::Mismatch`], and no payload of a mismatched
//! size is ever posted to MPI. A header that never arrives names the rank that is missing.

use crate::error::CommError;
use crate::group::Group;
use crate::types::{CollectiveKind, DType, ReduceOp};

/// First word of every header: "hpfsdp" + wire version 1.
const MAGIC: u64 = 0x6870_6673_6470_0001;

/// Words before the two count vectors.
const FIXED_WORDS: usize = 8;

const KINDS: [CollectiveKind; 9] = [
    CollectiveKind::AllGather,
    CollectiveKind::ReduceScatter,
    CollectiveKind::AllReduce,
    CollectiveKind::Broadcast,
    CollectiveKind::AllToAll,
    CollectiveKind::AllToAllV,
    CollectiveKind::Barrier,
    CollectiveKind::Send,
    CollectiveKind::Recv,
];

const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// What one member's call promises about its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallHeader {
    pub kind: CollectiveKind,
    pub dtype: DType,
    pub len: usize,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
    pub seq: u64,
    pub group_id: u64,
    /// All-to-all-v only: elements sent to / expected from each member (empty otherwise).
    pub send_counts: Vec<usize>,
    /// See `send_counts`.
    pub recv_counts: Vec<usize>,
}

/// Number of u64 words of a header for a group of `p` members.
pub(crate) fn header_words(p: usize) -> usize {
    FIXED_WORDS + 2 * p
}

fn code_of<T: PartialEq>(all: &[T], x: &T) -> u64 {
    all.iter()
        .position(|y| y == x)
        .map_or(u64::MAX, |i| i as u64)
}

impl CallHeader {
    /// The wire form for a group of `p` members.
    pub fn encode(&self, p: usize) -> Vec<u64> {
        let mut w = vec![
            MAGIC,
            code_of(&KINDS, &self.kind),
            self.dtype.code(),
            self.len as u64,
            self.op.map_or(0, |o| code_of(&OPS, &o) + 1),
            self.root.map_or(0, |r| r as u64 + 1),
            self.seq,
            self.group_id,
        ];
        for counts in [&self.send_counts, &self.recv_counts] {
            w.extend((0..p).map(|i| counts.get(i).map_or(0, |&c| c as u64)));
        }
        w
    }

    /// Decode a received header, or say why it is not one.
    pub fn decode(w: &[u64], p: usize) -> Result<CallHeader, String> {
        if w.len() != header_words(p) || w[0] != MAGIC {
            return Err("not an hpfsdp call header (another program or wire version?)".into());
        }
        let kind = *KINDS
            .get(w[1] as usize)
            .ok_or_else(|| format!("unknown call kind code {}", w[1]))?;
        let dtype = DType::from_code(w[2]).ok_or_else(|| format!("unknown dtype code {}", w[2]))?;
        let op = match w[4] {
            0 => None,
            c => Some(
                *OPS.get(c as usize - 1)
                    .ok_or_else(|| format!("unknown reduce op code {c}"))?,
            ),
        };
        let counts = |k: usize| -> Vec<usize> {
            if kind == CollectiveKind::AllToAllV {
                w[FIXED_WORDS + k * p..FIXED_WORDS + (k + 1) * p]
                    .iter()
                    .map(|&c| c as usize)
                    .collect()
            } else {
                Vec::new()
            }
        };
        Ok(CallHeader {
            kind,
            dtype,
            len: w[3] as usize,
            op,
            root: w[5].checked_sub(1).map(|r| r as usize),
            seq: w[6],
            group_id: w[7],
            send_counts: counts(0),
            recv_counts: counts(1),
        })
    }

    /// Human form, as in the in-process backend's mismatch messages.
    pub fn describe(&self) -> String {
        let mut s = format!("{}({}, {} elements", self.kind, self.dtype, self.len);
        if let Some(op) = self.op {
            s.push_str(&format!(", op={op}"));
        }
        if let Some(root) = self.root {
            s.push_str(&format!(", root={root}"));
        }
        s.push(')');
        s
    }

    /// Whether two members' calls can be combined (all-to-all-v lengths may differ).
    fn compatible(&self, other: &CallHeader) -> bool {
        self.kind == other.kind
            && self.dtype == other.dtype
            && self.op == other.op
            && self.root == other.root
            && self.group_id == other.group_id
            && self.seq == other.seq
            && (self.kind == CollectiveKind::AllToAllV || self.len == other.len)
    }
}

/// Check every member's header (in group order) against the first member's; the same
/// verdict on every member. For all-to-all-v also checks every pair's counts.
pub(crate) fn validate(group: &Group, seq: u64, headers: &[CallHeader]) -> Result<(), CommError> {
    let mismatch = |detail: String| CommError::Mismatch {
        group: group.label().to_string(),
        seq,
        detail,
    };
    let ranks = group.ranks();
    let first = &headers[0];
    for (j, h) in headers.iter().enumerate().skip(1) {
        if !first.compatible(h) {
            let mut detail = format!(
                "rank {} called {} but rank {} called {}",
                ranks[0],
                first.describe(),
                ranks[j],
                h.describe()
            );
            if first.seq != h.seq || first.group_id != h.group_id {
                detail.push_str(&format!(
                    " (their call numbers on the group are #{} and #{})",
                    first.seq, h.seq
                ));
            }
            return Err(mismatch(detail));
        }
    }
    if first.kind == CollectiveKind::AllToAllV {
        for (i, hi) in headers.iter().enumerate() {
            for (j, hj) in headers.iter().enumerate() {
                if hi.recv_counts[j] != hj.send_counts[i] {
                    return Err(mismatch(format!(
                        "all-to-all-v: rank {} expects {} elements from rank {} which sends {}",
                        ranks[i], hi.recv_counts[j], ranks[j], hj.send_counts[i]
                    )));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(kind: CollectiveKind, len: usize) -> CallHeader {
        CallHeader {
            kind,
            dtype: DType::Bf16,
            len,
            op: Some(ReduceOp::Avg),
            root: Some(3),
            seq: 7,
            group_id: 42,
            send_counts: Vec::new(),
            recv_counts: Vec::new(),
        }
    }

    #[test]
    fn round_trip_and_reject_garbage() {
        let mut a = h(CollectiveKind::AllToAllV, 5);
        a.send_counts = vec![1, 4];
        a.recv_counts = vec![2, 3];
        assert_eq!(CallHeader::decode(&a.encode(2), 2).unwrap(), a);
        let b = h(CollectiveKind::AllReduce, 9);
        assert_eq!(CallHeader::decode(&b.encode(3), 3).unwrap(), b);
        assert!(CallHeader::decode(&[0; 14], 3).is_err());
        assert!(CallHeader::decode(&b.encode(3), 2).is_err());
    }

    #[test]
    fn validation_names_both_ranks_and_calls() {
        let g = Group::new("dp", vec![1, 4]).unwrap();
        let e = validate(
            &g,
            7,
            &[
                h(CollectiveKind::AllReduce, 8),
                h(CollectiveKind::AllGather, 8),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rank 1 called all-reduce(bf16, 8 elements"),
            "{e}"
        );
        assert!(e.contains("rank 4 called all-gather"), "{e}");
        assert!(e.contains("group dp (call #7)"), "{e}");
        let mut a = h(CollectiveKind::AllToAllV, 3);
        a.send_counts = vec![1, 2];
        a.recv_counts = vec![1, 5];
        let mut b = a.clone();
        b.send_counts = vec![2, 1];
        b.recv_counts = vec![2, 1];
        let e = validate(&g, 7, &[a, b]).unwrap_err().to_string();
        assert!(
            e.contains("rank 1 expects 5 elements from rank 4 which sends 2"),
            "{e}"
        );
    }
}
