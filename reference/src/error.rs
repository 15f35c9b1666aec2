//! Typed errors of the reference executor.

/// Result type of the reference executor.
pub type RefResult<T> = Result<T, RefError>;

/// Why a reference computation refused its inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    /// Tensor shapes do not fit the operation.
    #[error("shape mismatch in {op}: {detail}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// Expected versus actual shapes.
        detail: String,
    },
    /// An argument is out of its valid range (token id, position, config value...).
    #[error("invalid argument to {op}: {detail}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A parameter the model needs is missing from a parameter set.
    #[error("missing parameter {0}")]
    MissingParam(String),
    /// A kernel variant cannot run on this CPU.
    #[error("kernel {0} is not supported on this CPU")]
    Unsupported(&'static str),
}

impl RefError {
    /// Shorthand for a [`RefError::Shape`].
    pub fn shape(op: &'static str, detail: impl Into<String>) -> RefError {
        RefError::Shape {
            op,
            detail: detail.into(),
        }
    }

    /// Shorthand for a [`RefError::Invalid`].
    pub fn invalid(op: &'static str, detail: impl Into<String>) -> RefError {
        RefError::Invalid {
            op,
            detail: detail.into(),
        }
    }
}
