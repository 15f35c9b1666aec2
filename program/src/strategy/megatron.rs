//! Megatron-LM DDP with the distributed optimizer (notes `pytorch-baselines.md` 4).
//!
//! - **Buffers and buckets (4.2):** one contiguous gradient buffer per data domain (dense over
//!   `dp_replicate x dp_shard x cp`, routed experts over `edp_replicate x edp_shard`),
//!   parameters in reverse model order, each padded to 64 elements, cut into buckets of
//!   `bucket_bytes / grad_bytes` elements (`[fsdp.variant.megatron-ddp] bucket_bytes`; default
//!   Megatron's max(40M, 1M x dp) elements), each bucket padded to `lcm(dp, 128)` elements.
//!   Gradients are kept in the reduce dtype (`grad_reduce_in_fp32` when it is f32).
//! - **Parameters are not sharded for compute:** full local (TP/EP-sharded) parameters and the
//!   full gradient buffer stay resident; only the fp32 main parameters and AdamW moments are
//!   sharded over the data-parallel group.
//! - **Backward (4.3.1):** `overlap_grad_reduce=True`: on the last micro-batch only, when every
//!   parameter of a bucket has its gradient (after the backward of the earliest stage it
//!   holds), the bucket is scaled by 1/dp (one kernel) and reduce-scattered in place. Earlier
//!   micro-batches accumulate into the buffer without communication.
//! - **Optimizer (4.3.3):** per bucket, on the rank's shard, then cast into the bf16 parameter
//!   buffer; or the optimizer strategy's schedule (`strategy::muon`, by default Moonlight's
//!   ZeRO-1 distributed Muon) after every reduce-scatter.
//! - **Parameter all-gather (4.3.4):** modelled with `overlap_param_gather=True`, the steady
//!   state: the all-gathers of the parameters updated by the previous step run in this step's
//!   first forward, each bucket dispatched at its first use and the next bucket prefetched
//!   (1-ahead). The alternative (`overlap_param_gather=False`, a synchronous all-gather right
//!   after the optimizer step) moves the same collectives after the optimizer.

use super::emit::{Emitter, backward_with_recompute, forward_activations};
use super::muon;
use super::optimizer::optimizer_step;
use super::parallel::CollSpec;
use super::{Ctx, GroupKind, StrategyError};
use crate::step::{Category, ComputeWork, Group, MemTag, OpId, StepProgram, Stream};
use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::fsdp::DataDomain;
use hpfsdp_plan::topology::Tier;

/// Parameter start alignment in the buffer, in elements (4.2).
pub const PARAM_ALIGN_ELEMS: u64 = 64;

/// One gradient/parameter bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Data domain (which buffer and group).
    pub domain: DataDomain,
    /// Padded bucket length in elements (a multiple of the group size).
    pub padded_elems: u64,
    /// Parameter tensors in the bucket.
    pub params: u32,
    /// Earliest forward stage holding one of its parameters: first forward use, and the stage
    /// after whose backward the bucket is ready.
    pub stage: usize,
    /// Data-parallel group size of the domain.
    pub dp: u64,
}

/// The bucket layout (rank-independent; every expert-parallel class has the same sizes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Buckets in buffer order (reverse model order: bucket 0 is ready first in backward).
    pub buckets: Vec<Bucket>,
    /// Local (TP/EP-sharded) parameter elements of one rank.
    pub param_elems: u64,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

