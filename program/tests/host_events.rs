//! Production host CPU operator events: the census tables of
//! `program/src/strategy/host_events.rs` replay the real PyTorch profiler's counts
//! (`program/tests/fixtures/host_census_torch.toml`, written by `tools/host_census_probe.py` from
//! the HF modules), the ops of a dense decoder layer add up to the measured whole layer, and
//! the step programs carry the events on their forward, recompute and backward ops.

use hpfsdp_program::step::Payload;
use hpfsdp_program::strategy::StrategyKind;
use hpfsdp_program::strategy::host_events::{
    self, CAUSAL_LM_LOSS, EMBEDDING, FALLBACK_BWD_EVENTS_PER_KERNEL,
    FALLBACK_FWD_EVENTS_PER_KERNEL, GQA_ATTENTION_CORE, LINEAR, PassEvents, QWEN3_MOE_ROUTER,
    RECOMPUTE_OVERHEAD_PER_LAYER, RESIDUAL, RMS_NORM, ROPE_QK, SWIGLU_DENSE,
    VALIDATION_OVER_PRODUCTION_EVENT_COST,
};
use std::path::PathBuf;

#[allow(dead_code)] // shared helpers this file does not use
mod common;
use common::{rank0_program as program, scenario};

fn fixture() -> toml::Table {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/host_census_torch.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.parse().unwrap()
}

/// `key` of fixture section `case`.
fn get(f: &toml::Table, case: &str, key: &str) -> i64 {
    f[case][key]
        .as_integer()
        .unwrap_or_else(|| panic!("fixture [{case}] {key}"))
}

/// A case's forward and backward events, the backward net of the probe's input stubs (each
/// non-leaf input's own backward: `MulBackward0` and `AccumulateGrad` of its leaf).
fn net(f: &toml::Table, case: &str) -> PassEvents {
    let stub = get(f, "input_stub", "bwd");
    PassEvents {
        fwd: get(f, case, "fwd") as u32,
        bwd: (get(f, case, "bwd") - get(f, case, "inputs") * stub) as u32,
    }
}

fn minus(a: PassEvents, parts: &[(u32, PassEvents)]) -> PassEvents {
    parts.iter().fold(a, |acc, (n, p)| PassEvents {
        fwd: acc.fwd - n * p.fwd,
        bwd: acc.bwd - n * p.bwd,
    })
}

#[test]
fn census_tables_replay_the_torch_profiler() {
    let f = fixture();
    assert_eq!(net(&f, "linear"), LINEAR);
    assert_eq!(net(&f, "rms_norm"), RMS_NORM);
    assert_eq!(net(&f, "rope_qk"), ROPE_QK);
    assert_eq!(net(&f, "qwen3_moe_router"), QWEN3_MOE_ROUTER);
    assert_eq!(net(&f, "embedding"), EMBEDDING);
    assert_eq!(net(&f, "causal_lm_loss"), CAUSAL_LM_LOSS);
    // The attention module without its four projections, q/k norms and RoPE.
    let attn = minus(
        net(&f, "gqa_self_attn"),
        &[(4, LINEAR), (2, RMS_NORM), (1, ROPE_QK)],
    );
    assert_eq!(attn, GQA_ATTENTION_CORE);
    // The dense MLP without its three projections.
    assert_eq!(minus(net(&f, "dense_mlp"), &[(3, LINEAR)]), SWIGLU_DENSE);
    // The residual add alone; the table adds the branch accumulation (checked below).
    let add = net(&f, "residual");
    assert_eq!((add.fwd, add.bwd + 1), (RESIDUAL.fwd, RESIDUAL.bwd));
    let layer = net(&f, "qwen3_layer");
    assert_eq!(
        RECOMPUTE_OVERHEAD_PER_LAYER as i64,
        get(&f, "qwen3_layer", "recompute") - get(&f, "qwen3_layer", "fwd")
    );
    assert_eq!(FALLBACK_FWD_EVENTS_PER_KERNEL.0, layer.fwd);
    assert_eq!(
        FALLBACK_FWD_EVENTS_PER_KERNEL.1 as i64,
        get(&f, "qwen3_layer", "fwd_kernels")
    );
    assert_eq!(FALLBACK_BWD_EVENTS_PER_KERNEL.0, layer.bwd);
    assert_eq!(
        FALLBACK_BWD_EVENTS_PER_KERNEL.1 as i64,
        get(&f, "qwen3_layer", "bwd_kernels") - get(&f, "input_stub", "bwd_kernels")
    );
    // The Qwen3-MoE decoder layer with a dense MLP runs the same code as Qwen3's.
    assert_eq!(net(&f, "qwen3_moe_layer_dense_mlp"), layer);
    assert_eq!(
        host_events::ADAMW_FOREACH_EVENTS_PER_PARAM as i64,
        get(&f, "adamw_foreach", "per_param_device_path")
    );
    let ratio = f["timing"]["validation_over_production"]
        .as_float()
        .unwrap();
    assert_eq!(ratio, VALIDATION_OVER_PRODUCTION_EVENT_COST);
    assert!(
        ratio > 1.0,
        "a validation event costs more than a production one"
    );
}

