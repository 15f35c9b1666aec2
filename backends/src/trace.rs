//! Per-rank record of every communication call, in issue order.
//!
//! The reference executor compares this record with the plan's step program; `replay` extends it
//! with measured times.

use std::fmt;

use crate::group::{Group, GroupId};
use crate::types::{CollectiveKind, DType, ReduceOp};

/// One communication call as issued by one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    /// Position of the call in this rank's issue order (0, 1, 2, ...).
    pub index: usize,
    /// What was called.
    pub kind: CollectiveKind,
    /// The group's label (`p2p` for send/recv).
    pub group_label: String,
    /// The group's stable id (`None` for send/recv).
    pub group_id: Option<GroupId>,
    /// The group's ranks (for send/recv: this rank and the peer, ascending).
    pub ranks: Vec<usize>,
    /// Sequence number of the call within its group (or its send/recv channel).
    pub seq: u64,
    /// Element type of the payload.
    pub dtype: DType,
    /// Elements this rank passed in.
    pub input_elements: usize,
    /// Bytes this rank passed in.
    pub input_bytes: usize,
    /// Bytes this rank gets back.
    pub output_bytes: usize,
    /// Reduction, for all-reduce and reduce-scatter.
    pub op: Option<ReduceOp>,
    /// Root (global rank), for broadcast.
    pub root: Option<usize>,
    /// Peer (global rank), for send/recv.
    pub peer: Option<usize>,
    /// Message tag, for send/recv.
    pub tag: Option<u64>,
}

impl TraceEvent {
    /// Start an event for a group collective; counters are filled in by the caller.
    pub fn collective(index: usize, kind: CollectiveKind, group: &Group, seq: u64) -> TraceEvent {
        TraceEvent {
            index,
            kind,
            group_label: group.label().to_string(),
            group_id: Some(group.id()),
            ranks: group.ranks().to_vec(),
            seq,
            dtype: DType::F32,
            input_elements: 0,
            input_bytes: 0,
            output_bytes: 0,
            op: None,
            root: None,
            peer: None,
            tag: None,
        }
    }
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} {} {}{:?} seq={} {} in={}B out={}B",
            self.index,
            self.kind,
            self.group_label,
            self.ranks,
            self.seq,
            self.dtype,
            self.input_bytes,
            self.output_bytes
        )?;
        if let Some(op) = self.op {
            write!(f, " op={op}")?;
        }
        if let Some(root) = self.root {
            write!(f, " root={root}")?;
        }
        if let Some(peer) = self.peer {
            write!(f, " peer={peer}")?;
        }
        if let Some(tag) = self.tag {
            write!(f, " tag={tag}")?;
        }
        Ok(())
    }
}
