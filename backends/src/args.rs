//! Argument checks every backend makes before a collective, with one wording: membership of
//! the caller, equal chunks, the broadcast root, all-to-all-v counts. Shared so the in-process,
//! MPI and device backends reject the same calls with the same messages.

use crate::error::{CommError, CommResult};
use crate::group::Group;
use crate::types::CollectiveKind;

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

/// The chunk length when `len` elements split into one equal chunk per member.
pub(crate) fn chunk_len(kind: CollectiveKind, len: usize, group: &Group) -> CommResult<usize> {
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

/// The broadcast root's position in `group` (the root is a global rank).
pub(crate) fn root_position(kind: CollectiveKind, group: &Group, root: usize) -> CommResult<usize> {
    group
        .position(root)
        .ok_or_else(|| CommError::InvalidArgument {
            kind,
            reason: format!("root {root} is not a member of {group}"),
        })
}

/// All-to-all-v counts: one send and one receive count per member, send counts adding up to
/// the input's `input_len` elements.
pub(crate) fn check_counts(
    group: &Group,
    input_len: usize,
    send_counts: &[usize],
    recv_counts: &[usize],
) -> CommResult<()> {
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
    Ok(())
}
