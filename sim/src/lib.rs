//! hpfsdp-sim: the discrete-event two-tier simulator that times step programs.
//!
//! This crate is a placeholder until the simulator issue lands; it exists so the workspace
//! layout matches DESIGN.md and the CLI can depend on it.

/// The crate version, so the CLI can report which simulator produced a prediction.
pub const SIM_VERSION: &str = env!("CARGO_PKG_VERSION");
