//! The gate's checks: one evaluated scenario against its lock entry. Each check passes, fails
//! (with a one-line message and, for JUnit, a diff) or is skipped (with the reason).

use crate::commands::gate::evaluate::{Evaluated, VerifyOutcome};
use crate::commands::gate::lock::{ScenarioLock, StrategyLock};
use crate::commands::scenario_figures::RunFigures;

/// The tier whose optimizer traffic the gate watches.
pub const INTER_SUPERNODE: &str = "inter-supernode";

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The check passed.
    Pass,
    /// The check failed.
    Fail,
    /// The check does not apply (the message says why).
    Skipped,
}

/// One check of one scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckOutcome {
    /// Scenario name.
    pub scenario: String,
    /// Check name (`lint`, `verify`, `plan-digest`, `step-time/<strategy>`, ...).
    pub check: String,
    /// Outcome.
    pub status: Status,
    /// One line: what was found.
    pub message: String,
    /// Locked vs now, line by line (empty when there is nothing to compare).
    pub diff: String,
}

/// How the gate compares.
#[derive(Debug, Clone, Copy)]
pub struct GateOptions {
    /// Largest accepted step-time regression vs the lock, percent.
    pub max_regression_pct: f64,
    /// Accept the new digest and figures (they are written to the lock).
    pub update: bool,
}

/// Every check of `eval` against `locked` (its lock entry, if any).
pub fn compare(
    eval: &Evaluated,
    locked: Option<&ScenarioLock>,
    options: GateOptions,
) -> Vec<CheckOutcome> {
    let mut out = Vec::new();
    let mut push = |check: String, status: Status, message: String, diff: String| {
        out.push(CheckOutcome {
            scenario: eval.name.clone(),
            check,
            status,
            message,
            diff,
        })
    };
    let (status, message) = if eval.plan.errors.is_empty() {
        (
            Status::Pass,
            format!("no lint errors ({} warning(s))", eval.plan.warnings.len()),
        )
    } else {
        (
            Status::Fail,
            format!(
                "{} lint error(s): {}",
                eval.plan.errors.len(),
                eval.plan.errors[0]
            ),
        )
    };
    push("lint".into(), status, message, eval.plan.errors.join("\n"));
    match &eval.verify {
        VerifyOutcome::Skipped(why) => {
            push("verify".into(), Status::Skipped, why.clone(), String::new())
        }
        VerifyOutcome::Passed(f) => push(
            "verify".into(),
            Status::Pass,
            format!("{f}: every gating check passed"),
            String::new(),
        ),
        VerifyOutcome::Failed(f, detail) => push(
            "verify".into(),
            Status::Fail,
            format!("{f}: verification failed (run `hpfsdp verify {f}` for the report)"),
            detail.clone(),
        ),
    }
    let (status, message, diff) = digest_check(eval, locked, options.update);
    push("plan-digest".into(), status, message, diff);
    for (label, run) in &eval.runs {
        match run {
            Err(e) => push(
                format!("simulate/{label}"),
                Status::Fail,
                e.clone(),
                String::new(),
            ),
            Ok(fig) => {
                let lock = locked.and_then(|l| l.strategy.get(&fig.strategy));
                let profile_changed =
                    locked.is_some_and(|l| l.profile_digest != eval.profile_digest);
                for (check, status, message, diff) in
                    strategy_checks(fig, lock, profile_changed, options)
                {
                    push(format!("{check}/{}", fig.strategy), status, message, diff);
                }
            }
        }
    }
    out
}

