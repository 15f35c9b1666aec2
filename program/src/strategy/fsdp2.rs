//! PyTorch FSDP2 (`fully_shard`, notes `pytorch-baselines.md` 1.1-1.8).
//!
//! - **Units:** one `fully_shard` per decoder block plus the root `fully_shard(model)`, which
//!   takes every remaining parameter (embedding, final norm, `lm_head`). With expert parallelism
//!   a block's routed experts form a second parameter group on the expert mesh. The root is
//!   not resharded after forward (`reshard_after_forward=None` gives `False` for the root).
//! - **All-gather** per unit and parameter group, of the concatenated padded shards:
//!   copy-in on the copy stream (`all_gather_copy_in`, one foreach copy of the shard bytes),
//!   the collective on the shard group's communication stream (FSDP2's all-gather stream
//!   only orders the call: the c10d backend runs every collective of a process group on that
//!   group's own stream, [`shard_group_stream`]), copy-out on the compute stream
//!   (`split_with_sizes_copy` of the whole output, plus one chunk/cat pass per `Shard(1)`
//!   parameter). Buffers whose length is not a multiple of 512 bytes are flagged unaligned.
//!   The copy-in of a unit waits for the copy-out two units earlier (at most about two
//!   all-gather outputs alive, 1.3.5).
//! - **Prefetch:** depth `d` issues the copy-in and all-gather of the next `d` units right
//!   after a unit's copy-out (explicit prefetch, 1.7); `d = 0` issues each unit's forward
//!   all-gather in its own pre-forward hook (implicit forward prefetch: the host runs ahead)
//!   and keeps FSDP2's default backward prefetch of one unit ([`backward_prefetch_depth`]).
//!   The copy-out of a unit is issued in its own pre-hook.
//! - **Reduce-scatter** per unit and group: the compute stream first waits for the previous
//!   unit's reduce-scatter (1.4.1), then runs the reduce-scatter copy-in (`chunk_cat`) of the
//!   gradients; the collective runs on the shard group's stream, behind the all-gathers
//!   issued before it (one HCCL stream per process group). With replicas the
//!   reduce-scatter output is all-reduced on the all-reduce stream right after it (the
//!   same-layer RS -> AR chain, 1.4.4), on every micro-batch (FSDP2's default gradient sync).
//! - **Gradient division** ([`super::avg_division::fsdp2_division`]): with a bf16 or f32
//!   reduce dtype both collectives are `ReduceOp.AVG`, which torch_npu runs as an HCCL sum
//!   plus one in-place division of the output on the collective's stream (one per unit
//!   reduce-scatter, 49 in exp B, and one per all-reduce); other dtypes sum and divide the
//!   reduce-scatter input before and the output after, on the reduce-scatter stream.
//! - The root's reduce-scatter runs at the end of backward (its post-backward fires last).
//! - **All-gathers per step** (exp B: 125 measured = 97 unit all-gathers + 28 Muon gathers).
//!   Forward: one per unit (49 = root + 48 blocks). Backward: one per block (48); none for
//!   the root, whose `reshard_after_forward` is left to FSDP2's default, which `_lazy_init`
//!   turns to `False` for the root (`_fsdp_state.py`: "For the root, do not reshard after
//!   forward", under `_auto_reshard_after_forward`; an explicit `True` on the root would add
//!   one). Activation recompute adds none: FSDP2's hooks sit on the `fully_shard` module, so
//!   with the checkpoint inside the unit (torchtitan applies `checkpoint_wrapper` before
//!   `fully_shard`) the recompute runs no FSDP hook, and with a non-reentrant checkpoint
//!   around it the pre-backward hook has already unsharded the unit when the recompute
//!   runs, so `_pre_forward` returns early in `PRE_BACKWARD`. (A reentrant checkpoint around
//!   the unit would add one all-gather per recomputed block, 27 here, and about 2.1 GB of
//!   payload.) The measured figures fix the count at 97: the all-gather payload (7.670 GB,
//!   per-rank input bytes) equals these 97 plus the Muon gathers' bytes exactly, and the
//!   97 unaligned all-gathers are these units (per-rank chunks not multiples of 512 B)
//!   while the 28 aligned ones are the Muon gathers (512-byte-padded packing). The 28
//!   are the optimizer's (`strategy::muon`): one fused gather per Newton-Schulz memory
//!   batch of the revision that ran exp B (see `[optimizer.muon] ns_batch_fill_owners`).
//! - **Optimizer:** the placeholder AdamW per unit after its reductions, or the optimizer
//!   strategy's schedule (`strategy::muon`) after all of them.

