//! Strategies: generate the [`StepProgram`] of one training step for any rank.
//!
//! A [`ProgramGenerator`] is built once per (scenario, strategy). It precomputes everything
//! that does not depend on the rank (compute stages, parallel boundary collectives, the
//! parameters each expert-parallel coordinate holds, bucket layouts), so that
//! [`ProgramGenerator::program`] only walks the schedule and [`ProgramGenerator::template_key`]
//! and [`ProgramGenerator::groups`] are cheap.
//!
//! Submodules: [`compute`] (compute stages from the model's compute profile), [`parallel`]
//! (TP/CP/EP boundary collectives from the sharding plan), `emit` (the shared program
//! emitter), [`hyperparallel`], [`fsdp2`], [`megatron`] (the FSDP strategies),
//! [`optimizer`] (the placeholder AdamW step), [`tp_overlap`] (TP collectives fused with the
//! neighbouring GEMMs, `[train] tp_comm_overlap`) and [`muon`] (the optimizer strategies: the
//! layout-driven distributed Muon and the Muon baselines, selected by [`OptimizerStrategy`]).
//! The context the strategies share lives below them, not here (this module only dispatches):
//! `ctx` (the rank-independent `Ctx`), `options` ([`StrategyOptions`], [`StrategyKind`],
//! [`StrategyError`]), `groups` (the process-group families), `trainer_tail` and
//! `tp_comm_overlap` (what `Ctx` and the options hold).

pub mod avg_division;
pub mod collective_staging;
pub mod compute;
mod ctx;
pub mod eager_experts;
mod emit;
pub mod fsdp2;
mod groups;
pub mod host_events;
pub mod hp_mixed_precision;
pub mod hyperparallel;
pub mod kernels;
pub mod megatron;
pub mod megatron_sp;
pub mod muon;
pub mod optimizer;
mod options;
pub mod parallel;
pub mod routing;
pub mod saved_activations;
mod segment_pieces;
mod step_tail;
pub mod torch_adamw;
mod tp_comm_overlap;
pub mod tp_grad_sync;
pub mod tp_overlap;
mod trainer_tail;
pub mod validation;
pub mod vocab_parallel_loss;

pub(crate) use ctx::{Ctx, ParamClass};
pub(crate) use groups::{GROUP_KINDS, GroupFamily, GroupKind};
pub use muon::OptimizerStrategy;
pub use options::{StrategyError, StrategyKind, StrategyOptions};

use crate::step::{Group, StepProgram};
use hpfsdp_plan::fsdp::FsdpPlan;
use hpfsdp_plan::mesh_groups::MeshGroups;
use hpfsdp_plan::planner::ShardingPlan;
use hpfsdp_plan::scenario::Scenario;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// Generates the step program of any rank for one (scenario, strategy).
#[derive(Debug, Clone)]
pub struct ProgramGenerator {
    ctx: Ctx,
    world_size: usize,
    tokens_per_step: u64,
    model_flops_per_step: f64,
    megatron: Option<megatron::Layout>,
    /// Per expert-parallel class, the class's template signature (computed on first use).
    class_signatures: std::sync::OnceLock<Vec<u64>>,
    /// Frozen model paths by model key ([`ProgramGenerator::program_shared`]).
    paths: PathCache,
}

/// One frozen model path per model key, built by the first rank that asks for it.
#[derive(Default)]
struct PathCache {
    paths: std::sync::Mutex<HashMap<u64, PathCell>>,
    /// The most ops a shared program appended to its model path: a capacity hint, as
    /// [`Ctx::ops_hint`] (program contents never depend on it).
    tail_hint: std::sync::atomic::AtomicUsize,
}

/// A model path being built or built (`None`: it could not be, the rank's program is then
/// generated whole, which reports the error).
type PathCell = std::sync::Arc<std::sync::OnceLock<Option<emit::FrozenPath>>>;

impl PathCache {
    /// The cell of `key`, created empty on first use.
    fn cell(&self, key: u64) -> PathCell {
        let mut paths = self.paths.lock().unwrap_or_else(|e| e.into_inner());
        paths.entry(key).or_default().clone()
    }
}

