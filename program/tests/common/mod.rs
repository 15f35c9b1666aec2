//! Helpers shared by the program crate's integration tests: the plan crate's test helpers
//! (scenarios with their sharding and FSDP plans, `plan/tests/common`) and rank 0's program.

// Every test crate compiles this module and uses a subset of it.
#![allow(dead_code)]

#[path = "../../../plan/tests/common/mod.rs"]
mod plan_common;

pub use plan_common::*;

use hpfsdp_plan::fsdp::build_fsdp_plan;
use hpfsdp_plan::planner::plan;
use hpfsdp_plan::scenario::Scenario;

/// Rank 0's step program of `s` under `kind`.
pub fn rank0_program(
    s: &Scenario,
    kind: hpfsdp_program::strategy::StrategyKind,
) -> hpfsdp_program::step::StepProgram {
    let p = plan(&s.model, &s.planner_input());
    let f = build_fsdp_plan(s, &p);
    hpfsdp_program::strategy::ProgramGenerator::new(s, &p, &f, kind)
        .unwrap()
        .program(0)
        .unwrap()
}
