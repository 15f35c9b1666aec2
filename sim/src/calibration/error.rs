//! Errors of calibration: simulation failures, unknown profile keys and bad measured tables
//! (each naming the file, line and column, and what to change).

use crate::error::SimError;
use thiserror::Error;

/// Why a calibration step failed.
#[derive(Debug, Error)]
pub enum CalibrationError {
    /// Simulating a measured run failed.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A fit parameter names a profile key the calibration cannot read or write.
    #[error(
        "unknown profile key '{key}' in the fit parameters; known keys are those of \
         hpfsdp_sim::calibration::profile_keys::KEYS (e.g. calibration.copy_efficiency, \
         tiers.intra_machine.efficiency)"
    )]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A measured table could not be read or has a bad cell.
    #[error("{file}:{line}: column '{column}': {message}")]
    Table {
        /// The table file.
        file: String,
        /// 1-based line (0 when the problem is the whole file).
        line: usize,
        /// The column (or `-`).
        column: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A runs file has a bad entry.
    #[error("{file}:{line}: {key}: {message}")]
    RunsFile {
        /// The runs file.
        file: String,
        /// 1-based line (0 when the problem is the whole file or a clash between files).
        line: usize,
        /// The key at fault (`run.figures.step_time_s`, `fit.key`, `-` for a syntax error).
        key: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
}
