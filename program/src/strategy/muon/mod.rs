//! Optimizer strategies: the optimizer part of a step program.
//!
//! [`OptimizerStrategy`] selects how the optimizer step is generated:
//!
//! | strategy | module | notes section |
//! |---|---|---|
//! | `adamw` | `strategy::optimizer` | placeholder AdamW on every local shard |
//! | `hyperparallel` | [`hyperparallel`] | `hyper-parallel.md` 6.4-6.7, 8.1; paper §6 |
//! | `naive` | [`naive`] | paper §6.1 "naive gather-then-compute on every rank" |
//! | `moonlight` | [`moonlight`] | `muon.md` 2.2 (ZeRO-1 distributed Muon) |
//! | `dmuon` | [`dmuon`] | `muon.md` 7.4; paper Table "design contrast" |
//! | `matrixfsdp` | [`matrixfsdp`] | `muon.md` 7.5; paper Table "design contrast" |
//! | `flexshard` | [`flexshard`] | `muon.md` 5.3, 7.3; paper §6.2 |
//!
//! Every Muon strategy routes parameters with the Muon plan ([`hpfsdp_plan::muon`]): AdamW-routed
//! parameters get one AdamW step per FSDP unit on their local shard (the chained optimizer
//! steps `adamw` first, notes 6.7), then the strategy's Muon pipeline runs. The rank's
//! optimizer ops are first built as a [`schedule::Schedule`] (hashable, so that template keys
//! follow owner-dependent differences) and then lowered into the program. Costs of the stages
//! are in [`ns_cost`].

pub mod dmuon;
pub mod flexshard;
pub mod hyperparallel;
pub mod matrixfsdp;
pub mod matrixfsdp_buffers;
pub mod moonlight;
pub mod naive;
pub mod ns_cost;
pub(crate) mod schedule;

use super::{Ctx, GroupFamily, StrategyError, StrategyKind};
use crate::step::{MemTag, Stream};
use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::fsdp::{DataDomain, FsdpPlan};
use hpfsdp_plan::mesh::DeviceMesh;
use hpfsdp_plan::muon::{MuonPlan, OptimizerRoute, build_muon_plan, build_owner_by_size};
use hpfsdp_plan::planner::ShardingPlan;
use hpfsdp_plan::scenario::Scenario;
use schedule::{Dep, Schedule};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// How the optimizer step of a program is generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerStrategy {
    /// The placeholder: AdamW on every local shard, one op per FSDP unit (or bucket).
    #[serde(rename = "adamw")]
    AdamW,
    /// HyperParallel's layout-driven distributed Muon (shard- and replica-domain dedup).
    #[serde(rename = "hyperparallel")]
    HyperParallelMuon,
    /// Every rank gathers every sharded matrix and orthogonalizes everything.
    Naive,
    /// Moonlight's ZeRO-1 distributed Muon: bucketed gathers, redundant NS.
    Moonlight,
    /// DMuon: dedicated owners publish parameters and receive reduced gradients in
    /// forward/recompute/backward; owner-resident full matrices.
    #[serde(rename = "dmuon")]
    DMuon,
    /// MatrixFSDP: owner-shaped ZeRO-3 shards, a communication-free optimizer step.
    #[serde(rename = "matrixfsdp")]
    MatrixFsdp,
    /// FlexShard / DistributedMuon: pack, all-to-all, NS, all-to-all, unpack.
    #[serde(rename = "flexshard")]
    FlexShard,
}

impl OptimizerStrategy {
    /// Every strategy, in a stable order.
    pub const ALL: [OptimizerStrategy; 7] = [
        OptimizerStrategy::AdamW,
        OptimizerStrategy::HyperParallelMuon,
        OptimizerStrategy::Naive,
        OptimizerStrategy::Moonlight,
        OptimizerStrategy::DMuon,
        OptimizerStrategy::MatrixFsdp,
        OptimizerStrategy::FlexShard,
    ];

