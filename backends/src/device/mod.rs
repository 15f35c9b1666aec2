//! What the run-time loaded accelerator backends (`hccl`, `nccl`) share.
//!
//! Always built (pure `std`, tested in CI without any vendor library):
//! - [`world`]: rank, world size and device index from arguments or the launcher's environment;
//! - [`rendezvous`]: the [`IdExchange`] that carries a unique id / root info from its creator to
//!   the other ranks (file and TCP stores; the MPI backend can implement the trait).
//!
//! Built with feature `hccl` or `nccl`:
//! - `loader`: `dlopen` through `libloading` with a search list, an override variable and an
//!   error that names every path tried;
//! - `runtime`: the `DeviceRuntime` abstraction over the CUDA runtime and ACL (device, streams,
//!   memory, copies, timing events), with `cuda` and `acl` implementations;
//! - `library`: the `CollLibrary` trait a vendor collective library implements;
//! - `comm`: `DeviceComm`, the [`crate::Collective`] implementation shared by both vendors,
//!   plus device-resident `DeviceBuffer`s and per-call device times for replay;
//! - `object`: `DeviceCollective`, the object-safe view a run-time backend factory returns;
//! - `kernels`: `DeviceKernels`, device-side compute for replay (a PTX spin kernel through the
//!   CUDA driver API in `cuda_driver`, GEMMs through `cublas`; none on ACL).
//!
//! Reductions on these backends are the vendor library's own (its order, its algorithms): the
//! bitwise equality with `inproc` that [`crate::reduce`] guarantees is **not** promised here.

pub mod rendezvous;
pub mod world;

#[cfg(feature = "hccl")]
pub mod acl;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod buffer;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod comm;
#[cfg(feature = "nccl")]
pub mod cublas;
#[cfg(feature = "nccl")]
pub mod cuda;
#[cfg(feature = "nccl")]
pub mod cuda_driver;
#[cfg(any(feature = "hccl", feature = "nccl"))]
mod device_ops;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod gemm;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod kernels;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod library;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod loader;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod object;
#[cfg(any(feature = "hccl", feature = "nccl"))]
mod p2p;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub mod runtime;
#[cfg(any(feature = "hccl", feature = "nccl"))]
mod staging;
#[cfg(any(feature = "hccl", feature = "nccl"))]
mod validate;

#[cfg(any(feature = "hccl", feature = "nccl"))]
pub use buffer::DeviceBuffer;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub use comm::{DeviceComm, DeviceOp, DeviceP2p, DeviceTiming, DeviceWork};
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub use kernels::DeviceKernels;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub use library::{CollLibrary, P2pDirection, P2pOp, RawComm};
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub use loader::{LibrarySet, LibrarySpec};
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub use object::DeviceCollective;
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub use runtime::{DevPtr, DeviceRuntime, Event, Stream};

pub use rendezvous::{
    FileStore, IdExchange, KeyValueStore, LocalExchange, StoreExchange, TcpStore,
    exchange_from_lookup, exchange_from_spec,
};
pub use world::{EnvLookup, WorldSpec, process_env};
