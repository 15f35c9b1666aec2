//! The program emitter shared by the strategies: a [`ProgramBuilder`] with the rank's group
//! table, c10d issue semantics and the forward/backward emission of compute stages.
//!
//! Issue semantics: a collective issued from the host thread through c10d (`async_op=True`)
//! makes its communication stream wait for the work already issued on the current (compute)
//! stream, so every collective issued here depends on the last compute-stream op issued
//! before it ([`Emitter::issue_point`]).

use super::collective_staging;
use super::compute::{Item, Segment, Stage};
use super::host_events;
use super::muon::schedule::{Dep, Layout, Schedule, Work};
use super::parallel::{CollSpec, ParAxis, ParColl};
use super::segment_pieces::{piece_of, share};
use super::tp_overlap::{self, Pass, SegmentSplit};
use super::{Ctx, GroupKind};
use crate::step::{
    Category, CollectiveOp, ComputeWork, Group, GroupId, HostDispatch, MemTag, OpId, Payload,
    ProgramBuilder, StepProgram, Stream,
};
use hpfsdp_plan::model::DType;
use hpfsdp_plan::topology::Tier;

/// The expert shard group's communication stream (see [`shard_group_stream`]).
pub(crate) const EXPERT_SHARD_STREAM: Stream = Stream::Aux(1);

/// The device stream that runs every collective of `domain`'s FSDP shard group: its all-gathers
/// and its reduce-scatters alike (and the owner broadcasts and reduces of placed matrices).
///
/// c10d backends run a process group's collectives on that group's own communication stream,
/// not on the caller's stream: torch_npu `ProcessGroupHCCL.cpp` ("[Sync Streams] ... HCCL
/// communications run on hcclStreams", `syncStreams` makes the group's stream wait for the
/// current stream), one stream per device per group, as `ProcessGroupNCCL` does. FSDP2's
/// separate all-gather and reduce-scatter streams (`FSDPCommContext`) only order the copies
/// and events around the call; HyperParallel creates no stream at all and relies on the
/// per-group streams (notes `hyper-parallel.md` 5.6). So a unit's reduce-scatter and the next
/// unit's prefetched all-gather, both in the shard group, queue one behind the other in issue
/// order instead of sharing the link. Exp B's measured weighted FSDP bandwidth (125.2 GB/s
/// HyperParallel, 56.8 GB/s FSDP2 of which the unaligned half runs at 51 GB/s) is what
/// collectives reach one at a time; sharing the link halved the modelled figure (68 / 37 GB/s).
/// The dense shard group keeps [`Stream::AllGather`] (its name in traces); the expert shard
/// group, a different process group, gets [`EXPERT_SHARD_STREAM`]; replicate groups keep
/// [`Stream::AllReduce`].
pub(crate) fn shard_group_stream(domain: hpfsdp_plan::fsdp::DataDomain) -> Stream {
    match domain {
        hpfsdp_plan::fsdp::DataDomain::Dense => Stream::AllGather,
        hpfsdp_plan::fsdp::DataDomain::Expert => EXPERT_SHARD_STREAM,
    }
}

/// Builds one rank's program.
#[derive(Clone)]
pub(crate) struct Emitter<'a> {
    pub ctx: &'a Ctx,
    pub b: ProgramBuilder,
    ids: Vec<(GroupId, Tier)>,
    /// The last op issued on the compute stream.
    pub last_compute: Option<OpId>,
    /// Ops the next compute op must wait for (collectives after a segment).
    pending: Vec<OpId>,
    /// Name prefix of the current micro-batch (`mb1.` when accumulating, else empty).
    pub mb_prefix: String,
}

impl<'a> Emitter<'a> {
    /// A new emitter for `rank` with its group table.
    pub fn new(ctx: &'a Ctx, rank: usize, groups: Vec<(Group, Tier)>) -> Self {
        let mut b = ProgramBuilder::new(rank);
        b.reserve_ops(ctx.ops_hint.load(std::sync::atomic::Ordering::Relaxed));
        let ids = groups.into_iter().map(|(g, t)| (b.group(g), t)).collect();
        Self {
            ctx,
            b,
            ids,
            last_compute: None,
            pending: Vec::new(),
            mb_prefix: String::new(),
        }
    }

    /// Keeps or drops op names ([`ProgramBuilder::set_names`]).
    pub fn with_names(mut self, names: bool) -> Self {
        self.b.set_names(names);
        self
    }

