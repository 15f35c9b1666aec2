//! hpfsdp-program: the step program, the schedule of one training step for one rank (ops on
//! streams with dependencies, collectives with groups, tiers and bytes, kernel mixes), and the
//! strategies that generate it from a plan (`hyperparallel`, `fsdp2`, `megatron-ddp` and the
//! Muon baselines). It is the contract the simulator, the reference executor and the backends
//! share: the simulator times a program, the reference executor's collective trace must equal
//! it, and replay executes it.

pub mod step;
pub mod strategy;

pub use step::{
    Category, CollectiveOp, ComputeWork, CopyWork, Group, GroupId, MemTag, MemoryEffect, Op,
    OpDeps, OpId, OpMemory, OpSpan, Payload, ProgramBuilder, ProgramError, RankRange, RankTimeline,
    ResidentMemory, StepProgram, Stream, Timeline, TimelineKind, TimelineSource,
};
pub use strategy::{ProgramGenerator, StrategyError, StrategyKind, StrategyOptions};
