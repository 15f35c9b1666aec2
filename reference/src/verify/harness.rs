//! The three executions of one training step (forward, backward, AdamW): the distributed
//! plan in production mode and in validation mode on N in-process ranks, and a single device
//! that accumulates the same micro-batches in the canonical order the collectives use.

use std::time::Instant;

use hpfsdp_backends::{CommError, InProcComm, InProcWorld, TraceEvent};
use hpfsdp_plan::Layout;
use hpfsdp_plan::fsdp::DataDomain;

use super::error::VerifyError;
use super::setup::VerifySpec;
use crate::model::{ParamSet, TinyModel};
use crate::optim::AdamState;
use crate::runtime::boundary::BoundaryTable;
use crate::runtime::executor::unit_kinds;
use crate::runtime::fsdp::{FsdpCounts, FsdpRuntime};
use crate::runtime::topo::dp_index_of;
use crate::runtime::{
    Ctx, DispatchStats, ExecMode, Executor, ParamFacts, RankTopo, RtResult, RuntimeError,
};
use crate::tensor::Tensor;

/// What one rank ends the step with.
#[derive(Debug, Clone)]
pub struct RankResult {
    /// Losses of this rank's micro-batches, by global micro-batch id.
    pub losses: Vec<(usize, f32)>,
    /// Averaged shard gradients, in FSDP-plan order.
    pub grads: Vec<Vec<f32>>,
    /// Updated master shards, in FSDP-plan order.
    pub params: Vec<Vec<f32>>,
    /// Dispatch counters.
    pub stats: DispatchStats,
    /// FSDP collectives issued.
    pub fsdp: FsdpCounts,
    /// Wall time of the step on this rank (forward, backward, optimizer), seconds.
    pub step_seconds: f64,
    /// Layout rules cached at the end of the step.
    pub cached_rules: usize,
}

/// A distributed run.
#[derive(Debug, Clone)]
pub struct DistRun {
    /// Mode.
    pub mode: ExecMode,
    /// Per-rank results.
    pub ranks: Vec<RankResult>,
    /// Per-rank communication traces.
    pub traces: Vec<Vec<TraceEvent>>,
}

impl DistRun {
    /// Slowest rank's step time, seconds.
    pub fn step_seconds(&self) -> f64 {
        self.ranks
            .iter()
            .map(|r| r.step_seconds)
            .fold(0.0, f64::max)
    }

    /// Dispatch counters summed over ranks.
    pub fn stats(&self) -> DispatchStats {
        let mut s = DispatchStats::default();
        for r in &self.ranks {
            s.add(&r.stats);
        }
        s
    }

    /// Mean loss over every micro-batch (summed in micro-batch id order).
    pub fn mean_loss(&self) -> f32 {
        let mut all: Vec<(usize, f32)> = self.ranks.iter().flat_map(|r| r.losses.clone()).collect();
        all.sort_by_key(|x| x.0);
        all.dedup_by_key(|x| x.0);
        let n = all.len().max(1) as f32;
        all.iter().map(|x| x.1).fold(0.0, |a, b| a + b) / n
    }
}

/// The layout facts of `rank` for every parameter.
fn param_facts(spec: &VerifySpec, topo: &RankTopo) -> Result<ParamFacts, VerifyError> {
    let mut facts = ParamFacts {
        expert_parallel: spec.expert_parallel(),
        ..ParamFacts::default()
    };
    for p in &spec.fsdp.params {
        facts
            .layouts
            .insert(p.name.clone(), spec.param_layout(&p.name, &topo.plan_mesh)?);
    }
    if let Some(l) = facts.layouts.get("model.embed_tokens.weight") {
        facts.embed_first_row = l
            .local_offset(&topo.plan_mesh, topo.plan_rank)
            .and_then(|o| o.first().copied())
            .unwrap_or(0) as usize;
    }
    Ok(facts)
}

/// This rank's plan-local piece of parameter `layout` (keyed initialisation of exactly the
/// global elements it holds).
fn init_piece(
    spec: &VerifySpec,
    name: &str,
    layout: &Layout,
    topo: &RankTopo,
) -> RtResult<Tensor<f32>> {
    let spec_p = spec
        .model
        .param_specs()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| RuntimeError::plan(format!("no reference parameter {name}")))?;
    let idx = layout.local_element_indices(&topo.plan_mesh, topo.plan_rank);
    let shape: Vec<usize> = layout
        .local_shape(&topo.plan_mesh, topo.plan_rank)
        .into_iter()
        .map(|d| d as usize)
        .collect();
    let mut vals = Vec::with_capacity(idx.len());
    let mut i = 0;
    while i < idx.len() {
        let mut j = i + 1;
        while j < idx.len() && idx[j] == idx[j - 1] + 1 {
            j += 1;
        }
        vals.extend(spec_p.init_range(spec.seed, idx[i], idx[j - 1] + 1));
        i = j;
    }
    Ok(Tensor::from_vec(&shape, vals)?)
}