    /// Names `op` with the micro-batch prefix, unless names are off.
    fn name(&mut self, op: OpId, name: &str) {
        if self.b.names() {
            self.b.name(op, format!("{}{name}", self.mb_prefix));
        }
    }

    /// Sets the micro-batch name prefix.
    pub fn set_micro_batch(&mut self, m: u64) {
        self.mb_prefix = if self.ctx.opts.grad_accum_steps > 1 {
            format!("mb{m}.")
        } else {
            String::new()
        };
    }

    /// Dependencies of an op issued now from the host: the last compute-stream op.
    pub fn issue_point(&self) -> Vec<OpId> {
        self.last_compute.into_iter().collect()
    }

    /// Appends a collective on `group` (nothing when the program has no such group, i.e. it
    /// has a single rank).
    #[allow(clippy::too_many_arguments)]
    pub fn collective(
        &mut self,
        stream: Stream,
        category: Category,
        group: GroupKind,
        spec: CollSpec,
        dtype: DType,
        aligned_512: bool,
        deps: &[OpId],
        name: &str,
    ) -> Option<OpId> {
        let slot = self.ctx.slot(group)?;
        self.collective_on(stream, category, slot, spec, dtype, aligned_512, deps, name)
    }

    /// Appends a collective on the group at table position `slot` (nothing when out of
    /// range).
    #[allow(clippy::too_many_arguments)]
    pub fn collective_on(
        &mut self,
        stream: Stream,
        category: Category,
        slot: usize,
        spec: CollSpec,
        dtype: DType,
        aligned_512: bool,
        deps: &[OpId],
        name: &str,
    ) -> Option<OpId> {
        let (gid, tier) = *self.ids.get(slot)?;
        // `aligned_512` means every buffer of the call is a multiple of 512 bytes: the
        // per-rank chunk as well as the whole buffer (the calibration counts FSDP2's units,
        // whose totals are aligned but whose per-rank chunks are not, as unaligned).
        let aligned_512 = aligned_512
            && spec.input_bytes.is_multiple_of(512)
            && spec.output_bytes.is_multiple_of(512);
        let op = self.b.collective(
            stream,
            category,
            CollectiveOp {
                kind: spec.kind,
                group: gid,
                tier,
                input_bytes: spec.input_bytes,
                output_bytes: spec.output_bytes,
                dtype,
                aligned_512,
            },
            deps,
        );
        self.name(op, name);
        Some(op)
    }

    /// Appends a list of kernels as one compute op (interned kernel mix); compute-stream ops
    /// become the new issue point.
    pub fn compute_kernels(
        &mut self,
        stream: Stream,
        category: Category,
        kernels: &[hpfsdp_plan::kernel::KernelWork],
        deps: &[OpId],
        name: &str,
    ) -> OpId {
        let work = self.b.intern_kernels(kernels);
        self.compute(stream, category, work, deps, name)
    }

    /// [`Emitter::compute_kernels`] of a mix whose id is known (`MixId::of(kernels)`).
    pub fn compute_kernels_as(
        &mut self,
        (stream, category): (Stream, Category),
        kernels: &[hpfsdp_plan::kernel::KernelWork],
        id: hpfsdp_plan::kernel::MixId,
        deps: &[OpId],
        name: &str,
    ) -> OpId {
        let work = self.b.intern_kernels_as(kernels, id);
        self.compute(stream, category, work, deps, name)
    }

    /// Appends kernel work; compute-stream ops become the new issue point.
    pub fn compute(
        &mut self,
        stream: Stream,
        category: Category,
        work: ComputeWork,
        deps: &[OpId],
        name: &str,
    ) -> OpId {
        let op = self.b.push(stream, category, Payload::Compute(work), deps);
        self.name(op, name);
        if stream == Stream::Compute {
            self.last_compute = Some(op);
        }
        op
    }

    /// Appends a device copy of `bytes` with `kernels` launches.
    pub fn copy(
        &mut self,
        stream: Stream,
        bytes: u64,
        kernels: u32,
        deps: &[OpId],
        name: &str,
    ) -> OpId {
        self.copy_of_kind(
            stream,
            bytes,
            kernels,
            crate::step::CopyKind::Plain,
            deps,
            name,
        )
    }

