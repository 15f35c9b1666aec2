//! The error of exporting or reading traces.

use thiserror::Error;

/// Errors of exporting or reading traces.
#[derive(Debug, Error)]
pub enum ExportError {
    /// The strategy or optimizer cannot generate programs for this scenario.
    #[error("{0}")]
    Strategy(String),
    /// A generated program is inconsistent (a bug: please report it).
    #[error("inconsistent step program: {0}")]
    Program(String),
    /// A file could not be written or read.
    #[error("{path}: {message}")]
    Io {
        /// The file or directory.
        path: String,
        /// The system's message.
        message: String,
    },
    /// A trace file is not a valid Chakra trace.
    #[error("{file}: not a Chakra execution trace: {message}")]
    Decode {
        /// The file.
        file: String,
        /// What could not be decoded.
        message: String,
    },
}