#[test]
fn a_dense_decoder_layers_ops_add_up_to_the_measured_layer() {
    let f = fixture();
    let s = scenario("paper/muon-vs-dmuon.toml");
    let cfg = &s.model.config;
    let profile = s.model.compute_profile(4096);
    let layer = profile.iter().find(|p| p.layer == Some(0)).unwrap();
    let mut sum = PassEvents::default();
    for op in &layer.ops {
        let e = host_events::census(op, cfg)
            .unwrap_or_else(|| panic!("{}: a dense layer op has a census entry", op.name));
        sum.fwd += e.fwd;
        sum.bwd += e.bwd;
    }
    assert_eq!(sum, net(&f, "qwen3_layer"), "ops of {}", layer.name);
}

#[test]
fn programs_carry_the_census_on_forward_recompute_and_backward() {
    let s = scenario("paper/muon-vs-dmuon.toml");
    let p = program(&s, StrategyKind::HyperParallel);
    let f = fixture();
    let layer = net(&f, "qwen3_layer");
    let events = |suffix: &str| -> Vec<u32> {
        p.ops
            .iter()
            .filter(|o| {
                let n = o.name.as_deref().unwrap_or("");
                let layer = n.starts_with("layers.") || n.contains(".layers.");
                layer && n.ends_with(suffix) && matches!(o.payload, Payload::Compute(_))
            })
            .map(|o| o.host_cpu_events)
            .collect()
    };
    let (fwd, re, bwd) = (events(".fwd"), events(".recompute"), events(".bwd"));
    // One micro-batch per rank and step is not assumed: every layer op carries the same.
    assert!(!fwd.is_empty() && fwd.len() == re.len() && fwd.len() == bwd.len());
    assert!(fwd.iter().all(|&e| e == layer.fwd), "{fwd:?}");
    assert!(
        re.iter()
            .all(|&e| e == layer.fwd + RECOMPUTE_OVERHEAD_PER_LAYER),
        "{re:?}"
    );
    assert!(bwd.iter().all(|&e| e == layer.bwd), "{bwd:?}");
    // Exp A (MoE, TP4 EP4): every model-path compute op carries events, the experts through
    // the per-kernel fallback; nothing outside compute ops does.
    let s = scenario("paper/exp-a-mbs2.toml");
    let p = program(&s, StrategyKind::HyperParallel);
    for o in &p.ops {
        let n = o.name.as_deref().unwrap_or("");
        if o.host_cpu_events > 0 {
            assert!(matches!(o.payload, Payload::Compute(_)), "{n}");
        }
    }
    let moe_fwd: Vec<u32> = p
        .ops
        .iter()
        .filter(|o| {
            o.name
                .as_deref()
                .is_some_and(|n| n.contains("layers.0.") && n.ends_with(".fwd"))
                && matches!(o.payload, Payload::Compute(_))
        })
        .map(|o| o.host_cpu_events)
        .collect();
    assert!(
        !moe_fwd.is_empty() && moe_fwd.iter().all(|&e| e > 0),
        "{moe_fwd:?}"
    );
}