    /// [`Self::copy`] of a given kernel kind (FSDP2's `chunk_cat`).
    pub fn copy_of_kind(
        &mut self,
        stream: Stream,
        bytes: u64,
        kernels: u32,
        kind: crate::step::CopyKind,
        deps: &[OpId],
        name: &str,
    ) -> OpId {
        let op = self.b.push(
            stream,
            Category::Copy,
            Payload::Copy(crate::step::CopyWork {
                bytes,
                kernels: kernels.max(1),
                memcpys: 0,
                kind,
                elements: 0,
            }),
            deps,
        );
        self.name(op, name);
        if stream == Stream::Compute {
            self.last_compute = Some(op);
        }
        op
    }

    /// Emits `calls` driver copies (`cudaMemcpyAsync` device to device, no kernel) of `bytes`
    /// bytes in all on `stream` with category [`Category::Copy`]; returns the op.
    pub fn memcpy(
        &mut self,
        stream: Stream,
        bytes: u64,
        calls: u32,
        deps: &[OpId],
        name: &str,
    ) -> OpId {
        let op = self.b.push(
            stream,
            Category::Copy,
            Payload::Copy(crate::step::CopyWork {
                bytes,
                kernels: 0,
                memcpys: calls.max(1),
                kind: crate::step::CopyKind::Plain,
                elements: 0,
            }),
            deps,
        );
        self.name(op, name);
        if stream == Stream::Compute {
            self.last_compute = Some(op);
        }
        op
    }

    fn par_group(axis: ParAxis) -> GroupKind {
        match axis {
            ParAxis::Tp => GroupKind::Tp,
            ParAxis::Cp => GroupKind::Cp,
            ParAxis::Ep => GroupKind::Ep,
        }
    }

    /// A model-parallel collective of `c` in `pass` (`dir` names it), with the kernels
    /// HyperParallel's runtime launches around it on the compute stream
    /// ([`collective_staging`]): before the collective (which waits for them) and after it
    /// (they wait for it).
    fn par_collective(&mut self, c: &ParColl, spec: CollSpec, pass: Pass, dir: &str) {
        let name = format!("{}.{dir}", c.name);
        let staging = self.staging(c, pass, &spec);
        if !staging.before.is_empty() {
            let d = self.take_deps(&[]);
            self.compute_kernels(
                Stream::Compute,
                c.axis.category(),
                &staging.before,
                &d,
                &format!("{name}.stage_in"),
            );
        }
        let deps = self.issue_point();
        let Some(op) = self.par_collective_op(c, spec, &deps, &name) else {
            return;
        };
        self.pending.push(op);
        if c.host_sync {
            // Device -> host read-back (`.tolist()` of the counts): the host stalls until
            // the collective has finished; its own cost is the engine's host time.
            let sync = self.b.host(Category::Host, 0, &[op]);
            self.b
                .name(sync, format!("{}{name}.d2h_sync", self.mb_prefix));
        }
        if !staging.after.is_empty() {
            let d = self.take_deps(&[]);
            self.compute_kernels(
                Stream::Compute,
                c.axis.category(),
                &staging.after,
                &d,
                &format!("{name}.stage_out"),
            );
        }
    }

    /// The kernels around collective `c` in `pass`: only HyperParallel's runtime issues its
    /// model-parallel collectives through the list-based APIs that stage them
    /// ([`collective_staging`]); the baselines' single-tensor calls launch nothing.
    fn staging(&self, c: &ParColl, pass: Pass, spec: &CollSpec) -> collective_staging::Staging {
        if self.ctx.opts.kind != super::StrategyKind::HyperParallel {
            return collective_staging::Staging::default();
        }
        collective_staging::staging(c.call, pass, spec, self.ctx.opts.micro_batch)
    }

    fn par_collective_op(
        &mut self,
        c: &ParColl,
        spec: CollSpec,
        deps: &[OpId],
        name: &str,
    ) -> Option<OpId> {
        let aligned = spec.input_bytes.is_multiple_of(512) && spec.output_bytes.is_multiple_of(512);
        self.collective(
            Stream::Parallel,
            c.axis.category(),
            Self::par_group(c.axis),
            spec,
            c.wire_dtype.unwrap_or(self.ctx.opts.param_dtype),
            aligned,
            deps,
            name,
        )
    }

    fn take_deps(&mut self, extra: &[OpId]) -> Vec<OpId> {
        let mut deps = std::mem::take(&mut self.pending);
        deps.extend_from_slice(extra);
        deps
    }