impl Clone for PathCache {
    /// A clone starts with no paths (they are a cache).
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for PathCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.paths.lock().map_or(0, |p| p.len());
        write!(f, "PathCache({n} model paths)")
    }
}

/// Digest of the part of a program its expert-parallel class decides, with op names left
/// out. With an optimizer schedule (`schedule`: the Muon strategies, whose schedule has its
/// own digest): every op outside it, the gradients it frees and the resident memory other
/// than optimizer state; without one (the AdamW placeholder): the whole program.
fn class_part_digest(p: &StepProgram, schedule: bool) -> u64 {
    use crate::step::{Category, MemTag};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for op in &p.ops {
        if schedule && op.category == Category::Optimizer {
            for m in op.memory.iter().filter(|m| m.tag == MemTag::Grads) {
                m.hash(&mut h);
            }
            continue;
        }
        op.id.hash(&mut h);
        op.stream.hash(&mut h);
        op.category.hash(&mut h);
        op.deps.hash(&mut h);
        op.payload.hash(&mut h);
        op.memory.hash(&mut h);
    }
    for r in p
        .resident
        .iter()
        .filter(|r| !schedule || r.tag != MemTag::Optimizer)
    {
        r.hash(&mut h);
    }
    h.finish()
}

impl ProgramGenerator {
    /// Precomputes everything rank-independent for `kind` on this scenario, with the default
    /// optimizer strategy of the scenario and `kind` ([`OptimizerStrategy::default_for`]).
    pub fn new(
        scenario: &Scenario,
        plan: &ShardingPlan,
        fsdp: &FsdpPlan,
        kind: StrategyKind,
    ) -> Result<Self, StrategyError> {
        let optimizer = OptimizerStrategy::default_for(scenario, kind);
        Self::with_optimizer(scenario, plan, fsdp, kind, optimizer)
    }

    /// Precomputes everything rank-independent for `kind` on this scenario, with the optimizer
    /// step generated by `optimizer`. Errors: a Muon strategy on an AdamW-only scenario, or an
    /// owner-placement strategy (dmuon, matrixfsdp) on an FSDP strategy other than
    /// hyperparallel.
    pub fn with_optimizer(
        scenario: &Scenario,
        plan: &ShardingPlan,
        fsdp: &FsdpPlan,
        kind: StrategyKind,
        optimizer: OptimizerStrategy,
    ) -> Result<Self, StrategyError> {
        optimizer.check(scenario, kind)?;
        let opts = StrategyOptions::resolve(scenario, kind)?;
        let (classes, local_numel, per_expert_owner) = param_classes(scenario, plan, fsdp)?;
        let sp = scenario.file.train.sequence_parallel;
        let (stages, unit_stage) = compute::build_stages(scenario, plan, fsdp, &opts, sp)?;

        let size = |s: Option<&hpfsdp_plan::fsdp::GroupSpec>| s.map_or(1, |g| g.size);
        let shard_size = [
            size(fsdp.groups.get("dense.shard")),
            size(fsdp.groups.get("expert.shard")),
        ];
        let replicate_size = [
            size(fsdp.groups.get("dense.replicate")),
            size(fsdp.groups.get("expert.replicate")),
        ];

        let (mut families, slot) = group_families(scenario, kind);
        let family_size = |g: GroupKind| {
            slot[g.index()]
                .and_then(|i| families.get(i))
                .map_or(1, |f| f.size)
        };
        let trainer = step_tail::TrainerTail::new(plan, fsdp, family_size, sp);
        // The optimizer strategy's per-axis groups, appended after the strategy's own.
        let opt = muon::OptCtx::new(scenario, plan, fsdp, optimizer, &mut families)?;

        let ctx = Ctx {
            opts,
            fsdp: fsdp.clone(),
            local_numel,
            stages,
            unit_stage,
            classes,
            per_expert_owner,
            trainer,
            tp_partial_grad: tp_grad_sync::partial_over_tp(
                plan,
                fsdp,
                scenario.file.mesh.tp.max(1),
                sp,
            ),
            shard_size,
            replicate_size,
            dense_mesh: scenario.dense_mesh.clone(),
            expert_mesh: scenario.expert_mesh.clone(),
            topology: scenario.topology,
            family_groups: families
                .iter()
                .map(|f| f.mesh_groups([&scenario.dense_mesh, &scenario.expert_mesh]))
                .collect(),
            families,
            slot,
            opt,
            ops_hint: Default::default(),
        };
        let tokens_per_step = scenario.file.train.global_batch * scenario.file.train.seq_len;
        let model_flops_per_step = model_flops_per_step(scenario, tokens_per_step);
        let megatron = (kind == StrategyKind::MegatronDdp).then(|| megatron::Layout::new(&ctx));
        Ok(Self {
            ctx,
            world_size: scenario.world_size(),
            tokens_per_step,
            model_flops_per_step,
            megatron,
            class_signatures: std::sync::OnceLock::new(),
            paths: PathCache::default(),
        })
    }

