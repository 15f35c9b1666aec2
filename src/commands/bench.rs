//! `hpfsdp bench`: how fast the simulator simulates, in one run (ratios, not assertions).

use anyhow::{Context, Result};
use hpfsdp_sim::HardwareProfile;
use std::process::ExitCode;

/// Prints the simulator benchmark suite for the named hardware profile.
pub fn run(hardware: &str) -> Result<ExitCode> {
    let profile = HardwareProfile::load_named(hardware, "scenarios/hardware")
        .with_context(|| format!("loading hardware profile '{hardware}'"))?;
    let reports =
        hpfsdp_sim::bench::bench_suite(&profile).context("running the simulator benchmark")?;
    for r in reports {
        println!("{r}");
    }
    Ok(ExitCode::SUCCESS)
}
