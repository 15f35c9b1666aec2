//! Synthetic SPMD workloads and the simulator benchmark (`hpfsdp bench`).
//!
//! The synthetic step is an FSDP/HSDP training step with `layers` identical layers: forward
//! (all-gather with prefetch depth 1, compute that reshards), backward (all-gather, compute,
//! reduce-scatter, and a cross-replica all-reduce when `dp_replicate > 1`), an optimizer
//! kernel and a final host synchronization. Sizes default to a Qwen3-30B-A3B-like layer.

use crate::engine::{SimOptions, simulate, simulate_unshared};
use crate::error::SimError;
use crate::profile::HardwareProfile;
use crate::resources::{Meter, cpu_seconds};
use crate::scenario_run::{ProgramJob, RunOptions, ScenarioPlans, run_prepared};
use crate::workload::Workload;
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_plan::{CollectiveKind, DType, Topology};
use hpfsdp_program::step::{
    Category, CollectiveOp, ComputeWork, Group, MemTag, OpId, ProgramBuilder, StepProgram, Stream,
};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Shape of a synthetic FSDP/HSDP step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyntheticConfig {
    /// Name printed by the benchmark.
    pub name: String,
    /// Replicas (outer mesh axis).
    pub dp_replicate: usize,
    /// Shards per replica (inner mesh axis, contiguous ranks).
    pub dp_shard: usize,
    /// Transformer layers.
    pub layers: usize,
    /// Unsharded bf16 parameter bytes per layer.
    pub layer_param_bytes: u64,
    /// Forward FLOPs per layer per rank (backward is twice this).
    pub layer_fwd_flops: u64,
    /// Activation bytes saved per layer per rank.
    pub layer_activation_bytes: u64,
    /// Kernels per layer forward (backward launches twice as many).
    pub layer_kernels: u32,
    /// Optional straggler: (rank, compute multiplier), making the job asymmetric.
    pub straggler: Option<(usize, u64)>,
}

impl SyntheticConfig {
    /// A Qwen3-30B-A3B-like layer (about 0.6 B parameters per layer, 3 B activated of 30 B)
    /// at micro-batch 2 x 4,096 tokens, on `dp_replicate x dp_shard` ranks.
    pub fn qwen3_like(name: &str, dp_replicate: usize, dp_shard: usize, layers: usize) -> Self {
        Self {
            name: name.into(),
            dp_replicate,
            dp_shard,
            layers,
            layer_param_bytes: 1_250_000_000,
            layer_fwd_flops: 1_000_000_000_000,
            layer_activation_bytes: 400_000_000,
            layer_kernels: 40,
            straggler: None,
        }
    }

    /// 768 ranks = 48 machines of 16 (one A3 supernode): shard 16 inside a machine,
    /// replicate 48 across the supernode.
    pub fn ranks_768() -> Self {
        Self::qwen3_like("768 ranks (48 x 16), 48 layers", 48, 16, 48)
    }

    /// 100,608 ranks = 131 A3 supernodes: shard 768 inside a supernode, replicate 131
    /// across supernodes over RoCE.
    pub fn ranks_100k() -> Self {
        Self::qwen3_like("100,608 ranks (131 x 768), 48 layers", 131, 768, 48)
    }

    /// Ranks in the job.
    pub fn world_size(&self) -> usize {
        self.dp_replicate * self.dp_shard
    }
}

/// The synthetic program of `rank` (see the module documentation).
pub fn synthetic_program(
    cfg: &SyntheticConfig,
    topology: &Topology,
    rank: usize,
) -> Result<StepProgram, SimError> {
    let mut b = ProgramBuilder::new(rank);
    let sy = Synth::new(cfg, topology, rank, &mut b)?;
    let layers = cfg.layers as u64;
    b.resident(MemTag::Params, sy.shard_bytes * layers);
    b.resident(MemTag::Optimizer, 4 * sy.shard_bytes * layers);
    let fwd = sy.forward(&mut b);
    let reduced = sy.backward(&mut b, &fwd);
    sy.optimizer(&mut b, &reduced);
    Ok(b.build()?)
}