impl Layout {
    /// Lays out the buckets of EP class 0.
    pub(crate) fn new(ctx: &Ctx) -> Self {
        let o = &ctx.opts;
        let grad_bytes = o.reduce_dtype.bytes();
        let class = &ctx.classes[0];
        let mut param_elems = 0;
        let mut buckets = Vec::new();
        for domain in [DataDomain::Dense, DataDomain::Expert] {
            let di = Ctx::domain_index(domain);
            let dp = (ctx.shard_size[di] * ctx.replicate_size[di]) as u64;
            let bucket_elems = match o.bucket_bytes {
                Some(b) => (b / grad_bytes).max(1),
                None => 40_000_000u64.max(1_000_000 * dp),
            };
            let pad = lcm(dp.max(1), 128);
            let mut cur: Option<Bucket> = None;
            let mut cur_elems = 0u64;
            // Parameters in reverse model order (roughly backward order).
            for (u, idx) in class.units.iter().enumerate().rev() {
                for &i in idx.iter().rev() {
                    let p = &ctx.fsdp.params[i as usize];
                    if p.domain != domain {
                        continue;
                    }
                    let numel = ctx.local_numel[i as usize];
                    param_elems += numel;
                    let stage = ctx.unit_stage[u];
                    let b = cur.get_or_insert(Bucket {
                        domain,
                        padded_elems: 0,
                        params: 0,
                        stage,
                        dp,
                    });
                    cur_elems += numel.div_ceil(PARAM_ALIGN_ELEMS) * PARAM_ALIGN_ELEMS;
                    b.params += 1;
                    b.stage = b.stage.min(stage);
                    if cur_elems >= bucket_elems {
                        let mut b = cur.take().unwrap_or_else(|| unreachable_bucket(domain));
                        b.padded_elems = cur_elems.div_ceil(pad) * pad;
                        buckets.push(b);
                        cur_elems = 0;
                    }
                }
            }
            if let Some(mut b) = cur.take() {
                b.padded_elems = cur_elems.div_ceil(pad) * pad;
                buckets.push(b);
            }
        }
        Self {
            buckets,
            param_elems,
        }
    }
}

fn unreachable_bucket(domain: DataDomain) -> Bucket {
    Bucket {
        domain,
        padded_elems: 0,
        params: 0,
        stage: 0,
        dp: 1,
    }
}

fn dp_group(d: DataDomain) -> GroupKind {
    match d {
        DataDomain::Dense => GroupKind::DataParallel,
        DataDomain::Expert => GroupKind::ExpertDataParallel,
    }
}

/// Generates the Megatron DDP program of `rank`: resident state, then per micro-batch a
/// forward (parameter all-gathers on the first, one bucket ahead) and a backward (bucket
/// reduce-scatters on the last), then the optimizer on the shard.
pub(crate) fn generate(
    ctx: &Ctx,
    layout: &Layout,
    rank: usize,
    groups: Vec<(Group, Tier)>,
    named: bool,
) -> Result<StepProgram, StrategyError> {
    let o = &ctx.opts;
    let mut e = Emitter::new(ctx, rank, groups).with_names(named);
    let sched = reserve_state(&mut e, ctx, layout, rank, named);
    let mut rs_ops = vec![None; layout.buckets.len()];
    for m in 0..o.grad_accum_steps {
        e.set_micro_batch(m);
        forward_micro_batch(&mut e, ctx, layout, m == 0);
        let last_mb = m + 1 == o.grad_accum_steps;
        backward_micro_batch(&mut e, ctx, layout, last_mb.then_some(&mut rs_ops));
    }
    // finish_grad_sync waits every reduce-scatter; optimizer per bucket on the shard.
    e.mb_prefix.clear();
    if let Some(sched) = &sched {
        let mut ready = e.issue_point();
        ready.extend(rs_ops.iter().flatten().copied());
        super::emit::lower_schedule(&mut e, sched, &ready);
        return e.build();
    }
    for (k, b) in layout.buckets.iter().enumerate() {
        let mut deps = e.issue_point();
        deps.extend(rs_ops[k]);
        optimizer_step(
            &mut e,
            &format!("bucket{k}"),
            b.padded_elems / b.dp.max(1),
            b.params,
            ctx.opts.reduce_dtype,
            &deps,
        );
    }
    e.build()
}

/// Resident memory: the whole bf16 model, the gradient buffer in the reduce dtype, and on the
/// shard fp32 main parameters plus two fp32 AdamW moments (or the Muon schedule's state,
/// returned for the optimizer tail).
fn reserve_state(
    e: &mut Emitter,
    ctx: &Ctx,
    layout: &Layout,
    rank: usize,
    named: bool,
) -> Option<muon::schedule::Schedule> {
    let (pd, gd) = (ctx.opts.param_dtype, ctx.opts.reduce_dtype);
    let grad_buffer: u64 = layout
        .buckets
        .iter()
        .map(|b| b.padded_elems * gd.bytes())
        .sum();
    let shard_elems: u64 = layout
        .buckets
        .iter()
        .map(|b| b.padded_elems / b.dp.max(1))
        .sum();
    e.resident(MemTag::Params, layout.param_elems * pd.bytes());
    e.resident(MemTag::Grads, grad_buffer);
    let sched = ctx
        .opt
        .strategy
        .is_muon()
        .then(|| muon::schedule(ctx, rank, named));
    e.resident(
        MemTag::Optimizer,
        shard_elems * 4
            + match &sched {
                Some(s) => s.momentum_bytes + s.adamw_state_bytes,
                None => shard_elems * super::optimizer::ADAMW_STATE_BYTES_PER_ELEM,
            },
    );
    sched
}

