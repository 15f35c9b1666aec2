//! `hpfsdp export`: a scenario's step programs as Chakra execution traces (one
//! `<name>.<rank>.et` per rank and `<name>.comm_groups.json`) with ASTRA-sim's system, network
//! and memory configurations, to run the plan in other simulators such as ASTRA-sim.

use anyhow::{Context, Result, bail};
use hpfsdp_plan::scenario::{FSDP_STRATEGIES, Scenario};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::scenario_run::{ScenarioPlans, hardware_dir_for};
use std::path::PathBuf;
use std::process::ExitCode;

/// Command-line arguments of `export`.
#[derive(clap::Args)]
pub struct ExportArgs {
    /// Scenario file (TOML).
    pub scenario: PathBuf,
    /// Write Chakra execution traces into DIR.
    #[arg(long, value_name = "DIR", required = true)]
    pub chakra: PathBuf,
    /// FSDP strategy whose programs are exported (default: the scenario's strategy).
    #[arg(long, value_name = "S")]
    pub strategy: Option<String>,
    /// Optimizer strategy of the programs (default: the scenario's; see `simulate --optimizer`).
    #[arg(long, value_name = "NAME")]
    pub optimizer: Option<String>,
}

/// Runs the export.
pub fn run(args: &ExportArgs) -> Result<ExitCode> {
    let scenario = Scenario::load(&args.scenario)?;
    let strategy = args
        .strategy
        .clone()
        .unwrap_or_else(|| scenario.file.fsdp.strategy.clone());
    if !FSDP_STRATEGIES.contains(&strategy.as_str()) {
        bail!(
            "--strategy {strategy}: unknown strategy; choose one of {}",
            FSDP_STRATEGIES.join(", ")
        );
    }
    let profile =
        HardwareProfile::load_named(&scenario.file.hardware, hardware_dir_for(&args.scenario))
            .with_context(|| format!("loading hardware profile '{}'", scenario.file.hardware))?;
    let plans_name = scenario.file.name.clone();
    let plans = ScenarioPlans::new(scenario);
    let lint = crate::commands::scenario_figures::plan_check(&plans);
    if let Some(first) = lint.errors.first() {
        bail!(
            "{}: the plan has {} lint error(s), first: {first}; fix them (`hpfsdp plan {}`) before exporting",
            args.scenario.display(),
            lint.errors.len(),
            args.scenario.display()
        );
    }
    let summary = hpfsdp_export::export_chakra(
        &plans,
        &strategy,
        args.optimizer.as_deref(),
        &profile,
        &args.chakra,
    )
    .with_context(|| format!("exporting {} as Chakra traces", args.scenario.display()))?;
    let file = |p: &PathBuf| {
        p.file_name()
            .map_or(String::new(), |f| f.to_string_lossy().into_owned())
    };
    println!(
        "wrote {} Chakra trace(s) ({} nodes, {} process groups), {}, {}, {} and {} into {}",
        summary.traces.len(),
        summary.nodes,
        summary.groups,
        file(&summary.comm_groups),
        file(&summary.system),
        file(&summary.network),
        file(&summary.memory),
        args.chakra.display()
    );
    let at = |p: &PathBuf| p.display().to_string();
    let prefix = args.chakra.join(&plans_name);
    println!(
        "run it in ASTRA-sim's analytical backend:\n  AstraSim_Analytical_Congestion_Unaware --workload-configuration={} --comm-group-configuration={} --system-configuration={} --network-configuration={} --remote-memory-configuration={}",
        prefix.display(),
        at(&summary.comm_groups),
        at(&summary.system),
        at(&summary.network),
        at(&summary.memory)
    );
    Ok(ExitCode::SUCCESS)
}