mod single_rank;

use super::emit::{Emitter, backward_with_recompute, forward_activations, shard_group_stream};
use super::host_events::ADAMW_FOREACH_EVENTS_PER_PARAM;
use super::muon;
use super::parallel::CollSpec;
use super::{Ctx, GroupKind, StrategyError};
use crate::step::{Category, ComputeWork, Group, MemTag, OpId, StepProgram, Stream};
use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::fsdp::{DataDomain, ParamFsdp};
use hpfsdp_plan::kernel::{KernelClass, KernelWork};
use hpfsdp_plan::topology::Tier;

/// One FSDP2 parameter group (the params of one unit in one data domain).
struct CommGroup {
    domain: DataDomain,
    params: u32,
    shard_elems: u64,
    /// Parameters sharded on dim 1 (extra chunk/cat pass in copy-out and copy-in).
    dim1: u32,
    ag_in: u64,
    ag_out: u64,
    /// The unit's unsharded gradients as autograd produces them (param dtype, padded).
    unsharded_grad_bytes: u64,
    /// Elements of each local parameter shard, in model order (the optimizer's tensor list).
    shard_numels: Vec<u64>,
    rs_in: u64,
    rs_out: u64,
}

struct Unit {
    name: String,
    root: bool,
    groups: Vec<CommGroup>,
}

fn short(name: &str) -> &str {
    name.strip_prefix("model.").unwrap_or(name)
}

fn comm_groups(ctx: &Ctx, params: &[&ParamFsdp]) -> Vec<CommGroup> {
    let pd = ctx.opts.param_dtype.bytes();
    let rd = ctx.opts.reduce_dtype.bytes();
    let mut out = Vec::new();
    for domain in [DataDomain::Dense, DataDomain::Expert] {
        let ps: Vec<&&ParamFsdp> = params.iter().filter(|p| p.domain == domain).collect();
        if ps.is_empty() {
            continue;
        }
        let s = ctx.shard_size[Ctx::domain_index(domain)] as u64;
        let shard_elems: u64 = ps.iter().map(|p| p.padded_shard_numel).sum();
        out.push(CommGroup {
            domain,
            params: ps.len() as u32,
            shard_elems,
            dim1: ps.iter().filter(|p| p.shard_dim != 0).count() as u32,
            ag_in: shard_elems * pd,
            ag_out: shard_elems * pd * s,
            unsharded_grad_bytes: shard_elems * pd * s,
            shard_numels: ps.iter().map(|p| p.padded_shard_numel).collect(),
            rs_in: shard_elems * rd * s,
            rs_out: shard_elems * rd,
        });
    }
    out
}

fn shard_group(d: DataDomain) -> GroupKind {
    match d {
        DataDomain::Dense => GroupKind::DenseShard,
        DataDomain::Expert => GroupKind::ExpertShard,
    }
}

fn replicate_group(d: DataDomain) -> GroupKind {
    match d {
        DataDomain::Dense => GroupKind::DenseReplicate,
        DataDomain::Expert => GroupKind::ExpertReplicate,
    }
}

fn group_name(unit: &str, d: DataDomain) -> String {
    match d {
        DataDomain::Dense => unit.to_string(),
        DataDomain::Expert => format!("{unit}.experts"),
    }
}

