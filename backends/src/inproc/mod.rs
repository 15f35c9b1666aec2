//! The in-process backend: every rank is an OS thread of this process.
//!
//! Calls rendezvous on a shared table keyed by `(group id, per-group sequence number)`: the
//! `n`-th call a rank makes on a group meets the `n`-th call of every other member there. The
//! member whose contribution completes the set computes every member's output from the
//! contributions **in group (ascending rank) order**, so the bits never depend on thread timing.
//! Mismatched kinds, dtypes, sizes, ops or roots are reported to every member as
//! [`CommError::Mismatch`]; a call that waits on a rank that has already returned fails with
//! [`CommError::PeerExited`], and any wait is bounded by the world's timeout.
//!
//! Sends are buffered (eager): a send completes at once and its message waits in a mailbox keyed
//! by `(src, dst, tag, n)` until the `n`-th matching receive takes it.

mod rendezvous;
mod world;

pub use world::{InProcComm, InProcWorld, WorldRun};
