//! One module per CLI subcommand.

pub mod bench;
pub mod plan;