/// Whether `domain`'s shard group is a single rank under `shard_size` (per data domain;
/// [`single_rank`]).
fn is_single_rank(shard_size: &[usize], domain: DataDomain) -> bool {
    shard_size[Ctx::domain_index(domain)] <= 1
}

struct F2<'c> {
    e: Emitter<'c>,
    units: Vec<Unit>,
    /// Pending all-gathers (group index, op) awaiting copy-out, per unit.
    ag: Vec<Vec<(usize, OpId)>>,
    gathered: Vec<bool>,
    /// Copy-outs issued so far (for the two-buffer limit of copy-in).
    copy_outs: Vec<OpId>,
    /// Reduce-scatter (and all-reduce) ops of the last unit reduced.
    prev_reduce: Vec<OpId>,
    /// Reduce ops per unit (waited by the optimizer).
    reduce_ops: Vec<Vec<OpId>>,
    /// The last one-rank reduce-scatter memcpy issued ([`single_rank`]): the next copy-out
    /// waits for it.
    last_single_rank_rs: Option<OpId>,
}

impl F2<'_> {
    fn unshard(&mut self, u: usize, bwd: bool) {
        if self.gathered[u] || !self.ag[u].is_empty() {
            return;
        }
        let o = &self.e.ctx.opts;
        let (pd, cast) = (o.param_dtype, o.param_dtype != o.master_dtype);
        let name = short(&self.units[u].name).to_string();
        let phase = if bwd { ".bwd" } else { "" };
        for gi in 0..self.units[u].groups.len() {
            let g = &self.units[u].groups[gi];
            if is_single_rank(&self.e.ctx.shard_size, g.domain) {
                let cin = self.single_rank_copy_in(u, gi, phase);
                self.ag[u].push((gi, cin));
                continue;
            }
            let (ag_in, ag_out, domain) = (g.ag_in, g.ag_out, g.domain);
            let gname = group_name(&name, domain);
            let deps: Vec<OpId> = self
                .copy_outs
                .len()
                .checked_sub(2)
                .map(|i| self.copy_outs[i])
                .into_iter()
                .collect();
            // Copy-in: cast into the flat param-dtype buffer (mixed precision) and pack into
            // this rank's slot of the output (1.3.2).
            let copy_bytes = if cast { 2 * ag_in } else { ag_in };
            let cin = self.e.copy(
                Stream::Copy,
                copy_bytes,
                1 + cast as u32,
                &deps,
                &format!("{gname}.copy_in{phase}"),
            );
            self.e.alloc(cin, MemTag::Buffers, ag_out);
            let spec = CollSpec {
                kind: CollectiveKind::AllGather,
                input_bytes: ag_in,
                output_bytes: ag_out,
            };
            if let Some(op) = self.e.collective(
                shard_group_stream(domain),
                Category::FsdpAg,
                shard_group(domain),
                spec,
                pd,
                ag_out.is_multiple_of(512),
                &[cin],
                &format!("{gname}.ag{phase}"),
            ) {
                self.ag[u].push((gi, op));
            }
        }
    }

    /// Copy-out of a unit's all-gathers on the compute stream; returns the last copy-out.
    fn wait_unshard(&mut self, u: usize, bwd: bool) -> Option<OpId> {
        let pending = std::mem::take(&mut self.ag[u]);
        let name = short(&self.units[u].name).to_string();
        let phase = if bwd { ".bwd" } else { "" };
        let mut last = None;
        for (gi, ag) in pending {
            let g = &self.units[u].groups[gi];
            if is_single_rank(&self.e.ctx.shard_size, g.domain) {
                let op = self.single_rank_copy_out(u, gi, ag, phase);
                self.copy_outs.push(op);
                last = Some(op);
                continue;
            }
            let (ag_out, dim1, domain) = (g.ag_out, g.dim1, g.domain);
            let op = self.e.copy(
                Stream::Compute,
                ag_out,
                1 + dim1,
                &[ag],
                &format!("{}.copy_out{phase}", group_name(&name, domain)),
            );
            self.e.alloc(op, MemTag::Params, ag_out);
            self.e.free(op, MemTag::Buffers, ag_out);
            self.copy_outs.push(op);
            last = Some(op);
        }
        if last.is_some() {
            self.gathered[u] = true;
        }
        last
    }

    fn reshard(&mut self, u: usize, at: OpId) {
        if !self.gathered[u] {
            return;
        }
        let bytes: u64 = self.units[u].groups.iter().map(|g| g.ag_out).sum();
        self.e.free(at, MemTag::Params, bytes);
        self.gathered[u] = false;
    }

    /// Reduces unit `u`'s gradients after its backward: every parameter group's
    /// reduce-scatter (and all-reduce with replicas), each after the previous unit's.
    fn reduce(&mut self, u: usize, first_mb: bool) {
        let wait = std::mem::take(&mut self.prev_reduce);
        let mut ops = Vec::new();
        for gi in 0..self.units[u].groups.len() {
            ops.extend(self.reduce_group(u, gi, &wait, first_mb));
        }
        self.reduce_ops[u].extend(ops.iter().copied());
        self.prev_reduce = ops;
    }

    /// One parameter group's reduction: its reduce-scatter (or the single-rank copies),
    /// then [`Self::reduce_tail`]. Returns the op that completes it.
    fn reduce_group(&mut self, u: usize, gi: usize, wait: &[OpId], first_mb: bool) -> Option<OpId> {
        let domain = self.units[u].groups[gi].domain;
        let di = Ctx::domain_index(domain);
        let div = super::avg_division::fsdp2_division(
            self.e.ctx.opts.reduce_dtype,
            self.e.ctx.shard_size[di] * self.e.ctx.replicate_size[di],
        );
        let rs = if is_single_rank(&self.e.ctx.shard_size, domain) {
            self.single_rank_reduce(u, gi, wait, first_mb)
        } else {
            self.reduce_scatter(u, gi, wait, first_mb, &div)?
        };
        Some(self.reduce_tail(u, gi, rs, first_mb, &div))
    }

    /// The reduce-scatter of group `gi` of unit `u` over a multi-rank shard group: the
    /// compute stream waits for the previous unit's reduce-scatter (`wait`), then packs
    /// (`chunk_cat`), the pre-division runs and the collective follows on the group's
    /// stream. `None` when no collective is issued.
    fn reduce_scatter(
        &mut self,
        u: usize,
        gi: usize,
        wait: &[OpId],
        first_mb: bool,
        div: &super::avg_division::Fsdp2Division,
    ) -> Option<OpId> {
        let rd = self.e.ctx.opts.reduce_dtype;
        let g = &self.units[u].groups[gi];
        let (rs_in, rs_out, dim1, domain) = (g.rs_in, g.rs_out, g.dim1, g.domain);
        let unsharded_grads = g.unsharded_grad_bytes;
        let gname = group_name(short(&self.units[u].name), domain);
        let cin = self.e.copy_of_kind(
            Stream::Compute,
            rs_in,
            1 + dim1,
            crate::step::CopyKind::ChunkCat,
            wait,
            &format!("{gname}.rs_copy_in"),
        );
        self.e.alloc(cin, MemTag::Buffers, rs_in);
        self.e.free(cin, MemTag::Grads, unsharded_grads);
        self.e.b.copy_elements(cin, rs_in / rd.bytes().max(1));
        let spec = CollSpec {
            kind: CollectiveKind::ReduceScatter,
            input_bytes: rs_in,
            output_bytes: rs_out,
        };
        // `_div_if_needed(input, predivide_factor)` on the reduce-scatter stream.
        let rs_stream = shard_group_stream(domain);
        let pre = self.divide_if_needed(rs_stream, div.pre_factor, rs_in, cin, &gname, "pre");
        let rs = self.e.collective(
            rs_stream,
            Category::FsdpRs,
            shard_group(domain),
            spec,
            rd,
            rs_in.is_multiple_of(512),
            &[pre],
            &format!("{gname}.rs"),
        )?;
        self.e.free(rs, MemTag::Buffers, rs_in);
        if first_mb {
            self.e.alloc(rs, MemTag::Grads, rs_out);
        }
        Some(self.npu_avg(div.op, domain, Category::FsdpRs, rs_out, rs, &gname))
    }

    /// After group `gi`'s reduce-scatter `rs`: the all-reduce over the replicas (HSDP), the
    /// post-division and, from the second micro-batch on, the accumulation into the sharded
    /// gradients, on the post-reduce stream (the all-reduce stream with replicas, else the
    /// reduce-scatter stream). Returns the last op.
    fn reduce_tail(
        &mut self,
        u: usize,
        gi: usize,
        rs: OpId,
        first_mb: bool,
        div: &super::avg_division::Fsdp2Division,
    ) -> OpId {
        let rd = self.e.ctx.opts.reduce_dtype;
        let g = &self.units[u].groups[gi];
        let (rs_out, params, domain) = (g.rs_out, g.params, g.domain);
        let gname = group_name(short(&self.units[u].name), domain);
        let spec = CollSpec {
            kind: CollectiveKind::AllReduce,
            input_bytes: rs_out,
            output_bytes: rs_out,
        };
        let ar = self.e.collective(
            Stream::AllReduce,
            Category::FsdpAr,
            replicate_group(domain),
            spec,
            rd,
            rs_out.is_multiple_of(512),
            &[rs],
            &format!("{gname}.ar"),
        );
        let ar = ar.map(|ar| self.npu_avg(div.op, domain, Category::FsdpAr, rs_out, ar, &gname));
        let (last, post_stream) = match ar {
            Some(ar) => (ar, Stream::AllReduce),
            None => (rs, shard_group_stream(domain)),
        };
        let post =
            self.divide_if_needed(post_stream, div.post_factor, rs_out, last, &gname, "post");
        if first_mb {
            return post;
        }
        // `sharded_param.grad._local_tensor += new_sharded_grad`: one add per parameter.
        let elems = rs_out / rd.bytes().max(1);
        let add = self.e.compute(
            post_stream,
            Category::FsdpRs,
            ComputeWork::memory_bound(elems, 3 * rs_out, params.max(1)),
            &[post],
            &format!("{gname}.grad_accumulate"),
        );
        add
    }
}

