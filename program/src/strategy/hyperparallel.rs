//! HyperParallel-FSDP (`comm_fusion=False`, notes `hyper-parallel.md` 5.2-5.6 and 8.1).
//!
//! - **All-gather** per sharded parameter, zero-copy into its persistent buffer, on the
//!   all-gather stream inside the shard group (FSDP plan sizes and alignment).
//! - **Root and blocks** (HyperParallel's trainer, `hyper_models/components/distributed/
//!   fsdp2.py` `FSDP2Manager.parallelize`): one `fully_shard` per decoder block, then the
//!   root `fully_shard(model)` holding every other parameter (embedding, final norm,
//!   `lm_head`: the FSDP plan's non-layer units, [`hpfsdp_plan::fsdp::FsdpUnit::is_root`]). The
//!   root gets `reshard_after_forward=False` whatever the configuration says
//!   (`_build_fully_shard_kwargs`), so it is gathered once, in its own pre-forward before
//!   any block, stays gathered through backward (no backward all-gather; its memory stays
//!   allocated). Its post-backward fires last, in the root callback's fallback (the root's
//!   forward inputs, token ids, carry no gradient, so its autograd hook never runs): it
//!   reshards the root and runs the post-backward pipeline below for the root units, after
//!   every block's (their gradients stay allocated until then). With `reshard_after_forward = true` for the blocks (exp B) that gives
//!   `2 P - P_root` all-gathers per micro-batch: exp B measured 1,059 FSDP all-gathers
//!   (1,087 minus the 28 Muon gathers) = `2 x 531 - 3`.
//! - **Prefetch** links the blocks only (`_configure_prefetch` over the wrapped blocks; the
//!   root's lists stay empty): with depth `d`, block `k`'s pre-forward gathers `k` (when no
//!   one prefetched it) and then blocks `k+1..=k+d`; its pre-backward gathers `k` and then
//!   blocks `k-1..=k-d`. The first block in forward and the last block in backward are
//!   therefore gathered by their own hook, unprefetched. Blocks reshard after forward when
//!   `reshard_after_forward` and after backward when `reshard_after_backward`.
//! - **Reduce-scatter** per sharded parameter, into views of the unit's fused all-reduce
//!   buffer. All-gathers and reduce-scatters of one shard group run on that group's single
//!   HCCL stream, in issue order ([`emit::shard_group_stream`]). The op is `ReduceOp.AVG`,
//!   which torch_npu runs as an HCCL sum followed by one in-place division of the shard on
//!   that same stream ([`super::avg_division`]): 531 division kernels per step in exp B, each
//!   queued between its reduce-scatter and the all-gathers issued after it.
//! - **Four-step post-backward pipeline** (5.4), per unit `u` after its backward, with `prev`
//!   the unit processed just before it: (1) wait the reduce-scatters of `prev` (the compute
//!   stream waits for their divisions) and (2) settle them: nothing on the first micro-batch
//!   (`apply_reduced_grad` assigns the gradient), one accumulation kernel per parameter on
//!   the compute stream from the second on, each preceded by `apply_reduced_grad`'s cast to
//!   the master dtype when the reduce dtype differs and no FP32 `main_grad` is kept
//!   (`hp_mixed_precision::reduced_grad_cast`, `[fsdp] fp32_main_grad`; with replicas the
//!   cast follows the all-reduce division instead); (3) issue `u`'s reduce-scatters; (4) issue `prev`'s fused
//!   all-reduce over the replicate group (one per unit and data domain, only when the
//!   replicate group has more than one rank). The root callback at the end of backward waits
//!   the last reduce-scatters, issues the last all-reduce and waits all of them; with replicas
//!   each gradient is then split out of its buffer view and divided by the replica count (one
//!   kernel per parameter).
//! - **Gradient accumulation** (5.3, 5.6): reduce-scatter on every micro-batch (the settle step
//!   accumulates into `reduce_partial_output`), the all-reduce only on the last micro-batch
//!   (`set_requires_all_reduce(False)` on the others).
//! - TP/CP/EP boundary collectives and recompute are shared.
//! - **Optimizer:** the placeholder AdamW per unit, or the optimizer strategy's schedule
//!   (`strategy::muon`) after the last reduction, the gradients freed when it ends.
//! - **Owner placement** (DMuon, MatrixFSDP, `strategy::muon::{dmuon, matrixfsdp}`): a placed
//!   matrix lives whole on its owner. Its all-gather becomes an owner-to-all broadcast of the
//!   whole bf16 matrix (on a recomputed stage DMuon publishes twice: a prefetched publication
//!   for the recompute forward, then an unprefetchable one after it, see
//!   `Hp::dmuon_backward_after_recompute`) and its reduce-scatter a
//!   reduce of the whole gradient to the owner, costed as a broadcast of the same bytes (the
//!   program IR has no reduce kind; HCCL's A3 reduce and broadcast both move `2 (p-1)/p n`
//!   per rank, `sim/src/cost.rs`). DMuon reduces per matrix; MatrixFSDP, as its
//!   `reduce_owner_rank_chunks_1d_async` does, once per owner rank of the unit
//!   (`Hp::matrixfsdp_owner_reduces`), and publishes once per owner rank of the unit
//!   (`Hp::matrixfsdp_publications`), with its flat buffer's casts and copies around both
//!   (`strategy::muon::matrixfsdp_buffers`).
//! - **Mixed precision** (5.2, 5.6; `strategy::hp_mixed_precision`): with a master dtype
//!   unlike `param_dtype`, one cast per all-gathered shard before the unit's all-gathers;
//!   with `param_dtype` unlike the reduce dtype, one cast per gradient before the unit's
//!   reduce-scatters (one compute op per unit each); with the reduce dtype unlike the master
//!   dtype, one cast per reduced shard back to the master dtype where it is applied. The owner holds the full master parameter and receives
//!   the full gradient; the other ranks hold nothing for it. HSDP all-reduce buffers keep
//!   the sharded sizes (the baselines' scenarios have no replicas).

use super::avg_division;
use super::compute::Stage;
use super::emit::{self, Emitter, backward_with_recompute, forward_activations};
use super::hp_mixed_precision;
use super::muon::{self, OptimizerStrategy, RankView, matrixfsdp_buffers};
use super::optimizer::optimizer_step;
use super::parallel::CollSpec;
use super::{Ctx, GroupKind, StrategyError};
use crate::step::{Category, ComputeWork, Group, MemTag, OpId, StepProgram, Stream};
use hpfsdp_plan::fsdp::{DataDomain, ParamFsdp, round_up_512};
use hpfsdp_plan::topology::Tier;

