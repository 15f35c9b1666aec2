//! The equivalence harness: the training steps in production mode, in validation mode and on
//! a single device ([`harness`]), compared per parameter ([`compare`]), reported ([`report`]),
//! with distributed Muon as the optimizer when the scenario asks for it ([`muon_spec`],
//! [`muon`], [`muon_report`]), plus the mode benchmark ([`mod@bench`]) and the trace-versus-step-program
//! comparator ([`trace`]). [`multiprocess`] runs the same verification with each rank in its own
//! process (the MPI backend), sending rank records ([`wire`]) to rank 0.

pub mod bench;
pub mod bounds;
pub mod check;
pub mod compare;
pub mod error;
pub mod harness;
pub mod multiprocess;
pub mod muon;
pub mod muon_report;
pub mod muon_spec;
pub mod report;
pub mod setup;
pub mod trace;
pub mod wire;

pub use error::VerifyError;
pub use harness::{DistRun, RankRun, SingleRun, run_distributed, run_rank, run_single};
pub use multiprocess::{run_distributed_on, verify_on};
pub use report::{VerifyReport, verify, verify_runs};
pub use setup::VerifySpec;
