//! The gate's checks: one evaluated scenario against its lock entry. Each check passes, fails
//! (with a one-line message and, for JUnit, a diff) or is skipped (with the reason).
//!
//! Performance is compared like with like: throughput (tokens/s) when both the lock and the
//! run know it, so a scenario whose tokens per step changed ("workload changed (a -> b tokens
//! per step)") is judged by the work it does per second, not by its longer step; step time
//! otherwise.

use crate::commands::gate::digest::digest_check;
use crate::commands::gate::evaluate::{Evaluated, VerifyOutcome};
use crate::commands::gate::lock::{Lock, ScenarioLock, StrategyLock};
use crate::commands::gate::outcome::{CheckOutcome, Status};
use crate::commands::scenario_figures::RunFigures;

/// The tier whose optimizer traffic the gate watches.
pub const INTER_SUPERNODE: &str = "inter-supernode";

/// How the gate compares.
#[derive(Debug, Clone, Copy)]
pub struct GateOptions {
    /// Largest accepted throughput (or step-time) regression vs the lock, percent.
    pub max_regression_pct: f64,
    /// Accept the new digest and figures (they are written to the lock).
    pub update: bool,
}

/// `v` with 6 significant digits (diffs and messages; the lock keeps every digit).
pub fn sig(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return v.to_string();
    }
    let digits = (5 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let text = format!("{v:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// Every check of `eval` against `locked` (its lock entry, if any).
pub fn compare(
    eval: &Evaluated,
    locked: Option<&ScenarioLock>,
    options: GateOptions,
) -> Vec<CheckOutcome> {
    let mut out = Vec::new();
    let mut push = |check: String, (status, message, diff): (Status, String, String), time_s| {
        out.push(CheckOutcome {
            scenario: eval.name.clone(),
            check,
            status,
            message,
            diff,
            time_s,
        })
    };
    push("lint".into(), lint_check(eval), eval.plan_s);
    push(
        "verify".into(),
        verify_check(eval, locked, options.update),
        eval.verify_s,
    );
    push(
        "plan-digest".into(),
        digest_check(eval, locked, options.update),
        0.0,
    );
    for run in &eval.runs {
        match &run.figures {
            Err(e) => push(
                format!("simulate/{}", run.label),
                (Status::Fail, e.clone(), String::new()),
                run.seconds,
            ),
            Ok(fig) => {
                let lock = locked.and_then(|l| l.strategy.get(&fig.strategy));
                let profile_changed =
                    locked.is_some_and(|l| l.profile_digest != eval.profile_digest);
                for (i, (check, status, message, diff)) in
                    strategy_checks(fig, lock, profile_changed, options)
                        .into_iter()
                        .enumerate()
                {
                    let time_s = if i == 0 { run.seconds } else { 0.0 };
                    push(
                        format!("{check}/{}", fig.strategy),
                        (status, message, diff),
                        time_s,
                    );
                }
            }
        }
    }
    out
}

fn lint_check(eval: &Evaluated) -> (Status, String, String) {
    if eval.plan.errors.is_empty() {
        (
            Status::Pass,
            format!("no lint errors ({} warning(s))", eval.plan.warnings.len()),
            String::new(),
        )
    } else {
        (
            Status::Fail,
            format!(
                "{} lint error(s): {}",
                eval.plan.errors.len(),
                eval.plan.errors[0]
            ),
            eval.plan.errors.join("\n"),
        )
    }
}

/// The verification outcome; a twin the lock names that the scenario no longer verifies with
/// fails (the scenario would otherwise silently stop being verified, or be verified by
/// something else) until accepted with `--update`.
fn verify_check(
    eval: &Evaluated,
    locked: Option<&ScenarioLock>,
    update: bool,
) -> (Status, String, String) {
    let locked_twin = locked.and_then(|l| l.verify.as_deref());
    if let Some(twin) = locked_twin.filter(|t| !update && eval.verify_file.as_deref() != Some(*t)) {
        let now = match (&eval.verify_file, &eval.verify) {
            (Some(f), _) if *f == eval.file => "it verifies itself".to_string(),
            (Some(f), _) => format!("it names {f}"),
            (None, VerifyOutcome::Skipped(why)) => format!("it is not verified: {why}"),
            (None, _) => "it is not verified".to_string(),
        };
        return (
            Status::Fail,
            format!(
                "the lock verifies this scenario with {twin}, but the scenario no longer names it ({now}); restore `[gate] verify = \"...\"` or accept the change with --update"
            ),
            format!(
                "- verify = \"{twin}\"\n+ verify = {}",
                eval.verify_file
                    .as_ref()
                    .map_or("(none)".to_string(), |f| format!("\"{f}\""))
            ),
        );
    }
    match &eval.verify {
        VerifyOutcome::Skipped(why) => (Status::Skipped, why.clone(), String::new()),
        VerifyOutcome::Passed(f) => (
            Status::Pass,
            format!("{f}: every gating check passed"),
            String::new(),
        ),
        VerifyOutcome::Failed(f, detail) => (
            Status::Fail,
            format!("{f}: verification failed (run `hpfsdp verify {f}` for the report)"),
            detail.clone(),
        ),
    }
}

/// The throughput (or step-time), memory and optimizer-tier checks of one strategy.
fn strategy_checks(
    fig: &RunFigures,
    lock: Option<&StrategyLock>,
    profile_changed: bool,
    options: GateOptions,
) -> Vec<(&'static str, Status, String, String)> {
    let mut out = vec![performance_check(fig, lock, profile_changed, options)];
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
    out.push(optimizer_check(fig, lock, options));
    out
}

/// Throughput vs the lock when both know tokens/s (the workload may have changed), else step
/// time.
fn performance_check(
    fig: &RunFigures,
    lock: Option<&StrategyLock>,
    profile_changed: bool,
    options: GateOptions,
) -> (&'static str, Status, String, String) {
    let note = if profile_changed {
        " (the hardware profile changed since the lock)"
    } else {
        ""
    };
    let throughput = fig
        .tokens_per_s
        .zip(lock.map_or(fig.tokens_per_s, |l| l.tokens_per_s));
    let name = if throughput.is_some() {
        "throughput"
    } else {
        "step-time"
    };
    let Some(l) = lock else {
        return if options.update {
            (
                name,
                Status::Pass,
                format!("recorded {}", figures_text(fig)),
                String::new(),
            )
        } else {
            (
                name,
                Status::Fail,
                format!(
                    "strategy '{}' is not in the lock; run the gate with --update to record it",
                    fig.strategy
                ),
                format!("+ step_time_s = {}", sig(fig.step_time_s)),
            )
        };
    };
    let workload = match (Lock::tokens_per_step(l), fig.tokens_per_step) {
        (Some(a), Some(b)) if a != b => Some((a, b)),
        _ => None,
    };
    let mut diff = Vec::new();
    if let Some((a, b)) = workload {
        diff.push(format!("- tokens_per_step = {a}\n+ tokens_per_step = {b}"));
    }
    let (regression_pct, message) = match throughput {
        Some((now, before)) => {
            let change = (now / before - 1.0) * 100.0;
            diff.push(format!(
                "- tokens_per_s = {}\n+ tokens_per_s = {}",
                sig(before),
                sig(now)
            ));
            (
                -change,
                format!(
                    "{now:.0} tokens/s, {change:+.2}% vs the lock's {before:.0} (step {:.4} s)",
                    fig.step_time_s
                ),
            )
        }
        None => {
            let change = (fig.step_time_s / l.step_time_s - 1.0) * 100.0;
            (
                change,
                format!(
                    "step time {:.4} s, {change:+.2}% vs the lock's {:.4} s",
                    fig.step_time_s, l.step_time_s
                ),
            )
        }
    };
    diff.push(format!(
        "- step_time_s = {}\n+ step_time_s = {}",
        sig(l.step_time_s),
        sig(fig.step_time_s)
    ));
    let prefix = workload.map_or(String::new(), |(a, b)| {
        format!("workload changed ({a} -> {b} tokens per step): ")
    });
    let failed = regression_pct > options.max_regression_pct && !options.update;
    let unchanged = regression_pct == 0.0 && workload.is_none();
    (
        name,
        if failed { Status::Fail } else { Status::Pass },
        format!(
            "{prefix}{message}{}{note}",
            if failed {
                format!(", over the {}% allowed", options.max_regression_pct)
            } else {
                String::new()
            }
        ),
        if unchanged {
            String::new()
        } else {
            diff.join("\n")
        },
    )
}

fn figures_text(fig: &RunFigures) -> String {
    match fig.tokens_per_s {
        Some(t) => format!("{t:.0} tokens/s, step {:.4} s", fig.step_time_s),
        None => format!("step {:.4} s", fig.step_time_s),
    }
}

/// New optimizer traffic on the inter-supernode tier where the lock had none fails.
fn optimizer_check(
    fig: &RunFigures,
    lock: Option<&StrategyLock>,
    options: GateOptions,
) -> (&'static str, Status, String, String) {
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
    match before {
        Some(0) if now > 0 && !options.update => (
            "optimizer-inter-supernode",
            Status::Fail,
            format!(
                "the optimizer now moves {now} bytes over the inter-supernode tier, where the lock had none; check the Muon replica subgroups (`hpfsdp plan`)"
            ),
            format!(
                "- optimizer {INTER_SUPERNODE} bytes = 0\n+ optimizer {INTER_SUPERNODE} bytes = {now}"
            ),
        ),
        _ => (
            "optimizer-inter-supernode",
            Status::Pass,
            format!("{now} optimizer bytes on the inter-supernode tier"),
            String::new(),
        ),
    }
}

/// The lock entry that records `eval` as it is now.
pub fn lock_entry(eval: &Evaluated) -> ScenarioLock {
    ScenarioLock {
        file: eval.file.clone(),
        plan_digest: eval.plan.digest.clone(),
        plan_entries: eval.plan.entries.clone(),
        hardware: eval.hardware.clone(),
        profile_digest: eval.profile_digest.clone(),
        verify: eval.verify_file.clone(),
        strategy: eval
            .runs
            .iter()
            .filter_map(|r| r.figures.as_ref().ok())
            .map(|f| {
                (
                    f.strategy.clone(),
                    StrategyLock {
                        step_time_s: f.step_time_s,
                        tokens_per_s: f.tokens_per_s,
                        tokens_per_step: f.tokens_per_step,
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
            tokens_per_s: Some(1000.0 / step_time_s),
            tokens_per_step: Some(1000),
            peak_memory_bytes: 70_000_000_000,
            hbm_capacity_bytes: 64_000_000_000,
            memory_fits: fits,
            tier_bytes: Default::default(),
            optimizer_tier_bytes: [(INTER_SUPERNODE.to_string(), opt_inter_bytes)].into(),
        }
    }

    /// A lock entry written before `tokens_per_step` was recorded (as `hpfsdp.lock` is).
    fn locked(step_time_s: f64) -> StrategyLock {
        StrategyLock {
            step_time_s,
            tokens_per_s: Some(1000.0 / step_time_s),
            ..StrategyLock::default()
        }
    }

    const STRICT: GateOptions = GateOptions {
        max_regression_pct: 2.0,
        update: false,
    };

    fn find<'a>(
        checks: &'a [(&str, Status, String, String)],
        name: &str,
    ) -> &'a (&'a str, Status, String, String) {
        checks.iter().find(|c| c.0 == name).unwrap()
    }

    fn status(checks: &[(&str, Status, String, String)], name: &str) -> Status {
        find(checks, name).1
    }

    #[test]
    fn throughput_fails_only_past_the_allowance() {
        let c = strategy_checks(&figures(1.019, true, 0), Some(&locked(1.0)), false, STRICT);
        assert_eq!(status(&c, "throughput"), Status::Pass);
        let c = strategy_checks(&figures(1.03, true, 0), Some(&locked(1.0)), true, STRICT);
        assert_eq!(status(&c, "throughput"), Status::Fail);
        let m = &find(&c, "throughput").2;
        assert!(
            m.contains("971 tokens/s, -2.91% vs the lock's 1000")
                && m.contains("hardware profile changed"),
            "{m}"
        );
        let update = GateOptions {
            update: true,
            ..STRICT
        };
        let c = strategy_checks(&figures(1.03, true, 0), Some(&locked(1.0)), false, update);
        assert_eq!(status(&c, "throughput"), Status::Pass);
    }

    #[test]
    fn a_changed_workload_is_judged_by_throughput_not_step_time() {
        // seq_len doubled: 2x the tokens in a 1.948x longer step is 2.7% more throughput.
        let mut now = figures(2.0 * 0.974, true, 0);
        now.tokens_per_step = Some(2000);
        now.tokens_per_s = Some(2000.0 / now.step_time_s);
        let c = strategy_checks(&now, Some(&locked(1.0)), false, STRICT);
        let (_, st, m, diff) = find(&c, "throughput");
        assert_eq!(*st, Status::Pass, "{m}");
        assert!(
            m.starts_with("workload changed (1000 -> 2000 tokens per step): 1027 tokens/s, +2.67%"),
            "{m}"
        );
        assert!(
            diff.contains("- tokens_per_step = 1000\n+ tokens_per_step = 2000"),
            "{diff}"
        );
        // The same workload change with less throughput fails.
        now.step_time_s = 2.2;
        now.tokens_per_s = Some(2000.0 / 2.2);
        let c = strategy_checks(&now, Some(&locked(1.0)), false, STRICT);
        assert_eq!(status(&c, "throughput"), Status::Fail);
    }

    #[test]
    fn diffs_print_rounded_figures() {
        assert_eq!(sig(2.5924469660000002), "2.59245");
        assert_eq!(sig(34325.22123322245), "34325.2");
        assert_eq!(sig(0.000123456789), "0.000123457");
        assert_eq!(sig(131072.0), "131072");
        let c = strategy_checks(
            &figures(2.5924469660000002, true, 0),
            Some(&locked(2.4)),
            false,
            STRICT,
        );
        let diff = &find(&c, "throughput").3;
        assert!(diff.ends_with("+ step_time_s = 2.59245"), "{diff}");
        assert!(!diff.contains("2.5924469660000002"), "{diff}");
    }

    #[test]
    fn step_time_is_compared_when_there_are_no_tokens() {
        let mut now = figures(1.03, true, 0);
        now.tokens_per_s = None;
        now.tokens_per_step = None;
        let mut l = locked(1.0);
        l.tokens_per_s = None;
        let c = strategy_checks(&now, Some(&l), false, STRICT);
        let (_, st, m, _) = find(&c, "step-time");
        assert_eq!(*st, Status::Fail);
        assert!(m.contains("step time 1.0300 s, +3.00%"), "{m}");
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
            status(&c, "throughput"),
            Status::Fail,
            "a strategy missing from the lock"
        );
    }
}
