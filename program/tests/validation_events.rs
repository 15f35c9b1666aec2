//! Validation-mode CPU operator events in the step programs: only forward (and recompute)
//! compute ops carry them, every micro-batch and every decoder layer carries the same
//! amount, and the MoE local region adds no dispatch events (its kernels are the same in both
//! modes); the contract-entry rules follow the boundary contracts (identity entries counted
//! in the in_plan, skipped in the out_plan); the torch-level census of the HF forward code
//! gives each module's DTensor wraps, and experiment A's total is that census plus the
//! contract entries, every micro-batch.

use hpfsdp_plan::model::ComputeKind;
use hpfsdp_plan::planner::{BoundarySpec, plan};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Payload, StepProgram};
use hpfsdp_program::strategy::StrategyKind;
use hpfsdp_program::strategy::validation::op_census::{self, TorchCall, forward_calls};
use hpfsdp_program::strategy::validation::{
    EVENTS_PER_CONTRACT_ENTRY, EVENTS_PER_WRAP, dispatch_events, in_check_events, in_local_region,
    in_plan_entries, in_plan_redistributions, out_check_events, out_plan_entries,
};
use std::path::PathBuf;

#[allow(dead_code)] // shared helpers this file does not use
mod common;
use common::{rank0_program as program, scenario};

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
    // in_plan entry), out_src == out_dst (no out_plan entry). In validation mode the identity
    // entry passes the DTensor through: no wrap, no event.
    assert_eq!(norm.in_src, norm.in_dst);
    assert_eq!(in_plan_entries(norm), 1);
    assert_eq!(in_plan_redistributions(norm), 0);
    assert_eq!(out_plan_entries(norm), 0);
    assert_eq!(in_check_events(norm) + out_check_events(norm), 0);
    let attn = p
        .boundaries
        .iter()
        .find(|b| b.module == "model.layers.0.self_attn")
        .expect("an attention boundary");
    // Sequence-sharded -> replicated on the way in (all-gather), partial -> sequence-sharded on
    // the way out (reduce-scatter): one wrap each.
    assert_eq!(in_plan_entries(attn), 1);
    assert_eq!(in_plan_redistributions(attn), 1);
    assert_eq!(out_plan_entries(attn), 1);
    assert_eq!(in_check_events(attn), EVENTS_PER_CONTRACT_ENTRY);
    assert_eq!(out_check_events(attn), EVENTS_PER_CONTRACT_ENTRY);
    // The MoE block's local map re-wraps its output once more.
    let mlp = p
        .boundaries
        .iter()
        .find(|b| b.module == "model.layers.0.mlp")
        .expect("an MoE boundary");
    assert!(mlp.flags.use_local_map);
    assert_eq!(out_check_events(mlp), 2 * EVENTS_PER_CONTRACT_ENTRY);
    // The embedding's token ids enter as a plain tensor: its identity entry wraps them.
    let embed = p
        .boundaries
        .iter()
        .find(|b| b.module == "model.embed_tokens")
        .expect("an embedding boundary");
    assert_eq!(in_plan_redistributions(embed), 0);
    assert_eq!(in_check_events(embed), EVENTS_PER_CONTRACT_ENTRY);
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

/// Calls of the ops of `layer` whose name starts with `module`, in forward order.
fn module_calls(s: &Scenario, layer: usize, module: &str) -> Vec<&'static TorchCall> {
    let profile = s.model.compute_profile(4096);
    let piece = profile.iter().find(|l| l.layer == Some(layer)).unwrap();
    piece
        .ops
        .iter()
        .filter(|o| o.name.starts_with(module))
        .flat_map(|o| {
            forward_calls(o, &s.model.config)
                .unwrap_or_else(|| panic!("{}: no census", o.name))
                .iter()
        })
        .collect()
}

