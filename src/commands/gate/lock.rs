//! The gate's lock (`hpfsdp.lock`): the accepted plan digest and predicted figures of every
//! gated scenario, one TOML table per scenario, so a plan change shows up in review as a
//! readable diff of the lock. Reading and writing the file: [`super::lock_file`].

use anyhow::{Result, bail};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The whole lock file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    /// Version of the `hpfsdp` that wrote the lock.
    pub tool_version: String,
    /// One entry per scenario, by scenario name.
    #[serde(default)]
    pub scenario: BTreeMap<String, ScenarioLock>,
}

/// The accepted state of one scenario.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioLock {
    /// The scenario file, as given to the gate.
    pub file: String,
    /// Digest of its sharding, FSDP and Muon plans.
    pub plan_digest: String,
    /// Short digest of each plan entry (`fsdp.units`, ...), so a changed digest can name the
    /// entries that changed (absent in locks written before they were recorded).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub plan_entries: IndexMap<String, String>,
    /// Hardware profile name.
    pub hardware: String,
    /// Digest of the hardware profile the figures were predicted with.
    pub profile_digest: String,
    /// The verification scenario run for it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<String>,
    /// Figures per simulated strategy, by strategy name.
    #[serde(default)]
    pub strategy: BTreeMap<String, StrategyLock>,
}

/// The accepted predicted figures of one strategy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyLock {
    /// Predicted step time, seconds.
    pub step_time_s: f64,
    /// Tokens per second of the whole job (absent when the scenario has no tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// Tokens per step of the whole job (absent in older locks: then `tokens_per_s x
    /// step_time_s`, rounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_step: Option<u64>,
    /// Highest peak memory over ranks, bytes.
    pub peak_memory_bytes: u64,
    /// Bytes per step per tier on the critical rank.
    #[serde(default)]
    pub tier_bytes: BTreeMap<String, u64>,
    /// The optimizer step's bytes per tier on the critical rank.
    #[serde(default)]
    pub optimizer_tier_bytes: BTreeMap<String, u64>,
}

impl Lock {
    /// The tokens per step a locked strategy was measured with: recorded, or derived from its
    /// tokens/s and step time.
    pub fn tokens_per_step(locked: &StrategyLock) -> Option<u64> {
        locked.tokens_per_step.or_else(|| {
            let t = locked.tokens_per_s? * locked.step_time_s;
            (t.is_finite() && t >= 0.5).then(|| t.round() as u64)
        })
    }

    /// Checks that no two gated files share a scenario name (the lock's key).
    pub fn check_unique_names<'a>(names: impl Iterator<Item = (&'a str, &'a str)>) -> Result<()> {
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, file) in names {
            if let Some(first) = seen.insert(name, file) {
                bail!(
                    "{file} and {first} are both called '{name}'; the lock keys scenarios by name, so give each a unique `name`"
                );
            }
        }
        Ok(())
    }
}
