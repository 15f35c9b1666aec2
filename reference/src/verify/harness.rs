//! The three executions of the training steps (forward, backward, optimizer: AdamW, or AdamW
//! chained with distributed Muon): the distributed plan in production mode and in validation
//! mode on N in-process ranks, and a single device that accumulates the same micro-batches in
//! the canonical order the collectives use. An AdamW verification runs one step, a Muon one
//! [`super::muon::MUON_VERIFY_STEPS`] so that momentum carries over.

use std::time::Instant;

use hpfsdp_backends::{Collective, CommError, InProcWorld, TraceEvent};
use hpfsdp_plan::Layout;
use hpfsdp_plan::fsdp::DataDomain;

use super::error::VerifyError;
use super::muon::{MuonRank, MuonStepRecord, runtime_error};
use super::setup::VerifySpec;
use crate::model::{ParamSet, TinyModel};
use crate::muon::SingleDeviceChained;
use crate::optim::AdamState;
use crate::runtime::boundary::BoundaryTable;
use crate::runtime::executor::unit_kinds;
use crate::runtime::fsdp::{FsdpCounts, FsdpRuntime};
use crate::runtime::topo::dp_index_of;
use crate::runtime::{
    Ctx, DispatchStats, ExecMode, Executor, ParamFacts, RankTopo, RtResult, RuntimeError,
};
use crate::tensor::Tensor;

/// One rank's shards after one training step.
#[derive(Debug, Clone)]
pub struct StepShards {
    /// Averaged shard gradients of the step, in FSDP-plan order.
    pub grads: Vec<Vec<f32>>,
    /// Master shards after the step's optimizer update, in FSDP-plan order.
    pub params: Vec<Vec<f32>>,
}

/// What one rank ends the run with.
#[derive(Debug, Clone)]
pub struct RankResult {
    /// Losses of this rank's micro-batches, by data id (see [`VerifySpec::step_data_id`]).
    pub losses: Vec<(usize, f32)>,
    /// Averaged shard gradients of the last step, in FSDP-plan order.
    pub grads: Vec<Vec<f32>>,
    /// Updated master shards after the last step, in FSDP-plan order.
    pub params: Vec<Vec<f32>>,
    /// Gradients and updated shards of every step (the last equals `grads` / `params`).
    pub history: Vec<StepShards>,
    /// The Muon optimizer's record of every step (empty under AdamW).
    pub muon: Vec<MuonStepRecord>,
    /// Dispatch counters.
    pub stats: DispatchStats,
    /// FSDP collectives issued.
    pub fsdp: FsdpCounts,
    /// Wall time of all steps on this rank (forward, backward, optimizer), seconds.
    pub step_seconds: f64,
    /// Layout rules cached at the end of the run.
    pub cached_rules: usize,
}

/// A distributed run.
#[derive(Debug, Clone)]
pub struct DistRun {
    /// Mode.
    pub mode: ExecMode,
    /// Per-rank results.
    pub ranks: Vec<RankResult>,
    /// Per-rank communication traces of the first step's forward and backward (the calls a
    /// step program describes; optimizer collectives and later steps are left out).
    pub traces: Vec<Vec<TraceEvent>>,
    /// Per-rank communication traces of the deduplicated Muon engine in the first optimizer
    /// step (the calls the Muon optimizer part of a step program describes; AdamW chained
    /// first issues none, naive Muon's calls are left out). Empty under AdamW.
    pub muon_traces: Vec<Vec<TraceEvent>>,
}

impl DistRun {
    /// Slowest rank's time for all steps, seconds.
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

    /// Mean loss over every micro-batch of every step (summed in data id order).
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

/// The optimizer of one rank.
enum RankOptimizer<'a> {
    /// AdamW on every parameter (one state per FSDP-plan parameter).
    Adamw(Vec<AdamState>),
    /// AdamW chained with distributed Muon.
    Muon(Box<MuonRank<'a>>),
}

impl<'a> RankOptimizer<'a> {
    fn new(
        spec: &'a VerifySpec,
        mode: ExecMode,
        rank: usize,
        shards: &[Vec<f32>],
    ) -> RtResult<RankOptimizer<'a>> {
        Ok(match &spec.muon {
            None => {
                RankOptimizer::Adamw(shards.iter().map(|s| AdamState::zeros(s.len())).collect())
            }
            Some(mv) => {
                let naive = mv.naive && mode == ExecMode::Production;
                RankOptimizer::Muon(Box::new(
                    MuonRank::new(mv, rank, shards, naive).map_err(runtime_error)?,
                ))
            }
        })
    }