#[test]
fn qwen3_30b_a3b_attention_census_follows_the_hf_forward() {
    let s = scenario("paper/exp-a-mbs2.toml");
    let calls = module_calls(&s, 0, "model.layers.0.self_attn.");
    let names: Vec<&str> = calls.iter().map(|c| c.call).collect();
    // q/k/v projections, per-head q/k RMSNorm (8 calls each), RoPE on q and k (7 each),
    // the SDPA core with its layout calls, o_proj.
    let expected_prefix = ["F.linear", "F.linear", "F.linear", "Tensor.to(float32)"];
    assert_eq!(&names[..4], &expected_prefix);
    assert_eq!(names.iter().filter(|n| **n == "F.linear").count(), 4);
    assert_eq!(
        names.iter().filter(|n| n.starts_with("Tensor.to(")).count(),
        4
    );
    assert_eq!(
        names.iter().filter(|n| n.starts_with("torch.cat")).count(),
        2
    );
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("__getitem__"))
            .count(),
        4
    );
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("Tensor.view"))
            .count(),
        3
    );
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("Tensor.transpose"))
            .count(),
        4
    );
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("Tensor.contiguous"))
            .count(),
        2
    );
    assert!(names.contains(&"F.scaled_dot_product_attention"));
    assert_eq!(names.last(), Some(&"F.linear"), "o_proj closes the module");
    assert_eq!(calls.len(), 4 + 2 * 8 + 14 + 11, "{names:#?}");
    // Every call wraps one DTensor: no tuple outputs in the attention block.
    assert!(calls.iter().all(|c| c.wraps == 1));
    // The whole decoder layer outside the MoE block: two more RMSNorms and two residuals.
    let layer: usize = ["input_layernorm", "self_attn.", "attn_residual"]
        .iter()
        .chain(["post_attention_layernorm", "mlp_residual"].iter())
        .map(|m| module_calls(&s, 0, &format!("model.layers.0.{m}")).len())
        .sum();
    assert_eq!(layer, 8 + 45 + 1 + 8 + 1);
}

#[test]
fn the_census_counts_shape_calls_the_kernel_list_skips() {
    let s = scenario("paper/exp-a-mbs2.toml");
    let profile = s.model.compute_profile(4096);
    let core = profile[1]
        .ops
        .iter()
        .find(|o| o.kind == ComputeKind::Attention)
        .unwrap();
    let calls = forward_calls(core, &s.model.config).unwrap();
    // One fused attention kernel plus one layout copy on the device, eleven wrapped calls on
    // the host (views, transposes, reshape and contiguous launch no kernel of their own).
    assert_eq!(op_census::wraps(calls), 11);
    let router = profile[1]
        .ops
        .iter()
        .find(|o| o.kind == ComputeKind::Router)
        .unwrap();
    let r = forward_calls(router, &s.model.config).unwrap();
    assert_eq!(r.len(), 8);
    assert_eq!(op_census::wraps(r), 9, "topk wraps values and indices");
}

#[test]
fn local_regions_contribute_no_dispatch_events() {
    let s = scenario("paper/exp-a-mbs2.toml");
    let p = plan(&s.model, &s.planner_input());
    let bs: Vec<&BoundarySpec> = p
        .boundaries
        .iter()
        .filter(|b| b.module.starts_with("model.layers.0."))
        .collect();
    let profile = s.model.compute_profile(4096);
    let layer0 = profile.iter().find(|l| l.layer == Some(0)).unwrap();
    let cfg = &s.model.config;
    let mut dispatched = 0;
    for op in &layer0.ops {
        let events = dispatch_events(&bs, op, cfg, &[]);
        if op.name.contains(".mlp.") {
            assert_eq!(events, 0, "{}: inside the MoE local map", op.name);
        } else {
            let calls = forward_calls(op, cfg).unwrap();
            assert_eq!(
                events,
                op_census::wraps(calls) * EVENTS_PER_WRAP,
                "{}",
                op.name
            );
            dispatched += events;
        }
    }
    assert_eq!(dispatched, 63 * EVENTS_PER_WRAP);
    // The same router outside any local region is dispatched: its census counts.
    let router = layer0
        .ops
        .iter()
        .find(|o| o.kind == ComputeKind::Router)
        .unwrap();
    assert_eq!(dispatch_events(&[], router, cfg, &[]), 9 * EVENTS_PER_WRAP);
}

#[test]
fn experiment_a_total_is_the_census_plus_the_contract_entries() {
    let s = scenario("paper/exp-a-mbs2.toml");
    let p = plan(&s.model, &s.planner_input());
    let prog = program(&s, StrategyKind::HyperParallel);
    let total: u64 = prog
        .ops
        .iter()
        .map(|o| u64::from(o.validation_cpu_events))
        .sum();
    // Per micro-batch forward: 48 layers of 63 wraps outside the MoE local map, the head
    // (final norm 8, lm_head 1, loss 4), the vocabulary-sharded embedding in its local
    // region, and every boundary's contract checks once.
    let wraps = 48 * 63 + 8 + 1 + 4;
    let contracts: u64 = p
        .boundaries
        .iter()
        .map(|b| u64::from(in_check_events(b) + out_check_events(b)))
        .sum();
    let micro_batches = 32 / 4 / 2;
    let expected = micro_batches * (wraps * u64::from(EVENTS_PER_WRAP) + contracts);
    assert_eq!(total, expected, "contract events per forward {contracts}");
    // The contract checks per forward, by hand: per layer the attention's all-gather and
    // reduce-scatter, the MoE block's all-gather, re-wrap and reduce-scatter (the four norms
    // are identities); the embedding's plain ids, re-wrap and reduce-scatter; lm_head's two
    // redistributions.
    assert_eq!(
        contracts,
        u64::from(EVENTS_PER_CONTRACT_ENTRY) * (48 * 5 + 3 + 2)
    );
    eprintln!("exp A mbs2: {total} validation CPU events per step");
}