/// The parameter all-gather of bucket `k` (distributed optimizer: the shard's updated
/// parameters gathered into the full buffer before its first use).
fn gather_bucket(e: &mut Emitter, ctx: &Ctx, layout: &Layout, k: usize) -> Option<OpId> {
    let pd = ctx.opts.param_dtype;
    let b = &layout.buckets[k];
    let full = b.padded_elems * pd.bytes();
    let spec = CollSpec {
        kind: CollectiveKind::AllGather,
        input_bytes: full / b.dp.max(1),
        output_bytes: full,
    };
    let dl = e.issue_point();
    e.collective(
        Stream::AllGather,
        Category::FsdpAg,
        dp_group(b.domain),
        spec,
        pd,
        full.is_multiple_of(512),
        &dl,
        &format!("bucket{k}.param_ag"),
    )
}

/// One micro-batch's forward. On the first (`gather`), every bucket first used by a stage
/// (and not prefetched) is gathered before it, then one more bucket ahead.
fn forward_micro_batch(e: &mut Emitter, ctx: &Ctx, layout: &Layout, gather: bool) {
    // Buckets in forward order of first use (stable by buffer position, reversed).
    let mut fwd_order: Vec<usize> = (0..layout.buckets.len()).rev().collect();
    fwd_order.sort_by_key(|&b| layout.buckets[b].stage);
    let mut ag_ops = vec![None; layout.buckets.len()];
    let mut next = 0usize;
    for (si, stage) in ctx.stages.iter().enumerate() {
        let mut deps = Vec::new();
        if gather {
            while next < fwd_order.len() && layout.buckets[fwd_order[next]].stage <= si {
                ag_ops[fwd_order[next]] = gather_bucket(e, ctx, layout, fwd_order[next]);
                next += 1;
            }
            deps.extend(
                fwd_order[..next]
                    .iter()
                    .filter(|&&k| layout.buckets[k].stage == si)
                    .filter_map(|&k| ag_ops[k]),
            );
            if next < fwd_order.len() {
                ag_ops[fwd_order[next]] = gather_bucket(e, ctx, layout, fwd_order[next]);
                next += 1;
            }
        }
        let (_, last) = e.stage_forward(stage, &deps, false);
        forward_activations(e, stage, last);
    }
}

/// One micro-batch's backward, stages in reverse. On the last micro-batch (`rs_ops` given)
/// each bucket whose stage finished is scaled and reduce-scattered (its op recorded in
/// `rs_ops` for the optimizer).
fn backward_micro_batch(
    e: &mut Emitter,
    ctx: &Ctx,
    layout: &Layout,
    mut rs_ops: Option<&mut Vec<Option<OpId>>>,
) {
    let gd = ctx.opts.reduce_dtype;
    for (si, stage) in ctx.stages.iter().enumerate().rev() {
        backward_with_recompute(e, stage, &[]);
        let Some(rs_ops) = rs_ops.as_deref_mut() else {
            continue;
        };
        for (k, b) in layout.buckets.iter().enumerate() {
            if b.stage != si {
                continue;
            }
            let bytes = b.padded_elems * gd.bytes();
            let scale = e.compute(
                Stream::Compute,
                Category::FsdpRs,
                ComputeWork {
                    flops: b.padded_elems,
                    hbm_bytes: 2 * bytes,
                    kernels: 1,
                    mix: None,
                },
                &[],
                &format!("bucket{k}.grad_scale"),
            );
            let spec = CollSpec {
                kind: CollectiveKind::ReduceScatter,
                input_bytes: bytes,
                output_bytes: bytes / b.dp.max(1),
            };
            rs_ops[k] = e.collective(
                Stream::ReduceScatter,
                Category::FsdpRs,
                dp_group(b.domain),
                spec,
                gd,
                bytes.is_multiple_of(512),
                &[scale],
                &format!("bucket{k}.grad_rs"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_padding_is_lcm_of_dp_and_128() {
        assert_eq!(lcm(32, 128), 128);
        assert_eq!(lcm(192, 128), 384);
        assert_eq!(lcm(3, 128), 384);
        assert_eq!(gcd(12, 18), 6);
    }
}