/// One rank's synthetic step: its collectives and per-layer sizes, shared by the phases.
struct Synth<'c> {
    cfg: &'c SyntheticConfig,
    /// Per-layer all-gather, reduce-scatter (shard group) and all-reduce (replica group).
    ag: CollectiveOp,
    rs: CollectiveOp,
    ar: CollectiveOp,
    shard_bytes: u64,
    full_bytes: u64,
    /// Compute multiplier (the straggler's, else 1).
    slow: u64,
}

impl<'c> Synth<'c> {
    /// Registers `rank`'s shard and replica groups (in that order) and sizes its collectives.
    fn new(
        cfg: &'c SyntheticConfig,
        topology: &Topology,
        rank: usize,
        b: &mut ProgramBuilder,
    ) -> Result<Self, SimError> {
        let s = cfg.dp_shard.max(1);
        let shard_ranks: Vec<usize> = (rank / s * s..rank / s * s + s).collect();
        let replica_ranks: Vec<usize> = (0..cfg.dp_replicate).map(|k| k * s + rank % s).collect();
        let shard_tier = topology.tier_of(&shard_ranks);
        let replica_tier = topology.tier_of(&replica_ranks);
        let shard_group = b.group(Group::new("dp_shard", shard_ranks)?);
        let replica_group = b.group(Group::new("dp_replicate", replica_ranks)?);
        let shard_bytes = cfg.layer_param_bytes.div_ceil(s as u64);
        let full_bytes = shard_bytes * s as u64;
        let coll = |kind, group, tier, input_bytes, output_bytes| CollectiveOp {
            kind,
            group,
            tier,
            input_bytes,
            output_bytes,
            dtype: DType::Bf16,
            aligned_512: true,
        };
        let slow = match cfg.straggler {
            Some((r, m)) if r == rank => m.max(1),
            _ => 1,
        };
        Ok(Self {
            cfg,
            ag: coll(
                CollectiveKind::AllGather,
                shard_group,
                shard_tier,
                shard_bytes,
                full_bytes,
            ),
            rs: coll(
                CollectiveKind::ReduceScatter,
                shard_group,
                shard_tier,
                full_bytes,
                shard_bytes,
            ),
            ar: coll(
                CollectiveKind::AllReduce,
                replica_group,
                replica_tier,
                shard_bytes,
                shard_bytes,
            ),
            shard_bytes,
            full_bytes,
            slow,
        })
    }

    /// Compute work of `flops` (scaled for a straggler) reading and writing the layer twice.
    fn work(&self, flops: u64, kernels: u32) -> ComputeWork {
        ComputeWork {
            flops: flops * self.slow,
            hbm_bytes: self.full_bytes * 2,
            kernels,
            mix: None,
        }
    }

    /// Forward with prefetch depth 1: all-gather i+1 is issued before compute i and waits for
    /// compute i-1 to reshard. Returns the forward compute ops.
    fn forward(&self, b: &mut ProgramBuilder) -> Vec<OpId> {
        let (cfg, full_bytes) = (self.cfg, self.full_bytes);
        let layers = cfg.layers;
        let mut fwd: Vec<OpId> = Vec::with_capacity(layers);
        let mut next_ag = Some(b.collective(Stream::AllGather, Category::FsdpAg, self.ag, &[]));
        for i in 0..layers {
            let this_ag = next_ag.take();
            if let Some(a) = this_ag {
                b.alloc(a, MemTag::Params, full_bytes);
            }
            if i + 1 < layers {
                let deps: Vec<OpId> = i.checked_sub(1).map(|j| fwd[j]).into_iter().collect();
                next_ag = Some(b.collective(Stream::AllGather, Category::FsdpAg, self.ag, &deps));
            }
            let deps: Vec<OpId> = this_ag.into_iter().collect();
            let f = b.compute(self.work(cfg.layer_fwd_flops, cfg.layer_kernels), &deps);
            b.alloc(f, MemTag::Activations, cfg.layer_activation_bytes)
                .free(f, MemTag::Params, full_bytes);
            fwd.push(f);
        }
        fwd
    }

