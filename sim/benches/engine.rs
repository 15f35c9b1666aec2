//! The engine's inner loop on a synthetic program: `cargo bench -p hpfsdp-sim --bench engine`.
//!
//! Simulates the synthetic 48-layer FSDP/HSDP step on 768 and on 1,024 ranks without folding
//! or prefix sharing (every rank its own unit: 768 or 1,024 x 290 ops), so the figure is the
//! event loop itself (event queue, host and stream bookkeeping, rendezvous, link sharing,
//! memory accounting), and prints the best of a few repetitions in events per second
//! (`ENGINE_BENCH_REPS`, default 5: the best of several filters out a loaded machine). Then
//! the same for a real scenario's programs: exp-c (128 ranks) and, with
//! `ENGINE_BENCH_LARGE=1`, exp-c with 8x the replicas (1,024 ranks, 14 M events, about 3 GB),
//! every rank on its own. A plain `harness = false` benchmark: no timing
//! assertion, nothing to fail but the simulation itself.

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_sim::bench::scaled_scenario;
use hpfsdp_sim::engine::{SimOptions, simulate_unshared};
use hpfsdp_sim::resources::cpu_seconds;
use hpfsdp_sim::scenario_run::{ScenarioPlans, prepare};
use hpfsdp_sim::{HardwareProfile, SyntheticConfig, Workload, synthetic_program};
use std::path::Path;
use std::time::Instant;

/// Simulates `workload` unshared `reps` times without timeline and memory series; prints the
/// best wall and CPU event rates.
fn time_unshared(
    name: &str,
    workload: &Workload,
    profile: &HardwareProfile,
    reps: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let options = SimOptions {
        record_timeline: false,
        record_memory_series: false,
        ..SimOptions::default()
    };
    time_with(name, workload, profile, reps, &options)
}

/// Simulates `workload` unshared with `options` `reps` times; prints the best wall and CPU
/// event rates.
fn time_with(
    name: &str,
    workload: &Workload,
    profile: &HardwareProfile,
    reps: usize,
    options: &SimOptions,
) -> Result<(), Box<dyn std::error::Error>> {
    let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
    let mut events = 0;
    for _ in 0..reps.max(1) {
        let (t, cpu) = (Instant::now(), cpu_seconds());
        let r = simulate_unshared(workload, profile, options)?;
        best = best.min(t.elapsed().as_secs_f64());
        best_cpu = best_cpu.min(cpu_seconds() - cpu);
        events = r.events_processed;
    }
    println!(
        "engine inner loop, {name} ({} units x {} ops): {events} events in {:.1} ms, \
         {:.2} M events/s ({:.2} M per CPU s)",
        workload.units.len(),
        workload.units[0].program.ops.len(),
        best * 1e3,
        events as f64 / best / 1e6,
        events as f64 / best_cpu.max(1e-9) / 1e6
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps: usize = match std::env::var("ENGINE_BENCH_REPS") {
        Ok(v) => v
            .parse()
            .map_err(|e| format!("ENGINE_BENCH_REPS={v:?}: {e}; give a whole number"))?,
        Err(_) => 5,
    };
    let profile = HardwareProfile::builtin("ascend-910c-a3")?;
    let configs = [
        SyntheticConfig::ranks_768(),
        SyntheticConfig::qwen3_like("1,024 ranks (64 x 16), 48 layers", 64, 16, 48),
    ];
    for cfg in configs {
        let topology = profile.topology_for(cfg.world_size());
        let programs = (0..cfg.world_size())
            .map(|r| synthetic_program(&cfg, &topology, r))
            .collect::<Result<Vec<_>, _>>()?;
        let workload = Workload::unfolded(programs, topology)?;
        time_unshared(&cfg.name, &workload, &profile, reps)?;
        if cfg.world_size() == 768 {
            // As `hpfsdp bench` runs it: timeline, memory series and every rank's breakdown.
            let name = format!("{}, with timeline and memory series", cfg.name);
            time_with(&name, &workload, &profile, reps, &SimOptions::default())?;
        }
    }
    let exp_c = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/paper/exp-c.toml");
    let exp_c = Scenario::load(&exp_c)?;
    let mut scenarios = vec![("exp-c, 128 ranks", exp_c.clone())];
    if std::env::var("ENGINE_BENCH_LARGE").is_ok_and(|v| v == "1") {
        let large = scaled_scenario(&exp_c, 1_024)?;
        scenarios.push(("exp-c x8 replicas, 1,024 ranks", large));
    }
    for (name, scenario) in scenarios {
        let plans = ScenarioPlans::new(scenario);
        let prepared = prepare(&plans, "hyperparallel", None, false)?;
        let profile = HardwareProfile::builtin(&plans.scenario.file.hardware)?;
        time_unshared(name, &prepared.workload, &profile, reps)?;
    }
    Ok(())
}