/// Per-unit data of one rank's parameter class.
struct UnitInfo<'a> {
    /// The unit's parameters this rank holds.
    params: Vec<&'a ParamFsdp>,
    /// Owner placement of each (DMuon / MatrixFSDP): `Some(true)` on the owner.
    placed: Vec<Option<bool>>,
    /// Owner position of each placed parameter in its FSDP shard group.
    owners: Vec<Option<usize>>,
    /// Master-parameter elements resident on this rank.
    master_elems: u64,
    /// Bytes of the gathered (unsharded, local) parameters.
    gathered_bytes: u64,
    /// Unsharded gradient bytes in the reduce dtype (reduce-scatter inputs).
    grad_in_bytes: u64,
    /// Sharded gradient bytes (reduce-scatter outputs).
    grad_out_bytes: u64,
    /// Fused all-reduce buffer bytes per domain (0: no all-reduce).
    ar_bytes: [u64; 2],
    /// Positions in `params` of the unit's TP-partial gradients, each all-reduced over `tp`
    /// on its own in the root callback of every micro-batch ([`super::tp_grad_sync`]).
    tp_sync: Vec<usize>,
    /// Local shard elements.
    shard_elems: u64,
}

impl<'a> UnitInfo<'a> {
    /// The unit's sharded parameters that no owner holds whole: the ones HyperParallel's
    /// own `TorchHSDPParamV2` all-gathers and reduce-scatters (and casts under mixed
    /// precision).
    fn unplaced_sharded(&self) -> Vec<&'a ParamFsdp> {
        self.params
            .iter()
            .zip(&self.placed)
            .filter(|(p, pl)| pl.is_none() && sharded(p))
            .map(|(p, _)| *p)
            .collect()
    }
}

fn short(name: &str) -> &str {
    name.strip_prefix("model.").unwrap_or(name)
}

fn domain_groups(d: DataDomain) -> (GroupKind, GroupKind) {
    match d {
        DataDomain::Dense => (GroupKind::DenseShard, GroupKind::DenseReplicate),
        DataDomain::Expert => (GroupKind::ExpertShard, GroupKind::ExpertReplicate),
    }
}

/// Whether the optimizer strategy is MatrixFSDP (its backward reduces per owner rank).
fn reduces_per_owner(ctx: &Ctx) -> bool {
    ctx.opt.strategy == OptimizerStrategy::MatrixFsdp
}

fn sharded(p: &ParamFsdp) -> bool {
    p.all_gather.bytes_out_per_rank > 0
}

/// Reduce-scatter output bytes of a parameter on this rank (the whole gradient on a placed
/// matrix's owner, nothing on the others).
fn grad_out(p: &ParamFsdp, placed: Option<bool>) -> u64 {
    match placed {
        None => p.reduce_scatter.bytes_out_per_rank,
        Some(true) => p.reduce_scatter.bytes_in_per_rank,
        Some(false) => 0,
    }
}

/// torch_npu's division after reduce-scatter `rs` of `p` with HyperParallel's AVG op
/// ([`avg_division`]): one in-place division of the shard on the shard group's stream.
/// Returns the op that completes the reduce-scatter's work.
fn npu_division(e: &mut Emitter, p: &ParamFsdp, rs: OpId, name: &str) -> OpId {
    let size = e.ctx.shard_size[Ctx::domain_index(p.domain)];
    if !avg_division::npu_divides(avg_division::HYPERPARALLEL_REDUCE_SCATTER_OP, size) {
        return rs;
    }
    let rd = e.ctx.opts.reduce_dtype;
    avg_division::after_collective(
        e,
        emit::shard_group_stream(p.domain),
        Category::FsdpRs,
        p.reduce_scatter.bytes_out_per_rank,
        rd,
        rs,
        &format!("{name}.div"),
    )
}

fn unit_infos(ctx: &Ctx, rank: usize) -> Vec<UnitInfo<'_>> {
    let class = &ctx.classes[ctx.class_of(rank)];
    let rd = ctx.opts.reduce_dtype.bytes();
    let pos = if ctx.opt.strategy.owner_placement() {
        Some(RankView::new(ctx, rank).fsdp_pos)
    } else {
        None
    };
    class
        .units
        .iter()
        .map(|idx| {
            let params: Vec<&ParamFsdp> =
                idx.iter().map(|&i| &ctx.fsdp.params[i as usize]).collect();
            let placed: Vec<Option<bool>> = idx
                .iter()
                .map(|&i| pos.and_then(|pos| muon::placed_owner(ctx, i as usize, pos)))
                .collect();
            let owners: Vec<Option<usize>> = idx
                .iter()
                .map(|&i| pos.and(ctx.opt.placed.get(i as usize).copied().flatten()))
                .collect();
            let master_elems = idx
                .iter()
                .zip(&placed)
                .map(|(&i, pl)| match pl {
                    None => ctx.fsdp.params[i as usize].padded_shard_numel,
                    Some(true) => ctx.local_numel[i as usize],
                    Some(false) => 0,
                })
                .sum();
            let mut ar = [0u64; 2];
            for p in &params {
                let d = Ctx::domain_index(p.domain);
                if ctx.replicate_size[d] > 1 {
                    ar[d] += p.padded_shard_numel * rd;
                }
            }
            UnitInfo {
                gathered_bytes: params.iter().map(|p| p.all_gather.bytes_out_per_rank).sum(),
                grad_in_bytes: params
                    .iter()
                    .map(|p| p.reduce_scatter.bytes_in_per_rank)
                    .sum(),
                grad_out_bytes: params
                    .iter()
                    .zip(&placed)
                    .map(|(p, pl)| grad_out(p, *pl))
                    .sum(),
                ar_bytes: ar.map(round_up_512),
                tp_sync: idx
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| ctx.tp_partial_grad[**i as usize])
                    .map(|(pi, _)| pi)
                    .collect(),
                shard_elems: params.iter().map(|p| p.padded_shard_numel).sum(),
                params,
                placed,
                owners,
                master_elems,
            }
        })
        .collect()
}

struct Hp<'a, 'c> {
    e: Emitter<'c>,
    units: Vec<UnitInfo<'a>>,
    /// Units in forward order.
    order: Vec<usize>,
    /// The decoder-block units (not the root's) in forward order: the prefetch chain.
    blocks: Vec<usize>,
    /// Last all-gather op of each unit in the current phase.
    ag: Vec<Option<OpId>>,
    /// Whether each unit's parameters are currently gathered.
    gathered: Vec<bool>,
    /// Reduce-scatter op of each parameter of the previously processed unit.
    prev_rs: Vec<(usize, OpId)>,
    prev_unit: Option<usize>,
    /// All-reduce ops per unit (last micro-batch).
    ar_ops: Vec<Vec<OpId>>,
    /// TP all-reduces of TP-partial gradients (last micro-batch): the optimizer waits them.
    tp_sync_ops: Vec<OpId>,
    /// The previous unit's reduce-scatter completions (their divisions) waited at step 1:
    /// the all-reduces issued after that wait read their outputs.
    rs_done: Vec<OpId>,
}

impl<'a, 'c> Hp<'a, 'c> {
    /// Whether unit `u`'s backward runs DMuon's second, unprefetchable publication: DMuon on a
    /// recomputed stage (see [`Hp::publish_after_recompute`]).
    fn dmuon_republish(&self, u: usize) -> bool {
        self.e.ctx.opt.strategy == OptimizerStrategy::DMuon
            && self.e.ctx.stages[self.e.ctx.unit_stage[u]].recompute
    }