    /// One update of `shards` with `grads` (FSDP order).
    fn step(
        &mut self,
        spec: &VerifySpec,
        comm: &dyn Collective,
        shards: &mut [Vec<f32>],
        grads: &[Vec<f32>],
    ) -> RtResult<Option<MuonStepRecord>> {
        match self {
            RankOptimizer::Adamw(states) => {
                for ((p, g), st) in shards.iter_mut().zip(grads).zip(states.iter_mut()) {
                    spec.adamw.step(p, g, st);
                }
                Ok(None)
            }
            RankOptimizer::Muon(m) => m.step(comm, shards, grads).map(Some).map_err(runtime_error),
        }
    }
}

/// The steps of one rank. `comm` may have been used before (a process backend runs several
/// executions on one communicator): trace positions are returned relative to the calls made
/// before this run, so the result is the same as on a fresh communicator.
fn rank_main(
    spec: &VerifySpec,
    mode: ExecMode,
    boundaries: &BoundaryTable,
    comm: &dyn Collective,
) -> Result<(RankResult, usize), RuntimeError> {
    let base = comm.trace().len();
    let rank = comm.rank();
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
    let ctx =
        Ctx::new(mode, comm, topo.clone(), boundaries).with_activation_dtype(spec.act_dtype());
    let mut exec = Executor::new(ctx, fsdp, spec.model, spec.seq_len, units, facts);
    let dp = dp_index_of(&spec.scenario.dense_mesh, rank);
    let initial: Vec<Vec<f32>> = exec
        .fsdp
        .params
        .iter()
        .map(|p| p.shard.as_slice().to_vec())
        .collect();
    let mut opt = RankOptimizer::new(spec, mode, rank, &initial)?;
    let start = Instant::now();
    let mut losses = Vec::new();
    let mut history = Vec::with_capacity(spec.steps);
    let mut muon = Vec::new();
    let mut first_step_calls = 0;
    for step in 0..spec.steps {
        for a in 0..spec.grad_accum {
            let id = spec.step_data_id(step, spec.micro_batch_id(dp, a));
            let (ids, targets) = spec.data(id);
            let loss = exec.micro_step(&ids, &targets, a + 1 == spec.grad_accum)?;
            losses.push((id, loss));
        }
        if step == 0 {
            first_step_calls = comm.trace().len() - base;
        }
        let grads = exec.fsdp.take_grads(spec.micro_batches())?;
        let mut shards: Vec<Vec<f32>> = exec
            .fsdp
            .params
            .iter()
            .map(|p| p.shard.as_slice().to_vec())
            .collect();
        if let Some(mut rec) = opt.step(spec, comm, &mut shards, &grads)? {
            rec.dedup_calls = rec.dedup_calls.start - base..rec.dedup_calls.end - base;
            muon.push(rec);
        }
        for (p, s) in exec.fsdp.params.iter_mut().zip(&shards) {
            p.shard.as_mut_slice().copy_from_slice(s);
        }
        history.push(StepShards {
            grads,
            params: shards,
        });
    }
    let step_seconds = start.elapsed().as_secs_f64();
    let last = history
        .last()
        .cloned()
        .ok_or_else(|| RuntimeError::plan("a verification runs at least one step"))?;
    Ok((
        RankResult {
            losses,
            grads: last.grads,
            params: last.params,
            history,
            muon,
            stats: exec.ctx.stats,
            fsdp: exec.fsdp.counts,
            step_seconds,
            cached_rules: exec.ctx.cached_rules(),
        },
        first_step_calls,
    ))
}

fn is_peer_exit(e: &RuntimeError) -> bool {
    matches!(
        e,
        RuntimeError::Comm(CommError::PeerExited { .. })
            | RuntimeError::Comm(CommError::Timeout { .. })
    )
}

/// What one rank's run gives the report.
#[derive(Debug, Clone)]
pub struct RankRun {
    /// The rank's result.
    pub result: RankResult,
    /// The rank's calls of this run (positions and per-group call numbers counted from the
    /// start of the run), up to the end of the first step's backward pass and beyond.
    pub trace: Vec<TraceEvent>,
    /// Calls of the first step's forward and backward (what [`DistRun::traces`] holds).
    pub first_step_calls: usize,
}

