//! Simulating a scenario: strategy programs → folded workload → engine → result.
//!
//! This is the one place that joins a scenario's plans with a strategy's program generator and
//! the engine, so the CLI, the calibration report and the benchmark all simulate the same way.

use crate::engine::{SimOptions, simulate};
use crate::error::SimError;
use crate::fold_mesh::GroupFamilyTable;
use crate::profile::HardwareProfile;
use crate::result::SimResult;
use crate::workload::Workload;
use hpfsdp_plan::fsdp::{FsdpPlan, build_fsdp_plan};
use hpfsdp_plan::planner::{ShardingPlan, plan};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::StepProgram;
use hpfsdp_program::strategy::{OptimizerStrategy, ProgramGenerator, StrategyKind};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// The plans of a scenario, derived once and shared by every strategy simulated on it.
#[derive(Debug, Clone)]
pub struct ScenarioPlans {
    /// The scenario.
    pub scenario: Scenario,
    /// Its sharding plan.
    pub sharding: ShardingPlan,
    /// Its FSDP/HSDP plan.
    pub fsdp: FsdpPlan,
}

impl ScenarioPlans {
    /// Derives the sharding and FSDP plans of `scenario`.
    pub fn new(scenario: Scenario) -> Self {
        let sharding = plan(&scenario.model, &scenario.planner_input());
        let fsdp = build_fsdp_plan(&scenario, &sharding);
        Self {
            scenario,
            sharding,
            fsdp,
        }
    }

    /// The strategies a scenario asks for: its `fsdp.strategy` followed by its baselines.
    pub fn listed_strategies(&self) -> Vec<String> {
        let mut names = vec![self.scenario.file.fsdp.strategy.clone()];
        for b in &self.scenario.file.fsdp.baselines {
            if !names.contains(b) {
                names.push(b.clone());
            }
        }
        names
    }

    /// Every run a scenario asks for: each listed FSDP strategy with its default optimizer,
    /// then the scenario's own strategy with each distributed-Muon baseline of
    /// `[optimizer] baselines` (how the Muon comparison scenarios compare optimizers on the
    /// same FSDP schedule).
    pub fn listed_runs(&self) -> Vec<SimJob> {
        let mut jobs: Vec<SimJob> = self
            .listed_strategies()
            .into_iter()
            .map(|strategy| SimJob {
                strategy,
                optimizer: None,
            })
            .collect();
        for b in &self.scenario.file.optimizer.baselines {
            jobs.push(SimJob {
                strategy: self.scenario.file.fsdp.strategy.clone(),
                optimizer: Some(b.clone()),
            });
        }
        jobs
    }
}

/// One simulation a command asks for: an FSDP strategy and the optimizer of its programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimJob {
    /// FSDP strategy name (`hyperparallel`, `fsdp2`, `megatron-ddp`).
    pub strategy: String,
    /// Optimizer strategy name (see [`OptimizerStrategy::parse`]); `None` = the scenario's
    /// default for this FSDP strategy ([`OptimizerStrategy::default_for`]).
    pub optimizer: Option<String>,
}

/// How to run one simulation of a scenario.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Fold symmetric ranks (the result does not change; only the speed does).
    pub fold: bool,
    /// Charge the profile's validation-mode dispatch cost on every launch.
    pub validation_mode: bool,
    /// Keep the per-op timeline of every simulated rank.
    pub record_timeline: bool,
    /// The optimizer part of the programs: `None` = the scenario's default for the FSDP
    /// strategy ([`OptimizerStrategy::default_for`]: layout-driven distributed Muon on
    /// `muon+adamw` scenarios, per-parameter AdamW otherwise); `Some(name)` = a strategy of
    /// [`OptimizerStrategy::parse`] (`adamw`, `hyperparallel` or a Muon baseline).
    pub optimizer: Option<String>,
    /// Keep every simulated rank's breakdown and timeline ([`SimOptions::all_ranks`]); a
    /// summary needs only the critical rank's breakdown and rank 0's timeline.
    pub all_ranks: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            fold: true,
            validation_mode: false,
            record_timeline: true,
            optimizer: None,
            all_ranks: true,
        }
    }
}