#[test]
fn placeholder_adamw_steps_carry_the_foreach_census() {
    // `[optimizer] kind = "adamw"`: the placeholder AdamW on every unit.
    let s = scenario("fixtures/whatif-tiny.toml");
    let p = program(&s, StrategyKind::HyperParallel);
    let adamw: Vec<_> = p
        .ops
        .iter()
        .filter(|o| o.name.as_deref().is_some_and(|n| n.ends_with(".optimizer")))
        .collect();
    assert!(
        !adamw.is_empty(),
        "the placeholder optimizer steps every unit"
    );
    for o in adamw {
        let Payload::Compute(w) = o.payload else {
            panic!("an optimizer step is compute")
        };
        // One multi-tensor kernel per parameter tensor, four host events per parameter.
        assert_eq!(
            o.host_cpu_events,
            host_events::ADAMW_FOREACH_EVENTS_PER_PARAM * w.kernels
        );
    }
}

#[test]
fn backward_compute_is_dispatched_by_the_autograd_engine_and_chunk_cat_counts_its_elements() {
    use hpfsdp_program::step::{CopyKind, HostDispatch};
    // The measured one-GPU FSDP2 step of the 1.7B-shaped model (shared/calibration/h200).
    let s = scenario("gpu/dense1p7b-28l-mbs1.toml");
    let p = program(&s, StrategyKind::Fsdp2);
    let mut dispatch = std::collections::BTreeMap::new();
    let mut chunk_cat_elements = 0u64;
    for o in &p.ops {
        let n = o.name.as_deref().unwrap_or("");
        if matches!(o.payload, Payload::Compute(_)) && (n.ends_with(".fwd") || n.ends_with(".bwd"))
        {
            let pass = if n.ends_with(".bwd") { "bwd" } else { "fwd" };
            dispatch
                .entry((pass, o.host_dispatch))
                .and_modify(|c| *c += 1)
                .or_insert(1u32);
        } else {
            // FSDP hooks, copies and the optimizer run Python.
            assert_eq!(o.host_dispatch, HostDispatch::Python, "{n}");
        }
        if let Payload::Copy(w) = &o.payload {
            if w.kind == CopyKind::ChunkCat {
                assert!(w.elements > 0, "{n}");
                chunk_cat_elements += w.elements;
            } else {
                assert_eq!(w.elements, 0, "{n}");
            }
        }
    }
    let keys: Vec<_> = dispatch.keys().copied().collect();
    assert_eq!(
        keys,
        [
            ("bwd", HostDispatch::AutogradEngine),
            ("fwd", HostDispatch::Python)
        ],
        "{dispatch:?}"
    );
    // One chunk_cat per FSDP unit packs every gradient once: the model's 2,031,739,904
    // parameters (runs.jsonl `params` of the measured run).
    assert_eq!(chunk_cat_elements, 2_031_739_904);
}

#[test]
fn transformers_grouped_mm_experts_carry_their_module_census() {
    use hpfsdp_program::strategy::host_events::GROUPED_MM_EXPERTS_PER_LAYER;
    let f = fixture();
    // A Qwen3-MoE decoder layer on transformers' grouped_mm path (the measured H200 MoE
    // step): the dense layer's attention half, the router and the experts module's census.
    let s = scenario("gpu/moe30b-4l-mbs1-grouped.toml");
    let p = program(&s, StrategyKind::Fsdp2);
    let dense = net(&f, "qwen3_layer");
    let attention_half = minus(dense, &[(3, LINEAR), (1, SWIGLU_DENSE)]);
    let want = PassEvents {
        fwd: attention_half.fwd + QWEN3_MOE_ROUTER.fwd + GROUPED_MM_EXPERTS_PER_LAYER.fwd,
        bwd: attention_half.bwd + QWEN3_MOE_ROUTER.bwd + GROUPED_MM_EXPERTS_PER_LAYER.bwd,
    };
    for pass in ["fwd", "bwd"] {
        let layers: Vec<u32> =
            p.ops
                .iter()
                .filter(|o| {
                    o.name.as_deref().is_some_and(|n| {
                        n.starts_with("layers.") && n.ends_with(&format!(".{pass}"))
                    }) && matches!(o.payload, Payload::Compute(_))
                })
                .map(|o| o.host_cpu_events)
                .collect();
        let want = if pass == "fwd" { want.fwd } else { want.bwd };
        assert_eq!(layers, vec![want; 4], "{pass}");
    }
}