    /// The name in scenario files (`[optimizer] baselines`) and reports.
    pub fn name(self) -> &'static str {
        match self {
            OptimizerStrategy::AdamW => "adamw",
            OptimizerStrategy::HyperParallelMuon => "hyperparallel",
            OptimizerStrategy::Naive => "naive",
            OptimizerStrategy::Moonlight => "moonlight",
            OptimizerStrategy::DMuon => "dmuon",
            OptimizerStrategy::MatrixFsdp => "matrixfsdp",
            OptimizerStrategy::FlexShard => "flexshard",
        }
    }

    /// Parses `hyperparallel`, a Muon baseline name (`naive`, `moonlight`, `dmuon`,
    /// `matrixfsdp`, `flexshard`) or `adamw` (alias `placeholder`).
    pub fn parse(name: &str) -> Result<Self, StrategyError> {
        if name == "placeholder" {
            return Ok(OptimizerStrategy::AdamW);
        }
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| StrategyError::UnknownOptimizer {
                name: name.to_string(),
            })
    }

    /// True for the Muon strategies.
    pub fn is_muon(self) -> bool {
        self != OptimizerStrategy::AdamW
    }

    /// True for the strategies that move whole matrices onto owner ranks in the FSDP
    /// schedule itself (DMuon, MatrixFSDP).
    pub fn owner_placement(self) -> bool {
        matches!(
            self,
            OptimizerStrategy::DMuon | OptimizerStrategy::MatrixFsdp
        )
    }

    /// The optimizer a scenario runs by default on FSDP strategy `kind`:
    /// - `[optimizer] kind = "adamw"`: [`OptimizerStrategy::AdamW`];
    /// - Muon on `hyperparallel` and on `fsdp2`: [`OptimizerStrategy::HyperParallelMuon`].
    ///   The paper's exp B ran "Muon + AdamW groups" on both sides, and HyperParallel's Muon
    ///   groups PyTorch-native DTensors with the same code path (paper §6.3); FSDP2's
    ///   per-parameter dim-0 `Shard` layout gives the same plan. The calibration supports
    ///   this: the FSDP2 run's 28 non-FSDP all-gathers are exactly its 512-byte-aligned ones,
    ///   as the fused Muon gathers are (HyperParallel pads every segment to 512 B).
    /// - Muon on `megatron-ddp`: [`OptimizerStrategy::Moonlight`], the distributed Muon of
    ///   Megatron's distributed optimizer (Moonlight's Megatron PR, `muon.md` 2.2);
    ///   Megatron-Core's own `TensorParallelMuon` rejects `use_distributed_optimizer` (7.1).
    pub fn default_for(scenario: &Scenario, kind: StrategyKind) -> Self {
        if scenario.file.optimizer.kind != "muon+adamw" {
            return OptimizerStrategy::AdamW;
        }
        match kind {
            StrategyKind::HyperParallel | StrategyKind::Fsdp2 => {
                OptimizerStrategy::HyperParallelMuon
            }
            StrategyKind::MegatronDdp => OptimizerStrategy::Moonlight,
        }
    }

    /// Checks that this strategy can run on the scenario with FSDP strategy `kind`.
    pub fn check(self, scenario: &Scenario, kind: StrategyKind) -> Result<(), StrategyError> {
        if self.is_muon() && scenario.file.optimizer.kind != "muon+adamw" {
            return Err(StrategyError::OptimizerKindMismatch {
                optimizer: self.name(),
                kind: scenario.file.optimizer.kind.clone(),
            });
        }
        if self.owner_placement() && kind != StrategyKind::HyperParallel {
            return Err(StrategyError::UnsupportedOptimizer {
                optimizer: self.name(),
                strategy: kind.name(),
            });
        }
        Ok(())
    }
}

impl std::str::FromStr for OptimizerStrategy {
    type Err = StrategyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl std::fmt::Display for OptimizerStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One mesh axis a Muon parameter is sharded or replicated on, resolved to its group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AxisRef {
    /// Axis name.
    pub name: String,
    /// Group table position of its (sub)group; `None` for a single rank.
    pub slot: Option<usize>,
    /// Index of the axis in its mesh.
    pub mesh_axis: usize,
    /// Axis size.
    pub size: usize,
    /// On the expert mesh.
    pub expert: bool,
    /// Owner-coordinate size: the axis size, or the replica subgroup size on replicate axes.
    pub coord_size: usize,
}

/// The optimizer view of one parameter (same index as `FsdpPlan::params` and
/// `MuonPlan::params`).
#[derive(Debug, Clone)]
pub(crate) struct OptParam {
    /// Muon or AdamW.
    pub route: OptimizerRoute,
    /// FSDP unit.
    pub unit: usize,
    /// Expert-parallel class holding it (`None`: every class).
    pub ep_owner: Option<usize>,
    /// Padded local shard elements (FSDP plan).
    pub local_elems: u64,
    /// Global elements.
    pub numel: u64,
    /// Elements after TP/EP, before FSDP (`plan_local_shape`).
    pub plan_elems: u64,
    /// Core matrix shape (Muon only).
    pub core: Option<(u64, u64)>,
    /// Independent matrices of the global parameter.
    pub matrices: u64,
    /// Matrices of `plan_local_shape` (after TP/EP).
    pub plan_matrices: u64,
    /// Matrix-plane predicate (a shard axis cuts the last two dims).
    pub needs_gather: bool,
    /// Shard axes (mesh order).
    pub shard: Vec<AxisRef>,
    /// Replicate axes.
    pub replicate: Vec<AxisRef>,
    /// Data domain.
    pub domain: DataDomain,
    /// FSDP shard dim and `plan_local_shape` (for local matrix counts).
    pub fsdp_dim: usize,
    /// `plan_local_shape`.
    pub plan_shape: Vec<u64>,
}

impl OptParam {
    /// Whether EP class `class` holds it.
    pub fn held_by(&self, class: usize) -> bool {
        self.ep_owner.is_none_or(|o| o == class)
    }

