//! The lint gate of every command that derives a plan from a scenario: a sharding plan with
//! lint errors stops the command (exit status 1, the errors printed) exactly as `plan` and
//! `verify` refuse it, unless `--allow-lint-errors` asks for a what-if study anyway.

use hpfsdp_plan::planner::ShardingPlan;
use hpfsdp_plan::planner::lint::Severity;
use hpfsdp_plan::scenario::Scenario;
use std::process::ExitCode;

/// The `--allow-lint-errors` flag, shared by the plan-deriving commands.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct LintArgs {
    /// Go on although the sharding plan has lint errors (a what-if study of a plan `hpfsdp
    /// plan` rejects); the errors are still printed as warnings.
    #[arg(long)]
    pub allow_lint_errors: bool,
}

/// Prints the lint errors of `sharding` on stderr; returns the exit status 1 when there are
/// any and `allow` is false (the caller stops), `None` when the command may go on.
/// `has_allow_flag` says whether the command offers `--allow-lint-errors` (verify cannot run
/// a plan with lint errors at all, so it does not).
pub fn refuse_lint_errors(
    scenario: &Scenario,
    sharding: &ShardingPlan,
    allow: bool,
    command: &str,
    has_allow_flag: bool,
) -> Option<ExitCode> {
    let errors: Vec<_> = sharding
        .lints
        .iter()
        .filter(|l| l.severity == Severity::Error)
        .collect();
    if errors.is_empty() {
        return None;
    }
    let file = scenario.path.display();
    let level = if allow { "warning" } else { "error" };
    eprintln!(
        "{level}: {file}: the sharding plan has {} lint error(s):",
        errors.len()
    );
    for l in &errors {
        eprintln!("  {l}");
    }
    if allow {
        eprintln!("{level}: going on with {command} anyway (--allow-lint-errors): a what-if study");
        None
    } else {
        let what_if = if has_allow_flag {
            ", or pass --allow-lint-errors for a what-if study"
        } else {
            ""
        };
        eprintln!(
            "error: {command} refuses a plan with lint errors, as `hpfsdp plan {file}` does; fix \
             the scenario{what_if}"
        );
        Some(ExitCode::from(1))
    }
}