    fn gather(&mut self, u: usize, bwd: bool) {
        if self.gathered[u] || self.ag[u].is_some() {
            return;
        }
        // DMuon on a recomputed stage: the prefetched backward publication feeds the recompute
        // forward (DMuon's `_backward_prefetch`); the backward itself publishes again
        // (`publish_after_recompute`).
        let tag = if bwd && self.dmuon_republish(u) {
            Some("pub.recompute")
        } else {
            None
        };
        let deps = self.e.issue_point();
        let last = self.publish(u, bwd, tag, &deps, false);
        self.ag[u] = last;
        self.gathered[u] = last.is_some();
    }

    /// The all-gathers (or owner publications of placed matrices) of unit `u` after `deps`;
    /// `tag` overrides the placed matrices' op suffix; `republish`: only the placed matrices
    /// (DMuon's second publication), without recording buffers (the first one did).
    /// Returns the last op.
    fn publish(
        &mut self,
        u: usize,
        bwd: bool,
        tag: Option<&str>,
        deps: &[OpId],
        republish: bool,
    ) -> Option<OpId> {
        let pd = self.e.ctx.opts.param_dtype;
        let per_owner = reduces_per_owner(self.e.ctx);
        let copy_in = if republish {
            None
        } else {
            self.publication_copy_in(u, bwd)
        };
        let deps: Vec<OpId> = copy_in.map_or_else(|| deps.to_vec(), |op| vec![op]);
        let deps = deps.as_slice();
        let mut last = None;
        for (pi, p) in self.units[u].params.iter().enumerate() {
            let placed = self.units[u].placed[pi].is_some();
            // MatrixFSDP publishes its placed matrices per owner (`matrixfsdp_publications`).
            if !sharded(p) || (republish && !placed) || (per_owner && placed) {
                continue;
            }
            let (shard, _) = domain_groups(p.domain);
            let full = p.all_gather.bytes_out_per_rank;
            let spec = if placed {
                CollSpec {
                    kind: hpfsdp_plan::CollectiveKind::Broadcast,
                    input_bytes: full,
                    output_bytes: full,
                }
            } else {
                CollSpec {
                    kind: hpfsdp_plan::CollectiveKind::AllGather,
                    input_bytes: p.all_gather.bytes_in_per_rank,
                    output_bytes: full,
                }
            };
            let suffix = match (placed, bwd, tag) {
                (true, _, Some(t)) => t,
                (true, false, None) => "pub",
                (true, true, None) => "pub.bwd",
                (false, false, _) => "ag",
                (false, true, _) => "ag.bwd",
            };
            let name = format!("{}.{suffix}", short(&p.name));
            if let Some(op) = self.e.collective(
                emit::shard_group_stream(p.domain),
                Category::FsdpAg,
                shard,
                spec,
                pd,
                p.all_gather.aligned_512 || placed,
                deps,
                &name,
            ) {
                if !republish {
                    self.e.alloc(op, MemTag::Params, full);
                }
                last = Some(op);
            }
        }
        if per_owner && !republish {
            last = self.matrixfsdp_publications(u, bwd, deps).or(last);
        }
        last
    }

    /// The compute-stream work before unit `u`'s publication (returns its op, `None` when
    /// there is none). MatrixFSDP (`flat_buffer.py` `start_all_gather_full_params`,
    /// `collectives.py` `broadcast_rank_segments_1d_into_async`): the cast of the rank's
    /// whole local shard of the unit to the parameter dtype and its copy into the full
    /// buffer ([`matrixfsdp_buffers::publication_copy_in`]). Otherwise HyperParallel's
    /// per-parameter cast of the shards it all-gathers when the master dtype differs
    /// ([`hp_mixed_precision::param_cast`]; DMuon's publications are not sourced for it).
    fn publication_copy_in(&mut self, u: usize, bwd: bool) -> Option<OpId> {
        let o = &self.e.ctx.opts;
        let (master, pd) = (o.master_dtype, o.param_dtype);
        let info = &self.units[u];
        let (kernels, label) = if reduces_per_owner(self.e.ctx) {
            // A unit without owner-placed matrices takes `all_gather_equal_1d_into_async`,
            // which gathers straight into the full buffer: only the cast.
            let mut k = matrixfsdp_buffers::publication_copy_in(info.master_elems, master, pd);
            if info.placed.iter().all(Option::is_none) && master != pd {
                k.truncate(1);
            } else if info.placed.iter().all(Option::is_none) {
                k.clear();
            }
            (k, ("pub", "copy_in"))
        } else {
            let shards = info.unplaced_sharded();
            let elems = shards.iter().map(|p| p.padded_shard_numel).sum();
            let k = hp_mixed_precision::param_cast(elems, shards.len() as u32, master, pd);
            (k.into_iter().collect(), ("ag", "cast"))
        };
        if kernels.is_empty() {
            return None;
        }
        // `<unit>.pub.copy_in`, `<unit>.ag.bwd.cast`...: the phase sits before the last part so
        // that names ending in `.bwd` stay the backward compute and collectives.
        let phase = if bwd { ".bwd" } else { "" };
        let unit = short(&self.e.ctx.fsdp.units[u].name);
        let name = format!("{unit}.{}{phase}.{}", label.0, label.1);
        let deps = self.e.issue_point();
        Some(
            self.e
                .compute_kernels(Stream::Compute, Category::Copy, &kernels, &deps, &name),
        )
    }

    /// The placed parameters of unit `u`, grouped by (data domain, owner position), owners
    /// ascending.
    fn owner_groups(&self, u: usize) -> std::collections::BTreeMap<(usize, usize), Vec<usize>> {
        let mut by_owner: std::collections::BTreeMap<(usize, usize), Vec<usize>> =
            std::collections::BTreeMap::new();
        for (pi, p) in self.units[u].params.iter().enumerate() {
            if let (true, Some(owner)) = (sharded(p), self.units[u].owners[pi]) {
                let d = Ctx::domain_index(p.domain);
                by_owner.entry((d, owner)).or_default().push(pi);
            }
        }
        by_owner
    }

    /// MatrixFSDP's publication of unit `u`'s placed matrices as
    /// `broadcast_rank_segments_1d_into_async` issues it: the owner segments are coalesced
    /// per source rank (`coalesce_rank_segments`; a compact owner layout makes each owner's
    /// matrices of the unit one segment), then **one `dist.broadcast` per owner** in
    /// ascending source order, carrying all of that owner's matrices of the unit. Returns
    /// the last broadcast.
    fn matrixfsdp_publications(&mut self, u: usize, bwd: bool, deps: &[OpId]) -> Option<OpId> {
        let pd = self.e.ctx.opts.param_dtype;
        let unit = short(&self.e.ctx.fsdp.units[u].name).to_string();
        let phase = if bwd { ".bwd" } else { "" };
        let mut last = None;
        for ((_, owner), pis) in self.owner_groups(u) {
            let params: Vec<&ParamFsdp> = pis.iter().map(|&pi| self.units[u].params[pi]).collect();
            let full: u64 = params.iter().map(|p| p.all_gather.bytes_out_per_rank).sum();
            let spec = CollSpec {
                kind: hpfsdp_plan::CollectiveKind::Broadcast,
                input_bytes: full,
                output_bytes: full,
            };
            let (shard, _) = domain_groups(params[0].domain);
            let name = format!("{unit}.pub.o{owner}{phase}");
            if let Some(op) = self.e.collective(
                emit::shard_group_stream(params[0].domain),
                Category::FsdpAg,
                shard,
                spec,
                pd,
                true,
                deps,
                &name,
            ) {
                self.e.alloc(op, MemTag::Params, full);
                last = Some(op);
            }
        }
        last
    }

