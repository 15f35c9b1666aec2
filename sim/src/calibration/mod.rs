//! Calibration of a hardware profile against the held-in measurements of
//! `shared/calibration/README.md` (experiment B and experiment A micro batch 2 only).
//!
//! - [`measured`]: the measured figures, as data;
//! - [`compare`]: simulate the measured runs and put predicted beside measured;
//! - [`host_rows`]: each run's launches and host seconds by class, host busy vs step;
//! - [`gates`]: which figures are fitted and which gate, with their tolerances (one table);
//! - [`verdict`]: every row checked against its tolerance, and the overall verdict;
//! - [`params`]: the residual constants of the fit, their bounds, priors and sources (one table);
//! - [`prior`]: the priors' residuals and how much of each prior the data identify;
//! - [`lm`]: the bounded least-squares solver;
//! - [`fit`]: the joint fit of the constants on every fitted figure;
//! - [`holdout`]: what a fold leaves out (an experiment or one of its runs);
//! - [`loo`]: leave-one-out refits, one per experiment and one per run;
//! - [`coll_table`]: alpha-beta fit of the tiers from a measured collective table;
//! - [`gemm_table`]: GEMM efficiency table from measured GEMM timings;
//! - [`profile_edit`]: write fitted values into a copy of a profile file, comments kept.

pub mod coll_table;
pub mod compare;
pub mod error;
pub mod fit;
pub mod gates;
pub mod gemm_table;
pub mod holdout;
pub mod host_rows;
pub mod lm;
pub mod loo;
pub mod measured;
pub mod params;
pub mod prior;
pub mod profile_edit;
pub mod verdict;

pub use compare::{CalibrationSet, Comparison, FigureRow};
pub use error::CalibrationError;
pub use fit::{FitOutcome, fit_joint};
pub use measured::{EXP_B_MEASURED_DIFF, Figure, MeasuredRun, measured_runs};
