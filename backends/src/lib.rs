//! hpfsdp-backends: the [`Collective`] trait and its backends.
//!
//! - [`inproc`]: ranks as threads of one process; deterministic; used by the reference executor
//!   and by tests.
//! - `mpi`, `hccl`, `nccl`: to follow, behind cargo features, implementing the same trait.
//!
//! Every backend reduces in ascending rank order ([`reduce`]) so results are bit-identical
//! across backends, runs and thread timings, and records a per-rank [`TraceEvent`] list.

pub mod buffer;
pub mod collective;
pub mod error;
pub mod group;
pub mod inproc;
pub mod reduce;
pub mod trace;
pub mod types;

pub use buffer::Buffer;
pub use collective::{Collective, CollectiveExt, Handle, Work, wait_all};
pub use error::{CommError, CommResult};
pub use group::{Group, GroupId};
pub use half::bf16;
pub use inproc::{InProcComm, InProcWorld, WorldRun};
pub use trace::TraceEvent;
pub use types::{CollectiveKind, DType, Element, ReduceOp};

/// The crate version, reported next to replayed timelines.
pub const BACKENDS_VERSION: &str = env!("CARGO_PKG_VERSION");
