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

/// The caller's position in `group`, after checking the group fits the world.
pub(crate) fn position(
    kind: CollectiveKind,
    group: &Group,
    rank: usize,
    world_size: usize,
) -> CommResult<usize> {
    group.check_world(world_size)?;
    group.position(rank).ok_or_else(|| CommError::NotInGroup {
        rank,
        group: format!("{} ({kind})", group.label()),
        ranks: group.ranks().to_vec(),
    })
}

fn divisible(kind: CollectiveKind, len: usize, group: &Group) -> CommResult<usize> {
    if len.is_multiple_of(group.size()) {
        Ok(len / group.size())
    } else {
        Err(CommError::InvalidArgument {
            kind,
            reason: format!(
                "{len} elements do not split into {} equal chunks",
                group.size()
            ),
        })
    }
}

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
            recv_count: divisible(kind, input_len, group)?,
            op,
        },
        CollectiveKind::AllReduce => Spec::AllReduce {
            count: input_len,
            op,
        },
        CollectiveKind::Broadcast => {
            let root = root.unwrap_or(usize::MAX);
            let root_pos = group
                .position(root)
                .ok_or_else(|| CommError::InvalidArgument {
                    kind,
                    reason: format!("root {root} is not a member of {group}"),
                })?;
            Spec::Broadcast {
                count: input_len,
                root_pos,
            }
        }
        CollectiveKind::AllToAll => Spec::AllToAll {
            count: divisible(kind, input_len, group)?,
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
    let kind = CollectiveKind::AllToAllV;
    if send_counts.len() != group.size() || recv_counts.len() != group.size() {
        return Err(CommError::InvalidArgument {
            kind,
            reason: format!(
                "{} send counts and {} receive counts for a group of {}",
                send_counts.len(),
                recv_counts.len(),
                group.size()
            ),
        });
    }
    let total: usize = send_counts.iter().sum();
    if total != input_len {
        return Err(CommError::InvalidArgument {
            kind,
            reason: format!("send counts add up to {total} but the input has {input_len} elements"),
        });
    }
    Ok(Spec::AllToAllV(AllToAllVLayout::packed(
        send_counts,
        recv_counts,
    )))
}
