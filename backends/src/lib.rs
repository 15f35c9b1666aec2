//! hpfsdp-backends: the [`Collective`] trait and its backends.
//!
//! - [`inproc`]: ranks as threads of one process; deterministic; used by the reference executor
//!   and by tests.
//! - `mpi`, `hccl`, `nccl`: to follow, behind cargo features, implementing the same trait;
//!   [`select`] picks one at run time.
//! - [`replay`]: walks a rank's step program on any backend and records a measured timeline;
//!   [`collbench`]: the nccl-tests / hccl_test sweep on any backend.
//!
//! Every backend reduces in ascending rank order ([`reduce`]) so results are bit-identical
//! across backends, runs and thread timings, and records a per-rank [`TraceEvent`] list.
//!
//! ```
//! use hpfsdp_backends::{Collective, CollectiveExt, Group, InProcWorld, ReduceOp};
//!
//! let run = InProcWorld::run(4, |comm| {
//!     let dp = Group::new("dp", vec![0, 1, 2, 3])?;
//!     let mine = vec![comm.rank() as f32; 2];
//!     comm.all_reduce_vec(&dp, mine, ReduceOp::Sum)
//! })?;
//! for result in run.results {
//!     assert_eq!(result?, vec![6.0, 6.0]); // 0 + 1 + 2 + 3, added in rank order
//! }
//! assert_eq!(run.traces[0][0].kind.name(), "all-reduce");
//! # Ok::<(), hpfsdp_backends::CommError>(())
//! ```

pub mod buffer;
pub mod collbench;
pub mod collective;
pub mod error;
pub mod group;
pub mod inproc;
pub mod reduce;
pub mod replay;
pub mod select;
pub mod trace;
pub mod types;

pub use buffer::Buffer;
pub use collective::{Collective, CollectiveExt, Handle, Work, wait_all};
pub use error::{CommError, CommResult};
pub use group::{Group, GroupId};
pub use half::bf16;
pub use inproc::{InProcComm, InProcWorld, WorldRun};
pub use select::{BackendKind, SelectError, run_on_backend};
pub use trace::TraceEvent;
pub use types::{CollectiveKind, DType, Element, ReduceOp};

/// The crate version, reported next to replayed timelines.
pub const BACKENDS_VERSION: &str = env!("CARGO_PKG_VERSION");
