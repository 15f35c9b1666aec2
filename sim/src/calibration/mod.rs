//! Calibration of a hardware profile against measured runs given as data: runs files
//! ([`runs_file`]; the paper's held-in experiments are `scenarios/runs/paper-a3.toml`).
//!
//! - [`runs_file`]: the runs file format (runs, figures with sources and tolerances,
//!   differences, fit constants with bounds and priors, measured constants, public ranges);
//! - [`figure`]: the figures a run can report, with their keys and units;
//! - [`quantity`]: values with units and tolerances as a runs file writes them;
//! - [`measured`]: a measured run and its figures;
//! - [`compare`]: simulate the measured runs and put predicted beside measured;
//! - [`phases`]: forward / backward / optimizer device time of a simulated step;
//! - [`rank0_facts`]: what the figures read from a rank-0 program, read once per workload;
//! - [`difference`]: step-time differences between two runs;
//! - [`host_rows`]: each run's launches and host seconds by class, host busy vs step;
//! - [`gates`]: each figure's default rule (fit weight, tolerance, gating), in one table;
//! - [`verdict`]: every row checked against its tolerance, and the overall verdict;
//! - [`params`]: the types of the fitted constants, their bounds, blind bounds and ranges;
//! - [`profile_keys`]: the profile constants calibration reads and writes by dotted key;
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
pub mod difference;
pub mod division_time;
pub mod error;
pub mod figure;
pub mod fit;
pub mod gates;
pub mod gemm_table;
pub mod holdout;
pub mod host_rows;
pub mod lm;
pub mod loo;
pub mod measured;
pub mod params;
pub mod phases;
pub mod prior;
pub mod profile_edit;
pub mod profile_keys;
pub mod quantity;
pub mod rank0_facts;
pub mod runs_file;
pub mod verdict;

pub use compare::{CalibrationSet, Comparison, FigureRow};
pub use error::CalibrationError;
pub use figure::Figure;
pub use fit::{FitOutcome, fit_joint};
pub use measured::{MeasuredFigure, MeasuredRun};
pub use runs_file::{PAPER_A3_RUNS, RUNS_DIR, RunsFile};
