//! hpfsdp-reports: HTML (inline SVG), CSV and Chrome-trace reports.
//!
//! The CLI maps simulator results into the [`model`] types ([`SimReport`]) and calls
//! [`write_sim_report`], or renders pieces itself ([`sim_report_html`], [`summary_csv`],
//! [`timeline_csv`], [`chrome_trace_json`]). Other commands (verify, calibration, gate) use the
//! generic [`TableReport`]. Every output is a pure function of its input: the same report gives
//! byte-identical files.
//!
//! ```
//! use hpfsdp_reports::{SimReport, StrategyRun, sim_report_html, write_sim_report};
//!
//! let report = SimReport {
//!     scenario: "demo".into(),
//!     runs: vec![StrategyRun {
//!         strategy: "fsdp2".into(),
//!         step_time_s: 0.1,
//!         compute_s: 0.08,
//!         ..StrategyRun::default()
//!     }],
//!     ..SimReport::default()
//! };
//! assert_eq!(sim_report_html(&report), sim_report_html(&report));
//! let dir = std::env::temp_dir().join(format!("hpfsdp-reports-doc-{}", std::process::id()));
//! let files = write_sim_report(&dir, &report)?;
//! assert_eq!(files.len(), 4);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), hpfsdp_reports::ReportError>(())
//! ```

#![warn(missing_docs)]

pub mod calibration_chart;
pub mod calibration_page;
pub mod charts;
pub mod chrome_trace;
pub mod csv;
pub mod html;
pub mod model;
pub mod order;
mod page;
mod palette;
pub mod replay;
pub mod sweep;
pub mod sweep_chart;
pub mod sweep_page;
pub mod table;
pub mod units;
pub mod write;

pub use calibration_page::CalibrationPage;
pub use chrome_trace::chrome_trace_json;
pub use csv::{summary_csv, timeline_csv};
pub use html::sim_report_html;
pub use model::{
    CollectiveRow, MemorySpread, OptimizerFigures, RankTimelineView, SimReport, SpanView,
    StrategyRun, TierRow, WhatIfCostRow,
};
pub use replay::{ReplayReport, write_replay_report};
pub use table::{Section, Table, TableReport, Verdict};
pub use write::{ReportError, SIM_REPORT_FILES, write_sim_report};

/// The crate version, stamped into generated reports.
pub const REPORTS_VERSION: &str = env!("CARGO_PKG_VERSION");
