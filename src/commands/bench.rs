//! `hpfsdp bench`: how fast the simulator simulates, in one run (ratios, not assertions).
//! Each run's line is printed as soon as it ends (a progress bar shows the rest on a
//! terminal); `--json` prints the whole suite as JSON instead.

use anyhow::{Context, Result};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::bench::{bench_suite_with, suite_runs};
use std::process::ExitCode;

/// The real scenario the benchmark simulates (768 ranks) and scales to ~100,000 ranks.
const EXP_D: &str = "scenarios/paper/exp-d.toml";

/// Runs the simulator benchmark suite for the named hardware profile.
pub fn run(hardware: &str, json: bool) -> Result<ExitCode> {
    crate::commands::preflight::check_hardware_flag(hardware)?;
    let profile = HardwareProfile::load_named(hardware, "scenarios/hardware")
        .with_context(|| format!("loading hardware profile '{hardware}'"))?;
    let exp_d = hpfsdp_plan::scenario::Scenario::load(std::path::Path::new(EXP_D))
        .with_context(|| format!("loading {EXP_D} (run from the repository root)"))?;
    let bar = crate::commands::progress::bar(suite_runs(true), "runs");
    let suite = bench_suite_with(&profile, Some(&exp_d), &mut |r| {
        if !json {
            bar.suspend(|| println!("{r}"));
        }
        bar.inc(1);
    })
    .context("running the simulator benchmark")?;
    bar.finish_and_clear();
    if json {
        let value = serde_json::json!({ "hardware": profile.name, "suite": suite });
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        // The runs are printed; the figures drawn from them close the suite.
        let text = suite.to_string();
        for line in text.lines().skip(suite.reports.len()) {
            println!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
