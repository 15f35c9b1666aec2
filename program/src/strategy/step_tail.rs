//! The training loop's own device work and host synchronisations around the model, as
//! HyperParallel's trainer runs them (`trainer/base.py` `BaseTrainer.train_step`,
//! `trainer/runtime/metrics.py` `mean_global_loss`, `trainer/runtime/distributed.py`
//! `all_reduce`, `core/utils/clip_grad.py` `clip_grad_norm_`):
//!
//! - **Loss metrics, every micro-batch, after the forward** (`postforward`): the token count
//!   all-reduced over `tp` with sequence parallelism, the step's token count and the
//!   token-weighted loss over the data-parallel group (`dp_cp_mesh`). The trainer's
//!   `all_reduce` wraps a Python scalar in a device tensor, runs the collective and reads the
//!   result back with `.item()`: one f32 all-reduce and one device -> host synchronisation
//!   each, and the weighted loss is itself read back before its all-reduce
//!   (`local_weighted_loss.detach().item()`). Around them the scalar arithmetic of the loss
//!   (`cur_loss * tokens`, `/ all_reduced_len`, `* dp_size`, `* cp_size`, `+ global_mean`,
//!   `- backward_loss.detach()`, `/ tp` with SP) and `torch.stack(...).sum()`; its backward
//!   seeds the gradient (`ones`) and scales it back through the four (five with SP)
//!   multiplications and divisions.
//! - **Read-back after each backward**: `total_loss += loss.item()` and one `.item()` per
//!   loss entry: two synchronisations that drain the compute stream (the host cannot issue
//!   the next micro-batch before the backward has run).
//! - **Gradient clipping, once per step** (`clip_grad_norm_(model, max_grad_norm)`, whose
//!   result the trainer logs as the step's gradient norm): the gradients are bucketed by the
//!   process groups their DTensor shard dims reduce over (first-seen parameter order); per
//!   bucket one fused `_foreach_norm`, `stack`, `.to(float32)`, `vector_norm`, `** p`, one f32
//!   all-reduce per shard group, and the running sum; then `** (1/p)`, `+ 1e-6`, the
//!   coefficient `max_norm / norm`, `clamp`, its cast to the gradient dtype and one fused
//!   `_foreach_mul_` over every gradient. Foreach calls count one launch each, as the
//!   optimizer's foreach kernels do in these programs.
//!
//! Collectives and synchronisations carry [`Category::Host`]: trainer bookkeeping on the
//! host's critical path, not model communication (the verify reference executor, which
//! compares the FSDP/TP/EP/optimizer collectives of a step, issues none of them).

use super::parallel::CollSpec;
pub(crate) use super::trainer_tail::TrainerTail;
use super::{GroupKind, emit::Emitter};
use crate::step::{Category, ComputeWork, OpId, Stream};
use hpfsdp_plan::model::DType;

/// Bytes of one scalar the trainer all-reduces (`torch.tensor(x, dtype=torch.float)`).
const SCALAR_BYTES: u64 = 4;

/// Loss-metric kernels after the forward without sequence parallelism: `* tokens`,
/// `/ all_reduced_len`, `* dp_size`, `* cp_size`, `+ global_mean`, `- detach`, `stack`,
/// `sum`.
const LOSS_FWD_KERNELS: u32 = 8;

/// Their backward: the `ones` seed and the four scalings back to the loss.
const LOSS_BWD_KERNELS: u32 = 5;

/// Kernels of one gradient-norm bucket: `_foreach_norm`, `stack`, `.to(float32)`,
/// `vector_norm`, `** p`, running sum.
const NORM_BUCKET_KERNELS: u32 = 6;

/// Kernels of the clip after the buckets: `** (1/p)`, `+ 1e-6`, `max_norm /`, `clamp`, the
/// cast to the gradient dtype, `_foreach_mul_`.
const CLIP_KERNELS: u32 = 6;

/// Names `op` with the micro-batch prefix when names are kept.
fn name(e: &mut Emitter, op: OpId, what: &str) {
    if e.b.names() {
        let n = format!("{}{what}", e.mb_prefix);
        e.b.name(op, n);
    }
}

