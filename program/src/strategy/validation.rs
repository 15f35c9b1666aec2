//! HyperParallel's validation mode as host work: which forward operators pass through
//! DTensor dispatch and how many extra CPU operator events each one causes.
//!
//! Sources (`shared/reference/notes/hyper-parallel.md` sections 2.7, 3.3, 3.4; the paper's
//! sections "Precompiled Boundary Communication" and "Production and Validation Modes"):
//! - production mode runs plain local tensors: no per-operator dispatch at all;
//! - validation mode keeps parameters as DTensors; every **forward** operator invocation
//!   "still passes through interception, argument preprocessing, cache-keyed layout
//!   inference, local execution, and output checking" (paper); backward is local autograd in
//!   both modes, so it adds nothing (notes 3.3);
//! - modules whose logic DTensor dispatch cannot express run the same local-region wrapper
//!   in both modes (`to_local` -> local execution -> declarative re-wrap): the MoE block
//!   (`use_local_map`, expert all-to-all routing), the attention core and its K/V gather
//!   under context parallelism, and the embedding's vocab mask when the vocabulary is
//!   sharded (notes 2.7, 3.3). Their operators add no dispatch events;
//! - every module boundary checks its contracts: the `in_plan` has one entry per name of
//!   `in_src` ∪ `in_dst` **including identity entries**, the `out_plan` one per name whose
//!   `out_src` differs from its `out_dst` (identity skipped; a missing axis is Replicate)
//!   (notes 3.4). Validation mode runs each entry through the generic distributed-tensor path
//!   (`from_local` -> redistribute -> `to_local`), production through precompiled local ops.
//!
//! Event counts (from the mechanism and the sources named, not fitted to any measurement;
//! `hpfsdp calibrate` checks the total against the measured +23,713 events of experiment A):
//! - every DTensor the forward creates costs [`EVENTS_PER_WRAP`] profiler CPU operator events:
//!   `DTensor.from_local` (and the overridden `Tensor.to`) build the wrapper with
//!   `Tensor._make_subclass`, which calls `detach()` on the local tensor
//!   (pytorch `torch/csrc/autograd/python_variable.cpp`, `THPVariable_make_subclass`): the
//!   dispatcher records `aten::detach` and its autograd kernel records `detach` again
//!   (`torch/csrc/autograd/VariableTypeManual.cpp`, `RECORD_FUNCTION("detach", ...)`). The
//!   local operator itself runs in both modes, so it adds nothing;
//! - a forward op wraps one DTensor per torch-level call its forward code makes on DTensors
//!   (per tensor output), from the census in [`op_census`]: shape operators that launch no
//!   kernel count, fused calls that launch several kernels count once. Ops the census does not
//!   cover count one single-output call per launched device kernel;
//! - boundary contracts ([`EVENTS_PER_CONTRACT_ENTRY`] per wrap; mindspore-ai/hyper-parallel
//!   `distributed/_builder/precompiled_boundary.py`, `RedistOp.execute` with
//!   `as_dtensor=True` in validation mode): an entry that redistributes returns a new DTensor
//!   (one wrap); an identity entry passes a DTensor through unchanged and wraps only a plain
//!   input (the embedding's token ids from the data loader); the `out_plan` skips identity.
//!   A local region re-wraps each output from its local result with the declared `out_src`
//!   (notes 2.7), one wrap more. Production runs lowered collectives and identity
//!   pass-throughs on local tensors and wraps nothing.
//!
//! Recompute re-runs the module forwards, so a recomputed forward counts again.

pub mod op_census;

use hpfsdp_plan::kernel::KernelWork;
use hpfsdp_plan::model::{ComputeKind, ComputeOp, ModelConfig};
use hpfsdp_plan::placement::Placement;
use hpfsdp_plan::planner::BoundarySpec;
use hpfsdp_plan::planner::boundary::BoundaryType;
use hpfsdp_plan::planner::templates::{AxisPlacements, Contract};

/// Profiler CPU operator events per DTensor the validation-mode forward creates:
/// `aten::detach` and the nested `detach` of `Tensor._make_subclass` (see the module
/// documentation).
pub const EVENTS_PER_WRAP: u32 = 2;

/// Extra CPU operator events per DTensor a boundary contract check creates in validation
/// mode (a redistribution's result, a plain input's `from_local`, a local region's re-wrap):
/// one wrap ([`EVENTS_PER_WRAP`]).
pub const EVENTS_PER_CONTRACT_ENTRY: u32 = EVENTS_PER_WRAP;

/// True when boundary `b` encloses the op or module called `name` (equal or a prefix at a
/// `.`).
fn encloses(b: &BoundarySpec, name: &str) -> bool {
    name == b.module
        || (name.len() > b.module.len()
            && name.starts_with(&b.module)
            && name.as_bytes()[b.module.len()] == b'.')
}

/// True when `b` is a local-region wrapper for `op`: the same local code in both modes, so
/// `op` is never dispatched through DTensors.
fn local_region_for(b: &BoundarySpec, op: &ComputeOp) -> bool {
    if b.flags.use_local_map {
        return true;
    }
    if b.flags.needs_cp_attn && op.kind == ComputeKind::Attention {
        return true;
    }
    // Vocabulary-sharded embedding: the vocab mask runs in a local region.
    vocab_sharded_embed(b)
}

