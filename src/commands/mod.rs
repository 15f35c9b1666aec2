//! One module per CLI subcommand.

pub mod bench;
pub mod bench_process;
pub mod calibrate;
pub mod calibrate_csv;
pub mod calibrate_json;
pub mod calibrate_report;
pub mod calibrate_runs;
pub mod calibrate_tables;
pub mod collbench;
pub mod device_profile;
pub mod export;
pub mod gate;
pub mod limits;
pub mod lint_gate;
pub mod muon;
pub mod plan;
pub mod preflight;
pub mod progress;
pub mod replay;
pub mod sanity;
pub mod scenario_figures;
pub mod sim_summary;
pub mod simulate;
pub mod sweep;
pub mod sweep_mpi;
pub mod verify;
