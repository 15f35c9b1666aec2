//! The figures `gate` and `sweep` compare across scenarios: the plan digest and lint of a
//! scenario, and per simulated strategy its step time, tokens/s, peak memory and bytes per tier.
//!
//! Both commands derive them here from the same library calls `plan` and `simulate` use
//! ([`ScenarioPlans`], [`simulate_strategy`], [`summarize`]), so a gate lock, a sweep row and
//! a `simulate` table never disagree.

use crate::commands::sim_summary::summarize;
use anyhow::{Context, Result};
use hpfsdp_plan::muon::build_muon_plan;
use hpfsdp_plan::planner::lint::Severity;
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::scenario_run::{RunOptions, ScenarioPlans, SimJob, simulate_strategy};
use indexmap::IndexMap;
use std::collections::BTreeMap;

/// The plan side of a scenario: its digest and its lint.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanCheck {
    /// Digest of the sharding, FSDP and Muon plans together (as `hpfsdp plan --json` prints).
    pub digest: String,
    /// Lint errors (sharding plan, then Muon plan), one line each.
    pub errors: Vec<String>,
    /// Lint warnings, one line each.
    pub warnings: Vec<String>,
    /// Short digest of every plan entry (`sharding.params`, `fsdp.units`, `muon.batches`, ...),
    /// in plan order, so a digest change can name what changed.
    pub entries: IndexMap<String, String>,
}

/// Hex characters kept of each plan entry's digest (64 bits: enough to tell entries apart).
pub const ENTRY_DIGEST_CHARS: usize = 16;

/// The predicted figures of one simulated strategy.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunFigures {
    /// Strategy name as `simulate` prints it (`hyperparallel`, `fsdp2`, `hyperparallel+dmuon`).
    pub strategy: String,
    /// Optimizer strategy of its programs.
    pub optimizer: String,
    /// Predicted step time, seconds.
    pub step_time_s: f64,
    /// Tokens per second of the whole job.
    pub tokens_per_s: Option<f64>,
    /// Tokens the whole job processes per step (the workload the step time is for).
    pub tokens_per_step: Option<u64>,
    /// Highest peak memory over ranks, bytes.
    pub peak_memory_bytes: u64,
    /// The device's HBM capacity, bytes.
    pub hbm_capacity_bytes: u64,
    /// True when the peak fits the HBM.
    pub memory_fits: bool,
    /// Receive-buffer bytes per step per tier on the critical rank.
    pub tier_bytes: BTreeMap<String, u64>,
    /// The optimizer step's bytes per tier on the critical rank.
    pub optimizer_tier_bytes: BTreeMap<String, u64>,
}

/// Digest and lint of a scenario's plans.
pub fn plan_check(plans: &ScenarioPlans) -> PlanCheck {
    let muon = build_muon_plan(&plans.scenario, &plans.sharding, &plans.fsdp);
    let digest = hpfsdp_plan::digest::digest_json(&(&plans.sharding, &plans.fsdp, &muon));
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    for l in plans.sharding.lints.iter().chain(&muon.lints) {
        match l.severity {
            Severity::Error => errors.push(l.to_string()),
            Severity::Warning => warnings.push(l.to_string()),
        }
    }
    PlanCheck {
        digest,
        errors,
        warnings,
        entries: plan_entries(&[
            ("sharding", serde_json::to_value(&plans.sharding)),
            ("fsdp", serde_json::to_value(&plans.fsdp)),
            ("muon", serde_json::to_value(&muon)),
        ]),
    }
}

/// One short digest per top-level field of each plan (`<plan>.<field>`), in plan order.
fn plan_entries(
    plans: &[(&str, serde_json::Result<serde_json::Value>)],
) -> IndexMap<String, String> {
    let mut out = IndexMap::new();
    for (name, value) in plans {
        match value {
            Ok(serde_json::Value::Object(fields)) => {
                for (field, v) in fields {
                    out.insert(format!("{name}.{field}"), short_digest(v));
                }
            }
            Ok(other) => {
                out.insert(name.to_string(), short_digest(other));
            }
            Err(e) => {
                out.insert(name.to_string(), format!("unserializable: {e}"));
            }
        }
    }
    out
}

fn short_digest(v: &serde_json::Value) -> String {
    let mut d = hpfsdp_plan::digest::digest_json(v);
    d.truncate(ENTRY_DIGEST_CHARS);
    d
}

/// Simulates one job (folded, without a timeline: only the summary figures are kept).
pub fn simulate_job(
    plans: &ScenarioPlans,
    job: &SimJob,
    profile: &HardwareProfile,
) -> Result<RunFigures> {
    let options = RunOptions {
        fold: true,
        validation_mode: false,
        record_timeline: false,
        optimizer: job.optimizer.clone(),
        // The figures need the critical rank and the memory spread, not every rank's timeline.
        all_ranks: false,
    };
    let label = match &job.optimizer {
        Some(o) => format!("{} with optimizer {o}", job.strategy),
        None => job.strategy.clone(),
    };
    let run = simulate_strategy(plans, &job.strategy, profile, &options)
        .with_context(|| format!("simulating strategy '{label}'"))?;
    let s = summarize(&run);
    Ok(RunFigures {
        strategy: s.strategy.clone(),
        optimizer: s.optimizer.clone(),
        step_time_s: s.step_time_s,
        tokens_per_s: s.tokens_per_s,
        tokens_per_step: Some(plans.scenario.tokens_per_step()).filter(|t| *t > 0),
        peak_memory_bytes: s.peak_memory_bytes,
        hbm_capacity_bytes: profile.device.hbm_capacity_bytes,
        memory_fits: s.memory_fits,
        tier_bytes: s
            .tier_bytes
            .iter()
            .map(|(k, t)| (k.clone(), t.bytes))
            .collect(),
        optimizer_tier_bytes: s
            .optimizer_figures
            .as_ref()
            .map(|o| o.tier_bytes.clone())
            .unwrap_or_default(),
    })
}