/// `full[base..]` renumbered as if the communicator were fresh at `base`: positions from 0,
/// and each group's (or send/receive channel's) call numbers from 0.
pub fn rebase_trace(full: &[TraceEvent], base: usize) -> Vec<TraceEvent> {
    use std::collections::HashMap;
    let key = |e: &TraceEvent| (e.kind.name() == "recv", e.group_id, e.peer, e.tag);
    let mut before: HashMap<_, u64> = HashMap::new();
    for e in &full[..base.min(full.len())] {
        *before.entry(key(e)).or_insert(0) += 1;
    }
    full.iter()
        .skip(base)
        .enumerate()
        .map(|(i, e)| {
            let mut e = e.clone();
            e.index = i;
            e.seq -= before.get(&key(&e)).copied().unwrap_or(0);
            e
        })
        .collect()
}

fn boundary_table(spec: &VerifySpec) -> Result<BoundaryTable, RuntimeError> {
    let topo0 = RankTopo::new(0, &spec.scenario.dense_mesh, &spec.scenario.expert_mesh)?;
    BoundaryTable::compile(&spec.sharding, &topo0.plan_mesh)
}

/// Run this rank's part of the steps of the plan in `mode` over `comm` (any backend: an
/// in-process thread or one process of an MPI job).
pub fn run_rank(
    spec: &VerifySpec,
    mode: ExecMode,
    comm: &dyn Collective,
) -> Result<RankRun, RuntimeError> {
    let boundaries = boundary_table(spec)?;
    let base = comm.trace().len();
    let (result, first_step_calls) = rank_main(spec, mode, &boundaries, comm)?;
    Ok(RankRun {
        result,
        trace: rebase_trace(&comm.trace(), base),
        first_step_calls,
    })
}

impl DistRun {
    /// Assemble a distributed run from every rank's [`RankRun`] (indexed by rank).
    pub fn from_rank_runs(mode: ExecMode, runs: Vec<RankRun>) -> DistRun {
        let mut ranks = Vec::with_capacity(runs.len());
        let mut traces = Vec::with_capacity(runs.len());
        let mut muon_traces = Vec::with_capacity(runs.len());
        for run in runs {
            muon_traces.push(
                run.result
                    .muon
                    .first()
                    .and_then(|m| run.trace.get(m.dedup_calls.clone()))
                    .map_or_else(Vec::new, <[TraceEvent]>::to_vec),
            );
            let mut t = run.trace;
            t.truncate(run.first_step_calls);
            traces.push(t);
            ranks.push(run.result);
        }
        DistRun {
            mode,
            ranks,
            traces,
            muon_traces,
        }
    }
}