    /// Backward in reverse layer order: all-gather (prefetched one layer ahead), compute,
    /// reduce-scatter and, with replicas, the all-reduce. Returns the last reduce-scatter and
    /// all-reduce.
    fn backward(&self, b: &mut ProgramBuilder, fwd: &[OpId]) -> Vec<OpId> {
        let (cfg, full_bytes) = (self.cfg, self.full_bytes);
        let mut last_rs = None;
        let mut last_ar = None;
        let mut bwd: Vec<OpId> = Vec::with_capacity(cfg.layers);
        let first_dep: Vec<OpId> = fwd.last().copied().into_iter().collect();
        let mut next_ag =
            Some(b.collective(Stream::AllGather, Category::FsdpAg, self.ag, &first_dep));
        for i in (0..cfg.layers).rev() {
            let this_ag = next_ag.take();
            if let Some(a) = this_ag {
                b.alloc(a, MemTag::Params, full_bytes);
            }
            if i > 0 {
                let deps: Vec<OpId> = bwd.last().copied().into_iter().collect();
                next_ag = Some(b.collective(Stream::AllGather, Category::FsdpAg, self.ag, &deps));
            }
            let deps: Vec<OpId> = this_ag.into_iter().collect();
            let g = b.compute(
                self.work(2 * cfg.layer_fwd_flops, 2 * cfg.layer_kernels),
                &deps,
            );
            b.alloc(g, MemTag::Grads, full_bytes)
                .free(g, MemTag::Params, full_bytes)
                .free(g, MemTag::Activations, cfg.layer_activation_bytes);
            bwd.push(g);
            let r = b.collective(Stream::ReduceScatter, Category::FsdpRs, self.rs, &[g]);
            b.alloc(r, MemTag::Grads, self.shard_bytes)
                .free(r, MemTag::Grads, full_bytes);
            last_rs = Some(r);
            if cfg.dp_replicate > 1 {
                last_ar = Some(b.collective(Stream::AllReduce, Category::FsdpAr, self.ar, &[r]));
            }
        }
        last_rs.into_iter().chain(last_ar).collect()
    }

    /// The optimizer kernel after the last reductions, then the final host synchronization.
    fn optimizer(&self, b: &mut ProgramBuilder, reduced: &[OpId]) {
        let layers = self.cfg.layers;
        let shard_bytes = self.shard_bytes;
        let opt = b.compute_on(
            Stream::Compute,
            Category::Optimizer,
            ComputeWork {
                flops: 10 * shard_bytes * layers as u64,
                hbm_bytes: 12 * shard_bytes * layers as u64,
                kernels: 4 * layers as u32,
                mix: None,
            },
            reduced,
        );
        b.free(opt, MemTag::Grads, shard_bytes * layers as u64);
        b.host(Category::Host, 20_000, &[opt]);
    }
}

/// Wall-clock, CPU and memory figures of one benchmark run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// Configuration name.
    pub name: String,
    /// Optimizer strategy of a scenario run (`None` for synthetic steps).
    #[serde(default)]
    pub optimizer: Option<String>,
    /// Ranks in the job.
    pub world_size: usize,
    /// Ranks simulated after folding.
    pub simulated_ranks: usize,
    /// Whether folding was on.
    pub folded: bool,
    /// Ops per rank program.
    pub ops_per_rank: usize,
    /// Seconds to derive the scenario's sharding and FSDP plans (0 for synthetic steps);
    /// done once per scenario, not per simulated step.
    pub plan_s: f64,
    /// Seconds to generate (and fold) the programs.
    pub prepare_s: f64,
    /// CPU seconds (user + system, all threads) of generating (and folding) the programs.
    #[serde(default)]
    pub prepare_cpu_s: f64,
    /// Seconds to simulate the step.
    pub simulate_s: f64,
    /// Events processed.
    pub events: u64,
    /// Events per second of simulation wall time.
    pub events_per_s: f64,
    /// Predicted step time, seconds.
    pub step_time_s: f64,
    /// CPU seconds (user + system, all threads) of preparing plus simulating.
    #[serde(default)]
    pub cpu_s: f64,
    /// CPU seconds of simulating alone (events per CPU second are robust to a loaded
    /// machine, events per wall second are not).
    #[serde(default)]
    pub simulate_cpu_s: f64,
    /// Peak resident memory while preparing and simulating, bytes (see [`crate::resources`]).
    #[serde(default)]
    pub peak_rss_bytes: u64,
}

