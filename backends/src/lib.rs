//! hpfsdp-backends: collective backends (in-process, MPI, HCCL, NCCL) and the replay runner.
//!
//! Placeholder until the reference-executor issue lands the `Collective` trait.

/// The crate version, reported next to replayed timelines.
pub const BACKENDS_VERSION: &str = env!("CARGO_PKG_VERSION");