    /// Emits a stage's forward (or its recompute); the first compute op also waits for
    /// `deps`. Returns (first, last) compute op.
    pub fn stage_forward(&mut self, stage: &Stage, deps: &[OpId], recompute: bool) -> (OpId, OpId) {
        let suffix = if recompute { "recompute" } else { "fwd" };
        self.stage_pass(stage, Pass::Forward, deps, suffix)
    }

    /// Emits a stage's backward, segments in reverse. Returns (first, last) compute op.
    pub fn stage_backward(&mut self, stage: &Stage, deps: &[OpId]) -> (OpId, OpId) {
        self.stage_pass(stage, Pass::Backward, deps, "bwd")
    }

    /// Emits the items of a stage in `pass` order; TP collectives fused with a neighbouring
    /// GEMM (`[train] tp_comm_overlap`, see [`super::tp_overlap`]) become chunk ops.
    fn stage_pass(
        &mut self,
        stage: &Stage,
        pass: Pass,
        deps: &[OpId],
        suffix: &str,
    ) -> (OpId, OpId) {
        let plan = tp_overlap::plan_stage(&stage.items, pass, self.ctx.opts.tp_comm_overlap);
        // Chunk ops of fused items (collective chunks; GEMM chunks feeding a reduce).
        let mut chunk_ops: Vec<Vec<OpId>> = vec![Vec::new(); stage.items.len()];
        let mut first = None;
        let mut last = None;
        for i in pass.order(stage.items.len()) {
            match &stage.items[i] {
                Item::Compute(s) => {
                    let stage_deps = if first.is_none() { deps } else { &[] };
                    let name = format!("{}.{suffix}", s.name);
                    let host = match pass {
                        Pass::Forward if suffix == "recompute" && first.is_none() => {
                            s.fwd_host_events + host_events::RECOMPUTE_OVERHEAD_PER_LAYER
                        }
                        Pass::Forward => s.fwd_host_events,
                        Pass::Backward => s.bwd_host_events,
                    };
                    let (f, l) = match &plan.segments[i] {
                        Some(split) => {
                            let gathered = split.gather.map(|g| chunk_ops[g].clone());
                            let (f, l, feeding) =
                                self.fused_segment(split, gathered, stage_deps, &name);
                            chunk_ops[i] = feeding;
                            self.segment_host_work(s, pass, (f, l), host, &name);
                            (f, l)
                        }
                        None => {
                            let d = self.take_deps(stage_deps);
                            self.segment_pieces(s, pass, &d, host, &name)
                        }
                    };
                    if pass == Pass::Forward && s.fwd_validation_events > 0 {
                        self.b.validation_events(f, s.fwd_validation_events);
                    }
                    first.get_or_insert(f);
                    last = Some(l);
                }
                Item::Coll(c) => match (&plan.colls[i], pass.spec(c)) {
                    (Some(split), _) => {
                        let feeding = chunk_ops[split.segment].clone();
                        chunk_ops[i] = self.fused_collective(c, split, &feeding, suffix);
                    }
                    (None, Some(spec)) => self.par_collective(c, spec, pass, suffix),
                    (None, None) => {}
                },
            }
        }
        // Stages always hold a compute segment (see compute::build_stages).
        let last = last.unwrap_or(OpId(0));
        (first.unwrap_or(last), last)
    }

    /// Emits segment `s` in `pass` as [`Segment::pieces`] compute ops on the compute stream
    /// (the first waits for `deps`; piece `i` is named `<name>.part<i>` after the first),
    /// each with its share of the kernels ([`piece_of`]), of the `host` CPU operator events
    /// and, in forward, of the device -> host syncs, issued right after it. One piece is the
    /// whole segment as one op. Returns (first, last) op.
    fn segment_pieces(
        &mut self,
        s: &Segment,
        pass: Pass,
        deps: &[OpId],
        host: u32,
        name: &str,
    ) -> (OpId, OpId) {
        let n = s.pieces.max(1);
        let kernels = pass.kernels(s);
        let mut ends: Option<(OpId, OpId)> = None;
        for i in 0..n {
            let piece_name = if i == 0 {
                name.to_string()
            } else {
                format!("{name}.part{i}")
            };
            let d = if i == 0 { deps } else { &[] };
            let piece;
            let work = if n == 1 {
                kernels
            } else {
                piece = piece_of(kernels, i, n);
                &piece[..]
            };
            let op = self.compute_kernels(Stream::Compute, Category::Compute, work, d, &piece_name);
            let events = share(host, i, n);
            if events > 0 {
                self.b.host_events(op, events);
            }
            if pass == Pass::Backward {
                self.b.host_dispatch(op, HostDispatch::AutogradEngine);
            }
            if pass == Pass::Forward {
                self.syncs(share(s.fwd_d2h_syncs, i, n), op, &piece_name);
            }
            ends = Some((ends.map_or(op, |(f, _)| f), op));
        }
        ends.expect("a segment has at least one piece")
    }