fn rank_main(
    spec: &VerifySpec,
    mode: ExecMode,
    boundaries: &BoundaryTable,
    comm: &InProcComm,
) -> Result<RankResult, RuntimeError> {
    let rank = hpfsdp_backends::Collective::rank(comm);
    let topo = RankTopo::new(rank, &spec.scenario.dense_mesh, &spec.scenario.expert_mesh)?;
    let facts = param_facts(spec, &topo).map_err(|e| RuntimeError::plan(e.to_string()))?;
    let fsdp = FsdpRuntime::new(
        &spec.fsdp,
        &topo,
        &mut |name| {
            let l = facts
                .layouts
                .get(name)
                .ok_or_else(|| RuntimeError::plan(format!("no layout for {name}")))?;
            init_piece(spec, name, l, &topo)
        },
        spec.param_bf16,
    )?;
    let units = unit_kinds(&spec.fsdp)?;
    let ctx = Ctx::new(mode, comm, topo.clone(), boundaries);
    let mut exec = Executor::new(ctx, fsdp, spec.model, spec.seq_len, units, facts);
    let dp = dp_index_of(&spec.scenario.dense_mesh, rank);
    let start = Instant::now();
    let mut losses = Vec::new();
    for a in 0..spec.grad_accum {
        let id = spec.micro_batch_id(dp, a);
        let (ids, targets) = spec.data(id);
        let loss = exec.micro_step(&ids, &targets, a + 1 == spec.grad_accum)?;
        losses.push((id, loss));
    }
    let grads = exec.fsdp.take_grads(spec.micro_batches())?;
    let mut params = Vec::with_capacity(grads.len());
    for (p, g) in exec.fsdp.params.iter_mut().zip(&grads) {
        let mut state = AdamState::zeros(g.len());
        let shard = p.shard.as_mut_slice();
        spec.adamw.step(shard, g, &mut state);
        params.push(shard.to_vec());
    }
    let step_seconds = start.elapsed().as_secs_f64();
    Ok(RankResult {
        losses,
        grads,
        params,
        stats: exec.ctx.stats,
        fsdp: exec.fsdp.counts,
        step_seconds,
        cached_rules: exec.ctx.cached_rules(),
    })
}

fn is_peer_exit(e: &RuntimeError) -> bool {
    matches!(
        e,
        RuntimeError::Comm(CommError::PeerExited { .. })
            | RuntimeError::Comm(CommError::Timeout { .. })
    )
}

/// Run one step of the plan on `spec.world()` in-process ranks in `mode`. A failure reports
/// the first rank's own error (not the peers that saw it exit).
pub fn run_distributed(spec: &VerifySpec, mode: ExecMode) -> Result<DistRun, VerifyError> {
    let run_err = |source: RuntimeError| VerifyError::Run {
        mode: mode.name().to_string(),
        source,
    };
    let boundaries = {
        let topo0 = RankTopo::new(0, &spec.scenario.dense_mesh, &spec.scenario.expert_mesh)
            .map_err(run_err)?;
        BoundaryTable::compile(&spec.sharding, &topo0.plan_mesh).map_err(run_err)?
    };
    let world = InProcWorld::run(spec.world(), |comm| {
        rank_main(spec, mode, &boundaries, comm)
    })
    .map_err(|e| run_err(RuntimeError::Comm(e)))?;
    let mut ranks = Vec::new();
    let mut first_err: Option<RuntimeError> = None;
    for r in world.results {
        match r {
            Ok(v) => ranks.push(v),
            Err(e) => {
                let replace = match &first_err {
                    None => true,
                    Some(prev) => is_peer_exit(prev) && !is_peer_exit(&e),
                };
                if replace {
                    first_err = Some(e);
                }
            }
        }
    }
    if let Some(e) = first_err {
        return Err(run_err(e));
    }
    Ok(DistRun {
        mode,
        ranks,
        traces: world.traces,
    })
}

/// The single-device run.
#[derive(Debug, Clone)]
pub struct SingleRun {
    /// Averaged full gradients.
    pub grads: ParamSet<f32>,
    /// Updated full parameters.
    pub params: ParamSet<f32>,
    /// Mean loss over the micro-batches.
    pub mean_loss: f32,
    /// Wall time, seconds.
    pub step_seconds: f64,
}