    /// Product of the shard axis sizes.
    pub fn shard_size(&self) -> u64 {
        self.shard.iter().map(|a| a.size as u64).product()
    }
}

/// One execution slot of the Muon plan: the batches sharing it (one per EP coordinate, or one
/// for every rank) and its number of NS memory-batch steps (the most of its batches).
#[derive(Debug, Clone, Default)]
pub(crate) struct Slot {
    /// Plan batch indices.
    pub batches: Vec<usize>,
    /// NS memory-batch positions.
    pub steps: usize,
}

/// Rank-independent data of the optimizer strategy.
#[derive(Debug, Clone)]
pub struct OptCtx {
    /// The strategy.
    pub strategy: OptimizerStrategy,
    pub(crate) plan: MuonPlan,
    /// The plan's batches by slot, in execution order.
    pub(crate) slots: Vec<Slot>,
    pub(crate) ns_steps: u64,
    pub(crate) params: Vec<OptParam>,
    /// DMuon / MatrixFSDP: owner position in the FSDP shard group of each placed matrix.
    pub(crate) placed: Vec<Option<usize>>,
    /// Slots of the FSDP shard group per domain (dense, expert) in the group table.
    pub(crate) fsdp_shard_slot: [Option<usize>; 2],
    /// Indices of the AdamW-routed parameters ([`adamw_routed_units`] walks these instead of
    /// every parameter: on exp-d most parameters are Muon-routed experts).
    pub(crate) adamw_params: Vec<usize>,
    /// Per plan batch, per EP class: the batch's parameters the class holds, in batch order
    /// (built on first use; [`OptCtx::held`]).
    held: std::sync::OnceLock<Vec<Vec<Vec<usize>>>>,
    digests: Arc<Mutex<HashMap<Vec<usize>, u64>>>,
    /// Anonymous schedules built for a digest, one per distinct digest (coordinates whose
    /// schedules are equal share one): the first program with that schedule takes it instead
    /// of building it again.
    built: Arc<Mutex<BuiltSchedules>>,
    /// Rank-independent pieces of HyperParallel Muon schedules, shared by every rank's
    /// build ([`hyperparallel::Pieces`]).
    pub(crate) hp_pieces: hyperparallel::Pieces,
}

/// Anonymous schedules kept by [`OptCtx::digest`] for reuse, keyed by their digest.
type BuiltSchedules = HashMap<u64, Schedule>;

/// Schedules kept for reuse at most (a bound on the memory of [`OptCtx`]'s cache on jobs
/// with very many optimizer coordinates; beyond it the program builds its own).
const KEPT_SCHEDULES: usize = 4096;

/// Registers (or reuses) the group family of one mesh axis, optionally cut into contiguous
/// blocks; returns its table position (`None` when the group has one rank).
fn axis_family(
    families: &mut Vec<GroupFamily>,
    meshes: [&DeviceMesh; 2],
    expert: bool,
    axis: usize,
    block: Option<usize>,
) -> Option<usize> {
    let mesh = meshes[usize::from(expert)];
    let size = mesh.axes()[axis].size;
    let block = block.filter(|&b| b < size);
    let eff = block.unwrap_or(size);
    if eff <= 1 {
        return None;
    }
    let fam = GroupFamily {
        kind: None,
        expert_mesh: expert,
        axes: vec![axis],
        label: match block {
            Some(b) => format!("{}/{b}", mesh.axes()[axis].name),
            None => mesh.axes()[axis].name.clone(),
        },
        size: eff,
        block,
    };
    let key = fam.key(meshes);
    if let Some(i) = families.iter().position(|f| f.key(meshes) == key) {
        return Some(i);
    }
    families.push(fam);
    Some(families.len() - 1)
}

/// Newton-Schulz iterations of the scenario's preset: `[optimizer.muon] ns_steps`, default 5;
/// HyperParallel's asym5 table runs at most 5 (notes 6.1), `custom` at most its groups.
fn ns_steps(scenario: &Scenario) -> u64 {
    let o = &scenario.file.optimizer;
    let steps = o.muon.ns_steps.unwrap_or(5) as u64;
    match o.preset.as_str() {
        "hyperparallel" => steps.min(5),
        "custom" => steps.min(o.muon.coefficients.as_ref().map_or(5, |c| c.len() as u64)),
        _ => steps,
    }
}

/// The optimizer view of every parameter (plan order), its shard and replicate axes resolved
/// to group families (registered in `families` as met; a replicate axis resolves to its
/// replica subgroup, a contiguous block of the group).
fn opt_params(
    muon: &MuonPlan,
    fsdp: &FsdpPlan,
    trainable: &[&hpfsdp_plan::planner::ParamPlan],
    meshes: [&DeviceMesh; 2],
    families: &mut Vec<GroupFamily>,
) -> Vec<OptParam> {
    let mut out = Vec::with_capacity(muon.params.len());
    for ((mp, fp), pp) in muon.params.iter().zip(&fsdp.params).zip(trainable) {
        let expert = fp.domain == DataDomain::Expert;
        let mesh = meshes[usize::from(expert)];
        let mut resolve = |name: &str, size: usize, replicate: bool| -> Option<AxisRef> {
            let mesh_axis = mesh.axis_index(name)?;
            // Replicate axes: the replica subgroup (a contiguous block of the group).
            let coord_size = if replicate {
                muon.replica_subgroup_size(name, size)
            } else {
                size
            };
            let block = (coord_size < size).then_some(coord_size);
            let slot = axis_family(families, meshes, expert, mesh_axis, block);
            Some(AxisRef {
                name: name.to_string(),
                slot,
                mesh_axis,
                size,
                expert,
                coord_size,
            })
        };
        let shard = mp
            .shard_axes
            .iter()
            .filter_map(|a| resolve(&a.axis, a.size, false))
            .collect();
        let replicate = mp
            .replicate_axes
            .iter()
            .filter_map(|(a, s)| resolve(a, *s, true))
            .collect();
        let nd = fp.plan_local_shape.len();
        out.push(OptParam {
            route: mp.route,
            unit: fp.unit,
            ep_owner: pp.ep_owner,
            local_elems: fp.padded_shard_numel,
            numel: mp.numel(),
            plan_elems: fp.plan_local_shape.iter().product(),
            core: mp.core_shape,
            matrices: mp.matrices,
            plan_matrices: if nd >= 3 {
                fp.plan_local_shape[..nd - 2].iter().product()
            } else {
                1
            },
            needs_gather: mp.needs_gather,
            shard,
            replicate,
            domain: fp.domain,
            fsdp_dim: fp.shard_dim,
            plan_shape: fp.plan_local_shape.clone(),
        });
    }
    out
}

/// The plan's batches by execution slot, each slot with its most NS memory-batch steps.
fn slots_of(muon: &MuonPlan) -> Vec<Slot> {
    let mut slots: Vec<Slot> = Vec::new();
    for (i, b) in muon.batches.iter().enumerate() {
        if slots.len() <= b.slot {
            slots.resize_with(b.slot + 1, Slot::default);
        }
        let slot = &mut slots[b.slot];
        slot.batches.push(i);
        slot.steps = slot.steps.max(b.memory_batches.len());
    }
    slots
}

/// Group-table positions of the FSDP shard group per domain (dense, expert): `dp_shard x cp`
/// (the dense shard family when CP is on) or `edp_shard`.
fn fsdp_shard_slots(
    meshes: [&DeviceMesh; 2],
    families: &mut Vec<GroupFamily>,
) -> [Option<usize>; 2] {
    let mut out = [None, None];
    for (d, (shard, mesh)) in [("dp_shard", 0usize), ("edp_shard", 1usize)]
        .into_iter()
        .enumerate()
    {
        let m = meshes[mesh];
        if let Some(a) = m.axis_index(shard) {
            let cp = if mesh == 0 { m.axis_index("cp") } else { None };
            // The FSDP shard group is dp_shard x cp (dense) or edp_shard (expert).
            out[d] = match cp.filter(|&c| m.axes()[c].size > 1) {
                Some(_) => families
                    .iter()
                    .position(|f| f.kind == Some(super::GroupKind::DenseShard)),
                None => axis_family(families, meshes, mesh == 1, a, None),
            };
        }
    }
    out
}

impl OptCtx {
    /// Builds the Muon plan and resolves every parameter's axes to group families (appended
    /// to `families`).
    pub(crate) fn new(
        scenario: &Scenario,
        plan: &ShardingPlan,
        fsdp: &FsdpPlan,
        strategy: OptimizerStrategy,
        families: &mut Vec<GroupFamily>,
    ) -> Result<Self, StrategyError> {
        let mut ctx = OptCtx::empty(scenario, strategy);
        if !strategy.is_muon() {
            return Ok(ctx);
        }
        let muon = build_muon_plan(scenario, plan, fsdp);
        let meshes = [&scenario.dense_mesh, &scenario.expert_mesh];
        let trainable: Vec<_> = plan.params.iter().filter(|p| p.trainable).collect();
        if muon.params.len() != fsdp.params.len() || trainable.len() != fsdp.params.len() {
            return Err(StrategyError::PlanMismatch {
                detail: format!(
                    "{} Muon parameters, {} FSDP parameters",
                    muon.params.len(),
                    fsdp.params.len()
                ),
            });
        }
        ctx.params = opt_params(&muon, fsdp, &trainable, meshes, families);
        ctx.slots = slots_of(&muon);
        ctx.plan = muon;
        ctx.adamw_params = (0..ctx.params.len())
            .filter(|&i| ctx.params[i].route == OptimizerRoute::Adamw)
            .collect();
        ctx.fsdp_shard_slot = fsdp_shard_slots(meshes, families);
        if strategy.owner_placement() {
            ctx.placed = owner_placement(&ctx, strategy, fsdp);
        }
        Ok(ctx)
    }