    /// The host events and forward syncs of a segment emitted as fused chunk ops (first,
    /// last): the events on the first, the syncs after the last.
    fn segment_host_work(
        &mut self,
        s: &Segment,
        pass: Pass,
        (first, last): (OpId, OpId),
        host: u32,
        name: &str,
    ) {
        if host > 0 {
            self.b.host_events(first, host);
        }
        if pass == Pass::Backward {
            self.b.host_dispatch(first, HostDispatch::AutogradEngine);
        }
        if pass == Pass::Forward {
            self.syncs(s.fwd_d2h_syncs, last, name);
        }
    }

    /// `count` device -> host syncs ([`Segment::fwd_d2h_syncs`]: transformers' eager experts
    /// loop reads values back every expert) as host ops waiting for `after`: the host drains
    /// the device at the first and pays one sync call at each, so the work before them runs
    /// host-then-device serial and the host issues nothing more until the device is done.
    fn syncs(&mut self, count: u32, after: OpId, name: &str) {
        for i in 0..count {
            let sync = self.b.host(Category::Host, 0, &[after]);
            self.b
                .name(sync, format!("{}{name}.d2h_sync{i}", self.mb_prefix));
        }
    }

    /// Emits the chunks of a fused collective `<name>.<suffix>.c<i>`. A gather's chunks are
    /// issued from the host like one collective; a reduce's chunk `i` waits for the GEMM
    /// chunk `i` in `feeding` and the next compute op waits for every chunk. Returns the
    /// chunk ops.
    fn fused_collective(
        &mut self,
        c: &ParColl,
        split: &tp_overlap::CollSplit,
        feeding: &[OpId],
        suffix: &str,
    ) -> Vec<OpId> {
        let gather = split
            .chunks
            .first()
            .is_some_and(|s| s.kind == hpfsdp_plan::collective::CollectiveKind::AllGather);
        let issue = self.issue_point();
        let mut ops = Vec::with_capacity(split.chunks.len());
        for (i, &spec) in split.chunks.iter().enumerate() {
            let deps = match feeding.get(i) {
                Some(&gemm) => vec![gemm],
                None => issue.clone(),
            };
            let name = format!("{}.{suffix}.c{i}", c.name);
            if let Some(op) = self.par_collective_op(c, spec, &deps, &name) {
                ops.push(op);
                if !gather {
                    self.pending.push(op);
                }
            }
        }
        ops
    }

    /// Emits a compute segment fused with a gather (its head GEMM chunk `i` waits for gather
    /// chunk `i` in `gathered`) and/or a reduce (its chunks are returned for the reduce
    /// chunks to wait on). The stage's `stage_deps` go to the first op; collectives pending
    /// from before go to the first op that is not a head chunk (the head GEMM only needs the
    /// gathered input). Returns (first, last, chunks feeding the reduce).
    fn fused_segment(
        &mut self,
        split: &SegmentSplit,
        gathered: Option<Vec<OpId>>,
        stage_deps: &[OpId],
        name: &str,
    ) -> (OpId, OpId, Vec<OpId>) {
        let mut stage_deps = Some(stage_deps);
        let mut ops: Vec<OpId> = Vec::new();
        let gathered = gathered.unwrap_or_default();
        let mut head = Vec::with_capacity(split.head.len());
        for (i, kernels) in split.head.iter().enumerate() {
            let mut d: Vec<OpId> = gathered.get(i).copied().into_iter().collect();
            d.extend_from_slice(stage_deps.take().unwrap_or(&[]));
            let op = self.compute_kernels(
                Stream::Compute,
                Category::Compute,
                kernels,
                &d,
                &format!("{name}.c{i}"),
            );
            head.push(op);
        }
        ops.extend(&head);
        if !split.body.is_empty() {
            let d = self.take_deps(stage_deps.take().unwrap_or(&[]));
            ops.push(self.compute_kernels(
                Stream::Compute,
                Category::Compute,
                &split.body,
                &d,
                name,
            ));
        }
        let tail_name = if split.head.is_empty() { "c" } else { "out.c" };
        let mut tail = Vec::with_capacity(split.tail.len());
        for (i, kernels) in split.tail.iter().enumerate() {
            let d = if i == 0 {
                self.take_deps(stage_deps.take().unwrap_or(&[]))
            } else {
                Vec::new()
            };
            let op = self.compute_kernels(
                Stream::Compute,
                Category::Compute,
                kernels,
                &d,
                &format!("{name}.{tail_name}{i}"),
            );
            tail.push(op);
        }
        ops.extend(&tail);
        let feeding = if split.shared { head } else { tail };
        let first = ops.first().copied().unwrap_or(OpId(0));
        let last = ops.last().copied().unwrap_or(first);
        (
            first,
            last,
            if split.reduce.is_some() {
                feeding
            } else {
                Vec::new()
            },
        )
    }

