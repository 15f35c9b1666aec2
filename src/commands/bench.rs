//! `hpfsdp bench`: how fast the simulator simulates, in one run (ratios, not assertions).

use anyhow::{Context, Result};
use hpfsdp_sim::HardwareProfile;
use std::process::ExitCode;

/// The real scenario the benchmark simulates (768 ranks) and scales to ~100,000 ranks.
const EXP_D: &str = "scenarios/paper/exp-d.toml";

/// Prints the simulator benchmark suite for the named hardware profile.
pub fn run(hardware: &str) -> Result<ExitCode> {
    crate::commands::preflight::check_hardware_flag(hardware)?;
    let profile = HardwareProfile::load_named(hardware, "scenarios/hardware")
        .with_context(|| format!("loading hardware profile '{hardware}'"))?;
    let exp_d = hpfsdp_plan::scenario::Scenario::load(std::path::Path::new(EXP_D))
        .with_context(|| format!("loading {EXP_D} (run from the repository root)"))?;
    let suite = hpfsdp_sim::bench::bench_suite(&profile, Some(&exp_d))
        .context("running the simulator benchmark")?;
    print!("{suite}");
    Ok(ExitCode::SUCCESS)
}