impl F2<'_> {
    /// torch_npu's division of an averaged collective's output ([`super::avg_division`]),
    /// on the stream the collective `coll` ran on; returns the op completing its work.
    fn npu_avg(
        &mut self,
        op: super::avg_division::ReduceOp,
        domain: DataDomain,
        category: Category,
        bytes: u64,
        coll: OpId,
        gname: &str,
    ) -> OpId {
        if op != super::avg_division::ReduceOp::Avg {
            return coll;
        }
        let stream = match category {
            Category::FsdpAr => Stream::AllReduce,
            _ => shard_group_stream(domain),
        };
        let rd = self.e.ctx.opts.reduce_dtype;
        let what = if category == Category::FsdpAr {
            "ar"
        } else {
            "rs"
        };
        super::avg_division::after_collective(
            &mut self.e,
            stream,
            category,
            bytes,
            rd,
            coll,
            &format!("{gname}.{what}.div"),
        )
    }

    /// FSDP2's own `_div_if_needed` of `bytes` by `factor` after `dep` (nothing for a factor
    /// of 1 or less) on `stream` (its reduce-scatter stream is modelled by the shard group's
    /// stream, [`shard_group_stream`], its all-reduce stream by [`Stream::AllReduce`]).
    /// Returns the division, or `dep` when there is none.
    fn divide_if_needed(
        &mut self,
        stream: Stream,
        factor: f64,
        bytes: u64,
        dep: OpId,
        gname: &str,
        what: &str,
    ) -> OpId {
        if factor <= 1.0 {
            return dep;
        }
        let rd = self.e.ctx.opts.reduce_dtype;
        let category = if stream == Stream::AllReduce {
            Category::FsdpAr
        } else {
            Category::FsdpRs
        };
        self.e.compute(
            stream,
            category,
            super::avg_division::division_work(bytes, rd),
            &[dep],
            &format!("{gname}.rs.{what}_div"),
        )
    }
}

