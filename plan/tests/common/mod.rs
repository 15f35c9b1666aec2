//! Helpers shared by the plan crate's integration tests: a scenario with its sharding and FSDP
//! plans.

use hpfsdp_plan::fsdp::{FsdpPlan, build_fsdp_plan};
use hpfsdp_plan::planner::{ShardingPlan, plan};
use hpfsdp_plan::scenario::Scenario;
use std::path::PathBuf;

/// A scenario and the plans derived from it.
pub struct Plans {
    /// The scenario.
    pub s: Scenario,
    /// Its sharding plan (lint-clean).
    pub p: ShardingPlan,
    /// Its FSDP/HSDP plan.
    pub f: FsdpPlan,
}

/// The repository's `scenarios/` directory.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

/// Derives the plans of `s`, asserting the sharding plan has no lint errors.
pub fn plans_of(s: Scenario) -> Plans {
    let p = plan(&s.model, &s.planner_input());
    assert!(!p.has_errors(), "{:?}", p.lints);
    let f = build_fsdp_plan(&s, &p);
    Plans { s, p, f }
}