fn digest_check(
    eval: &Evaluated,
    locked: Option<&ScenarioLock>,
    update: bool,
) -> (Status, String, String) {
    let now = &eval.plan.digest;
    match locked {
        None if update => (
            Status::Pass,
            format!("recorded plan digest {now}"),
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
        Some(l) => (
            if update { Status::Pass } else { Status::Fail },
            format!(
                "plan digest changed{}: review the plan (`hpfsdp plan {}`){}",
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
            format!(
                "- plan_digest = \"{}\"\n+ plan_digest = \"{now}\"",
                l.plan_digest
            ),
        ),
    }
}

/// The step-time, memory and optimizer-tier checks of one strategy.
fn strategy_checks(
    fig: &RunFigures,
    lock: Option<&StrategyLock>,
    profile_changed: bool,
    options: GateOptions,
) -> Vec<(&'static str, Status, String, String)> {
    let mut out = Vec::new();
    let note = if profile_changed {
        " (the hardware profile changed since the lock)"
    } else {
        ""
    };
    out.push(match lock {
        None if options.update => (
            "step-time",
            Status::Pass,
            format!("recorded {:.4} s", fig.step_time_s),
            String::new(),
        ),
        None => (
            "step-time",
            Status::Fail,
            format!(
                "strategy '{}' is not in the lock; run the gate with --update to record it",
                fig.strategy
            ),
            format!("+ step_time_s = {}", fig.step_time_s),
        ),
        Some(l) => {
            let pct = (fig.step_time_s / l.step_time_s - 1.0) * 100.0;
            let diff = format!("- step_time_s = {}\n+ step_time_s = {}", l.step_time_s, fig.step_time_s);
            if pct > options.max_regression_pct && !options.update {
                (
                    "step-time",
                    Status::Fail,
                    format!(
                        "step time {:.4} s is {pct:+.2}% vs the lock's {:.4} s, over the {}% allowed{note}",
                        fig.step_time_s, l.step_time_s, options.max_regression_pct
                    ),
                    diff,
                )
            } else {
                (
                    "step-time",
                    Status::Pass,
                    format!("{:.4} s ({pct:+.2}% vs the lock){note}", fig.step_time_s),
                    if pct == 0.0 { String::new() } else { diff },
                )
            }
        }
    });
    use hpfsdp_reports::units::bytes;
    out.push((
        "memory",
        if fig.memory_fits {
            Status::Pass
        } else {
            Status::Fail
        },
        format!(
            "peak {} per rank {} the {} of HBM",
            bytes(fig.peak_memory_bytes),
            if fig.memory_fits {
                "fits"
            } else {
                "does NOT fit"
            },
            bytes(fig.hbm_capacity_bytes)
        ),
        String::new(),
    ));
    let now = fig
        .optimizer_tier_bytes
        .get(INTER_SUPERNODE)
        .copied()
        .unwrap_or(0);
    let before = lock.map(|l| {
        l.optimizer_tier_bytes
            .get(INTER_SUPERNODE)
            .copied()
            .unwrap_or(0)
    });
    out.push(match before {
        Some(0) if now > 0 && !options.update => (
            "optimizer-inter-supernode",
            Status::Fail,
            format!(
                "the optimizer now moves {now} bytes over the inter-supernode tier, where the lock had none; check the Muon replica subgroups (`hpfsdp plan`)"
            ),
            format!("- optimizer {INTER_SUPERNODE} bytes = 0\n+ optimizer {INTER_SUPERNODE} bytes = {now}"),
        ),
        _ => (
            "optimizer-inter-supernode",
            Status::Pass,
            format!("{now} optimizer bytes on the inter-supernode tier"),
            String::new(),
        ),
    });
    out
}

/// The lock entry that records `eval` as it is now.
pub fn lock_entry(eval: &Evaluated) -> ScenarioLock {
    ScenarioLock {
        file: eval.file.clone(),
        plan_digest: eval.plan.digest.clone(),
        hardware: eval.hardware.clone(),
        profile_digest: eval.profile_digest.clone(),
        verify: eval.verify_file.clone(),
        strategy: eval
            .runs
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok())
            .map(|f| {
                (
                    f.strategy.clone(),
                    StrategyLock {
                        step_time_s: f.step_time_s,
                        tokens_per_s: f.tokens_per_s,
                        peak_memory_bytes: f.peak_memory_bytes,
                        tier_bytes: f.tier_bytes.clone(),
                        optimizer_tier_bytes: f.optimizer_tier_bytes.clone(),
                    },
                )
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(step_time_s: f64, fits: bool, opt_inter_bytes: u64) -> RunFigures {
        RunFigures {
            strategy: "hyperparallel".into(),
            optimizer: "hyperparallel".into(),
            step_time_s,
            tokens_per_s: Some(1.0),
            peak_memory_bytes: 70_000_000_000,
            hbm_capacity_bytes: 64_000_000_000,
            memory_fits: fits,
            tier_bytes: Default::default(),
            optimizer_tier_bytes: [(INTER_SUPERNODE.to_string(), opt_inter_bytes)].into(),
        }
    }

    fn locked(step_time_s: f64) -> StrategyLock {
        StrategyLock {
            step_time_s,
            ..StrategyLock::default()
        }
    }

    const STRICT: GateOptions = GateOptions {
        max_regression_pct: 2.0,
        update: false,
    };

    fn status(checks: &[(&str, Status, String, String)], name: &str) -> Status {
        checks.iter().find(|c| c.0 == name).unwrap().1
    }

    #[test]
    fn step_time_fails_only_past_the_allowance() {
        let c = strategy_checks(&figures(1.019, true, 0), Some(&locked(1.0)), false, STRICT);
        assert_eq!(status(&c, "step-time"), Status::Pass);
        let c = strategy_checks(&figures(1.03, true, 0), Some(&locked(1.0)), true, STRICT);
        assert_eq!(status(&c, "step-time"), Status::Fail);
        assert!(
            c[0].2.contains("+3.00%") && c[0].2.contains("hardware profile changed"),
            "{}",
            c[0].2
        );
        let update = GateOptions {
            update: true,
            ..STRICT
        };
        let c = strategy_checks(&figures(1.03, true, 0), Some(&locked(1.0)), false, update);
        assert_eq!(status(&c, "step-time"), Status::Pass);
    }

    #[test]
    fn memory_and_new_inter_supernode_optimizer_traffic_fail() {
        let c = strategy_checks(&figures(1.0, false, 0), Some(&locked(1.0)), false, STRICT);
        assert_eq!(status(&c, "memory"), Status::Fail);
        assert!(
            c[1].2.contains("65.19 GiB") && c[1].2.contains("does NOT fit"),
            "{}",
            c[1].2
        );
        let c = strategy_checks(&figures(1.0, true, 4096), Some(&locked(1.0)), false, STRICT);
        assert_eq!(status(&c, "optimizer-inter-supernode"), Status::Fail);
        let mut had = locked(1.0);
        had.optimizer_tier_bytes
            .insert(INTER_SUPERNODE.into(), 1024);
        let c = strategy_checks(&figures(1.0, true, 4096), Some(&had), false, STRICT);
        assert_eq!(status(&c, "optimizer-inter-supernode"), Status::Pass);
        let c = strategy_checks(&figures(1.0, true, 0), None, false, STRICT);
        assert_eq!(
            status(&c, "step-time"),
            Status::Fail,
            "a strategy missing from the lock"
        );
    }
}