/// One strategy simulated on one scenario.
#[derive(Debug, Clone)]
pub struct StrategyRun {
    /// Strategy name (`hyperparallel`, `fsdp2`, `megatron-ddp`; `+<optimizer>` when the
    /// optimizer is not the scenario's default for the strategy).
    pub strategy: String,
    /// Optimizer strategy name of the programs (`hyperparallel`, `dmuon`, `adamw`, ...).
    pub optimizer: String,
    /// Rank 0's program, to name the spans of its timeline.
    pub rank0_program: StepProgram,
    /// The prediction.
    pub result: SimResult,
}

/// A strategy's programs for one scenario, folded (or not) and ready to simulate.
#[derive(Debug, Clone)]
pub struct PreparedRun {
    /// Strategy name.
    pub strategy: String,
    /// Optimizer strategy name of the programs.
    pub optimizer: String,
    /// The workload.
    pub workload: Workload,
    /// Tokens per step of the whole job.
    pub tokens_per_step: u64,
    /// Model FLOPs per step of the whole job, recompute excluded.
    pub model_flops_per_step: f64,
}

/// A strategy's program generator on a scenario's plans, ready to generate and fold its
/// programs ([`ProgramJob::prepare`]). It keeps no reference to the plans (the generator
/// holds its own copy of what it reads), so a caller that runs one job drops them first.
pub struct ProgramJob {
    /// Strategy name as asked.
    strategy: String,
    /// The optimizer strategy of the programs.
    optimizer: OptimizerStrategy,
    /// The scenario's default optimizer strategy for this FSDP strategy.
    default_optimizer: OptimizerStrategy,
    generator: ProgramGenerator,
    whatif: Option<crate::whatif::WhatIfModel>,
    topology: hpfsdp_plan::Topology,
}

impl ProgramJob {
    /// The generator of `strategy`'s programs on the scenario's plans with the optimizer
    /// `optimizer` (see [`RunOptions::optimizer`]).
    pub fn new(
        plans: &ScenarioPlans,
        strategy: &str,
        optimizer: Option<&str>,
    ) -> Result<Self, SimError> {
        let kind = StrategyKind::parse(strategy).map_err(|e| SimError::Workload(e.to_string()))?;
        let default_optimizer = OptimizerStrategy::default_for(&plans.scenario, kind);
        let optimizer = match optimizer {
            None => default_optimizer,
            Some(name) => {
                OptimizerStrategy::parse(name).map_err(|e| SimError::Workload(e.to_string()))?
            }
        };
        let generator = ProgramGenerator::with_optimizer(
            &plans.scenario,
            &plans.sharding,
            &plans.fsdp,
            kind,
            optimizer,
        )
        .map_err(|e| SimError::Workload(format!("strategy '{strategy}': {e}")))?;
        Ok(Self {
            strategy: strategy.to_string(),
            optimizer,
            default_optimizer,
            generator,
            whatif: crate::whatif::WhatIfModel::for_scenario(&plans.scenario)?,
            topology: plans.scenario.topology,
        })
    }

