//! The optimizer schedule: a rank's optimizer ops as a small, hashable list that the
//! strategies lower into their emitter after backward
//! ([`lower_schedule`](crate::strategy::emit::lower_schedule)).
//!
//! Building the schedule apart from the program lets [`super::template_digest`] hash exactly
//! what will be emitted (owner-dependent NS work, relay participation, owned state), so that
//! equal template keys still mean identical programs modulo groups and op names, and ranks
//! whose optimizer work happens to be identical share one template.

use crate::step::{Category, ComputeWork, CopyWork, MemTag, Stream};
use crate::strategy::parallel::CollSpec;
use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::kernel::{KernelWork, MixId};
use hpfsdp_plan::model::DType;

/// What an op waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Dep {
    /// An earlier op of the schedule (its index).
    Op(u32),
    /// The last compute-stream op issued before it (c10d issue semantics).
    Issue,
    /// The strategy's "gradients are reduced" ops.
    Ready,
}

/// What an op does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Work {
    /// Kernels.
    Compute(ComputeWork),
    /// A kernel mix (interned into the program when lowered).
    Kernels(Vec<KernelWork>),
    /// A device copy.
    Copy(CopyWork),
    /// A collective on the group at table position `slot`.
    Coll {
        /// Group table position.
        slot: usize,
        /// Kind and per-rank bytes.
        spec: CollSpec,
        /// Wire dtype.
        dtype: DType,
        /// Every buffer a multiple of 512 bytes.
        aligned: bool,
    },
}

/// One scheduled op.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SOp {
    /// Name (no parameter names: equal work gives equal names).
    pub name: String,
    /// Stream.
    pub stream: Stream,
    /// Report category.
    pub category: Category,
    /// Payload.
    pub work: Work,
    /// Dependencies.
    pub deps: Vec<Dep>,
    /// Bytes allocated when it starts.
    pub alloc: Option<(MemTag, u64)>,
    /// Bytes freed when it ends.
    pub free: Option<(MemTag, u64)>,
}

/// A schedule laid out for lowering without copying its ops: each op with the index its
/// [`Dep::Op`]s count from (0 in a whole [`Schedule`]; where its part starts in one
/// assembled from parts, [`super::hp_parts::Parts::layout`]) and, when known, the id of its
/// kernel mix; and the resident state. An entry is 40 bytes (an op is about 150): a layout
/// of thousands of ops is built for every program lowered from parts.
#[derive(Debug, Clone)]
pub(crate) struct Layout<'a> {
    /// Ops in issue order, each with its dependency base and its mix id (`None`: unknown,
    /// or no mix).
    pub ops: Vec<(LaidOp<'a>, u32, Option<MixId>)>,
    /// The ops the layout made itself ([`LaidOp::Own`] indexes them).
    pub own: Vec<SOp>,
    /// Resident Muon momentum bytes.
    pub momentum_bytes: u64,
    /// Resident AdamW moment bytes.
    pub adamw_state_bytes: u64,
}

/// An op of a [`Layout`]: borrowed from a schedule or a part, or one the layout made.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LaidOp<'a> {
    /// An op of a schedule or part.
    Borrowed(&'a SOp),
    /// The layout's own op of this index ([`Layout::own`]).
    Own(u32),
}

impl Layout<'_> {
    /// Every op with its dependency base and mix id, in issue order.
    pub fn iter(&self) -> impl Iterator<Item = (&SOp, u32, Option<MixId>)> + '_ {
        self.ops.iter().map(|&(op, base, mix)| {
            let op = match op {
                LaidOp::Borrowed(op) => op,
                LaidOp::Own(i) => &self.own[i as usize],
            };
            (op, base, mix)
        })
    }
}

/// A rank's optimizer schedule and the optimizer state it keeps resident.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Schedule {
    /// Ops in issue order.
    pub ops: Vec<SOp>,
    /// Resident Muon momentum bytes.
    pub momentum_bytes: u64,
    /// Resident AdamW moment bytes.
    pub adamw_state_bytes: u64,
    /// Leave op names empty (a schedule built only to be hashed: names cost time and
    /// [`Schedule::hash_without_names`] skips them).
    pub anonymous: bool,
}

