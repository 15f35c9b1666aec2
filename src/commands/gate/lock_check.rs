//! Validation of the figures read from a lock: every number finite and in range, every digest
//! well-formed, so a hand-edited or corrupted lock (`step_time_s = nan`, a negative tokens/s)
//! fails naming its entry instead of passing as "NaN% vs the lock".

use crate::commands::gate::lock::{Lock, ScenarioLock, StrategyLock};
use std::fmt;

/// One out-of-range figure of a lock.
#[derive(Debug, Clone, PartialEq)]
pub struct BadFigure {
    /// The TOML table holding it (`scenario.exp-b.strategy.fsdp2`).
    pub table: String,
    /// The key (`step_time_s`).
    pub key: &'static str,
    /// The value as read.
    pub value: String,
    /// What the value must be.
    pub rule: &'static str,
}

impl fmt::Display for BadFigure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{} = {}: {}",
            self.table, self.key, self.value, self.rule
        )
    }
}

/// The first bad figure of `lock`, scenarios and strategies in name order.
pub fn first_bad_figure(lock: &Lock) -> Option<BadFigure> {
    lock.scenario
        .iter()
        .find_map(|(name, s)| scenario_bad(&format!("scenario.{}", key(name)), s))
}

/// `name` as a TOML key (quoted when it is not a bare key).
fn key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        name.to_string()
    } else {
        format!("{name:?}")
    }
}

fn is_digest(d: &str) -> bool {
    d.len() == 64 && d.chars().all(|c| c.is_ascii_hexdigit())
}

fn scenario_bad(table: &str, s: &ScenarioLock) -> Option<BadFigure> {
    let bad = |key, value: &str, rule| {
        Some(BadFigure {
            table: table.to_string(),
            key,
            value: format!("{value:?}"),
            rule,
        })
    };
    if !is_digest(&s.plan_digest) {
        return bad("plan_digest", &s.plan_digest, "a digest is 64 hex digits");
    }
    if !is_digest(&s.profile_digest) {
        return bad(
            "profile_digest",
            &s.profile_digest,
            "a digest is 64 hex digits",
        );
    }
    s.strategy
        .iter()
        .find_map(|(name, l)| strategy_bad(&format!("{table}.strategy.{}", key(name)), l))
}

fn strategy_bad(table: &str, l: &StrategyLock) -> Option<BadFigure> {
    let bad = |key, value: String, rule| {
        Some(BadFigure {
            table: table.to_string(),
            key,
            value,
            rule,
        })
    };
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(l.step_time_s) {
        return bad(
            "step_time_s",
            l.step_time_s.to_string(),
            "a step time is a finite number of seconds above 0",
        );
    }
    if let Some(t) = l.tokens_per_s.filter(|t| !positive(*t)) {
        return bad(
            "tokens_per_s",
            t.to_string(),
            "a throughput is a finite number of tokens per second above 0",
        );
    }
    if l.tokens_per_step == Some(0) {
        return bad(
            "tokens_per_step",
            "0".into(),
            "tokens per step are at least 1",
        );
    }
    if let (Some(tps), Some(tokens)) = (l.tokens_per_s, l.tokens_per_step) {
        let implied = tps * l.step_time_s;
        if (implied - tokens as f64).abs() > 1e-6 * tokens as f64 + 0.5 {
            return bad(
                "tokens_per_s",
                tps.to_string(),
                "tokens_per_s x step_time_s must equal tokens_per_step",
            );
        }
    }
    if l.peak_memory_bytes == 0 {
        return bad(
            "peak_memory_bytes",
            "0".into(),
            "a peak memory is at least 1 byte",
        );
    }
    None
}

/// The line (1-based) of `bad`'s key in the lock `text`: the first `key =` line after the
/// table's header, when the lock is laid out as `gate --update` writes it.
pub fn line_of(text: &str, bad: &BadFigure) -> Option<usize> {
    let header = format!("[{}]", bad.table);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| l.trim() == header)?;
    lines[start + 1..]
        .iter()
        .take_while(|l| !l.trim_start().starts_with('['))
        .position(|l| {
            l.trim_start()
                .strip_prefix(bad.key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map(|i| start + 2 + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "5be28f704a3da33b9ef336a7cad901930258d7ad849911ff9833acabe6894491";

    fn lock_text(step: &str, tps: &str) -> String {
        format!(
            "tool_version = \"0.1.0\"\n\n[scenario.exp-b]\nfile = \"x.toml\"\nplan_digest = \"{DIGEST}\"\nhardware = \"hw\"\nprofile_digest = \"{DIGEST}\"\n\n[scenario.exp-b.strategy.fsdp2]\nstep_time_s = {step}\ntokens_per_s = {tps}\npeak_memory_bytes = 5\n"
        )
    }

    fn first(text: &str) -> Option<(BadFigure, Option<usize>)> {
        let lock: Lock = toml::from_str(text).unwrap();
        first_bad_figure(&lock).map(|b| {
            let l = line_of(text, &b);
            (b, l)
        })
    }

    #[test]
    fn nan_negative_and_inconsistent_figures_are_named_with_their_line() {
        assert_eq!(first(&lock_text("2.0", "100.0")), None);
        let (b, line) = first(&lock_text("nan", "100.0")).unwrap();
        assert_eq!(b.table, "scenario.exp-b.strategy.fsdp2");
        assert_eq!((b.key, line), ("step_time_s", Some(10)));
        assert!(
            b.to_string().contains("step_time_s = NaN: a step time"),
            "{b}"
        );
        let (b, line) = first(&lock_text("2.0", "-3.5")).unwrap();
        assert_eq!((b.key, line), ("tokens_per_s", Some(11)));
        let (b, _) = first(&lock_text("-inf", "1.0")).unwrap();
        assert_eq!(b.key, "step_time_s");
        let text = lock_text("2.0", "100.0").replace(
            "peak_memory_bytes = 5",
            "peak_memory_bytes = 5\ntokens_per_step = 300",
        );
        assert_eq!(first(&text).unwrap().0.key, "tokens_per_s");
        let text = lock_text("2.0", "100.0").replace(DIGEST, "abc");
        assert_eq!(first(&text).unwrap().0.key, "plan_digest");
    }
}