    /// The context of `strategy` before any Muon plan: no parameters, batches or slots (all
    /// the placeholder AdamW needs).
    fn empty(scenario: &Scenario, strategy: OptimizerStrategy) -> Self {
        OptCtx {
            strategy,
            plan: MuonPlan {
                params: Vec::new(),
                batches: Vec::new(),
                replica_count: None,
                devices_per_machine: scenario.topology.dies_per_machine,
                replica_subgroups: Default::default(),
                replica_subgroup_sizes: BTreeMap::new(),
                lints: Vec::new(),
            },
            slots: Vec::new(),
            ns_steps: ns_steps(scenario),
            params: Vec::new(),
            placed: Vec::new(),
            fsdp_shard_slot: [None, None],
            adamw_params: Vec::new(),
            held: std::sync::OnceLock::new(),
            digests: Arc::new(Mutex::new(HashMap::new())),
            built: Arc::new(Mutex::new(HashMap::new())),
            hp_pieces: hyperparallel::Pieces::default(),
        }
    }

    /// The parameters of plan batch `batch` that EP class `class` holds, in batch order:
    /// looked up in a table built once instead of filtered per schedule build (an all-rank
    /// batch lists every class's per-expert weights).
    pub(crate) fn held(&self, batch: usize, class: usize) -> Vec<usize> {
        let table = self.held.get_or_init(|| {
            let classes = self
                .params
                .iter()
                .filter_map(|p| p.ep_owner)
                .max()
                .map_or(1, |m| m + 1);
            self.plan
                .batches
                .iter()
                .map(|b| {
                    (0..classes)
                        .map(|c| {
                            b.params
                                .iter()
                                .copied()
                                .filter(|&i| self.params[i].held_by(c))
                                .collect()
                        })
                        .collect()
                })
                .collect()
        });
        match table.get(batch).and_then(|b| b.get(class)) {
            Some(held) => held.clone(),
            None => self.plan.batches[batch]
                .params
                .iter()
                .copied()
                .filter(|&i| self.params[i].held_by(class))
                .collect(),
        }
    }

