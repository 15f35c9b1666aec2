//! Helpers shared by the plan crate's integration tests: a scenario with its sharding and FSDP
//! plans.

// Every test crate compiles this module and uses a subset of it.
#![allow(dead_code)]

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

/// A verify miniature (`rel` under `scenarios/`) with its optimizer switched to Muon + AdamW.
pub fn verify_muon(rel: &str) -> Plans {
    let path = root().join(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("kind = \"adamw\""), "{rel}");
    let text = text.replacen("kind = \"adamw\"", "kind = \"muon+adamw\"", 1);
    plans_of(Scenario::from_str_at(&text, &path).unwrap_or_else(|e| panic!("{rel}: {e}")))
}

/// The exp-d miniature fixture (per-expert weights, EP classes).
pub fn mini_exp_d() -> Plans {
    let at = root().join("fixtures/mini-exp-d.toml");
    plans_of(Scenario::load(&at).unwrap_or_else(|e| panic!("mini-exp-d: {e}")))
}

/// Five verify miniatures switched to Muon (HSDP, EP, TP, MLA, uneven shards) and mini-exp-d:
/// the scenarios the program-shape tests walk.
pub fn muon_miniatures() -> Vec<Plans> {
    let mut all: Vec<Plans> = [
        "verify/dense-hsdp2x4.toml",
        "verify/moe-ep2-fsdp2.toml",
        "verify/dense-tp2-fsdp2.toml",
        "verify/mla-hsdp2x2.toml",
        "verify/uneven-fsdp3.toml",
    ]
    .iter()
    .map(|rel| verify_muon(rel))
    .collect();
    all.push(mini_exp_d());
    all
}

/// The scenario at `rel` under `scenarios/`, loaded as `hpfsdp` loads it.
pub fn scenario(rel: &str) -> Scenario {
    let path = root().join(rel);
    Scenario::load(&path).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

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
