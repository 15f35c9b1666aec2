//! Eager launch counts of the gradient reduction's device work: torch_npu's division of every
//! averaged reduce-scatter (on its HCCL stream, every micro-batch) and the accumulation into
//! the gradient held so far from the second micro-batch on (hyper-parallel
//! `TorchHSDPParamV2.apply_reduced_grad`), as the simulator receives them.

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Category, Payload, Stream};
use hpfsdp_program::strategy::avg_division::is_collective_stream_division;
use hpfsdp_sim::scenario_run::{ScenarioPlans, prepare};
use std::path::Path;

fn rank0(scenario: &str) -> hpfsdp_program::step::StepProgram {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let s = Scenario::load(&root.join(scenario)).unwrap();
    let plans = ScenarioPlans::new(s);
    let prepared = prepare(&plans, "hyperparallel", None, true).unwrap();
    prepared.workload.units[0].program.clone()
}

/// (division kernels, compute-stream settle kernels) of the ops named with `prefix`
/// (`mb{i}.` with gradient accumulation, empty with one micro-batch).
fn kernels(p: &hpfsdp_program::step::StepProgram, prefix: &str) -> (u64, u64) {
    let mut out = (0, 0);
    for op in &p.ops {
        let named = op.name.as_deref().is_some_and(|n| n.starts_with(prefix));
        let Payload::Compute(w) = &op.payload else {
            continue;
        };
        if !named || op.category != Category::FsdpRs {
            continue;
        }
        if is_collective_stream_division(op) {
            out.0 += u64::from(w.kernels);
        } else if op.stream == Stream::Compute {
            out.1 += u64::from(w.kernels);
        }
    }
    out
}

#[test]
fn gradients_accumulate_across_micro_batches_with_one_add_per_parameter() {
    // Experiment A micro batch 2: four micro-batches per rank.
    let p = rank0("scenarios/paper/exp-a-mbs2.toml");
    let (params, first) = kernels(&p, "mb0.");
    assert!(
        params > 48 * 10,
        "every layer's parameters divide: {params}"
    );
    // First micro-batch: the division only (the gradient is assigned, not added).
    assert_eq!(first, 0);
    for mb in 1..4 {
        // Later micro-batches: division + `grad += reduced_grad`.
        let later = kernels(&p, &format!("mb{mb}."));
        assert_eq!(later, (params, params), "micro-batch {mb}");
    }
    // Experiment B runs one micro-batch per rank: nothing accumulates.
    let b = rank0("scenarios/paper/exp-b.toml");
    let (divisions, adds) = kernels(&b, "");
    assert_eq!(divisions, 531);
    assert_eq!(adds, 0);
}