    /// Generates the programs and folds them when `fold`.
    pub fn prepare(self, fold: bool) -> Result<PreparedRun, SimError> {
        let Self {
            strategy,
            optimizer,
            default_optimizer,
            generator,
            whatif,
            topology,
        } = self;
        let world_size = generator.world_size();
        let gen_err = |e: hpfsdp_program::strategy::StrategyError| {
            SimError::Workload(format!("strategy '{strategy}': {e}"))
        };
        let salt = |r| whatif.as_ref().map_or(0, |m| m.fold_salt(r));
        let mut workload = if fold {
            let families: Vec<GroupFamilyTable> = generator
                .group_families()
                .into_iter()
                .map(|(label, groups)| GroupFamilyTable { label, groups })
                .collect();
            Workload::fold_on_mesh(
                world_size,
                topology,
                |r| generator.template_key(r),
                &families,
                // Only rank 0's program keeps names (reports name spans from it); the others
                // are generated without, which `fold_templated` would strip anyway, on the
                // model path they share with ranks of the same model key.
                |r| {
                    if r == 0 {
                        generator.program(r)
                    } else {
                        generator.program_shared(r)
                    }
                    .map_err(gen_err)
                },
                salt,
            )?
        } else {
            // In parallel, in rank order; the first failing rank is the error.
            let programs: Vec<Result<StepProgram, SimError>> = (0..world_size)
                .into_par_iter()
                .map(|r| generator.program(r).map_err(gen_err))
                .collect();
            let programs = programs.into_iter().collect::<Result<Vec<_>, _>>()?;
            Workload::unfolded(programs, topology)?
        };
        workload.whatif = whatif;
        Ok(PreparedRun {
            strategy: if optimizer == default_optimizer {
                strategy
            } else {
                format!("{strategy}+{}", optimizer.name())
            },
            optimizer: optimizer.name().to_string(),
            workload,
            tokens_per_step: generator.tokens_per_step(),
            model_flops_per_step: generator.model_flops_per_step(),
        })
    }
}

/// Generates `strategy`'s programs on the scenario's plans with the optimizer `optimizer`
/// (see [`RunOptions::optimizer`]) and folds them when `fold` ([`ProgramJob`]).
pub fn prepare(
    plans: &ScenarioPlans,
    strategy: &str,
    optimizer: Option<&str>,
    fold: bool,
) -> Result<PreparedRun, SimError> {
    ProgramJob::new(plans, strategy, optimizer)?.prepare(fold)
}

/// Simulates a prepared workload with `profile`.
pub fn run_prepared(
    prepared: &PreparedRun,
    profile: &HardwareProfile,
    options: &RunOptions,
) -> Result<StrategyRun, SimError> {
    let sim_options = SimOptions {
        validation_mode: options.validation_mode,
        record_timeline: options.record_timeline,
        record_memory_series: true,
        tokens_per_step: Some(prepared.tokens_per_step),
        model_flops_per_step: Some(prepared.model_flops_per_step),
        all_ranks: options.all_ranks,
    };
    let result = simulate(&prepared.workload, profile, &sim_options)?;
    Ok(StrategyRun {
        strategy: prepared.strategy.clone(),
        optimizer: prepared.optimizer.clone(),
        rank0_program: prepared.workload.units[0].program.clone(),
        result,
    })
}

/// Simulates `strategy` on the scenario's plans with `profile` ([`prepare`] then
/// [`run_prepared`]).
pub fn simulate_strategy(
    plans: &ScenarioPlans,
    strategy: &str,
    profile: &HardwareProfile,
    options: &RunOptions,
) -> Result<StrategyRun, SimError> {
    let prepared = prepare(plans, strategy, options.optimizer.as_deref(), options.fold)?;
    let run = run_prepared(&prepared, profile, options);
    drop_in_background(prepared);
    run
}

/// Workloads with more simulated ops than this are freed on a background thread.
const BACKGROUND_DROP_OPS: usize = 1_000_000;

/// Frees a large prepared run on a background thread: millions of ops are millions of small
/// allocations (4-6 % of a Muon exp-d run's CPU time), and a command that exits first
/// never pays for them (the process's memory is returned whole). Small runs are freed here.
pub fn drop_in_background(prepared: PreparedRun) {
    if prepared.workload.simulated_ops() > BACKGROUND_DROP_OPS {
        std::thread::spawn(move || drop(prepared));
    }
}

/// Where a scenario's hardware profile lives: `<scenario dir>/../hardware/<name>.toml` when
/// that directory exists (the repository layout), else `scenarios/hardware` under the
/// working directory; [`HardwareProfile::load_named`] falls back to the built-in copy.
pub fn hardware_dir_for(scenario_path: &Path) -> PathBuf {
    let beside = scenario_path
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("hardware"));
    match beside {
        Some(dir) if dir.is_dir() => dir,
        _ => PathBuf::from("scenarios/hardware"),
    }
}
