//! The equivalence harness: the training steps in production mode, in validation mode and on
//! a single device ([`harness`]), compared per parameter ([`compare`]), reported ([`report`]),
//! with distributed Muon as the optimizer when the scenario asks for it ([`muon`],
//! [`muon_report`]), plus the mode benchmark ([`mod@bench`]) and the trace-versus-step-program
//! comparator ([`trace`]).

pub mod bench;
pub mod compare;
pub mod error;
pub mod harness;
pub mod muon;
pub mod muon_report;
pub mod report;
pub mod setup;
pub mod trace;

pub use error::VerifyError;
pub use harness::{DistRun, SingleRun, run_distributed, run_single};
pub use report::{VerifyReport, verify};
pub use setup::VerifySpec;