    /// DMuon's backward of a recomputed stage (`dmuon/_core/state.py`, `_backends/fsdp2/
    /// group.py`): the recompute forward runs DMuon's forward hooks, so its post-forward
    /// **reshards** the published matrices (`reshard_after_forward`) and does not prefetch
    /// ("during activation-checkpoint recompute ... the next forward layer is not the next
    /// layer consumed by backward"); the pre-backward hook then calls `unshard()` +
    /// `wait_for_unshard()`: a second publication whose broadcast stream first waits for the
    /// compute stream (`broadcast_stream.wait_stream(current_stream)`), i.e. for the recompute
    /// forward, and which the backward compute waits for at once. Nothing hides it. (FSDP2 and
    /// HyperParallel keep the gathered parameters through the recompute: one prefetched
    /// gather.) Returns the backward's (first, last) ops.
    fn dmuon_backward_after_recompute(
        &mut self,
        stage: &Stage,
        units: &[usize],
        deps: &[OpId],
    ) -> (OpId, OpId) {
        let (_, last_re) = self.e.stage_forward(stage, deps, true);
        self.e
            .alloc(last_re, MemTag::Activations, stage.full_act_bytes);
        let mut deps = self.e.drain_pending();
        let after = self.e.issue_point();
        for &u in units.iter().rev() {
            deps.extend(self.publish(u, true, None, &after, true));
        }
        let (first, last) = self.e.stage_backward(stage, &deps);
        self.e.free(
            last,
            MemTag::Activations,
            stage.full_act_bytes + stage.saved_bytes,
        );
        (first, last)
    }

    /// MatrixFSDP's backward reduction of unit `u`'s placed parameters as its code runs it
    /// with the default `owner_broadcast` backend (`runtime/collectives.py`
    /// `reduce_owner_rank_chunks_1d_async`): the unit's gradients are packed owner by owner
    /// and **one `dist.reduce` per owner rank with a non-empty chunk** is issued, in ascending
    /// owner order, carrying all of that owner's matrices of the unit. Costed as a broadcast
    /// of the same bytes (HCCL's A3 reduce is a reduce-scatter then a gather to the root,
    /// `sim/src/cost.rs`). Returns (parameter, op) for each placed parameter.
    fn matrixfsdp_owner_reduces(&mut self, u: usize, m: u64, deps: &[OpId]) -> Vec<(usize, OpId)> {
        let rd = self.e.ctx.opts.reduce_dtype;
        let by_owner = self.owner_groups(u);
        let unit = short(&self.e.ctx.fsdp.units[u].name).to_string();
        let mut out = Vec::new();
        for ((_, owner), pis) in by_owner {
            let params: Vec<&ParamFsdp> = pis.iter().map(|&pi| self.units[u].params[pi]).collect();
            let full: u64 = params
                .iter()
                .map(|p| p.reduce_scatter.bytes_in_per_rank)
                .sum();
            let spec = CollSpec {
                kind: hpfsdp_plan::CollectiveKind::Broadcast,
                input_bytes: full,
                output_bytes: full,
            };
            let (shard, _) = domain_groups(params[0].domain);
            let name = format!("{unit}.reduce.o{owner}");
            let Some(op) = self.e.collective(
                emit::shard_group_stream(params[0].domain),
                Category::FsdpRs,
                shard,
                spec,
                rd,
                true,
                deps,
                &name,
            ) else {
                continue;
            };
            if m == 0 {
                let kept: u64 = pis
                    .iter()
                    .map(|&pi| grad_out(self.units[u].params[pi], self.units[u].placed[pi]))
                    .sum();
                self.e.alloc(op, MemTag::Grads, kept);
            }
            self.e.free(op, MemTag::Grads, full);
            out.extend(pis.into_iter().map(|pi| (pi, op)));
        }
        out
    }

    /// Steps 1 and 2 for the previous unit: the compute stream waits for its reduce-scatters
    /// (their divisions, [`npu_division`]), then settles each gradient
    /// (hyper-parallel `TorchHSDPParamV2.apply_reduced_grad`): the first micro-batch assigns
    /// it (`sharded_param.grad = ...`, no kernel; no cast when the reduce dtype is the
    /// parameter's), later ones add it into the gradient held so far (`grad += reduced_grad`,
    /// or into `reduce_partial_output` when the all-reduce is deferred): one kernel reading two
    /// shards and writing one. Owner-placed matrices keep their division kernel here (see
    /// [`Hp::reduce_scatters`]).
    fn settle_prev(&mut self, last_mb: bool, accumulate: bool) {
        let rd = self.e.ctx.opts.reduce_dtype;
        let prev = std::mem::take(&mut self.prev_rs);
        self.rs_done.clear();
        let Some(u) = self.prev_unit else { return };
        let per_owner = reduces_per_owner(self.e.ctx);
        let mut owner_done: Vec<OpId> = Vec::new();
        let mut owned_elems = 0u64;
        for (pi, done) in prev {
            let p = self.units[u].params[pi];
            let placed = self.units[u].placed[pi];
            let out = grad_out(p, placed);
            if per_owner && placed.is_some() {
                // MatrixFSDP settles the unit's owner reductions together (below).
                self.rs_done.push(done);
                if !owner_done.contains(&done) {
                    owner_done.push(done);
                }
                owned_elems += out / rd.bytes();
                continue;
            }
            let elems = out / rd.bytes();
            let (div_kernels, div_hbm) = match placed {
                Some(_) if last_mb => (1u32, 2 * out),
                Some(_) => (1, 3 * out),
                None => (0, 0),
            };
            // `apply_reduced_grad` casts the reduced shard to the master dtype first when it
            // is applied here (no deferred replica all-reduce), then assigns or adds it in
            // that dtype.
            let cast = (placed.is_none() && !self.defers_apply(u, p))
                .then(|| self.reduced_grad_cast(elems))
                .flatten();
            let add_bytes = if cast.is_some() {
                3 * elems * self.e.ctx.opts.master_dtype.bytes()
            } else {
                3 * out
            };
            let (add_kernels, add_hbm) = if accumulate {
                (1u32, add_bytes)
            } else {
                (0, 0)
            };
            let (cast_kernels, cast_hbm) = cast.map_or((0, 0), |k| (k.count, k.hbm_bytes));
            self.rs_done.push(done);
            let kernels = div_kernels + add_kernels + cast_kernels;
            if kernels == 0 {
                continue;
            }
            self.e.compute(
                Stream::Compute,
                Category::FsdpRs,
                ComputeWork {
                    flops: elems * u64::from(kernels),
                    hbm_bytes: div_hbm + add_hbm + cast_hbm,
                    kernels,
                    mix: None,
                },
                &[done],
                &format!("{}.settle", short(&p.name)),
            );
        }
        if !owner_done.is_empty() {
            self.matrixfsdp_settle(u, owned_elems, accumulate, &owner_done);
        }
        let done = self.rs_done.clone();
        self.e.wait_for(&done);
    }

