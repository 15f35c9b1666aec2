//! Typed errors of the Muon optimizer.

use hpfsdp_backends::CommError;
use hpfsdp_plan::PlanError;

use crate::error::RefError;

/// Result type of the Muon optimizer.
pub type MuonResult<T> = Result<T, MuonError>;

/// Why a Muon configuration, plan or step was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MuonError {
    /// A scenario option has a bad value; names the section and the key.
    #[error("[{section}] {key}: {detail}")]
    Config {
        /// TOML section (`optimizer`, `optimizer.muon`).
        section: &'static str,
        /// The key.
        key: &'static str,
        /// What is wrong and what to use instead.
        detail: String,
    },
    /// The Muon plan and the tensors or meshes handed to the optimizer disagree.
    #[error("muon plan mismatch: {0}")]
    Plan(String),
    /// A tensor operation refused its inputs.
    #[error(transparent)]
    Tensor(#[from] RefError),
    /// A collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A layout or mesh computation failed.
    #[error(transparent)]
    Layout(#[from] PlanError),
}

impl MuonError {
    /// Shorthand for a [`MuonError::Config`] error.
    pub fn config(section: &'static str, key: &'static str, detail: impl Into<String>) -> Self {
        MuonError::Config {
            section,
            key,
            detail: detail.into(),
        }
    }

    /// Shorthand for a [`MuonError::Plan`] error.
    pub fn plan(detail: impl Into<String>) -> Self {
        MuonError::Plan(detail.into())
    }
}