/// Run the steps of the plan on `spec.world()` in-process ranks in `mode`. A failure reports
/// the first rank's own error (not the peers that saw it exit).
pub fn run_distributed(spec: &VerifySpec, mode: ExecMode) -> Result<DistRun, VerifyError> {
    let run_err = |source: RuntimeError| VerifyError::Run {
        mode: mode.name().to_string(),
        source: Box::new(source),
    };
    let boundaries = boundary_table(spec).map_err(run_err)?;
    let world = InProcWorld::run(spec.world(), |comm| {
        rank_main(spec, mode, &boundaries, comm)
    })
    .map_err(|e| run_err(RuntimeError::Comm(e)))?;
    let mut runs = Vec::new();
    let mut first_err: Option<RuntimeError> = None;
    for (r, trace) in world.results.into_iter().zip(world.traces) {
        match r {
            Ok((result, first_step_calls)) => runs.push(RankRun {
                result,
                trace,
                first_step_calls,
            }),
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
    Ok(DistRun::from_rank_runs(mode, runs))
}

/// The single device's state after one training step.
#[derive(Debug, Clone)]
pub struct SingleStep {
    /// Averaged full gradients of the step.
    pub grads: ParamSet<f32>,
    /// Full parameters after the step's update.
    pub params: ParamSet<f32>,
}

/// The single-device run.
#[derive(Debug, Clone)]
pub struct SingleRun {
    /// Averaged full gradients of the last step.
    pub grads: ParamSet<f32>,
    /// Updated full parameters after the last step.
    pub params: ParamSet<f32>,
    /// Mean loss over the micro-batches of every step.
    pub mean_loss: f32,
    /// Mean loss of each step.
    pub step_losses: Vec<f32>,
    /// Newton-Schulz matrices run in each step (empty under AdamW).
    pub ns_matrices: Vec<usize>,
    /// Gradients and parameters of every step of a multi-step run (empty for one step:
    /// `grads` and `params` are that step).
    pub history: Vec<SingleStep>,
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

/// The single-device optimizer.
enum SingleOptimizer {
    /// AdamW on every parameter, states by name.
    Adamw(std::collections::BTreeMap<String, AdamState>),
    /// AdamW chained with single-device Muon.
    Muon(Box<SingleDeviceChained>),
}

impl SingleOptimizer {
    fn new(spec: &VerifySpec) -> SingleOptimizer {
        match &spec.muon {
            None => SingleOptimizer::Adamw(Default::default()),
            Some(m) => SingleOptimizer::Muon(Box::new(m.single_device())),
        }
    }

    /// One update; returns the Newton-Schulz matrices run (Muon).
    fn step(
        &mut self,
        spec: &VerifySpec,
        params: &mut ParamSet<f32>,
        grads: &ParamSet<f32>,
    ) -> RtResult<Option<usize>> {
        match self {
            SingleOptimizer::Adamw(states) => {
                for (name, g) in grads.iter() {
                    let st = states
                        .entry(name.to_string())
                        .or_insert_with(|| AdamState::zeros(g.len()));
                    spec.adamw
                        .step(params.get_mut(name)?.as_mut_slice(), g.as_slice(), st);
                }
                Ok(None)
            }
            SingleOptimizer::Muon(m) => m.step(params, grads).map(Some).map_err(runtime_error),
        }
    }
}

/// The training steps on a single device: each micro-batch's gradient with [`TinyModel`],
/// summed per parameter in [`canonical_order`], divided once by the micro-batch count, then
/// the optimizer (AdamW, or AdamW chained with single-device Muon).
pub fn run_single(spec: &VerifySpec) -> Result<SingleRun, VerifyError> {
    let err = |source: RuntimeError| VerifyError::Run {
        mode: "single-device".into(),
        source: Box::new(source),
    };
    let start = Instant::now();
    let model = TinyModel::new(spec.model)
        .map_err(|e| err(e.into()))?
        .with_expert_wire(spec.single_device_expert_wire());
    let mut master = spec
        .model
        .init_params::<f32>(spec.seed)
        .map_err(|e| err(e.into()))?;
    let m = spec.micro_batches();
    let mut opt = SingleOptimizer::new(spec);
    let mut loss_sum = 0.0f32;
    let mut step_losses = Vec::with_capacity(spec.steps);
    let mut ns_matrices = Vec::new();
    let mut grads = ParamSet::new();
    let mut history = Vec::new();
    for step in 0..spec.steps {
        let compute = if spec.param_bf16 {
            let mut c = ParamSet::new();
            for (n, t) in master.iter() {
                c.insert(n, t.quantize_bf16());
            }
            c
        } else {
            master.clone()
        };
        let mut per_mb = Vec::with_capacity(m);
        let mut step_sum = 0.0f32;
        for id in 0..m {
            let (ids, targets) = spec.data(spec.step_data_id(step, id));
            let (loss, g) = model
                .loss_and_grads(&compute, &ids, &targets, spec.seq_len)
                .map_err(|e| err(e.into()))?;
            loss_sum += loss;
            step_sum += loss;
            per_mb.push(g);
        }
        step_losses.push(step_sum / m as f32);
        grads = ParamSet::new();
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
            grads.insert(
                name,
                Tensor::from_vec(t.shape(), avg).map_err(|e| err(e.into()))?,
            );
        }
        if let Some(ns) = opt.step(spec, &mut master, &grads).map_err(err)? {
            ns_matrices.push(ns);
        }
        if spec.steps > 1 {
            history.push(SingleStep {
                grads: grads.clone(),
                params: master.clone(),
            });
        }
    }
    Ok(SingleRun {
        grads,
        params: master,
        mean_loss: loss_sum / (m * spec.steps) as f32,
        step_losses,
        ns_matrices,
        history,
        step_seconds: start.elapsed().as_secs_f64(),
    })
}
