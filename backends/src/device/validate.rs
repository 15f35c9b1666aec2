//! Argument checks shared by the host-buffer and device-buffer paths of [`super::DeviceComm`],
//! with the same error wording as the in-process backend.

use super::library::AllToAllVLayout;
use crate::error::{CommError, CommResult};
use crate::group::Group;
use crate::types::{CollectiveKind, ReduceOp};

/// A validated collective: what to enqueue, with every count in elements.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Spec {
    AllGather { count: usize },
    ReduceScatter { recv_count: usize, op: ReduceOp },
    AllReduce { count: usize, op: ReduceOp },
    Broadcast { count: usize, root_pos: usize },
    AllToAll { count: usize, nranks: usize },
    AllToAllV(AllToAllVLayout),
    Barrier,
}

impl Spec {
    /// The trace/error kind.
    pub(crate) fn kind(&self) -> CollectiveKind {
        match self {
            Spec::AllGather { .. } => CollectiveKind::AllGather,
            Spec::ReduceScatter { .. } => CollectiveKind::ReduceScatter,
            Spec::AllReduce { .. } => CollectiveKind::AllReduce,
            Spec::Broadcast { .. } => CollectiveKind::Broadcast,
            Spec::AllToAll { .. } => CollectiveKind::AllToAll,
            Spec::AllToAllV(_) => CollectiveKind::AllToAllV,
            Spec::Barrier => CollectiveKind::Barrier,
        }
    }

    /// The reduction, for the trace.
    pub(crate) fn op(&self) -> Option<ReduceOp> {
        match self {
            Spec::ReduceScatter { op, .. } | Spec::AllReduce { op, .. } => Some(*op),
            _ => None,
        }
    }

    /// Elements this rank gets back.
    pub(crate) fn output_elements(&self, group_size: usize) -> usize {
        match self {
            Spec::AllGather { count } => count * group_size,
            Spec::ReduceScatter { recv_count, .. } => *recv_count,
            Spec::AllReduce { count, .. } | Spec::Broadcast { count, .. } => *count,
            Spec::AllToAll { count, nranks } => count * nranks,
            Spec::AllToAllV(l) => l.recv_counts.iter().sum(),
            Spec::Barrier => 0,
        }
    }
}

pub(crate) use crate::args::position;
use crate::args::{check_counts, chunk_len, root_position};

/// Build the spec of a group collective from the caller's arguments (`input_len` elements in).
pub(crate) fn spec_for(
    kind: CollectiveKind,
    group: &Group,
    input_len: usize,
    op: Option<ReduceOp>,
    root: Option<usize>,
) -> CommResult<Spec> {
    let op = op.unwrap_or(ReduceOp::Sum);
    Ok(match kind {
        CollectiveKind::AllGather => Spec::AllGather { count: input_len },
        CollectiveKind::ReduceScatter => Spec::ReduceScatter {
            recv_count: chunk_len(kind, input_len, group)?,
            op,
        },
        CollectiveKind::AllReduce => Spec::AllReduce {
            count: input_len,
            op,
        },
        CollectiveKind::Broadcast => {
            let root_pos = root_position(kind, group, root.unwrap_or(usize::MAX))?;
            Spec::Broadcast {
                count: input_len,
                root_pos,
            }
        }
        CollectiveKind::AllToAll => Spec::AllToAll {
            count: chunk_len(kind, input_len, group)?,
            nranks: group.size(),
        },
        CollectiveKind::Barrier => Spec::Barrier,
        CollectiveKind::AllToAllV | CollectiveKind::Send | CollectiveKind::Recv => {
            return Err(CommError::InvalidArgument {
                kind,
                reason: "not a fixed-size group collective".into(),
            });
        }
    })
}

/// Build the spec of an all-to-all-v, checking the counts against the group and the input.
pub(crate) fn spec_all_to_all_v(
    group: &Group,
    input_len: usize,
    send_counts: &[usize],
    recv_counts: &[usize],
) -> CommResult<Spec> {
    check_counts(group, input_len, send_counts, recv_counts)?;
    Ok(Spec::AllToAllV(AllToAllVLayout::packed(
        send_counts,
        recv_counts,
    )))
}
