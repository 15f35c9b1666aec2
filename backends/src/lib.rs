//! hpfsdp-backends: the [`Collective`] trait and its backends.
//!
//! - [`inproc`]: ranks as threads of one process; deterministic; used by the reference executor
//!   and by tests.
//! - [`mpi`] (feature `mpi`): one rank per process under `mpirun`; deterministic (bitwise equal
//!   to `inproc`) or native MPI reductions.
//! - `hccl`, `nccl` (features of the same names): vendor libraries loaded at run time with
//!   `libloading`, sharing [`device`] (runtime abstraction, rendezvous, the `Collective` impl).
//! - [`select`] picks a backend at run time; [`replay`] walks a rank's step program on any
//!   backend and records a measured timeline; [`collbench`] is the nccl-tests / hccl_test sweep.
//!
//! Every backend records a per-rank [`TraceEvent`] list. The host backends (`inproc`, `mpi`)
//! reduce in ascending rank order ([`reduce`]), so their results are bit-identical across
//! backends, runs and thread timings; `hccl` and `nccl` use the vendor library's own reduction,
//! where bitwise equality with `inproc` is not promised.
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

mod args;
pub mod buffer;
pub mod collbench;
pub mod collective;
pub mod device;
pub mod error;
pub mod group;
#[cfg(feature = "hccl")]
pub mod hccl;
pub mod inproc;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod reduce;
pub mod replay;
pub mod select;
pub mod trace;
pub mod types;

pub use buffer::Buffer;
pub use buffer::Element;
pub use collective::{Collective, CollectiveExt, Handle, Work, wait_all};
pub use error::{CommError, CommResult};
pub use group::{Group, GroupId};
pub use half::bf16;
pub use inproc::{InProcComm, InProcWorld, WorldRun};
#[cfg(feature = "mpi")]
pub use mpi::{MpiComm, MpiOptions, ReductionMode};
pub use select::{BackendKind, SelectError, run_on_backend};
pub use trace::TraceEvent;
pub use types::{CollectiveKind, DType, ReduceOp};

/// The crate version, reported next to replayed timelines.
pub const BACKENDS_VERSION: &str = env!("CARGO_PKG_VERSION");