/// Units FSDP2 all-gathers ahead in backward for the scenario's `prefetch_depth` `d`: `d`
/// explicit ones (`set_modules_to_backward_prefetch`), and one when `d = 0`. FSDP2's
/// pre-backward hook falls back to its default prefetch whenever no explicit list is set
/// (`_fsdp_state.py::_pre_backward`: `default_prefetch = len(self._states_to_backward_prefetch)
/// == 0`; `FSDPParamGroup.pre_backward` then calls `_backward_prefetch`, which unshards the
/// unit before it in post-forward order). So `d = 0` cannot switch backward prefetch off.
pub fn backward_prefetch_depth(d: usize) -> usize {
    d.max(1)
}

/// Generates the FSDP2 program of `rank` (op names kept when `named`): resident state, then
/// per micro-batch the forward and backward with their all-gathers and reductions, then
/// the optimizer.
pub(crate) fn generate(
    ctx: &Ctx,
    rank: usize,
    groups: Vec<(Group, Tier)>,
    named: bool,
) -> Result<StepProgram, StrategyError> {
    let (units, stage_unit) = fsdp2_units(ctx, rank);
    let n = units.len();
    let mut f = F2 {
        e: Emitter::new(ctx, rank, groups).with_names(named),
        units,
        ag: vec![Vec::new(); n],
        gathered: vec![false; n],
        copy_outs: Vec::new(),
        prev_reduce: Vec::new(),
        reduce_ops: vec![Vec::new(); n],
        last_single_rank_rs: None,
    };
    let sched = ctx
        .opt
        .strategy
        .is_muon()
        .then(|| muon::schedule(ctx, rank, named));
    f.reserve_resident_state(sched.as_ref());
    let o = &ctx.opts;
    for m in 0..o.grad_accum_steps {
        f.e.set_micro_batch(m);
        f.forward(&stage_unit);
        f.backward(&stage_unit, m == 0, m + 1 == o.grad_accum_steps);
    }
    f.e.mb_prefix.clear();
    match &sched {
        Some(sched) => f.muon_optimizer(sched),
        None => f.torch_adamw(),
    }
    f.e.build()
}

