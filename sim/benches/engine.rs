//! The engine's inner loop on a synthetic program: `cargo bench -p hpfsdp-sim --bench engine`.
//!
//! Simulates the synthetic 48-layer FSDP/HSDP step on 768 ranks without folding or prefix
//! sharing (every rank its own unit: 768 x 290 ops), so the figure is the event loop itself
//! (heap, host and stream bookkeeping, rendezvous, link sharing), and prints the best of a
//! few repetitions in events per second. A plain `harness = false` benchmark: no timing
//! assertion, nothing to fail but the simulation itself.

use hpfsdp_sim::engine::{SimOptions, simulate_unshared};
use hpfsdp_sim::{HardwareProfile, SyntheticConfig, Workload, synthetic_program};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let profile = HardwareProfile::builtin("ascend-910c-a3")?;
    let cfg = SyntheticConfig::ranks_768();
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
    let mut best = f64::INFINITY;
    let mut events = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let r = simulate_unshared(&workload, &profile, &options)?;
        best = best.min(t.elapsed().as_secs_f64());
        events = r.events_processed;
    }
    println!(
        "engine inner loop, {} ({} units x {} ops): {} events in {:.1} ms, {:.2} M events/s",
        cfg.name,
        workload.units.len(),
        workload.units[0].program.ops.len(),
        events,
        best * 1e3,
        events as f64 / best / 1e6
    );
    Ok(())
}
