//! Calibration of a hardware profile against the held-in measurements of
//! `shared/calibration/README.md` (experiment B and experiment A micro batch 2 only).
//!
//! - [`measured`]: the measured figures, as data;
//! - [`compare`]: simulate the measured runs and put predicted beside measured;
//! - [`fit`]: fit the profile's calibrated constants to them.

pub mod compare;
pub mod fit;
pub mod measured;

pub use compare::{CalibrationSet, Comparison, FigureRow};
pub use fit::{FitOutcome, fit};
pub use measured::{EXP_B_MEASURED_DIFF, Figure, MeasuredRun, measured_runs};
