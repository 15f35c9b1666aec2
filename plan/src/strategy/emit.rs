//! The program emitter shared by the strategies: a [`ProgramBuilder`] with the rank's group
//! table, c10d issue semantics and the forward/backward emission of compute stages.
//!
//! Issue semantics: a collective issued from the host thread through c10d (`async_op=True`)
//! makes its communication stream wait for the work already issued on the current (compute)
//! stream, so every collective issued here depends on the last compute-stream op issued
//! before it ([`Emitter::issue_point`]).

use super::compute::{Item, Stage};
use super::parallel::{CollSpec, ParAxis, ParColl};
use super::{Ctx, GroupKind};
use crate::model::DType;
use crate::program::{
    Category, CollectiveOp, ComputeWork, Group, GroupId, MemTag, OpId, Payload, ProgramBuilder,
    StepProgram, Stream,
};
use crate::topology::Tier;

/// Builds one rank's program.
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
        self.b.name(op, format!("{}{name}", self.mb_prefix));
        Some(op)
    }

    /// Appends a list of kernels as one compute op (interned kernel mix); compute-stream ops
    /// become the new issue point.
    pub fn compute_kernels(
        &mut self,
        stream: Stream,
        category: Category,
        kernels: &[crate::kernel::KernelWork],
        deps: &[OpId],
        name: &str,
    ) -> OpId {
        let work = self.b.intern_kernels(kernels);
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
        self.b.name(op, format!("{}{name}", self.mb_prefix));
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
        let op = self.b.push(
            stream,
            Category::Copy,
            Payload::Copy(crate::program::CopyWork {
                bytes,
                kernels: kernels.max(1),
            }),
            deps,
        );
        self.b.name(op, format!("{}{name}", self.mb_prefix));
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

    fn par_collective(&mut self, c: &ParColl, spec: CollSpec, dir: &str) {
        let deps = self.issue_point();
        let name = format!("{}.{dir}", c.name);
        let aligned = spec.input_bytes.is_multiple_of(512) && spec.output_bytes.is_multiple_of(512);
        if let Some(op) = self.collective(
            Stream::Parallel,
            c.axis.category(),
            Self::par_group(c.axis),
            spec,
            c.wire_dtype.unwrap_or(self.ctx.opts.param_dtype),
            aligned,
            &deps,
            &name,
        ) {
            self.pending.push(op);
            if c.host_sync {
                // Device -> host read-back (`.tolist()` of the counts): the host stalls until
                // the collective has finished; its own cost is the engine's host time.
                let sync = self.b.host(Category::Host, 0, &[op]);
                self.b
                    .name(sync, format!("{}{name}.d2h_sync", self.mb_prefix));
            }
        }
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
        let mut first = None;
        let mut last = None;
        for item in &stage.items {
            match item {
                Item::Compute(s) => {
                    let d = self.take_deps(if first.is_none() { deps } else { &[] });
                    let op = self.compute_kernels(
                        Stream::Compute,
                        Category::Compute,
                        &s.fwd,
                        &d,
                        &format!("{}.{suffix}", s.name),
                    );
                    first.get_or_insert(op);
                    last = Some(op);
                }
                Item::Coll(c) => {
                    if let Some(spec) = c.fwd {
                        self.par_collective(c, spec, suffix);
                    }
                }
            }
        }
        // Stages always hold a compute segment (see compute::build_stages).
        let last = last.unwrap_or(OpId(0));
        (first.unwrap_or(last), last)
    }

    /// Emits a stage's backward, segments in reverse. Returns (first, last) compute op.
    pub fn stage_backward(&mut self, stage: &Stage, deps: &[OpId]) -> (OpId, OpId) {
        let mut first = None;
        let mut last = None;
        for item in stage.items.iter().rev() {
            match item {
                Item::Compute(s) => {
                    let d = self.take_deps(if first.is_none() { deps } else { &[] });
                    let op = self.compute_kernels(
                        Stream::Compute,
                        Category::Compute,
                        &s.bwd,
                        &d,
                        &format!("{}.bwd", s.name),
                    );
                    first.get_or_insert(op);
                    last = Some(op);
                }
                Item::Coll(c) => {
                    if let Some(spec) = c.bwd {
                        self.par_collective(c, spec, "bwd");
                    }
                }
            }
        }
        let last = last.unwrap_or(OpId(0));
        (first.unwrap_or(last), last)
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
        e.free(
            last,
            MemTag::Activations,
            stage.full_act_bytes + stage.saved_bytes,
        );
        (first, last)
    } else {
        let (first, last) = e.stage_backward(stage, &deps);
        e.free(last, MemTag::Activations, stage.saved_bytes);
        (first, last)
    }
}
