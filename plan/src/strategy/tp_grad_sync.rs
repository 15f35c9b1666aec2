//! Gradient synchronisation of TP-replicated parameters over the tensor-parallel group.
//!
//! With sequence parallelism every TP rank runs the norms, the Q/K norms and the MoE router on
//! its own chunk of the sequence (the `Shard(1)` activations between TP regions), and the Q/K
//! norms see only the rank's heads: the gradient of a parameter that is *replicated* on `tp`
//! (RMSNorm weights, `q_norm`/`k_norm`, the router gate, the final norm) is then a partial sum
//! over the TP ranks. HyperParallel's FSDP takes each parameter's TP placement from the
//! sharding plan (`apply_sharding_plan` returns `source_shard_info = {fqn: (tp_placement,
//! tp_mesh)}`; design doc "FSDP combination (interface contract)": a `Replicate` TP placement
//! makes FSDP all-reduce the gradient over the TP group, a `Shard` one must not be, and routed
//! experts under TP-extend-EP are marked `Shard` and never TP-synchronised) and reduces those
//! gradients like an HSDP replica axis: reduce-scatter over the shard group, then one fused
//! all-reduce per (FSDP unit, process group, reduce dtype) into a zero-padded buffer rounded
//! up to 512 bytes, issued at step 4 of the post-backward pipeline on the last micro-batch
//! (notes `hyper-parallel.md` 5.3 and 5.4, `AllReduceParamGroup`). Experiment A (TP 4, SP)
//! thus issues one TP all-reduce per decoder layer (both layer norms, `q_norm`, `k_norm`,
//! `mlp.gate`) and one for the root unit's `model.norm`: 49 per step.
//!
//! Without sequence parallelism the layer norms and the router see every token on every TP
//! rank and their gradients are already whole; the program issues nothing then (the verify
//! reference executor, which rejects `sequence_parallel` with `tp > 1`, runs that case).

use crate::fsdp::{DataDomain, FsdpPlan};
use crate::planner::ShardingPlan;

/// Per FSDP parameter (in `fsdp.params` order): whether its gradient is a partial sum over the
/// TP group that FSDP completes with a TP all-reduce. True for trainable dense parameters with
/// no `Shard` placement on `tp`, when `tp > 1` and sequence parallelism is on.
pub fn partial_over_tp(
    plan: &ShardingPlan,
    fsdp: &FsdpPlan,
    tp: usize,
    sequence_parallel: bool,
) -> Vec<bool> {
    fsdp.params
        .iter()
        .map(|p| {
            sequence_parallel
                && tp > 1
                && p.domain == DataDomain::Dense
                && plan.param(&p.name).is_some_and(|pp| {
                    pp.trainable && !pp.placements.get("tp").is_some_and(|x| x.is_shard())
                })
        })
        .collect()
}

/// Bytes of one unit's fused TP all-reduce buffer: the padded shard gradients of its
/// TP-partial parameters back to back in the reduce dtype, rounded up to 512 bytes (0 when the
/// unit has none).
pub fn fused_bytes(padded_shard_numels: impl IntoIterator<Item = u64>, reduce_bytes: u64) -> u64 {
    let total: u64 = padded_shard_numels.into_iter().sum::<u64>() * reduce_bytes;
    total.div_ceil(512) * 512
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsdp::build_fsdp_plan;
    use crate::planner::plan;
    use crate::scenario::Scenario;

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

    #[test]
    fn fused_buffer_rounds_up_to_512_bytes() {
        assert_eq!(fused_bytes([], 2), 0);
        assert_eq!(fused_bytes([1], 2), 512);
        assert_eq!(fused_bytes([128, 128], 2), 512);
        assert_eq!(fused_bytes([512, 1], 2), 1536);
    }
}
