//! Eager launch counts of the gradient settle step: the post-reduction division of every
//! reduce-scattered gradient, plus the accumulation into the gradient held so far from the
//! second micro-batch on (hyper-parallel `TorchHSDPParamV2.apply_reduced_grad`).

use hpfsdp_plan::program::{Category, Payload};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_sim::scenario_run::{ScenarioPlans, prepare};
use std::path::Path;

fn rank0(scenario: &str) -> hpfsdp_plan::program::StepProgram {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let s = Scenario::load(&root.join(scenario)).unwrap();
    let plans = ScenarioPlans::new(s);
    let prepared = prepare(&plans, "hyperparallel", None, true).unwrap();
    prepared.workload.units[0].program.clone()
}

/// (settle ops, settle kernels) of the ops named with `prefix` (`mb{i}.` with gradient
/// accumulation, empty with one micro-batch).
fn settles(p: &hpfsdp_plan::program::StepProgram, prefix: &str) -> (u64, u64) {
    let mut out = (0, 0);
    for op in &p.ops {
        let named = op
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".settle"));
        if let (true, Category::FsdpRs, Payload::Compute(w)) = (named, op.category, &op.payload) {
            out.0 += 1;
            out.1 += u64::from(w.kernels);
        }
    }
    out
}

#[test]
fn gradients_accumulate_across_micro_batches_with_one_add_per_parameter() {
    // Experiment A micro batch 2: four micro-batches per rank.
    let p = rank0("scenarios/paper/exp-a-mbs2.toml");
    let (params, first) = settles(&p, "mb0.");
    assert!(
        params > 48 * 10,
        "every layer's parameters settle: {params}"
    );
    // First micro-batch: the division only (the gradient is assigned, not added).
    assert_eq!(first, params);
    for mb in 1..4 {
        // Later micro-batches: division + `grad += reduced_grad`.
        let later = settles(&p, &format!("mb{mb}."));
        assert_eq!(later, (params, 2 * params), "micro-batch {mb}");
    }
    // Experiment B runs one micro-batch per rank: nothing accumulates.
    let b = rank0("scenarios/paper/exp-b.toml");
    let (params_b, kernels_b) = settles(&b, "");
    assert!(params_b > 0);
    assert_eq!(kernels_b, params_b);
}
