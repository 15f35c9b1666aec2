//! The options a strategy runs with ([`StrategyOptions`]), the strategies ([`StrategyKind`])
//! and why a program cannot be generated ([`StrategyError`]).

use super::tp_comm_overlap::TpCommOverlap;
use crate::step::ProgramError;
use hpfsdp_plan::model::DType;
use hpfsdp_plan::scenario::Scenario;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The strategies a step program can be generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// HyperParallel-FSDP: per-parameter zero-copy AG/RS, fused replica all-reduce, four-step
    /// post-backward pipeline.
    HyperParallel,
    /// PyTorch FSDP2 (`fully_shard`): fused units with copy-in/copy-out.
    Fsdp2,
    /// Megatron-LM DDP with the distributed optimizer and gradient buckets.
    MegatronDdp,
}

impl StrategyKind {
    /// Every strategy, in a stable order.
    pub const ALL: [StrategyKind; 3] = [
        StrategyKind::HyperParallel,
        StrategyKind::Fsdp2,
        StrategyKind::MegatronDdp,
    ];

    /// The scenario-file name (`hyperparallel`, `fsdp2`, `megatron-ddp`).
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::HyperParallel => "hyperparallel",
            StrategyKind::Fsdp2 => "fsdp2",
            StrategyKind::MegatronDdp => "megatron-ddp",
        }
    }

    /// Parses a scenario-file name; unknown names give an error listing the known ones.
    pub fn parse(name: &str) -> Result<Self, StrategyError> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| StrategyError::UnknownStrategy {
                name: name.to_string(),
            })
    }
}

impl std::str::FromStr for StrategyKind {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl std::fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a program cannot be generated. Messages name the scenario key and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StrategyError {
    /// A strategy name that is not known.
    #[error(
        "[fsdp] strategy/baselines: unknown strategy '{name}'; use one of hyperparallel, fsdp2, megatron-ddp"
    )]
    UnknownStrategy {
        /// The name given.
        name: String,
    },
    /// The global batch is not a whole number of micro-batches per data-parallel rank.
    #[error(
        "[train] global_batch {global_batch} is not a multiple of micro_batch {micro_batch} x data-parallel degree {dp} (dp_replicate x dp_shard); change global_batch or micro_batch so that gradient accumulation has a whole number of micro-batches"
    )]
    IndivisibleBatch {
        /// `[train] global_batch`.
        global_batch: u64,
        /// `[train] micro_batch`.
        micro_batch: u64,
        /// Data-parallel degree.
        dp: u64,
    },
    /// A zero in the training shape.
    #[error("[train] {key} = 0; it must be positive")]
    ZeroShape {
        /// The key.
        key: &'static str,
    },
    /// The FSDP plan and the sharding plan disagree (they must come from the same scenario).
    #[error(
        "the FSDP plan does not match the sharding plan ({detail}); build both from the same scenario with build_fsdp_plan(scenario, plan)"
    )]
    PlanMismatch {
        /// What differs.
        detail: String,
    },
    /// A rank outside the job.
    #[error("rank {rank} is outside the job of {world_size} ranks")]
    RankOutOfRange {
        /// The rank asked for.
        rank: usize,
        /// Ranks in the job.
        world_size: usize,
    },
    /// An optimizer strategy name that is not known.
    #[error(
        "[optimizer] baselines: unknown optimizer strategy '{name}'; use one of adamw, hyperparallel, naive, moonlight, dmuon, matrixfsdp, flexshard"
    )]
    UnknownOptimizer {
        /// The name given.
        name: String,
    },
    /// A Muon optimizer strategy asked for on a scenario whose optimizer is AdamW only.
    #[error(
        "optimizer strategy '{optimizer}' needs Muon parameters, but [optimizer] kind = \"{kind}\" routes every parameter to AdamW; set kind = \"muon+adamw\" or use the adamw optimizer strategy"
    )]
    OptimizerKindMismatch {
        /// The optimizer strategy.
        optimizer: &'static str,
        /// `[optimizer] kind`.
        kind: String,
    },
    /// An optimizer strategy that does not run on this FSDP strategy.
    #[error(
        "optimizer strategy '{optimizer}' changes parameter placement and runs only on the hyperparallel FSDP strategy, not on '{strategy}'; set [fsdp] strategy = \"hyperparallel\" or pick another optimizer strategy"
    )]
    UnsupportedOptimizer {
        /// The optimizer strategy.
        optimizer: &'static str,
        /// The FSDP strategy.
        strategy: &'static str,
    },
    /// A TP communication overlap mode or chunk count that is not known.
    #[error(
        "[train] tp_comm_overlap = \"{mode}\" with tp_comm_overlap_chunks = {chunks:?}; use tp_comm_overlap = \"none\" or \"fused\", and a positive tp_comm_overlap_chunks (or none: the TP degree)"
    )]
    TpCommOverlap {
        /// `[train] tp_comm_overlap`.
        mode: String,
        /// `[train] tp_comm_overlap_chunks`.
        chunks: Option<u64>,
    },
    /// The generated program failed validation (a bug in a strategy).
    #[error("generated program is invalid: {0}")]
    Program(#[from] ProgramError),
}

