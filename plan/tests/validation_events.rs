//! Validation-mode CPU operator events in the step programs: only forward (and recompute)
//! compute ops carry them, every micro-batch and every decoder layer carries the same
//! amount, and the MoE local region adds no dispatch events (its kernels are the same in both
//! modes); the contract-entry rules follow the boundary contracts (identity entries counted
//! in the in_plan, skipped in the out_plan).

use hpfsdp_plan::fsdp::build_fsdp_plan;
use hpfsdp_plan::model::ComputeKind;
use hpfsdp_plan::planner::{BoundarySpec, plan};
use hpfsdp_plan::program::{Payload, StepProgram};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_plan::strategy::validation::{
    EVENTS_PER_CONTRACT_ENTRY, in_check_events, in_local_region, in_plan_entries, out_check_events,
    out_plan_entries,
};
use hpfsdp_plan::strategy::{ProgramGenerator, StrategyKind};
use std::path::PathBuf;

fn scenario(rel: &str) -> Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(rel);
    Scenario::load(&path).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn program(s: &Scenario, kind: StrategyKind) -> StepProgram {
    let p = plan(&s.model, &s.planner_input());
    let f = build_fsdp_plan(s, &p);
    ProgramGenerator::new(s, &p, &f, kind)
        .unwrap()
        .program(0)
        .unwrap()
}

fn events_where(p: &StepProgram, keep: impl Fn(&str) -> bool) -> u64 {
    p.ops
        .iter()
        .filter(|o| o.name.as_deref().is_some_and(&keep))
        .map(|o| u64::from(o.validation_cpu_events))
        .sum()
}

#[test]
fn only_forward_compute_ops_carry_validation_events_and_each_layer_the_same() {
    let s = scenario("paper/exp-a-mbs2.toml");
    let p = program(&s, StrategyKind::HyperParallel);
    let total: u64 = p
        .ops
        .iter()
        .map(|o| u64::from(o.validation_cpu_events))
        .sum();
    assert!(total > 0, "exp A's forward has DTensor-dispatched modules");
    for o in p.ops.iter().filter(|o| o.validation_cpu_events > 0) {
        let name = o.name.as_deref().unwrap_or("");
        assert!(
            matches!(o.payload, Payload::Compute(_)),
            "{name}: only compute ops dispatch operators"
        );
        assert!(
            name.contains(".fwd") || name.contains(".recompute"),
            "{name}: backward runs local autograd in both modes"
        );
    }
    // Four micro-batches (global 32 / DP 4 / micro 2), 48 layers: every layer forward of
    // every micro-batch carries the same count.
    let per_layer = |mb: u64, l: usize| {
        let prefix = format!("mb{mb}.layers.{l}.");
        events_where(&p, |n| n.starts_with(&prefix))
    };
    let first = per_layer(0, 0);
    assert!(first > 0);
    for mb in 0..4 {
        for l in 0..48 {
            assert_eq!(per_layer(mb, l), first, "micro-batch {mb} layer {l}");
        }
    }
    eprintln!(
        "exp A mbs2 rank 0: {total} validation CPU events per step, {first} per layer forward"
    );
}

#[test]
fn moe_experts_are_a_local_region_and_attention_projections_are_dispatched() {
    let s = scenario("paper/exp-a-mbs2.toml");
    let p = plan(&s.model, &s.planner_input());
    let bs: Vec<&BoundarySpec> = p
        .boundaries
        .iter()
        .filter(|b| b.module.starts_with("model.layers.0."))
        .collect();
    let ops = &s.model.compute_profile(4096);
    let layer0 = ops.iter().find(|l| l.layer == Some(0)).unwrap();
    let experts: Vec<_> = layer0
        .ops
        .iter()
        .filter(|o| o.kind == ComputeKind::ExpertMatmul)
        .collect();
    assert!(!experts.is_empty());
    assert!(experts.iter().all(|o| in_local_region(&bs, o)));
    let router = layer0
        .ops
        .iter()
        .find(|o| o.kind == ComputeKind::Router)
        .unwrap();
    assert!(
        in_local_region(&bs, router),
        "the router sits inside the MoE block's local map"
    );
    let q = layer0
        .ops
        .iter()
        .find(|o| o.name.ends_with("q_proj"))
        .unwrap();
    assert!(!in_local_region(&bs, q));
    // CP = 1: the attention core is dispatched too.
    let core = layer0
        .ops
        .iter()
        .find(|o| o.kind == ComputeKind::Attention)
        .unwrap();
    assert!(!in_local_region(&bs, core));
    let checks: u32 = bs
        .iter()
        .map(|b| in_check_events(b) + out_check_events(b))
        .sum();
    eprintln!(
        "exp A layer 0: {} boundaries, {checks} contract-check events per forward",
        bs.len()
    );
}

#[test]
fn contract_entries_count_identity_in_the_in_plan_and_skip_it_in_the_out_plan() {
    let s = scenario("paper/exp-a-mbs2.toml");
    let p = plan(&s.model, &s.planner_input());
    let norm = p
        .boundaries
        .iter()
        .find(|b| b.module == "model.layers.0.input_layernorm")
        .expect("a norm boundary");
    // A norm keeps the sequence-sharded layout: in_src == in_dst (identity, still one
    // in_plan entry), out_src == out_dst (no out_plan entry).
    assert_eq!(norm.in_src, norm.in_dst);
    assert_eq!(in_plan_entries(norm), 1);
    assert_eq!(out_plan_entries(norm), 0);
    let attn = p
        .boundaries
        .iter()
        .find(|b| b.module == "model.layers.0.self_attn")
        .expect("an attention boundary");
    // Partial -> sequence-sharded on the way out: one out_plan entry.
    assert_eq!(in_plan_entries(attn), 1);
    assert_eq!(out_plan_entries(attn), 1);
}

#[test]
fn a_dense_model_dispatches_its_forward_kernels() {
    // A dense model has no local region, so every forward kernel is dispatched: more events
    // per layer than its contract checks alone.
    let s = scenario("verify/dense-hsdp2x4.toml");
    let p = program(&s, StrategyKind::HyperParallel);
    let per_layer: u64 = events_where(&p, |n| n.contains("layers.0.") && n.contains(".fwd"));
    assert!(per_layer > 2 * u64::from(EVENTS_PER_CONTRACT_ENTRY));
}
