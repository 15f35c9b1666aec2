//! One module per CLI subcommand.

pub mod bench;
pub mod calibrate;
pub mod muon;
pub mod plan;
pub mod sim_summary;
pub mod simulate;
pub mod verify;