/// One scalar f32 all-reduce on `group` after the last compute op; with `item`, read back
/// with `.item()` (the host waits for it). Nothing when the group has one rank.
fn scalar_all_reduce(e: &mut Emitter, group: GroupKind, what: &str, item: bool) -> Option<OpId> {
    let deps = e.issue_point();
    let spec = CollSpec {
        kind: hpfsdp_plan::CollectiveKind::AllReduce,
        input_bytes: SCALAR_BYTES,
        output_bytes: SCALAR_BYTES,
    };
    let op = e.collective(
        Stream::Parallel,
        Category::Host,
        group,
        spec,
        DType::F32,
        false,
        &deps,
        what,
    )?;
    if item {
        let sync = e.b.host(Category::Host, 0, &[op]);
        name(e, sync, &format!("{what}.item"));
    }
    Some(op)
}

/// One scalar all-reduce over the data-parallel domain (`dp_cp_mesh`: data-parallel shard
/// and context-parallel ranks and the replicas), read back with `.item()` when `item`. It is
/// issued as the all-reduce over the dense shard group followed by the one over the dense
/// replicate group (a group of one rank issues nothing), the two levels a hierarchical HCCL or
/// NCCL all-reduce of 4 bytes crosses anyway: the programs carry no data-parallel
/// communicator of their own, whose member list (every replica's shard group) would make
/// folding at 100,000 ranks quadratic in its size. Without replicas it is exactly the one
/// all-reduce the trainer issues.
fn data_parallel_all_reduce(e: &mut Emitter, what: &str, item: bool) {
    let shard = scalar_all_reduce(e, GroupKind::DenseShard, what, false);
    let replica = scalar_all_reduce(
        e,
        GroupKind::DenseReplicate,
        &format!("{what}.replicas"),
        false,
    );
    if item && let Some(last) = replica.or(shard) {
        let sync = e.b.host(Category::Host, 0, &[last]);
        name(e, sync, &format!("{what}.item"));
    }
}

/// A device -> host read-back of the last compute op's result (`.item()`).
fn read_back(e: &mut Emitter, what: &str) {
    let deps = e.issue_point();
    let sync = e.b.host(Category::Host, 0, &deps);
    name(e, sync, what);
}

fn scalar_kernels(e: &mut Emitter, kernels: u32, deps: &[OpId], what: &str) -> OpId {
    let work = ComputeWork::memory_bound(u64::from(kernels), 8 * u64::from(kernels), kernels);
    e.compute(Stream::Compute, Category::Compute, work, deps, what)
}

/// The loss metrics of one micro-batch after its forward, and the loss graph's backward
/// kernels, which run first in the backward.
pub(crate) fn loss_metrics(e: &mut Emitter, tail: &TrainerTail) {
    if tail.sp_token_reduce {
        scalar_all_reduce(e, GroupKind::Tp, "loss_metrics.tokens.tp", true);
    }
    data_parallel_all_reduce(e, "loss_metrics.step_tokens.dp", true);
    let sp = u32::from(tail.sp_token_reduce);
    let deps = e.issue_point();
    // `cur_loss * tokens / all_reduced_len * dp_size * cp_size`.
    scalar_kernels(e, 4, &deps, "loss_metrics.weighted");
    read_back(e, "loss_metrics.weighted.item");
    data_parallel_all_reduce(e, "loss_metrics.global.dp", true);
    let deps = e.issue_point();
    scalar_kernels(e, LOSS_FWD_KERNELS - 4 + sp, &deps, "loss_metrics.mean");
    let deps = e.issue_point();
    scalar_kernels(e, LOSS_BWD_KERNELS + sp, &deps, "loss_metrics.bwd");
}

/// `loss.item()` and the loss entry's `.item()` after a micro-batch's backward.
pub(crate) fn loss_read_back(e: &mut Emitter) {
    read_back(e, "loss_metrics.loss.item");
    read_back(e, "loss_metrics.loss_dict.item");
}

