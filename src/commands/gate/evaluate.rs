//! Evaluating the gated scenarios: load each one, derive its plans, verify its tiny twin and
//! simulate every strategy it lists. Loading and verification are sequential (a bad file is
//! bad input, exit 2); planning and simulation run in parallel (rayon) and keep the input
//! order, so the outcome does not depend on scheduling.

use crate::commands::scenario_figures::{PlanCheck, RunFigures, plan_check, simulate_job};
use anyhow::{Context, Result, bail};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::verify::VerifySpec;
use hpfsdp_reference::verify::report::verify;
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::scenario_run::{ScenarioPlans, SimJob, hardware_dir_for};
use indicatif::ProgressBar;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A scenario without a `[gate] verify` twin is verified itself when the reference executor
/// accepts it and it has at most this many parameters (the verification scenarios have tens of
/// thousands; anything near this bound would take minutes on a CPU).
pub const SELF_VERIFY_MAX_PARAMS: u64 = 10_000_000;

/// How a scenario's verification went.
#[derive(Debug, Clone, PartialEq)]
pub enum VerifyOutcome {
    /// Not verified, and why.
    Skipped(String),
    /// The verification scenario passed every gating check.
    Passed(String),
    /// It failed: the file and the failed gating checks, one per line.
    Failed(String, String),
}

/// Everything measured on one gated scenario.
#[derive(Debug, Clone)]
pub struct Evaluated {
    /// Scenario name (the lock's key).
    pub name: String,
    /// The file as given.
    pub file: String,
    /// Hardware profile name.
    pub hardware: String,
    /// Digest of the hardware profile.
    pub profile_digest: String,
    /// Plan digest and lint.
    pub plan: PlanCheck,
    /// The verification scenario's path, when there is one.
    pub verify_file: Option<String>,
    /// Verification outcome.
    pub verify: VerifyOutcome,
    /// Each listed job: its label and its figures (or why it could not be simulated).
    pub runs: Vec<JobRun>,
    /// Wall time of deriving and linting the plans, seconds.
    pub plan_s: f64,
    /// Wall time of the verification (of the twin, run once however many scenarios name it).
    pub verify_s: f64,
}

/// One simulated job of a scenario.
#[derive(Debug, Clone)]
pub struct JobRun {
    /// `strategy` or `strategy+optimizer`.
    pub label: String,
    /// Its figures, or why it could not be simulated.
    pub figures: Result<RunFigures, String>,
    /// Wall time of the simulation, seconds.
    pub seconds: f64,
}

/// A scenario loaded and planned, before the expensive work.
struct Loaded {
    file: String,
    plans: ScenarioPlans,
    profile: HardwareProfile,
    profile_digest: String,
    verify_file: Option<PathBuf>,
    verify_skip: String,
}

/// The scenario files named by `inputs`: files as given, directories by their `*.toml` files
/// (not recursive), sorted.
pub fn expand_inputs(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(input)
                .with_context(|| format!("reading directory {}", input.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml"))
                .collect();
            if found.is_empty() {
                bail!(
                    "{}: no scenario files (*.toml) in this directory; name scenario files or directories holding them",
                    input.display()
                );
            }
            found.sort();
            files.extend(found);
        } else if input.is_file() {
            files.push(input.clone());
        } else {
            bail!("{}: no such scenario file or directory", input.display());
        }
    }
    Ok(files)
}

/// Loads, verifies and simulates every scenario, showing progress per verification and
/// simulation on a terminal. `Err` is bad input (an unreadable or invalid scenario, profile
/// or verification twin).
pub fn evaluate_all(files: &[PathBuf]) -> Result<Vec<Evaluated>> {
    let loaded = files.iter().map(|f| load(f)).collect::<Result<Vec<_>>>()?;
    crate::commands::gate::lock::Lock::check_unique_names(
        loaded
            .iter()
            .map(|l| (l.plans.scenario.file.name.as_str(), l.file.as_str())),
    )?;
    let mut twins: Vec<PathBuf> = loaded
        .iter()
        .filter_map(|l| l.verify_file.clone())
        .collect();
    twins.sort();
    twins.dedup();
    let specs = twins
        .iter()
        .map(|t| {
            let sc = Scenario::load(t)?;
            let spec = VerifySpec::from_scenario(&sc).with_context(|| {
                format!(
                    "{} cannot be verified by the reference executor",
                    t.display()
                )
            })?;
            Ok((t.clone(), spec))
        })
        .collect::<Result<Vec<_>>>()?;
    let jobs: Vec<(usize, SimJob)> = loaded
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.plans.listed_runs().into_iter().map(move |j| (i, j)))
        .collect();
    let bar = crate::commands::progress::bar(specs.len() + jobs.len(), "checks");
    // Sequential and outside the rayon pool: the in-process backend blocks one thread per
    // rank in its collectives, which would deadlock a pool with fewer threads than ranks.
    let verified: BTreeMap<PathBuf, (VerifyOutcome, f64)> = specs
        .iter()
        .map(|(t, spec)| {
            bar.set_message(format!("verifying {}", t.display()));
            let start = Instant::now();
            let outcome = run_verify(t, spec);
            bar.inc(1);
            (t.clone(), (outcome, start.elapsed().as_secs_f64()))
        })
        .collect();
    let plan_checks: Vec<(PlanCheck, f64)> = loaded
        .par_iter()
        .map(|l| {
            let start = Instant::now();
            (plan_check(&l.plans), start.elapsed().as_secs_f64())
        })
        .collect();
    let results: Vec<(usize, JobRun)> = jobs
        .par_iter()
        .map(|(i, job)| (*i, simulate(&loaded[*i], &plan_checks[*i].0, job, &bar)))
        .collect();
    bar.finish_and_clear();
    Ok(loaded
        .into_iter()
        .zip(plan_checks)
        .enumerate()
        .map(|(i, (l, (plan, plan_s)))| {
            let (verify, verify_s) = l.verify_file.as_ref().map_or_else(
                || (VerifyOutcome::Skipped(l.verify_skip.clone()), 0.0),
                |p| verified[p].clone(),
            );
            Evaluated {
                name: l.plans.scenario.file.name.clone(),
                hardware: l.profile.name.clone(),
                profile_digest: l.profile_digest,
                plan,
                verify_file: l.verify_file.as_ref().map(|p| p.display().to_string()),
                verify,
                runs: results
                    .iter()
                    .filter(|(j, _)| *j == i)
                    .map(|(_, r)| r.clone())
                    .collect(),
                plan_s,
                verify_s,
                file: l.file,
            }
        })
        .collect())
}

