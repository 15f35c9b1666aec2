//! Typed errors of the collective layer.

use crate::types::CollectiveKind;

/// Result type used by every collective call.
pub type CommResult<T> = Result<T, CommError>;

/// Why a collective call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    /// A group was described with ranks that are empty, unsorted, duplicated or out of range.
    #[error("invalid group {label:?}: {reason}")]
    InvalidGroup {
        /// The group's label.
        label: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The calling rank is not a member of the group it called a collective on.
    #[error("rank {rank} is not a member of group {group} (ranks {ranks:?})")]
    NotInGroup {
        /// The calling rank.
        rank: usize,
        /// The group's label.
        group: String,
        /// The group's ranks.
        ranks: Vec<usize>,
    },
    /// An argument was invalid on the calling rank alone (bad root, counts, divisibility...).
    #[error("invalid argument to {kind}: {reason}")]
    InvalidArgument {
        /// The collective that was called.
        kind: CollectiveKind,
        /// What is wrong.
        reason: String,
    },
    /// Ranks of one group made calls that do not match (kind, dtype, sizes, op or root).
    #[error("mismatched collective on group {group} (call #{seq}): {detail}")]
    Mismatch {
        /// The group's label.
        group: String,
        /// The per-group sequence number of the call.
        seq: u64,
        /// Which ranks disagreed and on what.
        detail: String,
    },
    /// A buffer held a different element type from the one asked for.
    #[error("dtype mismatch: expected {expected}, got {actual}")]
    DTypeMismatch {
        /// The requested element type.
        expected: crate::types::DType,
        /// The element type the buffer holds.
        actual: crate::types::DType,
    },
    /// A peer finished (or panicked) before taking part in a call another rank waits on.
    #[error("{kind} on group {group} (call #{seq}) can never complete: rank(s) {missing:?} exited")]
    PeerExited {
        /// The collective waited on.
        kind: CollectiveKind,
        /// The group's label (or `p2p` for send/recv).
        group: String,
        /// The per-group (or per-channel) sequence number.
        seq: u64,
        /// Ranks that exited without joining the call.
        missing: Vec<usize>,
    },
    /// A call did not complete within the world's timeout.
    #[error(
        "{kind} on group {group} (call #{seq}) timed out after {timeout_ms} ms; waiting for rank(s) {missing:?}"
    )]
    Timeout {
        /// The collective waited on.
        kind: CollectiveKind,
        /// The group's label.
        group: String,
        /// The per-group sequence number.
        seq: u64,
        /// The timeout in milliseconds.
        timeout_ms: u64,
        /// Ranks that had not joined.
        missing: Vec<usize>,
    },
    /// A rank's closure panicked; the message is the panic payload if it was a string.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank whose thread panicked.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// The world itself was configured wrongly (e.g. zero ranks).
    #[error("invalid world: {0}")]
    InvalidWorld(String),
    /// A vendor library (NCCL, HCCL, CUDA runtime, ACL) could not be loaded: every path tried,
    /// each with the loader's (dlerror) text, and the environment variable that overrides the
    /// search.
    #[error(
        "{backend}: cannot load the {library} library; tried {}. Set {env_var}=/full/path/to/the/library to choose the file",
        .attempts.join("; ")
    )]
    LibraryLoad {
        /// Backend name (`nccl`, `hccl`).
        backend: String,
        /// Which library (`NCCL`, `CUDA runtime`, `HCCL`, `ACL`).
        library: String,
        /// The environment variable that overrides the search.
        env_var: String,
        /// One `path: loader error` entry per path tried, in order.
        attempts: Vec<String>,
    },
    /// A vendor library or runtime call returned a failure code.
    #[error("{backend}: {call} failed with code {code}: {message}")]
    DeviceCall {
        /// Backend name (`nccl`, `hccl`).
        backend: String,
        /// The C function that failed, with the context it was called in.
        call: String,
        /// The numeric return code.
        code: i64,
        /// The library's own description of the code, when it offers one.
        message: String,
    },
    /// Exchanging a communicator id between processes (file or TCP rendezvous) failed.
    #[error("rendezvous {method}: {reason}")]
    Rendezvous {
        /// `file:/path`, `tcp:host:port`, `local` or `mpi`.
        method: String,
        /// What went wrong and how to fix it.
        reason: String,
    },
    /// The backend cannot do this (library absent, feature off, op unsupported).
    #[error("backend {backend} unavailable: {reason}")]
    Unavailable {
        /// Backend name.
        backend: String,
        /// Why.
        reason: String,
    },
}
