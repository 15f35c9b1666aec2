//! Gradient synchronisation of TP-replicated parameters over the tensor-parallel group.
//!
//! With sequence parallelism every TP rank runs the norms, the Q/K norms and the MoE router on
//! its own chunk of the sequence (the `Shard(1)` activations between TP regions), and the Q/K
//! norms see only the rank's heads: the gradient of a parameter that is *replicated* on `tp`
//! (RMSNorm weights, `q_norm`/`k_norm`, the router gate, the final norm) is then a partial sum
//! over the TP ranks. HyperParallel's FSDP takes each parameter's TP placement from the
//! sharding plan (`apply_sharding_plan` returns `source_shard_info = {fqn: (tp_placement,
//! tp_mesh)}`; its DTensor is forward-only, so the backward leaves these gradients partial:
//! `testing/grad_equiv.py`, "TP-Replicate parameters ... must first go through the
//! source_shard_info bypass all-reduce"). The reduction is not fused: the root backward hook
//! (`platform/torch/fully_shard/scheduler.py` `_root_backward_hook`, queued at the start of
//! every backward) drains the reduce-scatter/all-reduce pipeline, then
//! `launch_tp_replicate_reduce_and_apply` walks every FSDP state and parameter holding a
//! reduced gradient and calls `all_reduce_source_replicate_grad_inplace` (`param.py`): one
//! blocking `dist.all_reduce(reduced_grad, async_op=False)` of the parameter's reduced shard
//! over the flattened `Replicate` axes of its source mesh (nothing when that group has one
//! rank; the torch unit test `test_hsdp_param_v2_pure_tp_no_param_shard_all_reduce` checks the
//! sum, `..._pure_tp_sharded_param_skips_all_reduce` that a `Shard` placement issues none).
//! Experiment A (TP 4, SP, 4 micro-batches) thus issues one TP all-reduce per TP-partial
//! parameter per micro-batch: (48 x 5 + 1) x 4 = 964 per step.
//!
//! Without sequence parallelism the layer norms and the router see every token on every TP
//! rank and their gradients are already whole; the program issues nothing then (the verify
//! reference executor, which rejects `sequence_parallel` with `tp > 1`, runs that case).
//! HyperParallel's `all_reduce_source_replicate_grad_inplace` itself has no sequence-parallel
//! test: it would still all-reduce those whole gradients (a `Replicate` placement with a
//! group of more than one rank); that case is not modelled (no measured run has TP without
//! SP).

use hpfsdp_plan::fsdp::{DataDomain, FsdpPlan};
use hpfsdp_plan::planner::ShardingPlan;

/// Per FSDP parameter (in `fsdp.params` order): whether its gradient is a partial sum over the
/// TP group that FSDP completes with a TP all-reduce. True for trainable dense parameters with
/// no `Shard` placement on `tp`, when `tp > 1` and sequence parallelism is on.
pub fn partial_over_tp(
    plan: &ShardingPlan,
    fsdp: &FsdpPlan,
    tp: usize,
    sequence_parallel: bool,
) -> Vec<bool> {
    // Looked up by name in one map, not by a scan of every parameter per parameter.
    let by_name: std::collections::HashMap<&str, &hpfsdp_plan::planner::ParamPlan> =
        if sequence_parallel && tp > 1 {
            plan.params
                .iter()
                .rev()
                .map(|p| (p.name.as_str(), p))
                .collect()
        } else {
            Default::default()
        };
    fsdp.params
        .iter()
        .map(|p| {
            sequence_parallel
                && tp > 1
                && p.domain == DataDomain::Dense
                && by_name.get(p.name.as_str()).is_some_and(|pp| {
                    pp.trainable && !pp.placements.get("tp").is_some_and(|x| x.is_shard())
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_plan::fsdp::build_fsdp_plan;
    use hpfsdp_plan::planner::plan;
    use hpfsdp_plan::scenario::Scenario;

    fn load(name: &str) -> Scenario {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios")
            .join(name);
        Scenario::load(&path).unwrap()
    }

    #[test]
    fn sequence_parallel_makes_norm_and_router_gradients_partial_over_tp() {
        let s = load("paper/exp-a-mbs2.toml");
        let p = plan(&s.model, &s.planner_input());
        let f = build_fsdp_plan(&s, &p);
        let partial = partial_over_tp(&p, &f, 4, true);
        let names: Vec<&str> = f
            .params
            .iter()
            .zip(&partial)
            .filter(|(_, x)| **x)
            .map(|(p, _)| p.name.as_str())
            .collect();
        // Per layer: both norms, q_norm, k_norm and the router gate; plus the final norm.
        assert_eq!(names.len(), 48 * 5 + 1, "{names:?}");
        for n in [
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.post_attention_layernorm.weight",
            "model.layers.0.self_attn.q_norm.weight",
            "model.layers.0.self_attn.k_norm.weight",
            "model.layers.0.mlp.gate.weight",
            "model.norm.weight",
        ] {
            assert!(names.contains(&n), "{n}");
        }
        // Column/row-parallel projections, the vocab-sharded embedding and head and the
        // routed experts (EP-sharded) are not TP-synchronised.
        for n in names {
            assert!(
                !n.contains("proj") && !n.contains("embed") && !n.contains("lm_head"),
                "{n}"
            );
        }
        // Without SP (or without TP) nothing is partial.
        assert!(!partial_over_tp(&p, &f, 4, false).iter().any(|x| *x));
        assert!(!partial_over_tp(&p, &f, 1, true).iter().any(|x| *x));
    }
}
