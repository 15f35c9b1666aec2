//! One module per CLI subcommand.

pub mod plan;