    /// `apply_reduced_grad`'s cast of one reduced shard of `elems` elements back to the
    /// master dtype ([`hp_mixed_precision::reduced_grad_cast`]); `None` with an FP32
    /// `main_grad` (`[fsdp] fp32_main_grad`: the reduced gradient is kept as it is) or when
    /// the dtypes agree.
    fn reduced_grad_cast(&self, elems: u64) -> Option<hpfsdp_plan::kernel::KernelWork> {
        let o = &self.e.ctx.opts;
        if o.fp32_main_grad {
            return None;
        }
        hp_mixed_precision::reduced_grad_cast(elems, 1, o.reduce_dtype, o.master_dtype)
    }

    /// Whether parameter `p` of unit `u` applies its reduced gradient only after the replica
    /// all-reduce (its domain's replicate group has more than one rank): the settle step then
    /// accumulates into `reduce_partial_output` in the reduce dtype, and
    /// `apply_reduced_grad` runs after the all-reduce ([`Hp::divide_all_reduces`]).
    fn defers_apply(&self, u: usize, p: &ParamFsdp) -> bool {
        self.units[u].ar_bytes[Ctx::domain_index(p.domain)] > 0
    }

    /// MatrixFSDP's settle of unit `u`'s owner reductions once they are waited
    /// (`reduce_owner_rank_chunks_1d_async`'s `wait()`): the division of the rank's own chunk
    /// of `owned_elems` elements and its copy into the local gradient shard
    /// ([`matrixfsdp_buffers::reduce_settle`]), then on later micro-batches the add into the
    /// gradient held so far (`accumulate_local_grad_shard`: `existing.add_`). Nothing on a
    /// rank that owns nothing of the unit.
    fn matrixfsdp_settle(&mut self, u: usize, owned_elems: u64, accumulate: bool, deps: &[OpId]) {
        let rd = self.e.ctx.opts.reduce_dtype;
        let mut kernels = matrixfsdp_buffers::reduce_settle(owned_elems, rd);
        if accumulate && owned_elems > 0 {
            kernels.push(hpfsdp_plan::kernel::KernelWork::memory_bound(
                1,
                owned_elems,
                3 * rd.bytes() * owned_elems,
            ));
        }
        if kernels.is_empty() {
            return;
        }
        let name = format!("{}.reduce.settle", short(&self.e.ctx.fsdp.units[u].name));
        self.e
            .compute_kernels(Stream::Compute, Category::FsdpRs, &kernels, deps, &name);
    }

    fn all_reduce_prev(&mut self) {
        let Some(u) = self.prev_unit else { return };
        let name = short(&self.e.ctx.fsdp.units[u].name).to_string();
        for d in [DataDomain::Dense, DataDomain::Expert] {
            let bytes = self.units[u].ar_bytes[Ctx::domain_index(d)];
            if bytes == 0 {
                continue;
            }
            let (_, rep) = domain_groups(d);
            let label = match d {
                DataDomain::Dense => format!("{name}.ar"),
                DataDomain::Expert => format!("{name}.experts.ar"),
            };
            if let Some(op) = self.all_reduce(Category::FsdpAr, rep, bytes, &label) {
                self.e.alloc(op, MemTag::Buffers, bytes);
                self.ar_ops[u].push(op);
            }
        }
    }

    /// The root callback's `launch_tp_replicate_reduce_and_apply` (HyperParallel
    /// `platform/torch/fully_shard/scheduler.py`, run by `_root_backward_hook` after
    /// `_finalize_per_param_reductions` at the end of every backward): for every unit and
    /// every parameter holding a reduced gradient, `all_reduce_source_replicate_grad_inplace`
    /// issues one `dist.all_reduce(reduced_grad, group=<flattened Replicate axes of the
    /// parameter's source mesh>, async_op=False)` (`param.py`), i.e. one blocking all-reduce
    /// per TP-partial parameter per micro-batch, of its reduced shard
    /// ([`super::tp_grad_sync`]). The op is the state's `reduce_op_type`, the one its
    /// reduce-scatters use ([`avg_division::HYPERPARALLEL_REDUCE_SCATTER_OP`]): with AVG,
    /// torch_npu's `allreduce` divides the result on the HCCL stream
    /// ([`avg_division`]). The next compute waits for each (a synchronous call). Returns
    /// the all-reduces' completions.
    fn tp_replicate_reduce(&mut self) -> Vec<OpId> {
        let mut issued = Vec::new();
        let rd = self.e.ctx.opts.reduce_dtype;
        // Only parameters partial over a TP group of more than one rank get here
        // (`tp_grad_sync::partial_over_tp`), so AVG always divides.
        let divides = avg_division::HYPERPARALLEL_REDUCE_SCATTER_OP == avg_division::ReduceOp::Avg;
        for u in self.order.clone() {
            for pi in self.units[u].tp_sync.clone() {
                let p = self.units[u].params[pi];
                let bytes = grad_out(p, self.units[u].placed[pi]);
                if bytes == 0 {
                    continue;
                }
                let label = format!("{}.grad_sync.tp", short(&p.name));
                let Some(op) = self.all_reduce(Category::Tp, GroupKind::Tp, bytes, &label) else {
                    continue;
                };
                let done = if divides {
                    avg_division::after_collective(
                        &mut self.e,
                        Stream::AllReduce,
                        Category::Tp,
                        bytes,
                        rd,
                        op,
                        &format!("{label}.div"),
                    )
                } else {
                    op
                };
                self.e.wait_for(&[done]);
                issued.push(done);
            }
        }
        issued
    }

    /// One asynchronous all-reduce of `bytes` gradient bytes (reduce dtype) over `group` on
    /// the all-reduce stream, after everything issued so far; `None` when the group has one
    /// rank.
    fn all_reduce(
        &mut self,
        category: Category,
        group: GroupKind,
        bytes: u64,
        label: &str,
    ) -> Option<OpId> {
        let rd = self.e.ctx.opts.reduce_dtype;
        let mut deps = self.e.issue_point();
        deps.extend_from_slice(&self.rs_done);
        let spec = CollSpec {
            kind: hpfsdp_plan::CollectiveKind::AllReduce,
            input_bytes: bytes,
            output_bytes: bytes,
        };
        self.e.collective(
            Stream::AllReduce,
            category,
            group,
            spec,
            rd,
            true,
            &deps,
            label,
        )
    }
}

/// Generates the HyperParallel-FSDP program of `rank`.
pub(crate) fn generate(
    ctx: &Ctx,
    rank: usize,
    groups: Vec<(Group, Tier)>,
    named: bool,
) -> Result<StepProgram, StrategyError> {
    let hp = emit_model(ctx, rank, groups, named);
    if ctx.opt.strategy.is_muon() {
        let sched = muon::schedule(ctx, rank, named);
        return emit::finish_schedule(hp.into_path(), &sched);
    }
    adamw_tail(hp)
}

