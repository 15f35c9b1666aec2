//! The gate's lock file (`hpfsdp.lock`): the accepted plan digest and predicted figures of
//! every gated scenario, one TOML table per scenario, so a plan change shows up in review as
//! a readable diff of the lock.

use anyhow::{Context, Result, bail};
use hpfsdp_plan::input_file::read_text;
use hpfsdp_plan::limits::LOCK_FILE;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The header written above the tables.
const HEADER: &str =
    "# hpfsdp gate lock: the accepted plan digest and predicted figures of each gated
# scenario. Written by `hpfsdp gate ... --update`; review its diff like code.
";

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
    /// Reads a lock file; errors name the file, the line and the fix.
    pub fn load(path: &Path) -> Result<Self> {
        let text = read_text(path, &LOCK_FILE).with_context(|| {
            format!(
                "cannot read the lock file {}; create it with `hpfsdp gate <scenarios> --lock {} --update`",
                path.display(),
                path.display()
            )
        })?;
        let lock: Lock = toml::from_str(&text).map_err(|e| {
            let line = e.span().map_or(0, |s| {
                text[..s.start.min(text.len())].matches('\n').count() + 1
            });
            anyhow::anyhow!(
                "{}:{line}: {}; regenerate the lock with --update",
                path.display(),
                e.message().trim()
            )
        })?;
        if let Some(bad) = crate::commands::gate::lock_check::first_bad_figure(&lock) {
            bail!(
                "{}{}: {}; fix the entry or regenerate the lock with --update",
                path.display(),
                crate::commands::gate::lock_check::line_of(&text, &bad)
                    .map_or(String::new(), |l| format!(":{l}")),
                bad
            );
        }
        Ok(lock)
    }

    /// The tokens per step a locked strategy was measured with: recorded, or derived from its
    /// tokens/s and step time.
    pub fn tokens_per_step(locked: &StrategyLock) -> Option<u64> {
        locked.tokens_per_step.or_else(|| {
            let t = locked.tokens_per_s? * locked.step_time_s;
            (t.is_finite() && t >= 0.5).then(|| t.round() as u64)
        })
    }

    /// Writes the lock (header comment, then TOML with scenarios in name order).
    pub fn save(&self, path: &Path) -> Result<()> {
        let body = toml::to_string(self).context("serializing the lock")?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, format!("{HEADER}\n{body}"))
            .with_context(|| format!("writing the lock file {}", path.display()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_toml() {
        let mut lock = Lock {
            tool_version: "0.1.0".into(),
            ..Lock::default()
        };
        let mut s = ScenarioLock {
            file: "scenarios/paper/exp-b.toml".into(),
            plan_digest: "ab".repeat(32),
            plan_entries: [("fsdp.units".to_string(), "0123456789abcdef".to_string())].into(),
            hardware: "ascend-910c-a3".into(),
            profile_digest: "de".repeat(32),
            verify: Some("scenarios/verify/moe-ep2-fsdp2-muon.toml".into()),
            ..ScenarioLock::default()
        };
        s.strategy.insert(
            "fsdp2".into(),
            StrategyLock {
                step_time_s: 1.25,
                tokens_per_s: Some(1000.5),
                tokens_per_step: Some(1251),
                peak_memory_bytes: 42,
                tier_bytes: [("intra-machine".to_string(), 7u64)].into(),
                optimizer_tier_bytes: BTreeMap::new(),
            },
        );
        lock.scenario.insert("exp-b".into(), s);
        let dir = std::env::temp_dir().join(format!("hpfsdp-lock-{}", std::process::id()));
        let path = dir.join("hpfsdp.lock");
        lock.save(&path).unwrap();
        assert_eq!(Lock::load(&path).unwrap(), lock);
        std::fs::write(&path, "tool_version = 1\n").unwrap();
        let err = Lock::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("hpfsdp.lock:1") && err.contains("--update"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_shipped_lock_loads_and_derives_tokens_per_step() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("hpfsdp.lock");
        let lock = Lock::load(&path).expect("hpfsdp.lock is accepted as it is");
        let exp_a = &lock.scenario["exp-a-mbs1"].strategy["hyperparallel"];
        assert_eq!(exp_a.tokens_per_step, None);
        assert_eq!(Lock::tokens_per_step(exp_a), Some(131_072));
    }
}