/// The FSDP2 units of `rank`'s parameter class: the root (every non-layer FSDP unit's
/// parameters) first, then one unit per block in stage order; and the unit of every stage
/// (`None` for a stage no unit covers).
fn fsdp2_units(ctx: &Ctx, rank: usize) -> (Vec<Unit>, Vec<Option<usize>>) {
    let class = &ctx.classes[ctx.class_of(rank)];
    let mut stage_unit = vec![None; ctx.stages.len()];
    let mut root_params: Vec<&ParamFsdp> = Vec::new();
    let mut blocks: Vec<(usize, Vec<&ParamFsdp>, String)> = Vec::new();
    for (fu, idx) in class.units.iter().enumerate() {
        let params: Vec<&ParamFsdp> = idx.iter().map(|&i| &ctx.fsdp.params[i as usize]).collect();
        let unit = &ctx.fsdp.units[fu];
        if unit.layer.is_some() {
            blocks.push((ctx.unit_stage[fu], params, unit.name.clone()));
        } else {
            root_params.extend(params);
            stage_unit[ctx.unit_stage[fu]] = Some(0);
        }
    }
    blocks.sort_by_key(|b| b.0);
    let mut units = vec![Unit {
        name: "model".into(),
        root: true,
        groups: comm_groups(ctx, &root_params),
    }];
    for (s, params, name) in blocks {
        stage_unit[s] = Some(units.len());
        units.push(Unit {
            name,
            root: false,
            groups: comm_groups(ctx, &params),
        });
    }
    (units, stage_unit)
}