impl Schedule {
    /// Hashes everything the program will carry except op names (labels for reports, which
    /// symmetry folding ignores): ops, streams, payloads, dependencies, memory effects and the
    /// resident optimizer state.
    pub fn hash_without_names<H: std::hash::Hasher>(&self, h: &mut H) {
        use std::hash::Hash;
        self.ops.len().hash(h);
        for op in &self.ops {
            op.stream.hash(h);
            op.category.hash(h);
            op.work.hash(h);
            op.deps.hash(h);
            op.alloc.hash(h);
            op.free.hash(h);
        }
        self.momentum_bytes.hash(h);
        self.adamw_state_bytes.hash(h);
    }

    /// The schedule as a [`Layout`] (its ops borrowed, every base 0).
    pub fn layout(&self) -> Layout<'_> {
        Layout {
            ops: self
                .ops
                .iter()
                .map(|op| (LaidOp::Borrowed(op), 0, None))
                .collect(),
            own: Vec::new(),
            momentum_bytes: self.momentum_bytes,
            adamw_state_bytes: self.adamw_state_bytes,
        }
    }

    /// An op name: `f()`, or empty for an anonymous schedule (so hot paths do not format
    /// names that are thrown away).
    pub fn name(&self, f: impl FnOnce() -> String) -> String {
        if self.anonymous { String::new() } else { f() }
    }

    fn push(&mut self, op: SOp) -> u32 {
        self.ops.push(op);
        (self.ops.len() - 1) as u32
    }

    /// Appends kernel work on the compute stream.
    pub fn compute(&mut self, name: String, work: ComputeWork, deps: Vec<Dep>) -> u32 {
        self.push(SOp {
            name,
            stream: Stream::Compute,
            category: Category::Optimizer,
            work: Work::Compute(work),
            deps,
            alloc: None,
            free: None,
        })
    }

    /// Appends a kernel mix on the compute stream (NS GEMMs, memory-bound optimizer kernels).
    pub fn kernels(&mut self, name: String, kernels: Vec<KernelWork>, deps: Vec<Dep>) -> u32 {
        self.push(SOp {
            name,
            stream: Stream::Compute,
            category: Category::Optimizer,
            work: Work::Kernels(kernels),
            deps,
            alloc: None,
            free: None,
        })
    }

    /// Appends a device copy on the compute stream.
    pub fn copy(&mut self, name: String, bytes: u64, kernels: u32, deps: Vec<Dep>) -> u32 {
        self.push(SOp {
            name,
            stream: Stream::Compute,
            category: Category::Optimizer,
            work: Work::Copy(CopyWork {
                bytes,
                kernels: kernels.max(1),
                memcpys: 0,
                kind: crate::step::CopyKind::Plain,
                elements: 0,
            }),
            deps,
            alloc: None,
            free: None,
        })
    }

    /// Appends a collective on `stream` (nothing when the group is absent: a single rank).
    #[allow(clippy::too_many_arguments)]
    pub fn coll(
        &mut self,
        name: String,
        stream: Stream,
        slot: Option<usize>,
        kind: CollectiveKind,
        input_bytes: u64,
        output_bytes: u64,
        dtype: DType,
        deps: Vec<Dep>,
    ) -> Option<u32> {
        let slot = slot?;
        let aligned = input_bytes.is_multiple_of(512) && output_bytes.is_multiple_of(512);
        Some(self.push(SOp {
            name,
            stream,
            category: Category::Optimizer,
            work: Work::Coll {
                slot,
                spec: CollSpec {
                    kind,
                    input_bytes,
                    output_bytes,
                },
                dtype,
                aligned,
            },
            deps,
            alloc: None,
            free: None,
        }))
    }

    /// Adds an allocation to op `i`.
    pub fn alloc(&mut self, i: u32, tag: MemTag, bytes: u64) {
        if bytes > 0
            && let Some(op) = self.ops.get_mut(i as usize)
        {
            let a = op.alloc.get_or_insert((tag, 0));
            a.1 += bytes;
        }
    }

    /// Adds a free to op `i`.
    pub fn free(&mut self, i: u32, tag: MemTag, bytes: u64) {
        if bytes > 0
            && let Some(op) = self.ops.get_mut(i as usize)
        {
            let f = op.free.get_or_insert((tag, 0));
            f.1 += bytes;
        }
    }
}