/// The canonical summation order of a parameter's gradient over micro-batches:
/// `[replica][accumulation step][shard rank][expert-parallel source]` of micro-batch ids,
/// folded innermost first (each fold starts from its first element, as the collectives do).
pub fn canonical_order(spec: &VerifySpec, domain: DataDomain) -> Vec<Vec<Vec<Vec<usize>>>> {
    let dm = &spec.scenario.dense_mesh;
    let em = &spec.scenario.expert_mesh;
    let a_steps = spec.grad_accum;
    if domain == DataDomain::Expert && spec.expert_parallel() {
        let (er, es, ep) = (
            em.axis_size("edp_replicate"),
            em.axis_size("edp_shard"),
            em.axis_size("ep"),
        );
        (0..er)
            .map(|r| {
                (0..a_steps)
                    .map(|a| {
                        (0..es)
                            .map(|s| {
                                (0..ep)
                                    .map(|j| {
                                        let rank = em.rank_of(&[r, s, j, 0]);
                                        spec.micro_batch_id(dp_index_of(dm, rank), a)
                                    })
                                    .collect()
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect()
    } else {
        let (r_n, s_n) = (dm.axis_size("dp_replicate"), dm.axis_size("dp_shard"));
        (0..r_n)
            .map(|r| {
                (0..a_steps)
                    .map(|a| {
                        (0..s_n)
                            .map(|s| vec![spec.micro_batch_id(r * s_n + s, a)])
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }
}

fn fold(items: impl Iterator<Item = Vec<f32>>) -> Vec<f32> {
    let mut acc: Option<Vec<f32>> = None;
    for v in items {
        match &mut acc {
            None => acc = Some(v),
            Some(a) => a.iter_mut().zip(v).for_each(|(x, y)| *x += y),
        }
    }
    acc.unwrap_or_default()
}

/// One step on a single device: each micro-batch's gradient with [`TinyModel`], summed per
/// parameter in [`canonical_order`], divided once by the micro-batch count, then AdamW.
pub fn run_single(spec: &VerifySpec) -> Result<SingleRun, VerifyError> {
    let err = |source: RuntimeError| VerifyError::Run {
        mode: "single-device".into(),
        source,
    };
    let start = Instant::now();
    let model = TinyModel::new(spec.model).map_err(|e| err(e.into()))?;
    let master = spec
        .model
        .init_params::<f32>(spec.seed)
        .map_err(|e| err(e.into()))?;
    let compute = if spec.param_bf16 {
        let mut c = ParamSet::new();
        for (n, t) in master.iter() {
            c.insert(n, t.quantize_bf16());
        }
        c
    } else {
        master.clone()
    };
    let m = spec.micro_batches();
    let mut per_mb = Vec::with_capacity(m);
    let mut loss_sum = 0.0f32;
    for id in 0..m {
        let (ids, targets) = spec.data(id);
        let (loss, g) = model
            .loss_and_grads(&compute, &ids, &targets, spec.seq_len)
            .map_err(|e| err(e.into()))?;
        loss_sum += loss;
        per_mb.push(g);
    }
    let mut grads = ParamSet::new();
    let mut params = ParamSet::new();
    for (name, t) in master.iter() {
        let domain = spec
            .fsdp
            .param(name)
            .map_or(DataDomain::Dense, |p| p.domain);
        let order = canonical_order(spec, domain);
        let get = |id: usize| -> Vec<f32> {
            per_mb[id]
                .get(name)
                .map(|g| g.as_slice().to_vec())
                .unwrap_or_default()
        };
        let total = fold(order.iter().map(|rep| {
            fold(rep.iter().map(|step| {
                fold(
                    step.iter()
                        .map(|shard| fold(shard.iter().map(|&id| get(id)))),
                )
            }))
        }));
        let avg: Vec<f32> = total.into_iter().map(|x| x / m as f32).collect();
        let mut p = t.as_slice().to_vec();
        let mut state = AdamState::zeros(p.len());
        spec.adamw.step(&mut p, &avg, &mut state);
        grads.insert(
            name,
            Tensor::from_vec(t.shape(), avg).map_err(|e| err(e.into()))?,
        );
        params.insert(
            name,
            Tensor::from_vec(t.shape(), p).map_err(|e| err(e.into()))?,
        );
    }
    Ok(SingleRun {
        grads,
        params,
        mean_loss: loss_sum / m as f32,
        step_seconds: start.elapsed().as_secs_f64(),
    })
}