    /// Makes the next compute op wait for `ops`: a host-side `Work::wait()`, which blocks the
    /// current stream on the collective's end event without launching anything.
    pub fn wait_for(&mut self, ops: &[OpId]) {
        self.pending.extend_from_slice(ops);
    }

    /// Flushes pending collectives into the dependencies of the next compute op: returns them.
    pub fn drain_pending(&mut self) -> Vec<OpId> {
        std::mem::take(&mut self.pending)
    }

    /// Records an allocation.
    pub fn alloc(&mut self, op: OpId, tag: MemTag, bytes: u64) {
        if bytes > 0 {
            self.b.alloc(op, tag, bytes);
        }
    }

    /// Records a free.
    pub fn free(&mut self, op: OpId, tag: MemTag, bytes: u64) {
        if bytes > 0 {
            self.b.free(op, tag, bytes);
        }
    }

    /// Declares resident memory.
    pub fn resident(&mut self, tag: MemTag, bytes: u64) {
        if bytes > 0 {
            self.b.resident(tag, bytes);
        }
    }

    /// Validates and returns the program.
    pub fn build(self) -> Result<StepProgram, super::StrategyError> {
        Ok(self.b.build()?)
    }
}

/// Activation memory effects of a stage's forward, recompute and backward.
pub(crate) fn forward_activations(e: &mut Emitter, stage: &Stage, last_fwd: OpId) {
    e.alloc(last_fwd, MemTag::Activations, stage.saved_bytes);
    if stage.fwd_working_bytes > 0 {
        e.alloc(last_fwd, MemTag::Other, stage.fwd_working_bytes);
        e.free(last_fwd, MemTag::Other, stage.fwd_working_bytes);
    }
}

/// The stage's backward working memory, alive during its first backward op `first_bwd`.
fn backward_working_memory(e: &mut Emitter, stage: &Stage, first_bwd: OpId) {
    if stage.bwd_working_bytes > 0 {
        e.alloc(first_bwd, MemTag::Other, stage.bwd_working_bytes);
        e.free(first_bwd, MemTag::Other, stage.bwd_working_bytes);
    }
}

/// Emits a stage's backward, with recompute first when the stage recomputes, and the
/// activation memory effects. `deps` are waited for by the first op (recompute or backward).
/// Returns (first, last) backward compute op.
pub(crate) fn backward_with_recompute(
    e: &mut Emitter,
    stage: &Stage,
    deps: &[OpId],
) -> (OpId, OpId) {
    let mut deps = deps.to_vec();
    if stage.recompute {
        let (_, last_re) = e.stage_forward(stage, &deps, true);
        e.alloc(last_re, MemTag::Activations, stage.full_act_bytes);
        deps.clear();
        deps.extend(e.drain_pending());
        let (first, last) = e.stage_backward(stage, &deps);
        backward_working_memory(e, stage, first);
        e.free(
            last,
            MemTag::Activations,
            stage.full_act_bytes + stage.saved_bytes,
        );
        (first, last)
    } else {
        let (first, last) = e.stage_backward(stage, &deps);
        backward_working_memory(e, stage, first);
        e.free(last, MemTag::Activations, stage.saved_bytes);
        (first, last)
    }
}

