//! Typed errors of the distributed runtime and the equivalence harness.

use hpfsdp_backends::CommError;

use crate::error::RefError;

/// Result type of the runtime.
pub type RtResult<T> = Result<T, RuntimeError>;

/// Why a distributed step (or its set-up) failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuntimeError {
    /// Validation mode: a module boundary saw a layout other than its contract declares.
    #[error("{0}")]
    PlacementMismatch(Box<PlacementMismatch>),
    /// Validation mode: an operator's layout rule refused its input layouts.
    #[error("[{module}] {stage}: op '{op}' rejects its input layouts: {detail}")]
    OpRule {
        /// Innermost module being executed.
        module: String,
        /// `forward` or `backward`.
        stage: String,
        /// Operator name.
        op: String,
        /// Why.
        detail: String,
    },
    /// Validation mode: a local result does not have the shape its inferred layout gives.
    #[error("[{module}] op '{op}' output check failed: {detail}")]
    OutputCheck {
        /// Innermost module being executed.
        module: String,
        /// Operator name.
        op: String,
        /// Expected versus actual local shape.
        detail: String,
    },
    /// A collective failed.
    #[error("communication failed: {0}")]
    Comm(#[from] CommError),
    /// A kernel refused its inputs.
    #[error("kernel error: {0}")]
    Kernel(#[from] RefError),
    /// The plan or scenario cannot be executed by the reference runtime.
    #[error("unsupported by the reference runtime: {0}")]
    Unsupported(String),
    /// The plan is inconsistent with the model or the mesh.
    #[error("plan error: {0}")]
    Plan(String),
}

/// A boundary contract violated in validation mode (the message follows HyperParallel's
/// `PlacementMismatchError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "[{module}] {stage} placement mismatch on '{tensor}':\n  Expected (from sharding plan {contract}): {expected}\n  Actual   (from layout propagation):      {actual}\n  -> check the sharding plan for module '{module}'"
)]
pub struct PlacementMismatch {
    /// Module (boundary) name.
    pub module: String,
    /// `forward input`, `forward output`, `backward input` or `backward output`.
    pub stage: String,
    /// Contract tensor name (`hidden_states`, `logits`, ...).
    pub tensor: String,
    /// Which contract was checked (`in_src`, `out_src`, ...).
    pub contract: String,
    /// Declared layout.
    pub expected: String,
    /// Propagated layout.
    pub actual: String,
}

impl RuntimeError {
    /// Shorthand for [`RuntimeError::Unsupported`].
    pub fn unsupported(detail: impl Into<String>) -> RuntimeError {
        RuntimeError::Unsupported(detail.into())
    }

    /// Shorthand for [`RuntimeError::Plan`].
    pub fn plan(detail: impl Into<String>) -> RuntimeError {
        RuntimeError::Plan(detail.into())
    }

    /// The module a validation error names, if any.
    pub fn module(&self) -> Option<&str> {
        match self {
            RuntimeError::PlacementMismatch(m) => Some(&m.module),
            RuntimeError::OpRule { module, .. } | RuntimeError::OutputCheck { module, .. } => {
                Some(module)
            }
            _ => None,
        }
    }
}