impl F2<'_> {
    /// Memory held for the whole step: the master-dtype parameter shards and the
    /// optimizer state (the Muon schedule's, or AdamW's moments of every shard).
    fn reserve_resident_state(&mut self, sched: Option<&muon::schedule::Schedule>) {
        let shard_elems: u64 = self
            .units
            .iter()
            .flat_map(|u| u.groups.iter().map(|g| g.shard_elems))
            .sum();
        let master_bytes = self.e.ctx.opts.master_dtype.bytes();
        self.e.resident(MemTag::Params, shard_elems * master_bytes);
        self.e.resident(
            MemTag::Optimizer,
            match sched {
                Some(s) => s.momentum_bytes + s.adamw_state_bytes,
                // torch's AdamW keeps both moments in the parameter's dtype.
                None => shard_elems * 2 * master_bytes,
            },
        );
    }

    /// One micro-batch's forward: units in order 0 (root), 1.. (blocks), each gathered
    /// (with explicit prefetch of the next `prefetch_depth` units) before its first stage
    /// and, for blocks, resharded after its forward when `reshard_after_forward`.
    fn forward(&mut self, stage_unit: &[Option<usize>]) {
        let ctx = self.e.ctx;
        let n = self.units.len();
        let mut seen = vec![false; n];
        for (stage, &unit) in ctx.stages.iter().zip(stage_unit) {
            let mut deps = Vec::new();
            if let Some(u) = unit
                && !seen[u]
            {
                seen[u] = true;
                self.unshard(u, false);
                deps.extend(self.wait_unshard(u, false));
                // Explicit prefetch of the next `d` units after this unit's copy-out.
                for j in u + 1..=(u + ctx.opts.prefetch_depth).min(n - 1) {
                    self.unshard(j, false);
                }
            }
            let (_, last) = self.e.stage_forward(stage, &deps, false);
            forward_activations(&mut self.e, stage, last);
            if let Some(u) = unit
                && !self.units[u].root
                && ctx.opts.reshard_after_forward
            {
                self.reshard(u, last);
            }
        }
    }

    /// One micro-batch's backward: blocks in reverse, each gathered (prefetching the ones
    /// before it) and reduced after its backward; the root last, when the whole model's
    /// backward is done. `first_mb` allocates the reduced gradients; `last_mb` reshards
    /// whatever `reshard_after_backward` says.
    fn backward(&mut self, stage_unit: &[Option<usize>], first_mb: bool, last_mb: bool) {
        let ctx = self.e.ctx;
        let mut grads_held = vec![false; self.units.len()];
        for (stage, &unit) in ctx.stages.iter().zip(stage_unit).rev() {
            let deps = match unit {
                Some(u) if !self.units[u].root => self.gather_for_backward(u),
                _ => Vec::new(),
            };
            let (_, last) = backward_with_recompute(&mut self.e, stage, &deps);
            let Some(u) = unit else {
                continue;
            };
            // Gradients appear as a stage's backward ends (its weight gradients come last);
            // the root's buffers are allocated by its first stage's backward only.
            let grads: u64 = if self.units[u].root && grads_held[u] {
                0
            } else {
                self.units[u]
                    .groups
                    .iter()
                    .map(|g| g.unsharded_grad_bytes)
                    .sum()
            };
            self.e.alloc(last, MemTag::Grads, grads);
            grads_held[u] = true;
            if !self.units[u].root {
                if ctx.opts.reshard_after_backward || last_mb {
                    self.reshard(u, last);
                }
                self.reduce(u, first_mb);
            }
        }
        // Root post-backward fires when the whole model's backward is done.
        if let Some(l) = self.e.last_compute
            && (ctx.opts.reshard_after_backward || last_mb)
        {
            self.reshard(0, l);
        }
        self.reduce(0, first_mb);
    }

    /// Gathers block `u` for its backward and prefetches the blocks before it; returns what
    /// its backward waits for (its copy-out).
    fn gather_for_backward(&mut self, u: usize) -> Vec<OpId> {
        self.unshard(u, true);
        let deps = self.wait_unshard(u, true).into_iter().collect();
        // FSDP2's backward prefetches at least one unit ahead whatever the explicit
        // lists say ([`backward_prefetch_depth`]).
        for k in 1..=backward_prefetch_depth(self.e.ctx.opts.prefetch_depth) {
            if u > k {
                self.unshard(u - k, true);
            }
        }
        deps
    }

    /// The Muon optimizer schedule after every unit's reductions; frees the reduced
    /// gradients after its last op.
    fn muon_optimizer(&mut self, sched: &muon::schedule::Schedule) {
        let mut ready = self.e.issue_point();
        ready.extend(self.reduce_ops.iter().flatten().copied());
        let grads: u64 = (0..self.units.len())
            .flat_map(|u| self.units[u].groups.iter())
            .map(|g| g.rs_out)
            .sum();
        if let Some(last) = super::emit::lower_schedule(&mut self.e, sched, &ready) {
            self.e.free(last, MemTag::Grads, grads);
        }
    }

    /// `torch.optim.AdamW`'s foreach step over every local shard after every unit's
    /// reductions (`finalize_backward` waits them): one op per `_foreach_*` pass
    /// ([`super::torch_adamw`]), the square-root temporary alive from its pass to the last;
    /// `zero_grad(set_to_none=True)` then frees the reduced gradients.
    fn torch_adamw(&mut self) {
        let groups = || self.units.iter().flat_map(|u| u.groups.iter());
        let numels: Vec<u64> = groups()
            .flat_map(|g| g.shard_numels.iter().copied())
            .collect();
        if numels.is_empty() {
            return;
        }
        let elems: u64 = numels.iter().sum();
        let grads: u64 = groups().map(|g| g.rs_out).sum();
        let master = self.e.ctx.opts.master_dtype;
        let passes = super::torch_adamw::passes(master, master, self.e.ctx.opts.adamw_weight_decay);
        let mut deps = self.e.issue_point();
        deps.extend(self.reduce_ops.iter().flatten().copied());
        let temporary = elems * master.bytes();
        let mut last = None;
        for (i, pass) in passes.iter().enumerate() {
            let kernels =
                super::torch_adamw::launches(numels.iter().copied(), pass.depth, pass.scalar_list);
            let work = self.e.b.intern_kernels(&[KernelWork {
                class: KernelClass::MultiTensorApply,
                count: u32::try_from(kernels.max(1)).unwrap_or(u32::MAX),
                flops: elems,
                hbm_bytes: (pass.read_bytes + pass.write_bytes) * elems,
            }]);
            let op = self.e.compute(
                Stream::Compute,
                Category::Optimizer,
                work,
                if i == 0 { &deps } else { &[] },
                &format!("optimizer.{}", pass.name),
            );
            if i == 0 {
                self.e
                    .b
                    .host_events(op, ADAMW_FOREACH_EVENTS_PER_PARAM * numels.len() as u32);
            }
            if pass.allocates_temporary {
                self.e.alloc(op, MemTag::Optimizer, temporary);
            }
            if pass.frees_temporary {
                self.e.free(op, MemTag::Optimizer, temporary);
            }
            last = Some(op);
        }
        if let Some(op) = last {
            self.e.free(op, MemTag::Grads, grads);
        }
    }
}