    /// The rank's schedule digest, cached per optimizer coordinate. The schedule hashed is
    /// built anonymous (names are not hashed) and kept for the rank's unnamed program
    /// ([`OptCtx::take_built`]); a named program builds its own.
    fn digest(&self, ctx: &Ctx, rank: usize) -> u64 {
        let view = RankView::new(ctx, rank);
        let key = view.key(ctx);
        if let Ok(cache) = self.digests.lock()
            && let Some(&d) = cache.get(&key)
        {
            return d;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let anonymous = Schedule {
            anonymous: true,
            ..Schedule::default()
        };
        let schedule = build(ctx, &view, anonymous);
        schedule.hash_without_names(&mut h);
        if self.strategy.owner_placement() {
            placement_signature(ctx, &view).hash(&mut h);
        }
        let d = h.finish();
        if let Ok(mut built) = self.built.lock()
            && built.len() < KEPT_SCHEDULES
            && !built.contains_key(&d)
        {
            // Kept at its length: a doubling vector holds up to twice its ops.
            let mut schedule = schedule;
            schedule.ops.shrink_to_fit();
            built.insert(d, schedule);
        }
        if let Ok(mut cache) = self.digests.lock() {
            cache.insert(key, d);
        }
        d
    }

    /// A copy of the anonymous schedule [`OptCtx::digest`] built for `view`'s digest, if it
    /// was kept (several templates may share one schedule: their class signature or group
    /// tiers differ). Any rank with that digest may use it: the template key already relies
    /// on equal digests meaning schedules equal up to names, and anonymous schedules have
    /// none; so the result does not depend on which rank's digest was computed first (keys
    /// are computed in parallel).
    fn take_built(&self, ctx: &Ctx, view: &RankView) -> Option<Schedule> {
        let d = *self.digests.lock().ok()?.get(&view.key(ctx))?;
        self.built.lock().ok()?.get(&d).cloned()
    }
}

/// Owner position (in the FSDP shard group) of every matrix DMuon / MatrixFSDP place whole on
/// one rank: Muon-routed matrices whose plane the FSDP shard cuts and that no model-parallel
/// axis fragments (MatrixFSDP excludes TP-fragmented matrices, paper Table "design
/// contrast"; DMuon's nested TP ownership is not modelled, those matrices stay sharded).
/// Owners are greedy LPT by numel per data domain (DMuon: "LPT with constraints", MatrixFSDP:
/// "global owner planner balancing resident bytes", `muon.md` 7.4-7.5).
fn owner_placement(
    ctx: &OptCtx,
    strategy: OptimizerStrategy,
    fsdp: &FsdpPlan,
) -> Vec<Option<usize>> {
    let mut placed = vec![None; ctx.params.len()];
    for domain in [DataDomain::Dense, DataDomain::Expert] {
        let d = Ctx::domain_index(domain);
        let Some(size) = fsdp
            .groups
            .get(if d == 0 {
                "dense.shard"
            } else {
                "expert.shard"
            })
            .map(|g| g.size)
            .filter(|&s| s > 1)
        else {
            continue;
        };
        let records: Vec<(usize, u64)> = ctx
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| p.domain == domain && placeable(p, strategy))
            .map(|(i, p)| (i, p.plan_elems))
            .collect();
        for (i, c) in build_owner_by_size(&records, &[size]) {
            placed[i] = c.first().copied();
        }
    }
    placed
}

/// Whether DMuon / MatrixFSDP place this parameter on an owner.
fn placeable(p: &OptParam, strategy: OptimizerStrategy) -> bool {
    let fsdp_axes = ["dp_shard", "cp", "edp_shard"];
    let only_fsdp = p.shard.iter().all(|a| fsdp_axes.contains(&a.name.as_str()));
    let base = p.route == OptimizerRoute::Muon && p.needs_gather && only_fsdp;
    match strategy {
        // DMuon selects 2-D matrices; fused 3-D experts stay on FSDP + the original optimizer.
        OptimizerStrategy::DMuon => base && p.plan_shape.len() == 2,
        _ => base,
    }
}

/// A rank's coordinates on both meshes and its expert-parallel class.
#[derive(Debug, Clone)]
pub(crate) struct RankView {
    /// EP class.
    pub class: usize,
    /// Dense and expert mesh coordinates.
    pub coords: [Vec<usize>; 2],
    /// Position in the dense and expert FSDP shard groups.
    pub fsdp_pos: [usize; 2],
}

impl RankView {
    /// The view of `rank`.
    pub fn new(ctx: &Ctx, rank: usize) -> Self {
        Self {
            class: ctx.class_of(rank),
            coords: [
                ctx.dense_mesh.coords_of(rank),
                ctx.expert_mesh.coords_of(rank),
            ],
            fsdp_pos: [
                ctx.position_in(ctx.opt.fsdp_shard_slot[0], rank),
                ctx.position_in(ctx.opt.fsdp_shard_slot[1], rank),
            ],
        }
    }

    /// Coordinate along an axis.
    pub fn coord(&self, a: &AxisRef) -> usize {
        self.coords[usize::from(a.expert)]
            .get(a.mesh_axis)
            .copied()
            .unwrap_or(0)
    }

    /// Shard-owner coordinate of this rank for a parameter.
    pub fn shard_coord(&self, p: &OptParam) -> Vec<usize> {
        p.shard.iter().map(|a| self.coord(a)).collect()
    }

    /// Replica-owner coordinate (coordinate modulo the subgroup size).
    pub fn replica_coord(&self, p: &OptParam) -> Vec<usize> {
        p.replicate
            .iter()
            .map(|a| self.coord(a) % a.coord_size.max(1))
            .collect()
    }