    /// Ranks in the job.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The options this generator runs with.
    pub fn options(&self) -> &StrategyOptions {
        &self.ctx.opts
    }

    /// Tokens of the whole job per optimizer step.
    pub fn tokens_per_step(&self) -> u64 {
        self.tokens_per_step
    }

    /// Model FLOPs of the whole job per step (forward + backward = 3x forward; recompute
    /// excluded), for MFU.
    pub fn model_flops_per_step(&self) -> f64 {
        self.model_flops_per_step
    }

    fn check_rank(&self, rank: usize) -> Result<(), StrategyError> {
        if rank >= self.world_size {
            return Err(StrategyError::RankOutOfRange {
                rank,
                world_size: self.world_size,
            });
        }
        Ok(())
    }

    /// The full, validated step program of `rank`.
    pub fn program(&self, rank: usize) -> Result<StepProgram, StrategyError> {
        self.generate(rank, true)
    }

    /// [`ProgramGenerator::program`] without op names (every name `None`): the same ops,
    /// dependencies, payloads and memory effects, for programs that are only simulated
    /// (folded classes other than rank 0's, whose names reports never show). Skipping the
    /// names saves formatting millions of strings on large Muon jobs.
    pub fn program_unnamed(&self, rank: usize) -> Result<StepProgram, StrategyError> {
        self.generate(rank, false)
    }

