//! Typed errors of the simulator. Messages name the file, rank, op or group at fault.

use hpfsdp_program::step::{OpId, ProgramError};
use thiserror::Error;

/// Errors raised while loading profiles, preparing workloads and simulating.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SimError {
    /// A hardware profile that cannot be read, parsed or validated.
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
    /// A malformed step program.
    #[error(transparent)]
    Program(#[from] ProgramError),
    /// A workload that does not describe one consistent job.
    #[error("workload: {0}")]
    Workload(String),
    /// Ranks reached a rendezvous with collectives that do not match.
    #[error(
        "collective mismatch on communicator '{label}': rank {rank} {op} is {found}, but rank {other_rank} issued {expected} as the same call"
    )]
    CollectiveMismatch {
        /// Communicator label.
        label: String,
        /// The rank whose op disagrees.
        rank: usize,
        /// Its op.
        op: OpId,
        /// What that op is.
        found: String,
        /// The first participant's rank.
        other_rank: usize,
        /// What the first participant issued.
        expected: String,
    },
    /// The simulation stopped with ops that can never run.
    #[error("deadlock: {0}")]
    Deadlock(String),
}