/// A program emitted up to its optimizer schedule (the **model path**: forward, backward and
/// gradient reduction), with what lowering the schedule needs. Programs of ranks with the
/// same model path share it: the path is emitted once, its ops frozen into a shared prefix
/// ([`ProgramBuilder::freeze_prefix`]), and every rank's schedule appended to a copy
/// ([`finish_schedule`]).
#[derive(Clone)]
pub(crate) struct ModelPath<'a> {
    /// The emitter after the model path.
    pub e: Emitter<'a>,
    /// Ops the schedule's first ops wait for.
    pub ready: Vec<OpId>,
    /// Gradient bytes the schedule's last op frees (`None`: the strategy frees none there).
    pub grads_freed: Option<u64>,
    /// Resident optimizer-state bytes other than the schedule's (declared with them, as the
    /// last resident entry, by [`finish_schedule`]).
    pub optimizer_base_bytes: u64,
}

impl<'a> ModelPath<'a> {
    /// Moves the path to `rank` with its group table (`None` when the table does not intern
    /// to the same slots and tiers, so the path's collectives would name other groups).
    pub fn rebase(mut self, rank: usize, groups: Vec<(Group, Tier)>) -> Option<Self> {
        let tiers: Vec<Tier> = groups.iter().map(|(_, t)| *t).collect();
        let ids = self
            .e
            .b
            .rebase(rank, groups.into_iter().map(|(g, _)| g).collect());
        let same = ids.len() == self.e.ids.len()
            && ids
                .iter()
                .zip(&tiers)
                .zip(&self.e.ids)
                .all(|((id, t), (old_id, old_t))| id == old_id && t == old_t);
        same.then_some(self)
    }
}

/// A [`ModelPath`] whose ops are frozen into a shared prefix, held without the strategy
/// context (a generator caches one per model key): [`FrozenPath::thaw`] gives each rank a
/// copy that shares the prefix and appends its own ops.
#[derive(Clone)]
pub(crate) struct FrozenPath {
    b: ProgramBuilder,
    ids: Vec<(GroupId, Tier)>,
    last_compute: Option<OpId>,
    pending: Vec<OpId>,
    mb_prefix: String,
    ready: Vec<OpId>,
    grads_freed: Option<u64>,
    optimizer_base_bytes: u64,
}

impl ModelPath<'_> {
    /// Freezes the path's ops into a shared prefix (validated once, see
    /// [`ProgramBuilder::freeze_prefix`]).
    pub fn freeze(self) -> FrozenPath {
        let mut b = self.e.b;
        b.freeze_prefix();
        FrozenPath {
            b,
            ids: self.e.ids,
            last_compute: self.e.last_compute,
            pending: self.e.pending,
            mb_prefix: self.e.mb_prefix,
            ready: self.ready,
            grads_freed: self.grads_freed,
            optimizer_base_bytes: self.optimizer_base_bytes,
        }
    }
}

impl FrozenPath {
    /// Digest of everything a program built on the path takes from it, names left out: its
    /// ops, resident memory, group table shape (labels and sizes; ranks are rebased) and
    /// tiers, the emitter's state and the gradients it hands to the optimizer. Two paths of
    /// equal signature give equal programs for equal optimizer schedules, up to names and
    /// group ranks (a program is [`FrozenPath::thaw`], `rebase` and [`finish_layout`]).
    pub fn signature(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        // Destructured, so that a field added to the path or to `Op` must be placed here.
        let FrozenPath {
            b,
            ids,
            last_compute,
            pending,
            mb_prefix: _, // names only
            ready,
            grads_freed,
            optimizer_base_bytes,
        } = self;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let (p, failed) = b.in_progress();
        p.ops.len().hash(&mut h);
        for op in p.ops.iter() {
            let crate::step::Op {
                id,
                name: _,
                stream,
                category,
                deps,
                payload,
                memory,
                validation_cpu_events,
                host_cpu_events,
                host_dispatch,
            } = op;
            (id, stream, category, deps, payload, memory).hash(&mut h);
            (validation_cpu_events, host_cpu_events, host_dispatch).hash(&mut h);
        }
        p.resident.hash(&mut h);
        p.groups.len().hash(&mut h);
        for g in &p.groups {
            g.label.hash(&mut h);
            g.ranks.len().hash(&mut h);
        }
        failed.hash(&mut h);
        ids.hash(&mut h);
        last_compute.hash(&mut h);
        pending.hash(&mut h);
        ready.hash(&mut h);
        grads_freed.hash(&mut h);
        optimizer_base_bytes.hash(&mut h);
        h.finish()
    }

