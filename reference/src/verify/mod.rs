//! The equivalence harness: one training step in production mode, in validation mode and on a
//! single device, compared per parameter ([`compare`]), reported ([`report`]), plus the
//! mode benchmark ([`mod@bench`]) and the trace-versus-step-program comparator ([`trace`]).

pub mod bench;
pub mod compare;
pub mod error;
pub mod harness;
pub mod report;
pub mod setup;
pub mod trace;

pub use error::VerifyError;
pub use harness::{DistRun, SingleRun, run_distributed, run_single};
pub use report::{VerifyReport, verify};
pub use setup::VerifySpec;