    /// Everything the schedule depends on: the class, the coordinates on the axes the Muon
    /// parameters use (replicate axes modulo the subgroup) and the FSDP positions.
    fn key(&self, ctx: &Ctx) -> Vec<usize> {
        let mut k = vec![self.class, self.fsdp_pos[0], self.fsdp_pos[1]];
        for (e, coords) in self.coords.iter().enumerate() {
            let mesh = if e == 0 {
                &ctx.dense_mesh
            } else {
                &ctx.expert_mesh
            };
            for (i, &c) in coords.iter().enumerate() {
                let axis = &mesh.axes()[i];
                let modulo = if axis.name.ends_with("replicate") {
                    ctx.opt.plan.replica_subgroup_size(&axis.name, axis.size)
                } else {
                    usize::MAX
                };
                k.push(c % modulo.max(1));
            }
        }
        k
    }
}

/// Which placed matrices the rank owns (owner placement changes its FSDP ops and memory).
fn placement_signature(ctx: &Ctx, view: &RankView) -> Vec<bool> {
    ctx.opt
        .placed
        .iter()
        .zip(&ctx.opt.params)
        .filter_map(|(o, p)| {
            o.map(|o| p.held_by(view.class) && o == view.fsdp_pos[Ctx::domain_index(p.domain)])
        })
        .collect()
}

/// The optimizer schedule of `rank` (empty for the placeholder AdamW), with op names when
/// `named`. An unnamed schedule reuses the one [`OptCtx::digest`] built for the rank's
/// optimizer coordinate, if any (one build per coordinate on folded jobs).
pub(crate) fn schedule(ctx: &Ctx, rank: usize, named: bool) -> Schedule {
    let view = RankView::new(ctx, rank);
    let built = if named {
        None
    } else {
        ctx.opt.take_built(ctx, &view)
    };
    match built {
        Some(s) => s,
        None => build(
            ctx,
            &view,
            Schedule {
                anonymous: !named,
                ..Schedule::default()
            },
        ),
    }
}

/// Appends the strategy's ops for `view` to `s` (empty, possibly anonymous).
fn build(ctx: &Ctx, view: &RankView, s: Schedule) -> Schedule {
    match ctx.opt.strategy {
        OptimizerStrategy::AdamW => s,
        OptimizerStrategy::HyperParallelMuon => hyperparallel::schedule(ctx, view, s),
        OptimizerStrategy::Naive => naive::schedule(ctx, view, s),
        OptimizerStrategy::Moonlight => moonlight::schedule(ctx, view, s),
        OptimizerStrategy::DMuon => dmuon::schedule(ctx, view, s),
        OptimizerStrategy::MatrixFsdp => matrixfsdp::schedule(ctx, view, s),
        OptimizerStrategy::FlexShard => flexshard::schedule(ctx, view, s),
    }
}

/// Hash of the rank's optimizer schedule (0 for the placeholder AdamW, whose ops do not
/// depend on the rank beyond its class).
pub(crate) fn template_digest(ctx: &Ctx, rank: usize) -> u64 {
    if !ctx.opt.strategy.is_muon() {
        return 0;
    }
    ctx.opt.digest(ctx, rank)
}

/// Whether owner placement puts parameter `i` whole on `rank` (DMuon / MatrixFSDP); `None`
/// when the parameter is not placed.
pub(crate) fn placed_owner(ctx: &Ctx, i: usize, fsdp_pos: [usize; 2]) -> Option<bool> {
    let o = (*ctx.opt.placed.get(i)?)?;
    let p = &ctx.opt.params[i];
    Some(o == fsdp_pos[Ctx::domain_index(p.domain)])
}

// ------------------------------------------------------------------ shared schedule pieces

/// Bytes of `elems` bf16 elements rounded up to 512 bytes (HyperParallel's segment padding).
pub(crate) fn pad512_bf16(elems: u64) -> u64 {
    (elems * ns_cost::NS_ELEM_BYTES).div_ceil(512) * 512
}

/// The device work of an AdamW implementation over `(elements, tensors, master dtype,
/// gradient dtype)`.
pub(crate) type AdamwWork =
    fn(u64, u32, hpfsdp_plan::model::DType, hpfsdp_plan::model::DType) -> crate::step::ComputeWork;

/// AdamW on the AdamW-routed parameters the rank holds (plus `extra`, e.g. DMuon's
/// unselected experts), one op per FSDP unit in unit order with the implementation's `work`,
/// after the gradients are reduced. Accounts their moments in `s.adamw_state_bytes`.
pub(crate) fn adamw_units(
    ctx: &Ctx,
    view: &RankView,
    s: &mut Schedule,
    extra: impl Fn(usize, &OptParam) -> bool,
    work: AdamwWork,
) {
    let mut per_unit: BTreeMap<usize, (u64, u32)> = BTreeMap::new();
    for (i, p) in ctx.opt.params.iter().enumerate() {
        if p.held_by(view.class) && (p.route == OptimizerRoute::Adamw || extra(i, p)) {
            let e = per_unit.entry(p.unit).or_default();
            e.0 += p.local_elems;
            e.1 += 1;
        }
    }
    emit_adamw_units(ctx, s, per_unit, work);
}

/// [`adamw_units`] without extra parameters: AdamW on the AdamW-routed parameters the rank
/// holds, found from [`OptCtx::adamw_params`] instead of a walk over every parameter.
pub(crate) fn adamw_routed_units(ctx: &Ctx, view: &RankView, s: &mut Schedule) {
    let mut per_unit: BTreeMap<usize, (u64, u32)> = BTreeMap::new();
    for &i in &ctx.opt.adamw_params {
        let p = &ctx.opt.params[i];
        if p.held_by(view.class) {
            let e = per_unit.entry(p.unit).or_default();
            e.0 += p.local_elems;
            e.1 += 1;
        }
    }
    emit_adamw_units(ctx, s, per_unit, super::optimizer::adamw_work);
}

/// One AdamW op per FSDP unit of `per_unit` ((elements, tensors) by unit), in unit order,
/// each costed by `work`.
fn emit_adamw_units(
    ctx: &Ctx,
    s: &mut Schedule,
    per_unit: BTreeMap<usize, (u64, u32)>,
    work: AdamwWork,
) {
    for (u, (elems, tensors)) in per_unit {
        s.adamw_state_bytes += elems * super::optimizer::ADAMW_STATE_BYTES_PER_ELEM;
        let name = &ctx.fsdp.units[u].name;
        let name = name.strip_prefix("model.").unwrap_or(name);
        let work = work(elems, tensors, ctx.opts.master_dtype, grad_dtype(ctx));
        let name = s.name(|| format!("{name}.adamw"));
        s.compute(name, work, vec![Dep::Ready, Dep::Issue]);
    }
}

/// DTensor-style unpadded gathers of the parameters `members` (sharded like `members[0]`),
/// one all-gather per shard axis in order, each waiting for the previous one, in the gradient
/// dtype: on the axis `k` each rank contributes `ceil(numel / product of the remaining axis
/// sizes)` elements per parameter. Returns the last gather and the gathered buffer bytes
/// (allocated here). Shared by the `naive` (one parameter) and `moonlight` (one bucket)
/// baselines.
pub(crate) fn unpadded_gathers(
    ctx: &Ctx,
    s: &mut Schedule,
    prefix: &str,
    members: &[usize],
) -> (Option<u32>, u64) {
    let oc = &ctx.opt;
    let gb = grad_dtype(ctx).bytes();
    let (mut last, mut buf) = (None, 0);
    let Some(&f) = members.first() else {
        return (last, buf);
    };
    let first = &oc.params[f];
    let mut remaining = first.shard_size();
    for a in &first.shard {
        let input: u64 = members
            .iter()
            .map(|&i| oc.params[i].numel.div_ceil(remaining.max(1)) * gb)
            .sum();
        remaining /= a.size.max(1) as u64;
        let out = input * a.size as u64;
        let mut deps = vec![Dep::Issue];
        deps.extend(last.map(Dep::Op));
        if let Some(op) = s.coll(
            format!("{prefix}.ag.{}", a.name),
            Stream::Optimizer,
            a.slot,
            CollectiveKind::AllGather,
            input,
            out,
            grad_dtype(ctx),
            deps,
        ) {
            s.alloc(op, MemTag::Buffers, out);
            buf += out;
            last = Some(op);
        }
    }
    (last, buf)
}

/// Dtype of the sharded gradients the optimizer reads from the FSDP runtime. HyperParallel's
/// `apply_reduced_grad` (`TorchHSDPParamV2`: `reduced_grad.to(self.orig_dtype)`) and FSDP2's
/// `foreach_reduce` (`_to_dtype_if_needed(reduce_output, orig_dtype)`) cast each reduced
/// shard back to the parameter's own dtype, the master dtype, so the momentum buffer
/// (`zeros_like(grad)`), the foreach momentum kernels and AdamW read that dtype; with an FP32
/// `main_grad` (`[fsdp] fp32_main_grad`) and under Megatron (FP32 main grads) the gradient
/// stays in the reduce dtype.
pub(crate) fn grad_dtype(ctx: &Ctx) -> hpfsdp_plan::DType {
    let o = &ctx.opts;
    if o.fp32_main_grad || o.kind == StrategyKind::MegatronDdp {
        o.reduce_dtype
    } else {
        o.master_dtype
    }
}

/// Momentum update over `elems` local elements in `tensors` tensors (memory-bound foreach
/// kernels), once the gradients are reduced.
pub(crate) fn momentum(ctx: &Ctx, s: &mut Schedule, name: String, elems: u64, tensors: u32) -> u32 {
    let k = ns_cost::momentum_kernels(elems, tensors, grad_dtype(ctx));
    s.kernels(name, k, vec![Dep::Ready, Dep::Issue])
}

/// Slice-and-apply of the update on `elems` local elements in `tensors` tensors (memory-bound
/// foreach kernels), after `deps` and the issue point.
pub(crate) fn apply(
    ctx: &Ctx,
    s: &mut Schedule,
    name: String,
    elems: u64,
    tensors: u32,
    mut deps: Vec<Dep>,
) -> u32 {
    deps.push(Dep::Issue);
    let k = ns_cost::apply_kernels(elems, tensors, ctx.opts.master_dtype);
    s.kernels(name, k, deps)
}

/// How an implementation runs Newton-Schulz.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NsImpl {
    /// The standard quintic iteration in bf16 ([`ns_cost::ns_call_kernels`]).
    Bf16,
    /// DMuon's Gram-space iteration as it runs on an NPU: FP32 normalization, FP16 GEMM
    /// iterations (no CUDA SYRK), input and output in the gradient dtype
    /// ([`ns_cost::gram_ns_call_kernels`]).
    GramFp16,
}

