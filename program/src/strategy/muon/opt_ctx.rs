//! The optimizer strategy's rank-independent data ([`OptCtx`]): the Muon plan, its
//! parameters and slots, owner placement, and the caches every rank's build shares. The
//! shared context ([`crate::strategy::Ctx`]) holds it; the schedule builders read it.

use super::hp_pieces::Pieces;
use super::schedule::Schedule;
use crate::strategy::groups::GroupFamily;
use crate::strategy::options::{StrategyError, StrategyKind};
use hpfsdp_plan::fsdp::{DataDomain, FsdpPlan};
use hpfsdp_plan::mesh::DeviceMesh;
use hpfsdp_plan::muon::{MuonPlan, OptimizerRoute, build_muon_plan, build_owner_by_size};
use hpfsdp_plan::planner::ShardingPlan;
use hpfsdp_plan::scenario::Scenario;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct AxisRef {
    /// Axis name (shared: every parameter on the axis holds a copy of its view).
    pub name: Arc<str>,
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
    /// Indices of the AdamW-routed parameters ([`adamw_routed_units`](super::adamw_routed_units) walks these instead of
    /// every parameter: on exp-d most parameters are Muon-routed experts).
    pub(crate) adamw_params: Vec<usize>,
    /// Per plan batch, per EP class: the batch's parameters the class holds, in batch order
    /// (built on first use; [`OptCtx::held`]).
    pub(crate) held: std::sync::OnceLock<Vec<Vec<Vec<usize>>>>,
    pub(crate) digests: Arc<Mutex<HashMap<Vec<usize>, u64>>>,
    /// Anonymous schedules built for a digest, one per distinct digest (coordinates whose
    /// schedules are equal share one): the first program with that schedule takes it instead
    /// of building it again.
    pub(crate) built: Arc<Mutex<BuiltSchedules>>,
    /// Rank-independent pieces of HyperParallel Muon schedules, shared by every rank's
    /// build ([`Pieces`]).
    pub(crate) hp_pieces: Pieces,
}

/// Anonymous schedules kept by [`OptCtx::digest`] for reuse, keyed by their digest.
pub(crate) type BuiltSchedules = HashMap<u64, Built>;

/// A schedule kept for reuse: whole, or as its HyperParallel parts (assembled when taken).
#[derive(Debug, Clone)]
pub(crate) enum Built {
    /// The whole schedule.
    Whole(Schedule),
    /// Its parts ([`super::hp_parts`]).
    Parts(super::hp_parts::Parts),
}

impl Built {
    /// The schedule laid out for lowering (parts are not assembled).
    pub(crate) fn layout(&self) -> super::schedule::Layout<'_> {
        match self {
            Built::Whole(s) => s.layout(),
            Built::Parts(p) => p.layout(),
        }
    }
}

/// Schedules kept for reuse at most (a bound on the memory of [`OptCtx`]'s cache on jobs
/// with very many optimizer coordinates; beyond it the program builds its own).
pub(crate) const KEPT_SCHEDULES: usize = 4096;

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
fn opt_params<'m>(
    muon: &'m MuonPlan,
    fsdp: &FsdpPlan,
    trainable: &[&hpfsdp_plan::planner::ParamPlan],
    meshes: [&DeviceMesh; 2],
    families: &mut Vec<GroupFamily>,
) -> Vec<OptParam> {
    let mut out = Vec::with_capacity(muon.params.len());
    // Resolved axes by (expert mesh, axis name, size, replicate): a pure function of these
    // once its family is registered, so resolved once, not per parameter (each resolution
    // compares the family with every registered one).
    let mut resolved: HashMap<(bool, &str, usize, bool), Option<AxisRef>> = HashMap::new();
    for ((mp, fp), pp) in muon.params.iter().zip(&fsdp.params).zip(trainable) {
        let expert = fp.domain == DataDomain::Expert;
        let mut resolve = |name: &'m str, size: usize, replicate: bool| -> Option<AxisRef> {
            let key = (expert, name, size, replicate);
            if let Some(r) = resolved.get(&key) {
                return r.clone();
            }
            let r = resolve_axis(muon, meshes, families, expert, (name, size, replicate));
            resolved.insert(key, r.clone());
            r
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

/// The optimizer view of mesh axis `name` (of `size` ranks, a replicate axis when
/// `replicate`) on the dense or expert mesh, its group family registered in `families`;
/// `None` when the mesh has no such axis.
fn resolve_axis(
    muon: &MuonPlan,
    meshes: [&DeviceMesh; 2],
    families: &mut Vec<GroupFamily>,
    expert: bool,
    (name, size, replicate): (&str, usize, bool),
) -> Option<AxisRef> {
    let mesh_axis = meshes[usize::from(expert)].axis_index(name)?;
    // Replicate axes: the replica subgroup (a contiguous block of the group).
    let coord_size = if replicate {
        muon.replica_subgroup_size(name, size)
    } else {
        size
    };
    let block = (coord_size < size).then_some(coord_size);
    let slot = axis_family(families, meshes, expert, mesh_axis, block);
    Some(AxisRef {
        name: name.into(),
        slot,
        mesh_axis,
        size,
        expert,
        coord_size,
    })
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
                    .position(|f| f.kind == Some(crate::strategy::groups::GroupKind::DenseShard)),
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
            hp_pieces: Pieces::default(),
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
        let d = crate::strategy::groups::domain_index(domain);
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
    let only_fsdp = p.shard.iter().all(|a| fsdp_axes.contains(&&*a.name));
    let base = p.route == OptimizerRoute::Muon && p.needs_gather && only_fsdp;
    match strategy {
        // DMuon selects 2-D matrices; fused 3-D experts stay on FSDP + the original optimizer.
        OptimizerStrategy::DMuon => base && p.plan_shape.len() == 2,
        _ => base,
    }
}
