//! Loading, scaling and predicting the replayed scenario on the chosen hardware profile.

use super::args::ReplayArgs;
use super::scale::{self, Scaled};
use crate::commands::device_profile::ProfileChoice;
use anyhow::{Context, Result, bail};
use hpfsdp_backends::replay::ReplayRank;
use hpfsdp_plan::scenario::{FSDP_STRATEGIES, Scenario};
use hpfsdp_program::step::{StepProgram, Timeline};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::scenario_run::{
    RunOptions, ScenarioPlans, hardware_dir_for, prepare, run_prepared,
};
use std::process::ExitCode;

/// The programs and prediction of the scenario a replay runs.
pub struct Prepared {
    /// The scenario as replayed (scaled, placed on the profile).
    pub scenario: Scenario,
    /// What scaling and placement changed.
    pub notes: Vec<String>,
    /// The strategy replayed.
    pub strategy: String,
    /// The profile of the prediction.
    pub profile: HardwareProfile,
    /// Which profile and why.
    pub choice: ProfileChoice,
    /// Every rank's step program.
    pub programs: Vec<StepProgram>,
    /// The simulator's timeline of those programs.
    pub predicted: Timeline,
}

/// Loads and scales the scenario and checks the strategy (before any backend starts).
pub fn load_scaled(args: &ReplayArgs) -> Result<(Scaled, String)> {
    let scenario = Scenario::load(&args.scenario)?;
    let scaled = scale::scale(scenario, args.ranks, args.layers)?;
    let strategy = args
        .strategy
        .clone()
        .unwrap_or_else(|| scaled.scenario.file.fsdp.strategy.clone());
    if !FSDP_STRATEGIES.contains(&strategy.as_str()) {
        bail!(
            "--strategy {strategy}: unknown strategy; choose one of {}",
            FSDP_STRATEGIES.join(", ")
        );
    }
    Ok((scaled, strategy))
}

/// Places the scaled scenario on the chosen profile and predicts it; `Err(code)` inside when
/// the lint gate refused its plan (the lint errors are printed).
pub fn predict(
    args: &ReplayArgs,
    mut scaled: Scaled,
    strategy: &str,
    choice: ProfileChoice,
) -> Result<Result<Prepared, ExitCode>> {
    let hardware = &choice.name;
    let profile = HardwareProfile::load_named(hardware, hardware_dir_for(&args.scenario))
        .with_context(|| format!("loading hardware profile '{hardware}' ({})", choice.reason))?;
    if profile.name != scaled.scenario.file.hardware {
        scale::place_on_profile(&mut scaled.scenario, &profile, &mut scaled.notes)?;
    }
    let plans = ScenarioPlans::new(scaled.scenario.clone());
    if let Some(code) = crate::commands::lint_gate::refuse_lint_errors(
        &plans.scenario,
        &plans.sharding,
        args.lint.allow_lint_errors,
        "replay",
        true,
    ) {
        return Ok(Err(code));
    }
    let prepared = prepare(&plans, strategy, None, false)?;
    let options = RunOptions {
        fold: false,
        validation_mode: false,
        record_timeline: true,
        optimizer: None,
        all_ranks: true,
    };
    let run = run_prepared(&prepared, &profile, &options)?;
    let predicted = run
        .result
        .timeline
        .context("the simulator recorded no timeline")?;
    let programs = prepared
        .workload
        .units
        .into_iter()
        .map(|u| u.program)
        .collect();
    Ok(Ok(Prepared {
        scenario: scaled.scenario,
        notes: scaled.notes,
        strategy: strategy.to_string(),
        profile,
        choice,
        programs,
        predicted,
    }))
}

/// Every rank's program with the busy duration of each op from the prediction.
pub fn replay_ranks(prep: &Prepared) -> Result<Vec<ReplayRank>> {
    prep.programs
        .iter()
        .map(|p| {
            let t = prep
                .predicted
                .rank(p.rank)
                .with_context(|| format!("the prediction has no rank {}", p.rank))?;
            Ok(ReplayRank::from_prediction(p.clone(), t)?)
        })
        .collect()
}