/// Gradient clipping once per step, after every gradient is final (`deps`: the collectives
/// completing them). `grad_bytes`: this rank's gradient shards, read by the norm and read
/// and written by the clip. Returns the last op (the clipped gradients).
pub(crate) fn clip_grad_norm(
    e: &mut Emitter,
    tail: &TrainerTail,
    grad_bytes: u64,
    deps: &[OpId],
) -> Option<OpId> {
    if tail.norm_buckets.is_empty() {
        return None;
    }
    // The compute stream waits for the collectives completing the gradients, then for each
    // bucket's (synchronous) norm all-reduces before it goes on.
    let mut waits = deps.to_vec();
    let elem = e.ctx.opts.reduce_dtype.bytes().max(1);
    for (i, b) in tail.norm_buckets.iter().enumerate() {
        let mut d = e.issue_point();
        d.append(&mut waits);
        // The fused norm reads the bucket's share of the gradients (split evenly by count).
        let bytes = grad_bytes * u64::from(b.tensors) / u64::from(tail.tensors()).max(1);
        let work = ComputeWork::memory_bound(2 * bytes / elem, bytes, NORM_BUCKET_KERNELS);
        e.compute(
            Stream::Compute,
            Category::Compute,
            work,
            &d,
            &format!("clip.norm.b{i}"),
        );
        for &g in &b.groups {
            waits.extend(scalar_all_reduce(
                e,
                g,
                &format!("clip.norm.b{i}.ar"),
                false,
            ));
        }
    }
    let mut d = e.issue_point();
    d.append(&mut waits);
    let work = ComputeWork::memory_bound(grad_bytes / elem, 2 * grad_bytes, CLIP_KERNELS);
    Some(e.compute(Stream::Compute, Category::Compute, work, &d, "clip.scale"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_plan::fsdp::build_fsdp_plan;
    use hpfsdp_plan::planner::plan;
    use hpfsdp_plan::scenario::Scenario;

    fn tail(name: &str) -> TrainerTail {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios")
            .join(name);
        let s = Scenario::load(&path).unwrap();
        let p = plan(&s.model, &s.planner_input());
        let f = build_fsdp_plan(&s, &p);
        let m = &s.file.mesh;
        let (tp, ep) = (m.tp.max(1), m.ep.max(1));
        let (dense, expert) = (m.dp_shard.max(1), m.edp_shard.unwrap_or(1).max(1));
        TrainerTail::new(
            &p,
            &f,
            |g| match g {
                GroupKind::DenseShard => dense,
                GroupKind::ExpertShard if ep > 1 => expert,
                GroupKind::Tp => tp,
                GroupKind::Ep => ep,
                _ => 1,
            },
            s.file.train.sequence_parallel,
        )
    }

    #[test]
    fn gradient_norm_buckets_follow_the_shard_groups() {
        // Experiment A: TP-sharded dense (embedding first), TP-replicated dense, experts.
        let a = tail("paper/exp-a-mbs2.toml");
        assert!(a.sp_token_reduce);
        let groups: Vec<_> = a.norm_buckets.iter().map(|b| b.groups.clone()).collect();
        assert_eq!(
            groups,
            vec![
                vec![GroupKind::DenseShard, GroupKind::Tp],
                vec![GroupKind::DenseShard],
                vec![GroupKind::ExpertShard, GroupKind::Ep],
            ]
        );
        let tensors: u32 = a.norm_buckets.iter().map(|b| b.tensors).sum();
        // 48 layers x 11 parameters + embedding, final norm, head.
        assert_eq!(tensors, 48 * 11 + 3);
        // 48 x (2 norms, q_norm, k_norm, router) + final norm are TP-replicated.
        assert_eq!(a.norm_buckets[1].tensors, 48 * 5 + 1);
        // Experiment B (pure FSDP): one bucket over the shard group, no SP token reduce.
        let b = tail("paper/exp-b.toml");
        assert!(!b.sp_token_reduce);
        assert_eq!(b.norm_buckets.len(), 1);
        assert_eq!(b.norm_buckets[0].groups, vec![GroupKind::DenseShard]);
    }

    #[test]
    fn kernel_constants_sum_their_listed_ops() {
        let loss_fwd = [
            "* tokens", "/ len", "* dp", "* cp", "+ mean", "- detach", "stack", "sum",
        ];
        let loss_bwd = ["ones", "* tokens", "/ len", "* dp", "* cp"];
        let bucket = [
            "foreach_norm",
            "stack",
            "to f32",
            "vector_norm",
            "pow",
            "add",
        ];
        let clip = [
            "pow 1/p",
            "+ eps",
            "max /",
            "clamp",
            "to dtype",
            "foreach_mul",
        ];
        assert_eq!(loss_fwd.len() as u32, LOSS_FWD_KERNELS);
        assert_eq!(loss_bwd.len() as u32, LOSS_BWD_KERNELS);
        assert_eq!(bucket.len() as u32, NORM_BUCKET_KERNELS);
        assert_eq!(clip.len() as u32, CLIP_KERNELS);
    }
}