impl BenchReport {
    /// Wall time for one simulated step: preparing plus simulating, seconds.
    pub fn wall_s(&self) -> f64 {
        self.prepare_s + self.simulate_s
    }
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} ranks ({} simulated, folding {}), {} ops/rank; plan {:.3} s, programs+fold {:.3} s, simulate {:.3} ms \
             (step wall {:.3} s, CPU {:.3} s, peak RSS {:.0} MB), {} events ({:.2} M events/s, {:.2} M per CPU s), predicted step {:.3} s",
            self.name,
            self.world_size,
            self.simulated_ranks,
            if self.folded { "on" } else { "off" },
            self.ops_per_rank,
            self.plan_s,
            self.prepare_s,
            self.simulate_s * 1e3,
            self.wall_s(),
            self.cpu_s,
            self.peak_rss_bytes as f64 / 1e6,
            self.events,
            self.events_per_s / 1e6,
            self.events as f64 / self.simulate_cpu_s.max(1e-9) / 1e6,
            self.step_time_s
        )
    }
}

/// Generates, optionally folds, and simulates a synthetic step, timing each part. Unfolded,
/// every rank is simulated on its own ([`simulate_unshared`]), so the figure is the engine's
/// event rate on 768 units.
pub fn bench_synthetic(
    cfg: &SyntheticConfig,
    profile: &HardwareProfile,
    fold: bool,
) -> Result<BenchReport, SimError> {
    let world = cfg.world_size();
    let topology = profile.topology_for(world);
    let meter = Meter::start();
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    let workload = if fold {
        Workload::fold_with(world, topology, |r| synthetic_program(cfg, &topology, r))?
    } else {
        let programs = (0..world)
            .map(|r| synthetic_program(cfg, &topology, r))
            .collect::<Result<Vec<_>, _>>()?;
        Workload::unfolded(programs, topology)?
    };
    let prepare_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let cpu1 = cpu_seconds();
    let prepare_cpu_s = cpu1 - cpu0;
    let result = if fold {
        simulate(&workload, profile, &SimOptions::default())?
    } else {
        simulate_unshared(&workload, profile, &SimOptions::default())?
    };
    let simulate_s = t1.elapsed().as_secs_f64();
    let simulate_cpu_s = cpu_seconds() - cpu1;
    let usage = meter.stop();
    Ok(BenchReport {
        name: cfg.name.clone(),
        optimizer: None,
        world_size: world,
        simulated_ranks: result.simulated_ranks,
        folded: fold,
        ops_per_rank: workload.units.first().map_or(0, |u| u.program.ops.len()),
        plan_s: 0.0,
        prepare_s,
        prepare_cpu_s,
        simulate_s,
        events: result.events_processed,
        events_per_s: result.events_processed as f64 / simulate_s.max(1e-9),
        step_time_s: result.step_time_s(),
        cpu_s: usage.cpu_s,
        simulate_cpu_s,
        peak_rss_bytes: usage.peak_rss_bytes,
    })
}

