//! What the trainer's tail of a step needs from a scenario ([`TrainerTail`]): the token
//! reduce and the gradient-norm buckets. [`super::step_tail`] emits the tail from it; the
//! shared context ([`super::ctx::Ctx`]) holds it.

use super::groups::GroupKind;
use hpfsdp_plan::fsdp::{DataDomain, FsdpPlan};
use hpfsdp_plan::planner::ShardingPlan;

/// One gradient-norm bucket: the groups its partial norm is all-reduced over, in mesh-dim
/// order, and the gradients it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NormBucket {
    /// Shard groups of the bucket's DTensor spec (FSDP dim first, then TP or EP).
    pub groups: Vec<GroupKind>,
    /// Gradients in the bucket.
    pub tensors: u32,
}

/// What the trainer tail of a scenario needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct TrainerTail {
    /// The token count is all-reduced over `tp` first (sequence parallelism, `tp > 1`).
    pub sp_token_reduce: bool,
    /// Gradient-norm buckets in first-seen parameter order.
    pub norm_buckets: Vec<NormBucket>,
}

impl TrainerTail {
    /// The tail of a scenario: sequence parallelism, `tp` and each trainable FSDP
    /// parameter's shard groups (dense: the FSDP shard group, then `tp` when the plan shards
    /// it on `tp`; routed experts: the expert shard group, then `ep` when sharded on it).
    /// `size` gives each group's rank count; groups of one rank drop out (the program has no
    /// such group), and a bucket left without groups contributes its norm locally.
    pub fn new(
        plan: &ShardingPlan,
        fsdp: &FsdpPlan,
        size: impl Fn(GroupKind) -> usize,
        sequence_parallel: bool,
    ) -> Self {
        let mut buckets: Vec<NormBucket> = Vec::new();
        // One name lookup table (`ShardingPlan::param` searches linearly: quadratic on
        // exp-d's hundreds of thousands of unfused expert parameters).
        let by_name: std::collections::HashMap<&str, &hpfsdp_plan::planner::ParamPlan> = plan
            .params
            .iter()
            .map(|pp| (pp.name.as_str(), pp))
            .collect();
        for p in &fsdp.params {
            let Some(pp) = by_name
                .get(p.name.as_str())
                .copied()
                .filter(|pp| pp.trainable)
            else {
                continue;
            };
            let shard_on = |axis: &str| pp.placements.get(axis).is_some_and(|x| x.is_shard());
            let candidates = match p.domain {
                DataDomain::Dense => [
                    Some(GroupKind::DenseShard),
                    shard_on("tp").then_some(GroupKind::Tp),
                ],
                DataDomain::Expert => [
                    Some(GroupKind::ExpertShard),
                    shard_on("ep").then_some(GroupKind::Ep),
                ],
            };
            let groups: Vec<GroupKind> = candidates
                .into_iter()
                .flatten()
                .filter(|&g| size(g) > 1)
                .collect();
            match buckets.iter_mut().find(|b| b.groups == groups) {
                Some(b) => b.tensors += 1,
                None => buckets.push(NormBucket { groups, tensors: 1 }),
            }
        }
        Self {
            sp_token_reduce: sequence_parallel && size(GroupKind::Tp) > 1,
            norm_buckets: buckets,
        }
    }

    /// Gradients over every bucket.
    pub(crate) fn tensors(&self) -> u32 {
        self.norm_buckets.iter().map(|b| b.tensors).sum()
    }
}
