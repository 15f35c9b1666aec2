//! The options of `hpfsdp replay` and their defaults.

use crate::commands::limits;
use hpfsdp_backends::replay::{ComputeMode, FaultInjection};
use hpfsdp_backends::select::BackendKind;
use std::path::PathBuf;

/// Measured steps by default: enough for a median and a spread.
pub const DEFAULT_STEPS: usize = 5;
/// Warm-up steps by default: the first steps pay for first-touch allocations, communicator
/// set-up and cold caches.
pub const DEFAULT_WARMUP: usize = 2;

/// Options of `hpfsdp replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Scenario file (TOML).
    pub scenario: PathBuf,
    /// Collective backend: inproc (threads), mpi, hccl or nccl (one rank per process).
    #[arg(long, value_parser = crate::commands::flags::parse_backend)]
    pub backend: BackendKind,
    /// FSDP strategy whose programs are replayed (default: the scenario's).
    #[arg(long, value_name = "S")]
    pub strategy: Option<String>,
    /// Shrink the mesh to N ranks (dp_shard shrinks first; tp, cp, ep kept); 1 to 4096, at
    /// most the scenario's ranks, and at most 64 on --backend inproc.
    #[arg(long, value_name = "N", value_parser = limits::count_in(1, limits::REPLAY_MAX_RANKS))]
    pub ranks: Option<usize>,
    /// Truncate the model to L decoder layers (1 to the model's layers).
    #[arg(long, value_name = "L", value_parser = limits::count_in(1, limits::REPLAY_MAX_LAYERS))]
    pub layers: Option<usize>,
    /// Measured steps, 1 to 1000 (the median one is shown; their spread is reported).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_STEPS,
          value_parser = limits::count_in(1, limits::REPLAY_MAX_STEPS))]
    pub steps: usize,
    /// Unmeasured warm-up steps before them, 0 to 1000 (allocators, communicators, caches
    /// and clocks settle: the first step of a run is never a warm step).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WARMUP,
          value_parser = limits::count_in(0, limits::REPLAY_MAX_WARMUP))]
    pub warmup: usize,
    /// Output directory (default out/replay/<scenario>, under the ignored `out/` folder).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// A collective not complete after T seconds is a fault (hung or dead peer).
    #[arg(long = "timeout-s", default_value_t = 60.0, value_name = "T")]
    pub timeout_s: f64,
    /// busy: compute and copy ops spin for their predicted time; real: f32 GEMMs and copies.
    #[arg(long, default_value = "busy", value_parser = crate::commands::flags::parse_compute)]
    pub compute: ComputeMode,
    /// Hardware profile of the prediction (default cpu-mpi for inproc/mpi, the scenario's
    /// for hccl/nccl).
    #[arg(long)]
    pub hardware: Option<String>,
    /// Test hook: RANK:OP:KIND with KIND panic, error, hang or mismatch.
    #[arg(long = "inject-fault", hide = true, value_parser = crate::commands::flags::parse_fault)]
    pub inject_fault: Option<FaultInjection>,
    #[command(flatten)]
    pub lint: crate::commands::lint_gate::LintArgs,
}