/// One NS call: `matrices` matrices of one core shape orthogonalized by one batched launch
/// sequence (GEMM batch = `matrices`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NsCall {
    /// Core matrix shape.
    pub core: (u64, u64),
    /// Matrices in the call.
    pub matrices: u64,
}

/// Shape-fused batching (notes 6.6): one call per core shape over all its matrices.
pub(crate) fn fused_calls(items: impl IntoIterator<Item = ((u64, u64), u64)>) -> Vec<NsCall> {
    let mut by_shape: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for (core, n) in items {
        *by_shape.entry(core).or_default() += n;
    }
    by_shape
        .into_iter()
        .map(|(core, matrices)| NsCall { core, matrices })
        .collect()
}

/// One call per parameter (per-parameter optimizer loops: `torch.optim.Muon`, DTensor
/// `full_tensor()` recipes), batched only over the parameter's own leading dims.
pub(crate) fn per_param_calls(items: impl IntoIterator<Item = ((u64, u64), u64)>) -> Vec<NsCall> {
    items
        .into_iter()
        .map(|(core, matrices)| NsCall { core, matrices })
        .collect()
}

/// HyperParallel's owner-side NS calls (`_gather_and_compute_shard_updates`): per core shape,
/// the rank's gathered matrices split sequentially under `cap` whole-matrix elements
/// (`_split_into_memory_safe_batches(shard_size = S)`, at least one matrix per call).
/// `items` are (core shape, matrices, elements) per parameter in plan order.
pub(crate) fn capped_calls(items: &[((u64, u64), u64, u64)], cap: u64) -> Vec<NsCall> {
    let mut by_shape: BTreeMap<(u64, u64), Vec<(u64, u64)>> = BTreeMap::new();
    for &(core, matrices, elems) in items {
        by_shape.entry(core).or_default().push((matrices, elems));
    }
    let mut out = Vec::new();
    for (core, params) in by_shape {
        let (mut matrices, mut elems) = (0u64, 0u64);
        for (m, e) in params {
            if matrices > 0 && elems + e > cap {
                out.push(NsCall { core, matrices });
                (matrices, elems) = (0, 0);
            }
            matrices += m;
            elems += e;
        }
        if matrices > 0 {
            out.push(NsCall { core, matrices });
        }
    }
    out
}

