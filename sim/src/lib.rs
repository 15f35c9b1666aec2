//! hpfsdp-sim: the discrete-event two-tier simulator that times step programs.
//!
//! - [`profile`]: hardware profiles (TOML in `scenarios/hardware/`), with calibrated constants;
//! - [`cost`]: alpha-beta collective, copy and roofline compute cost models (pure functions);
//! - [`shape`]: how a process group sits on the topology (flat or two-level);
//! - [`workload`] and [`fold`]: the programs of one job, folded into symmetry classes;
//! - [`engine`]: the discrete-event engine (host threads, streams, rendezvous, shared links);
//! - [`share`]: units sharing a program prefix, simulated once until they diverge;
//! - [`net`]: fair bandwidth sharing on tier links;
//! - [`memory`]: live-memory accounting;
//! - [`metrics`] and [`result`]: breakdowns (exposed communication, overlap) and results;
//! - [`bench`]: synthetic SPMD workloads and the simulator benchmark ([`resources`]: CPU time
//!   and peak memory of a run; [`bench_case`]: its cases as data, one process each in the CLI).
//!
//! Typical use: build per-rank [`StepProgram`](hpfsdp_program::step::StepProgram)s, then
//! [`simulate_programs`] (or [`Workload::fold_with`] + [`simulate`] for very large jobs).

pub mod bench;
pub mod bench_case;
pub mod bench_suite;
pub mod calibration;
pub mod compute_cost;
pub mod compute_spec;
pub mod cost;
pub mod engine;
pub mod error;
pub mod fold;
pub mod fold_mesh;
pub mod gemm_table;
pub mod host_cost;
pub mod kernel_classes;
pub mod memory;
pub mod metrics;
pub mod net;
pub mod profile;
pub mod profile_values;
pub mod resources;
pub mod result;
pub mod scenario_run;
pub mod shape;
pub mod share;
pub mod sim_options;
pub mod whatif;
pub mod whatif_costs;
pub mod workload;

pub use bench::{BenchReport, SyntheticConfig, bench_synthetic, synthetic_program};
pub use bench_suite::{BenchSuite, bench_suite};
pub use engine::{SimOptions, simulate, simulate_programs, simulate_unshared};
pub use error::SimError;
pub use memory::{MemoryReport, MemorySample};
pub use metrics::{Breakdown, CategoryTime};
pub use profile::{HardwareProfile, ProfileError};
pub use result::{CollectiveStats, RankResult, SimResult};
pub use shape::GroupShape;
pub use workload::{SimUnit, Workload};

/// The crate version, so the CLI can report which simulator produced a prediction.
pub const SIM_VERSION: &str = env!("CARGO_PKG_VERSION");
