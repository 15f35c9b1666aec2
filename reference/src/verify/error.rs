//! Errors of the verification harness.

use crate::runtime::RuntimeError;

/// Why a verification could not run (a failed comparison is a verdict, not an error).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    /// The scenario cannot be planned or loaded.
    #[error("{0}")]
    Scenario(String),
    /// The scenario asks for something the reference runtime does not execute.
    #[error("{what}; {fix}")]
    Unsupported {
        /// What is not supported.
        what: String,
        /// How to change the scenario.
        fix: String,
    },
    /// `--mutate` named nothing mutable.
    #[error("cannot mutate '{target}': {reason}")]
    Mutation {
        /// The requested target.
        target: String,
        /// Why.
        reason: String,
    },
    /// A distributed run failed.
    #[error("{mode} run failed: {source}")]
    Run {
        /// `production`, `validation` or `single-device`.
        mode: String,
        /// The runtime error (boxed: it is the largest payload, and every `Result` of the
        /// harness would otherwise carry its size).
        source: Box<RuntimeError>,
    },
}

impl VerifyError {
    /// Shorthand for [`VerifyError::Unsupported`].
    pub fn unsupported(what: impl Into<String>, fix: impl Into<String>) -> VerifyError {
        VerifyError::Unsupported {
            what: what.into(),
            fix: fix.into(),
        }
    }
}
