//! The gate's plan-digest check: the plan's digest against the lock's, and when it changed,
//! the plan entries (`sharding.params`, `fsdp.units`, ...) whose own digests differ, so the
//! reviewer knows where to look.

use crate::commands::gate::evaluate::Evaluated;
use crate::commands::gate::lock::ScenarioLock;
use crate::commands::gate::outcome::Status;
use indexmap::IndexMap;

/// Entries named in a digest failure's message (the diff lists them all).
const NAMED_ENTRIES: usize = 3;

/// The entries whose digests differ between `locked` and `now`, in plan order: changed,
/// added (only now) and removed (only locked) ones, each with its locked and current digest.
pub fn changed_entries(
    locked: &IndexMap<String, String>,
    now: &IndexMap<String, String>,
) -> Vec<(String, Option<String>, Option<String>)> {
    let mut out: Vec<(String, Option<String>, Option<String>)> = now
        .iter()
        .filter(|(k, v)| locked.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), locked.get(k).cloned(), Some(v.clone())))
        .collect();
    out.extend(
        locked
            .iter()
            .filter(|(k, _)| !now.contains_key(*k))
            .map(|(k, v)| (k.clone(), Some(v.clone()), None)),
    );
    out
}

/// Status, message and diff of the plan-digest check.
pub fn digest_check(
    eval: &Evaluated,
    locked: Option<&ScenarioLock>,
    update: bool,
) -> (Status, String, String) {
    let now = &eval.plan.digest;
    match locked {
        None if update => (
            Status::Pass,
            format!("recorded plan digest {}", &now[..12.min(now.len())]),
            String::new(),
        ),
        None => (
            Status::Fail,
            format!(
                "'{}' is not in the lock; review its plan and run the gate with --update to record it",
                eval.name
            ),
            format!("+ plan_digest = \"{now}\""),
        ),
        Some(l) if &l.plan_digest == now => {
            (Status::Pass, "plan digest unchanged".into(), String::new())
        }
        Some(l) => changed(eval, l, update),
    }
}

fn changed(eval: &Evaluated, l: &ScenarioLock, update: bool) -> (Status, String, String) {
    let now = &eval.plan.digest;
    let mut diff = format!(
        "- plan_digest = \"{}\"\n+ plan_digest = \"{now}\"",
        l.plan_digest
    );
    let what = if l.plan_entries.is_empty() {
        " (the lock records no per-entry digests; --update records them)".to_string()
    } else {
        let entries = changed_entries(&l.plan_entries, &eval.plan.entries);
        for (k, before, after) in &entries {
            if let Some(b) = before {
                diff.push_str(&format!("\n- {k} = {b}"));
            }
            if let Some(a) = after {
                diff.push_str(&format!("\n+ {k} = {a}"));
            }
        }
        let names: Vec<&str> = entries
            .iter()
            .take(NAMED_ENTRIES)
            .map(|e| e.0.as_str())
            .collect();
        let more = entries.len().saturating_sub(NAMED_ENTRIES);
        format!(
            " in {}{}",
            names.join(", "),
            if more > 0 {
                format!(
                    " and {more} more entr{}",
                    if more == 1 { "y" } else { "ies" }
                )
            } else {
                String::new()
            }
        )
    };
    (
        if update { Status::Pass } else { Status::Fail },
        format!(
            "plan digest changed{what}{}: review the plan (`hpfsdp plan {}`){}",
            if update {
                " and was accepted (--update)"
            } else {
                ""
            },
            eval.file,
            if update {
                ""
            } else {
                " and run the gate with --update to accept it"
            }
        ),
        diff,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> IndexMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn names_changed_added_and_removed_entries_in_plan_order() {
        let locked = map(&[
            ("sharding.params", "a"),
            ("fsdp.units", "b"),
            ("muon.gone", "c"),
        ]);
        let now = map(&[
            ("sharding.params", "a"),
            ("fsdp.units", "B"),
            ("muon.new", "d"),
        ]);
        let c = changed_entries(&locked, &now);
        let names: Vec<&str> = c.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, ["fsdp.units", "muon.new", "muon.gone"]);
        assert_eq!(c[0].1.as_deref(), Some("b"));
        assert_eq!(c[1].1, None);
        assert_eq!(c[2].2, None);
    }
}