/// `rank`'s model path without names (everything before the optimizer schedule), for
/// programs built on a shared prefix ([`emit::ModelPath`]); Muon strategies only.
pub(crate) fn model_path<'c>(
    ctx: &'c Ctx,
    rank: usize,
    groups: Vec<(Group, Tier)>,
) -> emit::ModelPath<'c> {
    emit_model(ctx, rank, groups, false).into_path()
}

impl<'c> Hp<'_, 'c> {
    /// The model path for the Muon schedule: it waits for the last compute op and frees
    /// every unit's reduced gradients.
    fn into_path(self) -> emit::ModelPath<'c> {
        let grads: u64 = self.units.iter().map(|u| u.grad_out_bytes).sum();
        let mut ready = self.e.issue_point();
        ready.extend(&self.tp_sync_ops);
        emit::ModelPath {
            ready,
            e: self.e,
            grads_freed: Some(grads),
            optimizer_base_bytes: 0,
        }
    }
}

/// The placeholder AdamW step per unit after the model path.
fn adamw_tail(mut hp: Hp<'_, '_>) -> Result<StepProgram, StrategyError> {
    let ctx = hp.e.ctx;
    let o = &ctx.opts;
    for &u in &hp.order.clone() {
        let info = &hp.units[u];
        if info.params.is_empty() {
            continue;
        }
        let name = short(&ctx.fsdp.units[u].name).to_string();
        let (elems, tensors, out) = (
            info.shard_elems,
            info.params.len() as u32,
            info.grad_out_bytes,
        );
        let mut deps = hp.e.issue_point();
        deps.extend(&hp.tp_sync_ops);
        let op = optimizer_step(&mut hp.e, &name, elems, tensors, o.reduce_dtype, &deps);
        hp.e.free(op, MemTag::Grads, out);
    }
    hp.e.build()
}

/// Emits `rank`'s program up to its optimizer step: resident memory (the optimizer state
/// only for the placeholder AdamW; a Muon schedule declares its own), every micro-batch's
/// forward and backward with the four-step post-backward pipeline, and the replica
/// all-reduce division.
fn emit_model<'a, 'c: 'a>(
    ctx: &'c Ctx,
    rank: usize,
    groups: Vec<(Group, Tier)>,
    named: bool,
) -> Hp<'a, 'c> {
    let mut hp = Hp::start(ctx, rank, groups, named);
    let stage_units = hp.stage_units();
    let m_steps = ctx.opts.grad_accum_steps;
    for m in 0..m_steps {
        let last_mb = m + 1 == m_steps;
        hp.e.set_micro_batch(m);
        hp.forward_pass(&stage_units);
        // The trainer's loss metrics between forward and backward ([`super::step_tail`]).
        super::step_tail::loss_metrics(&mut hp.e, &ctx.trainer);
        hp.backward_pass(&stage_units, m, last_mb);
        // Root callback: wait the last reduce-scatters, issue the last all-reduce.
        hp.settle_prev(last_mb, m > 0);
        if last_mb {
            hp.all_reduce_prev();
        }
        // Then the TP-replicate gradient all-reduces of every micro-batch.
        let tp_synced = hp.tp_replicate_reduce();
        if last_mb {
            hp.tp_sync_ops.extend(tp_synced);
        }
        hp.prev_unit = None;
        super::step_tail::loss_read_back(&mut hp.e);
    }
    hp.divide_all_reduces();
    // The root callback waited for the last reduce-scatters: what follows waits for them.
    let waited = std::mem::take(&mut hp.rs_done);
    hp.tp_sync_ops.extend(waited);
    // The optimizer step comes after: the optimizer strategy's schedule, or the placeholder
    // AdamW per unit.
    hp.e.set_micro_batch(0);
    hp.e.mb_prefix.clear();
    // Gradient clipping once every gradient is final.
    let grads: u64 = hp.units.iter().map(|u| u.grad_out_bytes).sum();
    let tp_sync = hp.tp_sync_ops.clone();
    if let Some(clip) = super::step_tail::clip_grad_norm(&mut hp.e, &ctx.trainer, grads, &tp_sync) {
        // The clipped gradients are what the optimizer reads, and the clip already waited for
        // every TP gradient sync: the optimizer waits for the clip only. (Waiting for the
        // syncs directly would also be correct, but would make ops issued during backward the
        // first dependencies of the per-rank optimizer tail, so prefix sharing
        // (`hpfsdp_sim::share`) would fork every class there instead of at the model path's
        // end.)
        hp.tp_sync_ops = vec![clip];
    }
    hp
}

