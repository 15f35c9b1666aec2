//! hpfsdp-reports: HTML (inline SVG), CSV and Chrome-trace reports.
//!
//! Placeholder until the simulator issue lands the report writers.

/// The crate version, stamped into generated reports.
pub const REPORTS_VERSION: &str = env!("CARGO_PKG_VERSION");