#[test]
fn deepseek_v3_mla_attention_census_follows_the_hf_forward() {
    let s = scenario("paper/exp-d.toml");
    let cfg = &s.model.config;
    assert!(cfg.mla.is_some(), "exp D runs multi-head latent attention");
    let profile = s.model.compute_profile(4096);
    let layer0 = profile.iter().find(|l| l.layer == Some(0)).unwrap();
    let calls = |kind: ComputeKind| {
        let op = layer0.ops.iter().find(|o| o.kind == kind).unwrap();
        forward_calls(op, cfg).unwrap()
    };
    let core = calls(ComputeKind::Attention);
    // 16 calls, three of them `torch.split` with two outputs each: 19 wraps.
    assert_eq!(core.len(), 16);
    assert_eq!(
        core.iter()
            .filter(|c| c.call.starts_with("torch.split"))
            .count(),
        3
    );
    assert_eq!(op_census::wraps(core), 19);
    // Interleaved RoPE: the seven rotation calls plus view/transpose/reshape, per q and k.
    let rope = layer0
        .ops
        .iter()
        .find(|o| o.name.ends_with("rotary_emb"))
        .unwrap();
    assert_eq!(forward_calls(rope, cfg).unwrap().len(), 2 * (7 + 3));
}

/// The measured extra profiler events of `tools/validation_census_probe.py` (torch 2.15
/// profiler, a HyperParallel-style DTensor wrapper around the HF forward code).
fn measured_events(key: &str) -> u32 {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/validation_census_torch.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let doc: toml::Table = text.parse().unwrap();
    let v = doc["extra_events"][key]
        .as_integer()
        .unwrap_or_else(|| panic!("{path:?}: extra_events.{key} missing"));
    u32::try_from(v).unwrap()
}

/// Census events of the ops of `s`'s layer 0 whose name starts with `module`.
fn census_events(s: &Scenario, module: &str) -> u32 {
    let calls = module_calls(s, 0, module);
    calls.iter().map(|c| c.wraps).sum::<u32>() * EVENTS_PER_WRAP
}

#[test]
fn the_census_matches_the_torch_profiler_per_module() {
    use hpfsdp_program::strategy::validation::op_census::{
        CAUSAL_LM_LOSS, EMBEDDING, LINEAR, QWEN3_MOE_ROUTER, RESIDUAL, RMS_NORM, ROPE_QK, SWIGLU,
    };
    let ev = |calls: &[TorchCall]| op_census::wraps(calls) * EVENTS_PER_WRAP;
    assert_eq!(measured_events("wrap"), EVENTS_PER_WRAP);
    assert_eq!(measured_events("rms_norm"), ev(RMS_NORM));
    assert_eq!(measured_events("linear"), ev(LINEAR));
    assert_eq!(measured_events("residual"), ev(RESIDUAL));
    assert_eq!(measured_events("rope_qk"), ev(ROPE_QK));
    assert_eq!(measured_events("swiglu"), ev(SWIGLU));
    assert_eq!(measured_events("embedding"), ev(EMBEDDING));
    assert_eq!(
        measured_events("causal_lm_loss_with_lm_head"),
        ev(LINEAR) + ev(CAUSAL_LM_LOSS)
    );
    assert_eq!(measured_events("qwen3_moe_router"), ev(QWEN3_MOE_ROUTER));
    // Whole attention modules of the real configurations: every op of the profile under
    // `self_attn` (projections, q/k or latent norms, RoPE, the core) against one profiled
    // forward of the module.
    let a = scenario("paper/exp-a-mbs2.toml");
    assert_eq!(
        measured_events("gqa_self_attn"),
        census_events(&a, "model.layers.0.self_attn.")
    );
    let d = scenario("paper/exp-d.toml");
    assert_eq!(
        measured_events("mla_self_attn"),
        census_events(&d, "model.layers.0.self_attn.")
    );
}