impl<'a, 'c: 'a> Hp<'a, 'c> {
    /// The emitter with `rank`'s units in stage order and its resident memory: sharded master
    /// parameters (whole placed matrices on their owners) and, for the placeholder AdamW, the
    /// optimizer state (a Muon schedule declares its own).
    fn start(ctx: &'c Ctx, rank: usize, groups: Vec<(Group, Tier)>, named: bool) -> Self {
        let o = &ctx.opts;
        let units = unit_infos(ctx, rank);
        let n = units.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&u| (ctx.unit_stage[u], u));
        let blocks = order
            .iter()
            .copied()
            .filter(|&u| !ctx.fsdp.units[u].is_root())
            .collect();
        let mut hp = Hp {
            e: Emitter::new(ctx, rank, groups).with_names(named),
            units,
            order,
            blocks,
            ag: vec![None; n],
            gathered: vec![false; n],
            prev_rs: Vec::new(),
            prev_unit: None,
            ar_ops: vec![Vec::new(); n],
            tp_sync_ops: Vec::new(),
            rs_done: Vec::new(),
        };
        let shard_elems: u64 = hp.units.iter().map(|u| u.shard_elems).sum();
        let master_elems: u64 = hp.units.iter().map(|u| u.master_elems).sum();
        hp.e.resident(MemTag::Params, master_elems * o.master_dtype.bytes());
        let workspaces = hp.matrixfsdp_workspace_bytes();
        if workspaces > 0 {
            hp.e.resident(MemTag::Buffers, workspaces);
        }
        if !ctx.opt.strategy.is_muon() {
            hp.e.resident(
                MemTag::Optimizer,
                shard_elems * super::optimizer::ADAMW_STATE_BYTES_PER_ELEM,
            );
        }
        hp
    }

    /// The units of each stage, in unit order.
    fn stage_units(&self) -> Vec<Vec<usize>> {
        let ctx = self.e.ctx;
        let mut stage_units: Vec<Vec<usize>> = vec![Vec::new(); ctx.stages.len()];
        for &u in &self.order {
            stage_units[ctx.unit_stage[u]].push(u);
        }
        stage_units
    }

    /// Whether unit `u` is part of the root `fully_shard(model)` (never resharded after
    /// forward, outside the prefetch chain).
    fn is_root(&self, u: usize) -> bool {
        self.e.ctx.fsdp.units[u].is_root()
    }

    /// The units whose all-gathers unit `u`'s pre-forward (`bwd`: pre-backward) hook issues,
    /// in issue order: `u` itself, then for a block the next `prefetch_depth` blocks of the
    /// phase (forward order, or reverse order in backward). The root prefetches nothing.
    fn hook_gathers(&self, u: usize, bwd: bool) -> Vec<usize> {
        let mut out = vec![u];
        let Some(k) = self.blocks.iter().position(|&x| x == u) else {
            return out;
        };
        let d = self.e.ctx.opts.prefetch_depth;
        if bwd {
            out.extend(self.blocks[k.saturating_sub(d)..k].iter().rev());
        } else {
            out.extend(&self.blocks[k + 1..(k + 1 + d).min(self.blocks.len())]);
        }
        out
    }

    /// One micro-batch's forward: the root's pre-forward gathers the root units first; then
    /// each stage waits for its units' all-gathers (blocks prefetching `prefetch_depth`
    /// blocks ahead) and reshards its blocks after it when asked (never the root).
    fn forward_pass(&mut self, stage_units: &[Vec<usize>]) {
        let ctx = self.e.ctx;
        let o = &ctx.opts;
        self.ag.iter_mut().for_each(|a| *a = None);
        for u in self.order.clone() {
            if self.is_root(u) {
                self.gather(u, false);
            }
        }
        for (si, stage) in ctx.stages.iter().enumerate() {
            let mut deps = Vec::new();
            for &u in &stage_units[si] {
                for uj in self.hook_gathers(u, false) {
                    self.gather(uj, false);
                }
                deps.extend(self.ag[u]);
            }
            let (_, last) = self.e.stage_forward(stage, &deps, false);
            forward_activations(&mut self.e, stage, last);
            if o.reshard_after_forward {
                for &u in &stage_units[si] {
                    if !self.is_root(u) {
                        self.reshard(u, last);
                    }
                }
            }
        }
    }

    /// One micro-batch's backward, stages in reverse: gathers (blocks prefetched; the root
    /// is still gathered), the stage's backward (with recompute, or DMuon's republication
    /// after it), then per block the four-step post-backward pipeline; the root's
    /// post-backward (reshard, then the pipeline per root unit) comes after the last stage.
    fn backward_pass(&mut self, stage_units: &[Vec<usize>], m: u64, last_mb: bool) {
        let ctx = self.e.ctx;
        let o = &ctx.opts;
        self.ag.iter_mut().for_each(|a| *a = None);
        let mut last_bwd = None;
        for (si, stage) in ctx.stages.iter().enumerate().rev() {
            let mut deps = Vec::new();
            for &u in stage_units[si].iter().rev() {
                for uj in self.hook_gathers(u, true) {
                    self.gather(uj, true);
                }
                deps.extend(self.ag[u]);
            }
            let republish = stage_units[si]
                .first()
                .is_some_and(|&u| self.dmuon_republish(u));
            let (first, last) = if republish {
                self.dmuon_backward_after_recompute(stage, &stage_units[si], &deps)
            } else {
                backward_with_recompute(&mut self.e, stage, &deps)
            };
            last_bwd = Some(last);
            for &u in stage_units[si].iter().rev() {
                self.e
                    .alloc(first, MemTag::Grads, self.units[u].grad_in_bytes);
                if self.is_root(u) {
                    continue;
                }
                if o.reshard_after_backward || last_mb {
                    self.reshard(u, last);
                }
                self.post_backward(u, m, last_mb);
            }
        }
        // The root's post-backward fires last (the root callback's fallback: the root's
        // forward inputs carry no gradient, so its autograd hook never runs): it reshards the
        // root, then runs the pipeline for the root units in unit order.
        let roots: Vec<usize> = self
            .order
            .iter()
            .copied()
            .filter(|&u| self.is_root(u))
            .collect();
        if let Some(last) = last_bwd.filter(|_| o.reshard_after_backward || last_mb) {
            for &u in &roots {
                self.reshard(u, last);
            }
        }
        for u in roots {
            self.post_backward(u, m, last_mb);
        }
    }

    /// The four-step post-backward pipeline of unit `u` (notes 5.4), after its gradients
    /// exist: settle the previous unit's reduce-scatters, issue `u`'s, then the previous
    /// unit's fused all-reduce (last micro-batch only).
    fn post_backward(&mut self, u: usize, m: u64, last_mb: bool) {
        let per_owner = reduces_per_owner(self.e.ctx);
        // MatrixFSDP's `collect_grad_bucket` casts the unit's gradients before the scheduler
        // waits the previous unit's reductions (`before_backward_reduce`).
        if per_owner {
            self.matrixfsdp_bucket(u, false);
        }
        // Steps 1 and 2: wait and settle the previous unit's reduce-scatters.
        self.settle_prev(last_mb, m > 0);
        // Step 3: this unit's reduce-scatters (MatrixFSDP: after packing its bucket).
        if per_owner {
            self.matrixfsdp_bucket(u, true);
        }
        let deps = self.e.issue_point();
        let mut rs_ops = self.reduce_scatters(u, m, &deps, per_owner);
        if per_owner {
            rs_ops.extend(self.matrixfsdp_owner_reduces(u, m, &deps));
        }
        // Step 4: the previous unit's fused all-reduce (last micro-batch only).
        if last_mb {
            self.all_reduce_prev();
        }
        self.prev_rs = rs_ops;
        self.prev_unit = Some(u);
    }

    /// Frees unit `u`'s gathered parameters after `op` (nothing when not gathered).
    fn reshard(&mut self, u: usize, op: OpId) {
        if self.gathered[u] {
            let b = self.units[u].gathered_bytes;
            self.e.free(op, MemTag::Params, b);
        }
        self.gathered[u] = false;
    }

    /// Step 3 of the post-backward pipeline: unit `u`'s per-parameter reduce-scatters (a
    /// reduce to the owner, costed as a broadcast, for placed parameters unless MatrixFSDP
    /// reduces per owner), each allocating its output on the first micro-batch.
    fn reduce_scatters(
        &mut self,
        u: usize,
        m: u64,
        deps: &[OpId],
        per_owner: bool,
    ) -> Vec<(usize, OpId)> {
        let cast = if per_owner { None } else { self.grad_casts(u) };
        let deps: Vec<OpId> = cast.map_or_else(|| deps.to_vec(), |op| vec![op]);
        let deps = deps.as_slice();
        let o = &self.e.ctx.opts;
        let (rd, pd) = (o.reduce_dtype, o.param_dtype);
        let mut rs_ops = Vec::new();
        for (pi, p) in self.units[u].params.iter().enumerate() {
            if !sharded(p) || (per_owner && self.units[u].placed[pi].is_some()) {
                continue;
            }
            let (shard, _) = domain_groups(p.domain);
            let placed = self.units[u].placed[pi];
            let full = p.reduce_scatter.bytes_in_per_rank;
            let (spec, name, dtype) = match placed {
                // Reduce to the owner, costed as a broadcast of the whole gradient. DMuon (the
                // only owner strategy reducing here) reduces the gradient as autograd produced
                // it, in the parameter dtype, with no cast to the reduce dtype
                // (`dmuon/_backends/fsdp2/group.py` `reduce_grads`).
                Some(_) => {
                    let bytes = full / rd.bytes() * pd.bytes();
                    (
                        CollSpec {
                            kind: hpfsdp_plan::CollectiveKind::Broadcast,
                            input_bytes: bytes,
                            output_bytes: bytes,
                        },
                        format!("{}.reduce", short(&p.name)),
                        pd,
                    )
                }
                None => (
                    CollSpec {
                        kind: hpfsdp_plan::CollectiveKind::ReduceScatter,
                        input_bytes: full,
                        output_bytes: p.reduce_scatter.bytes_out_per_rank,
                    },
                    format!("{}.rs", short(&p.name)),
                    rd,
                ),
            };
            if let Some(op) = self.e.collective(
                emit::shard_group_stream(p.domain),
                Category::FsdpRs,
                shard,
                spec,
                dtype,
                p.reduce_scatter.aligned_512 || placed.is_some(),
                deps,
                &name,
            ) {
                if m == 0 {
                    self.e.alloc(op, MemTag::Grads, grad_out(p, placed));
                }
                // The unsharded gradient buffer (sized in the reduce dtype by the plan).
                self.e.free(op, MemTag::Grads, full);
                let done = match placed {
                    None => npu_division(&mut self.e, p, op, &name),
                    // ASSUMPTION: the op of DMuon's / MatrixFSDP's owner reductions is not
                    // sourced; their division stays in the settle step, as before.
                    Some(_) => op,
                };
                rs_ops.push((pi, done));
            }
        }
        rs_ops
    }

    /// HyperParallel's `reduce_scatter_grad()` casts of unit `u`'s unplaced sharded
    /// gradients to the reduce dtype ([`hp_mixed_precision::grad_cast`]), one compute op
    /// before the unit's reduce-scatters; `None` when the dtypes agree. (DMuon's owner
    /// reductions are not sourced for a cast.)
    fn grad_casts(&mut self, u: usize) -> Option<OpId> {
        let o = &self.e.ctx.opts;
        let (pd, rd) = (o.param_dtype, o.reduce_dtype);
        let info = &self.units[u];
        let grads = info.unplaced_sharded();
        let elems = grads
            .iter()
            .map(|p| p.reduce_scatter.bytes_in_per_rank / rd.bytes())
            .sum();
        let k = hp_mixed_precision::grad_cast(elems, grads.len() as u32, pd, rd)?;
        let name = format!("{}.rs.cast", short(&self.e.ctx.fsdp.units[u].name));
        let deps = self.e.issue_point();
        Some(
            self.e
                .compute_kernels(Stream::Compute, Category::Copy, &[k], &deps, &name),
        )
    }

    /// MatrixFSDP's gradient bucket of unit `u` on the compute stream
    /// (`flat_buffer.py`, `collect_grad_bucket` then
    /// `_fill_compact_owner_reduce_scatter_input`): `pack = false` emits the casts of every
    /// sharded gradient of the unit to the reduce dtype
    /// ([`matrixfsdp_buffers::reduce_cast`]), `pack = true` the workspace's `zero_` and one
    /// copy per gradient into it ([`matrixfsdp_buffers::reduce_pack`]), which the owner
    /// reductions then read (the persistent workspace is resident memory, see
    /// [`Hp::matrixfsdp_workspace_bytes`]).
    fn matrixfsdp_bucket(&mut self, u: usize, pack: bool) {
        let o = &self.e.ctx.opts;
        let (pd, rd) = (o.param_dtype, o.reduce_dtype);
        let grads: Vec<&ParamFsdp> = self.units[u]
            .params
            .iter()
            .copied()
            .filter(|p| sharded(p))
            .collect();
        let elems: u64 = grads
            .iter()
            .map(|p| p.reduce_scatter.bytes_in_per_rank / rd.bytes())
            .sum();
        let n = grads.len() as u32;
        let (kernels, label) = if pack {
            (matrixfsdp_buffers::reduce_pack(elems, n, rd), "grad.pack")
        } else {
            let k = matrixfsdp_buffers::reduce_cast(elems, n, pd, rd);
            (k.into_iter().collect(), "grad.cast")
        };
        if kernels.is_empty() {
            return;
        }
        let name = format!("{}.{label}", short(&self.e.ctx.fsdp.units[u].name));
        let deps = self.e.issue_point();
        self.e
            .compute_kernels(Stream::Compute, Category::Copy, &kernels, &deps, &name);
    }

    /// MatrixFSDP's persistent compact gradient workspaces on this rank: a unit with
    /// owner-placed matrices packs its reduce-dtype gradients into
    /// `ElasticParamBuffer.acquire_persistent_rank_chunk_workspace` (`flat_buffer.py`
    /// `start_reduce_grad_bucket_to_local_shard_with_stats`), one workspace per unit of the
    /// unit's whole numel, allocated at its first use and kept across steps (released leases
    /// are only marked free), so in the steady state they are all resident. Units without
    /// placed matrices pack into a transient padded workspace (not counted). 0 for other
    /// optimizers.
    fn matrixfsdp_workspace_bytes(&self) -> u64 {
        if !reduces_per_owner(self.e.ctx) {
            return 0;
        }
        self.units
            .iter()
            .filter(|u| u.placed.iter().any(Option::is_some))
            .map(|u| {
                u.params
                    .iter()
                    .filter(|p| sharded(p))
                    .map(|p| p.reduce_scatter.bytes_in_per_rank)
                    .sum::<u64>()
            })
            .sum()
    }

    /// After the last micro-batch: wait every fused all-reduce, then split and divide by the
    /// replica count per parameter.
    fn divide_all_reduces(&mut self) {
        let o = &self.e.ctx.opts;
        for &u in self.order.clone().iter().rev() {
            let ars = self.ar_ops[u].clone();
            if ars.is_empty() {
                continue;
            }
            let rd = o.reduce_dtype;
            let mut last = None;
            for i in 0..self.units[u].params.len() {
                let p = self.units[u].params[i];
                let bytes = p.padded_shard_numel * rd.bytes();
                // Then `apply_reduced_grad`'s cast of the divided shard to the master dtype
                // ([`hp_mixed_precision::reduced_grad_cast`]).
                let cast = self.units[u].placed[i]
                    .is_none()
                    .then(|| self.reduced_grad_cast(p.padded_shard_numel))
                    .flatten();
                let (cast_kernels, cast_hbm) = cast.map_or((0, 0), |k| (k.count, k.hbm_bytes));
                let op = self.e.compute(
                    Stream::Compute,
                    Category::FsdpAr,
                    ComputeWork {
                        flops: p.padded_shard_numel * u64::from(1 + cast_kernels),
                        hbm_bytes: 2 * bytes + cast_hbm,
                        kernels: 1 + cast_kernels,
                        mix: None,
                    },
                    &ars,
                    &format!("{}.ar_div", short(&p.name)),
                );
                last = Some(op);
            }
            if let Some(l) = last {
                let buf: u64 = self.units[u].ar_bytes.iter().sum();
                self.e.free(l, MemTag::Buffers, buf);
            }
        }
    }
}