/// The options one strategy runs with: the scenario's `[fsdp]` values overridden by
/// `[fsdp.variant.<strategy>]`, plus the training shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StrategyOptions {
    /// The strategy.
    pub kind: StrategyKind,
    /// Units (or buckets) prefetched ahead in forward and backward.
    pub prefetch_depth: usize,
    /// Free gathered parameters after forward and gather them again in backward.
    pub reshard_after_forward: bool,
    /// Free gathered parameters after backward.
    pub reshard_after_backward: bool,
    /// Megatron gradient bucket size in bytes (`None`: Megatron's default of
    /// max(40M, 1M x dp) elements).
    pub bucket_bytes: Option<u64>,
    /// Gathered-parameter (compute) dtype.
    pub param_dtype: DType,
    /// Gradient-reduction dtype.
    pub reduce_dtype: DType,
    /// Master (sharded parameter) dtype.
    pub master_dtype: DType,
    /// Reduced gradients kept in an FP32 `main_grad`, not cast back to the master dtype
    /// (`[fsdp] fp32_main_grad`).
    pub fp32_main_grad: bool,
    /// Micro-batches per optimizer step (gradient accumulation steps).
    pub grad_accum_steps: u64,
    /// Sequences per micro-batch per data-parallel rank.
    pub micro_batch: u64,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// TP collectives fused with the neighbouring GEMMs (`[train] tp_comm_overlap`).
    pub tp_comm_overlap: TpCommOverlap,
    /// AdamW's decoupled weight decay is on (`[optimizer.adamw] weight_decay != 0`): torch's
    /// AdamW then runs one more pass over the parameters ([`super::torch_adamw`]).
    pub adamw_weight_decay: bool,
}

impl StrategyOptions {
    /// Resolves the options of `kind` from a scenario; checks the gradient-accumulation shape.
    pub fn resolve(scenario: &Scenario, kind: StrategyKind) -> Result<Self, StrategyError> {
        let f = &scenario.file.fsdp;
        let t = &scenario.file.train;
        for (key, v) in [
            ("seq_len", t.seq_len),
            ("global_batch", t.global_batch),
            ("micro_batch", t.micro_batch),
        ] {
            if v == 0 {
                return Err(StrategyError::ZeroShape { key });
            }
        }
        let m = &scenario.file.mesh;
        let dp = (m.dp_replicate * m.dp_shard) as u64;
        let per_step = t.micro_batch * dp;
        if per_step == 0 || !t.global_batch.is_multiple_of(per_step) {
            return Err(StrategyError::IndivisibleBatch {
                global_batch: t.global_batch,
                micro_batch: t.micro_batch,
                dp,
            });
        }
        let v = f.variant.get(kind.name()).cloned().unwrap_or_default();
        let tp_comm_overlap =
            TpCommOverlap::resolve(&t.tp_comm_overlap, t.tp_comm_overlap_chunks, m.tp as u64)
                .ok_or_else(|| StrategyError::TpCommOverlap {
                    mode: t.tp_comm_overlap.clone(),
                    chunks: t.tp_comm_overlap_chunks,
                })?;
        Ok(Self {
            kind,
            prefetch_depth: v.prefetch_depth.unwrap_or(f.prefetch_depth),
            reshard_after_forward: v.reshard_after_forward.unwrap_or(f.reshard_after_forward),
            reshard_after_backward: f.reshard_after_backward,
            bucket_bytes: v.bucket_bytes,
            param_dtype: scenario.param_dtype,
            reduce_dtype: scenario.reduce_dtype,
            master_dtype: scenario.master_dtype,
            fp32_main_grad: f.fp32_main_grad,
            grad_accum_steps: t.global_batch / per_step,
            micro_batch: t.micro_batch,
            seq_len: t.seq_len,
            tp_comm_overlap,
            adamw_weight_decay: scenario.file.optimizer.adamw.weight_decay != 0.0,
        })
    }
}
