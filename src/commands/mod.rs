//! One module per CLI subcommand.

pub mod bench;
pub mod calibrate;
pub mod collbench;
pub mod muon;
pub mod plan;
pub mod replay;
pub mod sim_summary;
pub mod simulate;
pub mod verify;