/// Derives the plans of `scenario`, generates its strategy's programs with `optimizer`
/// (`None`: the scenario's default, distributed Muon on `muon+adamw` scenarios), folds and
/// simulates them, timing the whole (the `prepare` figure covers program generation). CPU
/// time and peak memory cover generating and simulating, not freeing the programs afterwards
/// (the CLI never pays for that, see [`crate::scenario_run::drop_in_background`]).
pub fn bench_scenario(
    name: &str,
    scenario: Scenario,
    strategy: &str,
    optimizer: Option<&str>,
    profile: &HardwareProfile,
) -> Result<BenchReport, SimError> {
    let t0 = Instant::now();
    let plans = ScenarioPlans::new(scenario);
    let plan_s = t0.elapsed().as_secs_f64();
    let meter = Meter::start();
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    let job = ProgramJob::new(&plans, strategy, optimizer)?;
    // The generator holds what it reads of the plans, and the simulation reads the programs
    // only: the plans (most of an AdamW run's memory on exp-d's 50k per-expert parameters)
    // go before the programs are generated.
    drop(plans);
    let prepared = job.prepare(true)?;
    let prepare_s = t0.elapsed().as_secs_f64();
    let prepare_cpu_s = cpu_seconds() - cpu0;
    let options = RunOptions {
        record_timeline: false,
        all_ranks: false,
        ..RunOptions::default()
    };
    let t1 = Instant::now();
    let cpu1 = cpu_seconds();
    let run = run_prepared(&prepared, profile, &options)?;
    let simulate_s = t1.elapsed().as_secs_f64();
    let simulate_cpu_s = cpu_seconds() - cpu1;
    let usage = meter.stop();
    drop(prepared);
    let r = &run.result;
    Ok(BenchReport {
        name: name.to_string(),
        optimizer: Some(run.optimizer.clone()),
        world_size: r.world_size,
        simulated_ranks: r.simulated_ranks,
        folded: r.folded,
        ops_per_rank: run.rank0_program.ops.len(),
        plan_s,
        prepare_s,
        prepare_cpu_s,
        simulate_s,
        events: r.events_processed,
        events_per_s: r.events_processed as f64 / simulate_s.max(1e-9),
        step_time_s: r.step_time_s(),
        cpu_s: usage.cpu_s,
        simulate_cpu_s,
        peak_rss_bytes: usage.peak_rss_bytes,
    })
}
/// `scenario` scaled to about `target_ranks` ranks by multiplying both replicate axes (and
/// the supernode count) by the same factor: the same job, more replicas.
pub fn scaled_scenario(scenario: &Scenario, target_ranks: usize) -> Result<Scenario, SimError> {
    let bad = |m: String| SimError::Workload(format!("scaling {}: {m}", scenario.path.display()));
    let world = scenario.world_size();
    let factor = target_ranks.div_ceil(world).max(1);
    let text =
        hpfsdp_plan::input_file::read_text(&scenario.path, &hpfsdp_plan::limits::SCENARIO_FILE)
            .map_err(|e| bad(e.reason))?;
    let mut doc: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| bad(e.to_string()))?;
    let scale = |doc: &mut toml::Table, section: &str, key: &str, default: i64| {
        let t = doc
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let Some(t) = t.as_table_mut() {
            let v = t
                .get(key)
                .and_then(toml::Value::as_integer)
                .unwrap_or(default);
            t.insert(key.into(), toml::Value::Integer(v * factor as i64));
        }
    };
    scale(&mut doc, "mesh", "dp_replicate", 1);
    let edp = scenario.expert_mesh.axis_size("edp_replicate") as i64;
    if let Some(m) = doc.get_mut("mesh").and_then(toml::Value::as_table_mut) {
        m.insert("edp_replicate".into(), toml::Value::Integer(edp));
    }
    scale(&mut doc, "mesh", "edp_replicate", 1);
    scale(&mut doc, "topology", "supernodes", 1);
    if let Some(t) = doc.get_mut("train").and_then(toml::Value::as_table_mut) {
        let gb = t
            .get("global_batch")
            .and_then(toml::Value::as_integer)
            .unwrap_or(1);
        t.insert(
            "global_batch".into(),
            toml::Value::Integer(gb * factor as i64),
        );
    }
    let text = toml::to_string(&doc).map_err(|e| bad(e.to_string()))?;
    Scenario::from_str_at(&text, &scenario.path).map_err(|e| bad(e.to_string()))
}

/// Slope of the least-squares line through `(ln x, ln y)`; `None` with fewer than two
/// distinct `x` or a non-positive value.
pub fn log_log_slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.iter().any(|&(x, y)| x <= 0.0 || y <= 0.0) {
        return None;
    }
    let n = points.len() as f64;
    let lx: Vec<f64> = points.iter().map(|p| p.0.ln()).collect();
    let ly: Vec<f64> = points.iter().map(|p| p.1.ln()).collect();
    let (mx, my) = (lx.iter().sum::<f64>() / n, ly.iter().sum::<f64>() / n);
    let sxx: f64 = lx.iter().map(|x| (x - mx) * (x - mx)).sum();
    let sxy: f64 = lx.iter().zip(&ly).map(|(x, y)| (x - mx) * (y - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_log_slope_recovers_a_power_law() {
        let pts: Vec<(f64, f64)> = [768.0, 3072.0, 100_608.0]
            .iter()
            .map(|&x: &f64| (x, 0.002 * x.powf(0.75)))
            .collect();
        let b = log_log_slope(&pts).unwrap();
        assert!((b - 0.75).abs() < 1e-9, "{b}");
        assert_eq!(log_log_slope(&[(1.0, 1.0)]), None);
        assert_eq!(log_log_slope(&[(1.0, 0.0), (2.0, 1.0)]), None);
    }
}
