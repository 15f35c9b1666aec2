//! Reading and writing the gate's lock file: TOML under a header comment, read with the
//! input-file cap and checked figure by figure ([`super::lock_check`]) so a bad entry is
//! named with its line.

use crate::commands::gate::lock::Lock;
use crate::commands::gate::lock_check::{first_bad_figure, line_of};
use anyhow::{Context, Result, bail};
use hpfsdp_plan::input_file::read_text;
use hpfsdp_plan::limits::LOCK_FILE;
use std::path::Path;

/// The header written above the tables.
const HEADER: &str =
    "# hpfsdp gate lock: the accepted plan digest and predicted figures of each gated
# scenario. Written by `hpfsdp gate ... --update`; review its diff like code.
";

/// Reads a lock file; errors name the file, the line and the fix.
pub fn load(path: &Path) -> Result<Lock> {
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
    if let Some(bad) = first_bad_figure(&lock) {
        bail!(
            "{}{}: {}; fix the entry or regenerate the lock with --update",
            path.display(),
            line_of(&text, &bad).map_or(String::new(), |l| format!(":{l}")),
            bad
        );
    }
    Ok(lock)
}

/// Writes the lock (header comment, then TOML with scenarios in name order).
pub fn save(lock: &Lock, path: &Path) -> Result<()> {
    let body = toml::to_string(lock).context("serializing the lock")?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, format!("{HEADER}\n{body}"))
        .with_context(|| format!("writing the lock file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::gate::lock::{ScenarioLock, StrategyLock};
    use std::collections::BTreeMap;

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
        save(&lock, &path).unwrap();
        assert_eq!(load(&path).unwrap(), lock);
        std::fs::write(&path, "tool_version = 1\n").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(
            err.contains("hpfsdp.lock:1") && err.contains("--update"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_shipped_lock_loads_and_derives_tokens_per_step() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("hpfsdp.lock");
        let lock = load(&path).expect("hpfsdp.lock is accepted as it is");
        let exp_a = &lock.scenario["exp-a-mbs1"].strategy["hyperparallel"];
        assert_eq!(exp_a.tokens_per_step, None);
        assert_eq!(Lock::tokens_per_step(exp_a), Some(131_072));
    }
}