/// NS ops for `calls`: one op per core shape holding the kernels of its calls in order (each
/// call's GEMMs batched over the call's matrices), allocating and freeing the largest call's
/// workspace. Returns the ops.
pub(crate) fn ns_ops(
    ctx: &Ctx,
    s: &mut Schedule,
    prefix: &str,
    calls: impl IntoIterator<Item = NsCall>,
    deps: &[Dep],
    imp: NsImpl,
) -> Vec<u32> {
    let mut by_shape: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
    for c in calls {
        if c.matrices > 0 {
            by_shape.entry(c.core).or_default().push(c.matrices);
        }
    }
    let steps = ctx.opt.ns_steps;
    let mut out = Vec::new();
    for (k, ((r, c), sizes)) in by_shape.into_iter().enumerate() {
        let mut kernels = Vec::new();
        let mut runs: Vec<(u64, u32)> = Vec::new();
        for n in &sizes {
            match runs.last_mut() {
                Some((m, times)) if m == n => *times += 1,
                _ => runs.push((*n, 1)),
            }
        }
        for (n, times) in runs {
            let call = match imp {
                NsImpl::Bf16 => ns_cost::ns_call_kernels(n, r, c, steps),
                NsImpl::GramFp16 => ns_cost::gram_ns_call_kernels(
                    n,
                    r,
                    c,
                    ns_cost::DMUON_COEFFICIENT_SETS,
                    // DMuon's input: its reduced gradient, in the parameter dtype.
                    ctx.opts.param_dtype,
                ),
            };
            kernels.extend(call.into_iter().map(|w| w.repeated(times)));
        }
        let mut d = deps.to_vec();
        d.push(Dep::Issue);
        let name = s.name(|| format!("{prefix}.ns{k}"));
        let op = s.kernels(name, kernels, d);
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let ws = ns_cost::ns_workspace_bytes(largest, r, c);
        s.alloc(op, MemTag::Buffers, ws);
        s.free(op, MemTag::Buffers, ws);
        out.push(op);
    }
    out
}

/// Unpadded elements of this rank's FSDP shard of `p`: the `chunk_range` rows of the FSDP
/// shard dim at the rank's shard position (ceil-sized chunks; the last positions are short,
/// or empty, when the dim does not split evenly) times the other dims of `plan_local_shape`.
/// What the rank really holds, where `local_elems` is the padded (chunk 0) size.
pub(crate) fn local_shard_elems(ctx: &Ctx, p: &OptParam, view: &RankView) -> u64 {
    let Some(&dim) = p.plan_shape.get(p.fsdp_dim) else {
        return p.local_elems;
    };
    let d = Ctx::domain_index(p.domain);
    let s = ctx.shard_size[d] as u64;
    let r = hpfsdp_plan::chunk_range(dim, s, view.fsdp_pos[d] as u64);
    p.plan_elems / dim.max(1) * (r.end - r.start)
}

/// Matrices of a local-path parameter on this rank: its `plan_local_shape` matrices, cut by
/// the FSDP shard of a leading dim (exact ceil-chunk share of the rank).
pub(crate) fn local_matrices(ctx: &Ctx, p: &OptParam, view: &RankView) -> u64 {
    let nd = p.plan_shape.len();
    if nd < 3 || p.fsdp_dim + 2 >= nd {
        return p.plan_matrices;
    }
    let d = Ctx::domain_index(p.domain);
    let s = ctx.shard_size[d] as u64;
    let dim = p.plan_shape[p.fsdp_dim];
    let r = hpfsdp_plan::chunk_range(dim, s, view.fsdp_pos[d] as u64);
    p.plan_matrices / dim.max(1) * (r.end - r.start)
}