    /// A copy of the path on `ctx` (the context it was emitted with) that shares its ops;
    /// `reserve_ops` is room for the ops the copy will append.
    pub fn thaw<'a>(&self, ctx: &'a Ctx, reserve_ops: usize) -> ModelPath<'a> {
        let mut b = self.b.clone();
        b.reserve_ops(reserve_ops);
        ModelPath {
            e: Emitter {
                ctx,
                b,
                ids: self.ids.clone(),
                last_compute: self.last_compute,
                pending: self.pending.clone(),
                mb_prefix: self.mb_prefix.clone(),
            },
            ready: self.ready.clone(),
            grads_freed: self.grads_freed,
            optimizer_base_bytes: self.optimizer_base_bytes,
        }
    }
}

/// Appends the optimizer schedule `sched` to a model path and builds the program: the
/// resident optimizer state (base plus the schedule's momentum and AdamW moments), the
/// schedule's ops after `ready`, and the gradient free on its last op.
pub(crate) fn finish_schedule(
    path: ModelPath<'_>,
    sched: &Schedule,
) -> Result<StepProgram, super::StrategyError> {
    finish_layout(path, &sched.layout())
}

/// [`finish_schedule`] of a schedule laid out as a [`Layout`].
pub(crate) fn finish_layout(
    mut path: ModelPath<'_>,
    sched: &Layout<'_>,
) -> Result<StepProgram, super::StrategyError> {
    path.e.resident(
        MemTag::Optimizer,
        path.optimizer_base_bytes + sched.momentum_bytes + sched.adamw_state_bytes,
    );
    if let Some(last) = lower_layout(&mut path.e, sched, &path.ready)
        && let Some(grads) = path.grads_freed
    {
        path.e.free(last, MemTag::Grads, grads);
    }
    path.e.build()
}

/// Emits the optimizer schedule `s` after the strategy's backward; `ready` are the ops that
/// deliver the reduced gradients. Returns the last op emitted. (Schedules are built apart from
/// the emitter, in [`super::muon::schedule`], which does not depend on this module.)
pub(crate) fn lower_schedule(e: &mut Emitter, s: &Schedule, ready: &[OpId]) -> Option<OpId> {
    lower_layout(e, &s.layout(), ready)
}

/// [`lower_schedule`] of a schedule laid out as a [`Layout`] (an op's [`Dep::Op`] indices
/// count from its base).
fn lower_layout(e: &mut Emitter, s: &Layout<'_>, ready: &[OpId]) -> Option<OpId> {
    let mut ids: Vec<Option<OpId>> = Vec::with_capacity(s.ops.len());
    let mut last = None;
    for (op, base, mix) in s.iter() {
        // On the stack: most ops have a few dependencies (the `Ready` ones may spill).
        let mut deps: smallvec::SmallVec<[OpId; 8]> = smallvec::SmallVec::new();
        for d in &op.deps {
            match *d {
                Dep::Op(i) => deps.extend(ids.get((i + base) as usize).copied().flatten()),
                Dep::Issue => deps.extend(e.issue_point()),
                Dep::Ready => deps.extend_from_slice(ready),
            }
        }
        deps.sort_unstable();
        deps.dedup();
        let id = match &op.work {
            Work::Compute(w) => Some(e.compute(op.stream, op.category, *w, &deps, &op.name)),
            Work::Kernels(k) => Some(match mix {
                Some(id) => e.compute_kernels_as((op.stream, op.category), k, id, &deps, &op.name),
                None => e.compute_kernels(op.stream, op.category, k, &deps, &op.name),
            }),
            Work::Copy(c) => Some(e.copy(op.stream, c.bytes, c.kernels, &deps, &op.name)),
            Work::Coll {
                slot,
                spec,
                dtype,
                aligned,
            } => e.collective_on(
                op.stream,
                op.category,
                *slot,
                *spec,
                *dtype,
                *aligned,
                &deps,
                &op.name,
            ),
        };
        if let Some(id) = id {
            if let Some((tag, b)) = op.alloc {
                e.alloc(id, tag, b);
            }
            if let Some((tag, b)) = op.free {
                e.free(id, tag, b);
            }
            last = Some(id);
        }
        ids.push(id);
    }
    last
}
