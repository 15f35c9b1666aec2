//! Typed errors of the plan model. Every message names the thing at fault and, where one
//! exists, the fix.

use thiserror::Error;

/// Errors raised while building meshes, layouts, models, plans and scenarios.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanError {
    /// A mesh or topology description that cannot describe real hardware.
    #[error("invalid mesh: {0}")]
    Mesh(String),
    /// A placement string or placement combination that is not legal.
    #[error("invalid placement: {0}")]
    Placement(String),
    /// A layout that does not fit its tensor (dim out of range, ragged units that do not divide...).
    #[error("invalid layout: {0}")]
    Layout(String),
    /// A model config that cannot be turned into a model IR.
    #[error("invalid model config {file}: {message}")]
    Model {
        /// The config file (or `<inline>`).
        file: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A scenario file error, with its file, line and key.
    #[error("{file}{}: {message}", line_suffix(*line))]
    Scenario {
        /// The scenario file.
        file: String,
        /// 1-based line of the offending key (0 when unknown).
        line: usize,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A plan that cannot be derived (overrides that do not apply, unknown axes...).
    #[error("planner: {0}")]
    Planner(String),
}

/// Shorthand result type of this crate.
pub type PlanResult<T> = Result<T, PlanError>;

/// `":LINE"` for a known 1-based line, nothing when the line is unknown (0), so a read error
/// or a whole-file error never points at a line that does not exist.
pub fn line_suffix(line: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(":{line}")
    }
}
