//! What a simulation records and reports ([`SimOptions`]), shared by the engine and the
//! results it assembles ([`crate::result`]).

use serde::{Deserialize, Serialize};

/// Switches of one simulation run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimOptions {
    /// HyperParallel validation mode: charge every op's extra CPU operator events
    /// ([`hpfsdp_program::step::Op::validation_cpu_events`]) at the profile's
    /// `validation_us_per_cpu_event` (see [`crate::host_cost`]).
    pub validation_mode: bool,
    /// Keep per-op spans of every simulated rank in the result's timeline.
    pub record_timeline: bool,
    /// Keep the memory-over-time series of every simulated rank.
    pub record_memory_series: bool,
    /// Tokens processed per step by the whole job (gives tokens/s).
    pub tokens_per_step: Option<u64>,
    /// Model FLOPs per step of the whole job, recompute excluded (gives MFU).
    pub model_flops_per_step: Option<f64>,
    /// Keep every simulated rank's breakdown (and timeline, when recorded). Off: only the
    /// critical rank gets a breakdown and the timeline holds the units of rank 0 and of the
    /// critical rank, the ones a summary reports; at thousands of classes the per-rank
    /// breakdowns and spans cost more than the simulation. Memory figures are kept for all.
    #[serde(default = "keep_all_ranks")]
    pub all_ranks: bool,
}

fn keep_all_ranks() -> bool {
    true
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            validation_mode: false,
            record_timeline: true,
            record_memory_series: true,
            tokens_per_step: None,
            model_flops_per_step: None,
            all_ranks: true,
        }
    }
}
