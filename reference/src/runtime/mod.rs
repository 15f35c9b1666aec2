//! The dual-mode distributed runtime: a sharding plan executed on N ranks (threads of the
//! in-process backend) in production or validation mode, with the FSDP/HSDP runtime, tensor
//! parallelism and expert parallelism.
//!
//! - [`mode`]: the mode flag and dispatch counters; [`ctx`]: op dispatch and module boundaries;
//! - [`dtensor`], [`rules`], [`boundary`], [`redistribute`]: layouts, the rule table, compiled
//!   contracts and their transitions;
//! - [`topo`]: a rank's groups and coordinates; [`fsdp`], [`tp`], [`ep`]: the parallel runtimes;
//! - [`wire`]: activation collectives in the compute dtype;
//! - [`executor`]: one rank's training step, unit by unit.

pub mod boundary;
pub mod ctx;
pub mod dtensor;
pub mod ep;
pub mod error;
pub mod executor;
pub mod fsdp;
pub mod mode;
pub mod redistribute;
pub mod rules;
pub mod topo;
pub mod tp;
pub mod wire;

pub use ctx::Ctx;
pub use dtensor::DTensor;
pub use error::{RtResult, RuntimeError};
pub use executor::{Executor, ParamFacts, UnitKind};
pub use fsdp::FsdpRuntime;
pub use mode::{DispatchStats, ExecMode};
pub use topo::RankTopo;
pub use wire::ActDType;
