//! The engine's inner loop on a synthetic program: `cargo bench -p hpfsdp-sim --bench engine`.
//!
//! Simulates the synthetic 48-layer FSDP/HSDP step on 768 and on 1,024 ranks without folding
//! or prefix sharing (every rank its own unit: 768 or 1,024 x 290 ops), so the figure is the
//! event loop itself (event queue, host and stream bookkeeping, rendezvous, link sharing,
//! memory accounting), and prints the best of a few repetitions in events per second
//! (`ENGINE_BENCH_REPS`, default 5: the best of several filters out a loaded machine). A
//! plain `harness = false` benchmark: no timing assertion, nothing to fail but the
//! simulation itself.

use hpfsdp_sim::engine::{SimOptions, simulate_unshared};
use hpfsdp_sim::resources::cpu_seconds;
use hpfsdp_sim::{HardwareProfile, SyntheticConfig, Workload, synthetic_program};
use std::time::Instant;

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
        let options = SimOptions {
            record_timeline: false,
            record_memory_series: false,
            ..SimOptions::default()
        };
        let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
        let mut events = 0;
        for _ in 0..reps.max(1) {
            let (t, cpu) = (Instant::now(), cpu_seconds());
            let r = simulate_unshared(&workload, &profile, &options)?;
            best = best.min(t.elapsed().as_secs_f64());
            best_cpu = best_cpu.min(cpu_seconds() - cpu);
            events = r.events_processed;
        }
        println!(
            "engine inner loop, {} ({} units x {} ops): {} events in {:.1} ms, {:.2} M events/s \
             ({:.2} M per CPU s)",
            cfg.name,
            workload.units.len(),
            workload.units[0].program.ops.len(),
            events,
            best * 1e3,
            events as f64 / best / 1e6,
            events as f64 / best_cpu.max(1e-9) / 1e6
        );
    }
    Ok(())
}