    /// [`ProgramGenerator::program_unnamed`], built on a **shared model path**: ranks with
    /// the same [`ProgramGenerator::model_key`] have the same ops before their optimizer
    /// schedule, so the first such rank emits that path once, freezes it into a prefix
    /// shared by all of them ([`crate::step::OpSeq`]) and validated once, and every
    /// rank appends only its own schedule. The program equals `program_unnamed(rank)` op for
    /// op (a test checks this); strategies without a model key (AdamW, owner placement,
    /// FSDP strategies other than hyperparallel) generate the whole program.
    pub fn program_shared(&self, rank: usize) -> Result<StepProgram, StrategyError> {
        self.check_rank(rank)?;
        let cell = self.path_cell(rank);
        let Some(frozen) = cell.as_ref().and_then(|c| c.get()).and_then(Option::as_ref) else {
            return self.generate(rank, false);
        };
        let hint = self
            .paths
            .tail_hint
            .load(std::sync::atomic::Ordering::Relaxed);
        let groups = self.ctx.groups(rank)?;
        let Some(path) = frozen.thaw(&self.ctx, hint).rebase(rank, groups) else {
            return self.generate(rank, false);
        };
        let sched = muon::unnamed(&self.ctx, rank);
        let program = emit::finish_layout(path, &sched.layout())?;
        self.paths.tail_hint.fetch_max(
            program.ops.tail().len(),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(program)
    }

    /// The cell of `rank`'s model path, built by the first rank of its model key that asks
    /// (`None`: the strategy has no model key, [`ProgramGenerator::model_key`]); the cell
    /// holds `None` when the path could not be built.
    fn path_cell(&self, rank: usize) -> Option<PathCell> {
        let key = self.model_key(rank)?;
        let cell = self.paths.cell(key);
        cell.get_or_init(|| {
            let groups = self.ctx.groups(rank).ok()?;
            Some(hyperparallel::model_path(&self.ctx, rank, groups).freeze())
        });
        Some(cell)
    }

    /// A key such that ranks with equal keys have identical model paths (every op before
    /// the optimizer schedule, names left out), or `None` when programs are not split
    /// there: the rank's expert-parallel class (which parameters it holds) and the tier of
    /// each of its groups (collectives carry their tier). Only the hyperparallel strategy
    /// with a Muon optimizer strategy that keeps FSDP placement has one: AdamW programs fold
    /// whole, and owner placement (DMuon, MatrixFSDP) changes the model path per rank.
    pub fn model_key(&self, rank: usize) -> Option<u64> {
        let opt = self.ctx.opt.strategy;
        if self.ctx.opts.kind != StrategyKind::HyperParallel
            || !opt.is_muon()
            || opt.owner_placement()
            || rank >= self.world_size
        {
            return None;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.ctx.class_of(rank).hash(&mut h);
        for f in 0..self.ctx.families.len() {
            self.ctx.family_tier(f, rank).hash(&mut h);
        }
        Some(h.finish())
    }

    fn generate(&self, rank: usize, named: bool) -> Result<StepProgram, StrategyError> {
        self.check_rank(rank)?;
        let groups = self.ctx.groups(rank)?;
        let program = match self.ctx.opts.kind {
            StrategyKind::HyperParallel => hyperparallel::generate(&self.ctx, rank, groups, named)?,
            StrategyKind::Fsdp2 => fsdp2::generate(&self.ctx, rank, groups, named)?,
            StrategyKind::MegatronDdp => match &self.megatron {
                Some(layout) => megatron::generate(&self.ctx, layout, rank, groups, named)?,
                None => unreachable_layout()?,
            },
        };
        self.ctx
            .ops_hint
            .fetch_max(program.ops.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(program)
    }

    /// A key such that two ranks with equal keys get programs that are identical except for
    /// the ranks inside their groups and op names (same ops, same group table order, labels
    /// and sizes). It hashes the signature of the rank's expert-parallel class (classes whose
    /// programs differ only in per-expert weight names share one), the tier of each of its
    /// groups (collectives carry their tier) and, for the Muon optimizer strategies, the
    /// digest of the rank's optimizer schedule without names (owners make it rank-dependent:
    /// which matrices a rank orthogonalizes, relays and owns).
    /// Cost: one group construction per family, O(group sizes), plus the optimizer digest
    /// (cached per distinct optimizer coordinate); the first call generates one program per
    /// expert-parallel class.
    pub fn template_key(&self, rank: usize) -> u64 {
        let rank = rank.min(self.world_size.saturating_sub(1));
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let class = self.ctx.class_of(rank);
        self.class_signatures().get(class).hash(&mut h);
        for f in 0..self.ctx.families.len() {
            self.ctx.family_tier(f, rank).hash(&mut h);
        }
        muon::template_digest(&self.ctx, rank).hash(&mut h);
        h.finish()
    }

    /// The template signature of every expert-parallel class: classes whose programs differ
    /// only in names (per-expert weights: the same shapes on every EP coordinate) share one,
    /// so their ranks can fold. On a shared model path it is the path's signature
    /// ([`emit::FrozenPath::signature`]: a program is its class's model path followed by
    /// its optimizer schedule, which [`ProgramGenerator::template_key`] hashes itself);
    /// otherwise the digest of the first rank's program outside the optimizer schedule,
    /// names left out. The class index itself under owner placement (DMuon, MatrixFSDP),
    /// whose FSDP part also depends on the rank's position, and when a program fails.
    fn class_signatures(&self) -> &[u64] {
        self.class_signatures.get_or_init(|| {
            let n = self.ctx.classes.len();
            let by_index = |c: usize| c as u64;
            let schedule = self.ctx.opt.strategy.is_muon();
            if n <= 1 || self.ctx.opt.strategy.owner_placement() {
                return (0..n).map(by_index).collect();
            }
            let mut first: Vec<Option<usize>> = vec![None; n];
            let mut found = 0;
            for r in 0..self.world_size {
                let c = self.ctx.class_of(r);
                if let Some(slot) = first.get_mut(c).filter(|s| s.is_none()) {
                    *slot = Some(r);
                    found += 1;
                    if found == n {
                        break;
                    }
                }
            }
            let digests: Vec<Option<(u8, u64)>> = first
                .iter()
                .map(|r| {
                    let r = (*r)?;
                    // The model path is built here for the templates of its model key.
                    let cell = self.path_cell(r);
                    if let Some(f) = cell.as_ref().and_then(|c| c.get()).and_then(Option::as_ref) {
                        return Some((2, f.signature()));
                    }
                    let p = self.program_shared(r).ok()?;
                    Some((0, class_part_digest(&p, schedule)))
                })
                .collect();
            // A class whose program could not be generated keeps its own signature.
            digests
                .iter()
                .enumerate()
                .map(|(c, d)| match d {
                    Some(d) => {
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        d.hash(&mut h);
                        h.finish()
                    }
                    None => {
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        (1u8, by_index(c)).hash(&mut h);
                        h.finish()
                    }
                })
                .collect()
        })
    }

    /// The optimizer strategy this generator emits.
    pub fn optimizer(&self) -> OptimizerStrategy {
        self.ctx.opt.strategy
    }

    /// Optimizer-state bytes resident on `rank`: (Muon momentum, AdamW moments).
    pub fn optimizer_state_bytes(&self, rank: usize) -> Result<(u64, u64), StrategyError> {
        self.check_rank(rank)?;
        let s = muon::schedule(&self.ctx, rank, false);
        Ok((s.momentum_bytes, s.adamw_state_bytes))
    }

    /// The group table of every rank by arithmetic on the mesh: entry `i` is the label and
    /// the groups of table position `i`, so `groups(rank)[i]` is entry `i`'s group holding
    /// `rank` (a test checks this). Folding uses it instead of listing every rank's groups.
    pub fn group_families(&self) -> Vec<(String, MeshGroups)> {
        self.ctx
            .families
            .iter()
            .zip(&self.ctx.family_groups)
            .map(|(f, g)| (f.label.clone(), g.clone()))
            .collect()
    }

    /// The group table of `rank`'s program (same order as `program(rank).groups`).
    pub fn groups(&self, rank: usize) -> Result<Vec<Group>, StrategyError> {
        self.check_rank(rank)?;
        Ok(self.ctx.groups(rank)?.into_iter().map(|(g, _)| g).collect())
    }
}

/// Each expert-parallel class's trainable parameters per FSDP unit (one class unless per-expert
/// weights have EP owners), every parameter's plan-local element count, and whether classes
/// differ; errors when the sharding and FSDP plans disagree.
fn param_classes(
    scenario: &Scenario,
    plan: &ShardingPlan,
    fsdp: &FsdpPlan,
) -> Result<(Vec<ParamClass>, Vec<u64>, bool), StrategyError> {
    let trainable: Vec<_> = plan.params.iter().filter(|p| p.trainable).collect();
    if trainable.len() != fsdp.params.len() {
        return Err(StrategyError::PlanMismatch {
            detail: format!(
                "{} trainable parameters in the sharding plan, {} in the FSDP plan",
                trainable.len(),
                fsdp.params.len()
            ),
        });
    }
    let ep = scenario.file.mesh.ep.max(1);
    let per_expert_owner = ep > 1 && trainable.iter().any(|p| p.ep_owner.is_some());
    let nclasses = if per_expert_owner { ep } else { 1 };
    let mut classes = vec![
        ParamClass {
            units: vec![Vec::new(); fsdp.units.len()],
        };
        nclasses
    ];
    let mut local_numel = Vec::with_capacity(fsdp.params.len());
    for (i, (pp, fp)) in trainable.iter().zip(&fsdp.params).enumerate() {
        if pp.name != fp.name {
            return Err(StrategyError::PlanMismatch {
                detail: format!("parameter {i} is '{}' vs '{}'", pp.name, fp.name),
            });
        }
        if fp.unit >= fsdp.units.len() {
            return Err(StrategyError::PlanMismatch {
                detail: format!(
                    "'{}' names unit {} of {}",
                    fp.name,
                    fp.unit,
                    fsdp.units.len()
                ),
            });
        }
        local_numel.push(fp.plan_local_shape.iter().product::<u64>());
        for (c, class) in classes.iter_mut().enumerate() {
            if pp.ep_owner.is_none_or(|o| o == c) {
                class.units[fp.unit].push(i as u32);
            }
        }
    }

    Ok((classes, local_numel, per_expert_owner))
}

/// The group families `kind` uses (size > 1 only, in table order) and each group kind's slot
/// among them.
fn group_families(
    scenario: &Scenario,
    kind: StrategyKind,
) -> (Vec<GroupFamily>, [Option<usize>; GROUP_KINDS]) {
    let m = &scenario.file.mesh;
    let dm = &scenario.dense_mesh;
    let em = &scenario.expert_mesh;
    let fam = |kind, expert_mesh: bool, names: &[&str]| {
        let mesh = if expert_mesh { em } else { dm };
        let axes: Vec<usize> = names.iter().filter_map(|n| mesh.axis_index(n)).collect();
        let size = axes.iter().map(|&a| mesh.axes()[a].size).product();
        GroupFamily {
            kind: Some(kind),
            expert_mesh,
            axes,
            label: names.join("+"),
            size,
            block: None,
        }
    };
    let expert_domain = m.ep > 1;
    let mut wanted = Vec::new();
    match kind {
        StrategyKind::HyperParallel | StrategyKind::Fsdp2 => {
            wanted.push(fam(GroupKind::DenseShard, false, &["dp_shard", "cp"]));
            wanted.push(fam(GroupKind::DenseReplicate, false, &["dp_replicate"]));
            if expert_domain {
                wanted.push(fam(GroupKind::ExpertShard, true, &["edp_shard"]));
                wanted.push(fam(GroupKind::ExpertReplicate, true, &["edp_replicate"]));
            }
        }
        StrategyKind::MegatronDdp => {
            wanted.push(fam(
                GroupKind::DataParallel,
                false,
                &["dp_replicate", "dp_shard", "cp"],
            ));
            if expert_domain {
                wanted.push(fam(
                    GroupKind::ExpertDataParallel,
                    true,
                    &["edp_replicate", "edp_shard"],
                ));
            }
        }
    }
    wanted.push(fam(GroupKind::Tp, false, &["tp"]));
    wanted.push(fam(GroupKind::Cp, false, &["cp"]));
    wanted.push(fam(GroupKind::Ep, true, &["ep"]));
    let families: Vec<GroupFamily> = wanted.into_iter().filter(|f| f.size > 1).collect();
    let mut slot = [None; GROUP_KINDS];
    for (i, f) in families.iter().enumerate() {
        if let Some(k) = f.kind {
            slot[k.index()] = Some(i);
        }
    }
    (families, slot)
}

/// Model FLOPs of a step of `tokens_per_step` tokens: 3x the forward (forward + backward),
/// recompute excluded.
fn model_flops_per_step(scenario: &Scenario, tokens_per_step: u64) -> f64 {
    3.0 * tokens_per_step as f64
        * scenario
            .model
            .compute_profile(scenario.file.train.seq_len)
            .iter()
            .map(|l| l.fwd_flops_per_token())
            .sum::<f64>()
}

fn unreachable_layout() -> Result<StepProgram, StrategyError> {
    Err(StrategyError::PlanMismatch {
        detail: "megatron layout missing".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_names_round_trip() {
        for k in StrategyKind::ALL {
            assert_eq!(StrategyKind::parse(k.name()).unwrap(), k);
            assert_eq!(k.to_string().parse::<StrategyKind>().unwrap(), k);
        }
        let err = StrategyKind::parse("ddp").unwrap_err().to_string();
        assert!(
            err.contains("[fsdp] strategy") && err.contains("fsdp2"),
            "{err}"
        );
    }
}