/// True when `b` is an embedding whose vocabulary is sharded (its mask runs locally).
fn vocab_sharded_embed(b: &BoundarySpec) -> bool {
    b.ty == BoundaryType::Embed && b.params.values().any(|p| !p.is_empty())
}

/// True when `op` runs inside a local region of any of the boundaries `bs` (nested
/// boundaries count: a router inside the MoE block's local map is local too).
pub fn in_local_region(bs: &[&BoundarySpec], op: &ComputeOp) -> bool {
    bs.iter()
        .any(|b| encloses(b, &op.name) && local_region_for(b, op))
}

/// DTensors `op`'s forward creates in validation mode outside local regions: the census of
/// its torch-level calls ([`op_census::forward_calls`]), or one per launched forward kernel
/// `fwd` when the census has no entry for the op.
pub fn forward_wraps(op: &ComputeOp, cfg: &ModelConfig, fwd: &[KernelWork]) -> u32 {
    match op_census::forward_calls(op, cfg) {
        Some(calls) => op_census::wraps(calls),
        None => fwd.iter().map(|k| k.count).sum(),
    }
}

/// Extra CPU operator events of `op`'s forward in validation mode (`fwd`: its forward
/// kernels, used where the census has no entry): [`EVENTS_PER_WRAP`] per DTensor it creates
/// outside local regions ([`forward_wraps`]), none inside.
pub fn dispatch_events(
    bs: &[&BoundarySpec],
    op: &ComputeOp,
    cfg: &ModelConfig,
    fwd: &[KernelWork],
) -> u32 {
    if in_local_region(bs, op) {
        return 0;
    }
    forward_wraps(op, cfg, fwd) * EVENTS_PER_WRAP
}

/// Names of `b`'s `in_src` ∪ `in_dst`, first appearance order.
fn in_names(b: &BoundarySpec) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for c in [&b.in_src, &b.in_dst].into_iter().flatten() {
        for n in c.keys() {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
    }
    names
}

/// Entries of `b`'s `in_plan`: one per name of `in_src` ∪ `in_dst`, identity included.
pub fn in_plan_entries(b: &BoundarySpec) -> u32 {
    in_names(b).len() as u32
}

/// True when placements `a` and `b` are the same layout (an axis missing from either is
/// Replicate).
fn same_layout(a: &AxisPlacements, b: &AxisPlacements) -> bool {
    let at = |p: &AxisPlacements, axis: &str| p.get(axis).cloned().unwrap_or(Placement::Replicate);
    a.keys()
        .chain(b.keys())
        .all(|axis| at(a, axis) == at(b, axis))
}

/// Entries of `b`'s `out_plan`: one per `out_src` name whose placements differ from its
/// `out_dst` (identity skipped; a name or axis missing from `out_dst` is Replicate).
pub fn out_plan_entries(b: &BoundarySpec) -> u32 {
    let Some(src) = &b.out_src else { return 0 };
    let empty = AxisPlacements::default();
    src.iter()
        .filter(|(name, p)| {
            let dst = b
                .out_dst
                .as_ref()
                .and_then(|d| d.get(name.as_str()))
                .unwrap_or(&empty);
            !same_layout(p, dst)
        })
        .count() as u32
}

/// Entries of `b`'s `in_plan` that redistribute: names of `in_src` ∪ `in_dst` whose source
/// and destination placements differ (a name or axis missing from either is Replicate).
pub fn in_plan_redistributions(b: &BoundarySpec) -> u32 {
    let get = |c: &Option<Contract>, n: &str| {
        c.as_ref()
            .and_then(|c| c.get(n))
            .cloned()
            .unwrap_or_default()
    };
    in_names(b)
        .iter()
        .filter(|n| !same_layout(&get(&b.in_src, n), &get(&b.in_dst, n)))
        .count() as u32
}

/// True when `b` hosts a local region (see [`in_local_region`]): its output is re-wrapped
/// from the local result with the declared `out_src` in validation mode.
fn hosts_local_region(b: &BoundarySpec) -> bool {
    b.flags.use_local_map || b.flags.needs_cp_attn || vocab_sharded_embed(b)
}

/// Extra CPU operator events of `b`'s input contracts in validation mode
/// (`PrecompiledBoundary.redistribute_inputs` with `as_dtensor`): an entry that redistributes
/// wraps its result once; an identity entry passes the DTensor through, except at the
/// embedding, whose token ids come from the data loader as a plain tensor and are wrapped
/// (`DTensor.from_local`). Production runs the same entries on local tensors (lowered
/// collectives, identity pass-through) and wraps nothing.
pub fn in_check_events(b: &BoundarySpec) -> u32 {
    let wraps = if b.ty == BoundaryType::Embed {
        in_plan_entries(b)
    } else {
        in_plan_redistributions(b)
    };
    wraps * EVENTS_PER_CONTRACT_ENTRY
}

/// Extra CPU operator events of `b`'s output contracts in validation mode: one wrap per
/// `out_plan` redistribution, plus the declarative re-wrap (`from_local` with the declared
/// `out_src`) of each output of a local region (notes 2.7).
pub fn out_check_events(b: &BoundarySpec) -> u32 {
    let rewraps = if hosts_local_region(b) {
        b.out_src.as_ref().map_or(1, |c| c.len().max(1) as u32)
    } else {
        0
    };
    (out_plan_entries(b) + rewraps) * EVENTS_PER_CONTRACT_ENTRY
}