/// Simulates one job of a loaded scenario (not when its plan has lint errors).
fn simulate(l: &Loaded, plan: &PlanCheck, job: &SimJob, bar: &ProgressBar) -> JobRun {
    let label = match &job.optimizer {
        Some(o) => format!("{}+{o}", job.strategy),
        None => job.strategy.clone(),
    };
    bar.set_message(format!("{} {label}", l.plans.scenario.file.name));
    let start = Instant::now();
    let figures = if plan.errors.is_empty() {
        simulate_job(&l.plans, job, &l.profile).map_err(|e| format!("{e:#}"))
    } else {
        Err("not simulated: the plan has lint errors".to_string())
    };
    bar.inc(1);
    JobRun {
        label,
        figures,
        seconds: start.elapsed().as_secs_f64(),
    }
}

fn load(path: &Path) -> Result<Loaded> {
    let scenario = Scenario::load(path)?;
    let profile = HardwareProfile::load_named(&scenario.file.hardware, hardware_dir_for(path))
        .with_context(|| {
            format!(
                "{}: loading hardware profile '{}'",
                path.display(),
                scenario.file.hardware
            )
        })?;
    let profile_digest = hpfsdp_plan::digest::digest_json(&profile);
    let (verify_file, verify_skip) = match scenario
        .file
        .gate
        .as_ref()
        .and_then(|g| g.verify.as_ref())
    {
        Some(twin) => {
            let p = path.parent().unwrap_or(Path::new(".")).join(twin);
            if !p.is_file() {
                bail!(
                    "{}: [gate] verify = \"{twin}\": no such file ({}); name a scenario under scenarios/verify/ relative to this file",
                    path.display(),
                    p.display()
                );
            }
            (Some(normalize(&p)), String::new())
        }
        None => self_verification(&scenario, path),
    };
    Ok(Loaded {
        file: path.display().to_string(),
        plans: ScenarioPlans::new(scenario),
        profile,
        profile_digest,
        verify_file,
        verify_skip,
    })
}

/// A scenario without a twin verifies itself when the reference executor takes it and it is
/// small (see [`SELF_VERIFY_MAX_PARAMS`]); otherwise the reason it is not verified.
fn self_verification(scenario: &Scenario, path: &Path) -> (Option<PathBuf>, String) {
    let params = scenario.model.total_params();
    if params > SELF_VERIFY_MAX_PARAMS {
        return (
            None,
            format!(
                "{params} parameters is too large for the reference executor; name a tiny twin with [gate] verify = \"../verify/<twin>.toml\""
            ),
        );
    }
    match VerifySpec::from_scenario(scenario) {
        Ok(_) => (Some(normalize(path)), String::new()),
        Err(e) => (
            None,
            format!(
                "the reference executor cannot run it ({e}); name a tiny twin with [gate] verify"
            ),
        ),
    }
}

/// `a/b/../c` → `a/c`, so one twin named from two directories is verified once.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn run_verify(path: &Path, spec: &VerifySpec) -> VerifyOutcome {
    let file = path.display().to_string();
    match verify(spec) {
        Ok(r) if r.passed => VerifyOutcome::Passed(file),
        Ok(r) => {
            let failed: Vec<String> = r
                .checks
                .iter()
                .filter(|c| c.gating && !c.passed)
                .map(|c| format!("{}: {}", c.name, c.detail))
                .collect();
            VerifyOutcome::Failed(file, failed.join("\n"))
        }
        Err(e) => VerifyOutcome::Failed(file, format!("verification could not run: {e}")),
    }
}
