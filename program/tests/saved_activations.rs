//! Saved activations: the formulas of `program/src/strategy/saved_activations.rs` against the
//! bytes autograd really saves in the HuggingFace modules (fixture written by
//! `tools/saved_activations_probe.py`, two sizes of Qwen3-MoE and dense Qwen3), and the step
//! programs allocating exactly those bytes per stage.

use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::model::{ModelConfig, ModelFamily};
use hpfsdp_program::step::{MemTag, StepProgram};
use hpfsdp_program::strategy::StrategyKind;
use hpfsdp_program::strategy::saved_activations::{
    SavedLayout, checkpoint_bytes, embed_bytes, head_bytes, layer_bytes,
};
use std::path::PathBuf;

#[allow(dead_code)] // shared helpers this file does not use
mod common;
use common::{rank0_program as program, scenario};

fn fixture() -> toml::Table {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/saved_activations_torch.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    text.parse().unwrap()
}

fn int(t: &toml::Table, key: &str) -> u64 {
    t.get(key)
        .and_then(|v| v.as_integer())
        .unwrap_or_else(|| panic!("fixture key {key} missing")) as u64
}

/// The probe's two-layer model as a `ModelConfig`: Qwen3-30B-A3B's config with the probed
/// dimensions (dense: no experts, the dense Qwen3 family).
fn probed_config(base: &ModelConfig, t: &toml::Table) -> ModelConfig {
    let mut cfg = base.clone();
    cfg.hidden_size = int(t, "hidden");
    cfg.num_attention_heads = int(t, "heads");
    cfg.num_key_value_heads = int(t, "kv_heads");
    cfg.head_dim = int(t, "head_dim");
    cfg.intermediate_size = int(t, "intermediate");
    cfg.vocab_size = int(t, "vocab");
    cfg.num_hidden_layers = 2;
    cfg.mtp_layers = 0;
    if int(t, "experts") == 0 {
        cfg.moe = None;
        cfg.family = ModelFamily::Qwen3;
    } else {
        let moe = cfg.moe.as_mut().unwrap();
        moe.num_experts = int(t, "experts");
        moe.experts_per_token = int(t, "top_k");
        moe.moe_intermediate_size = int(t, "moe_intermediate");
        moe.shared_experts = 0;
        moe.first_dense_layers = 0;
        moe.extra_dense_layers.clear();
    }
    cfg
}

/// One rank holding the whole micro-batch (no TP/CP/EP): what the probe ran.
fn single_rank(t: &toml::Table) -> SavedLayout {
    let tokens = (int(t, "batch") * int(t, "seq")) as f64;
    SavedLayout {
        local_tokens: tokens,
        sequence_tokens: tokens,
        linear_input_tokens: tokens,
        tp: 1,
        act_bytes: 2,
        routed: None,
        loss_parallel: false,
        positions: int(t, "seq") as f64,
    }
}

#[test]
fn formulas_match_what_autograd_saves_in_the_hf_modules() {
    let base = scenario("paper/exp-b.toml").model.config;
    let fx = fixture();
    let sizes: Vec<_> = fx
        .iter()
        .filter_map(|(k, v)| Some((k, v.as_table()?)))
        .collect();
    assert_eq!(sizes.len(), 4, "two MoE and two dense sizes");
    for (name, t) in sizes {
        let cfg = probed_config(&base, t);
        let l = single_rank(t);
        // Layer 1: a steady-state layer; layer 0 also saves the rotary tables first.
        assert_eq!(
            layer_bytes(&cfg, 1, &l),
            int(t, "saved_layer1_bytes") as f64,
            "{name} layer"
        );
        let rope = int(t, "saved_layer0_bytes") - int(t, "saved_layer1_bytes");
        let embed = int(t, "saved_embed_bytes") + int(t, "saved_shared_bytes") + rope;
        assert_eq!(
            embed_bytes(&cfg, &l),
            embed as f64,
            "{name} embedding + rotary tables"
        );
        assert_eq!(
            head_bytes(&cfg, &l),
            int(t, "saved_head_bytes") as f64,
            "{name} head"
        );
        for layer in ["checkpointed_layer0_bytes", "checkpointed_layer1_bytes"] {
            assert_eq!(
                checkpoint_bytes(&cfg, &l),
                int(t, layer) as f64,
                "{name} {layer}"
            );
        }
    }
}

/// Experiment B's layout: 8,192 tokens per rank (micro batch 2 x 4,096), no TP.
fn exp_b_layout() -> SavedLayout {
    SavedLayout {
        local_tokens: 8192.0,
        sequence_tokens: 8192.0,
        linear_input_tokens: 8192.0,
        tp: 1,
        act_bytes: 2,
        routed: None,
        loss_parallel: false,
        positions: 4096.0,
    }
}

#[test]
fn tensor_parallelism_splits_heads_and_features_not_the_vocabulary_without_loss_parallel() {
    let cfg = scenario("paper/exp-b.toml").model.config;
    let one = exp_b_layout();
    let tp4 = SavedLayout {
        local_tokens: 2048.0,
        tp: 4,
        ..one
    };
    // Every per-head and per-feature term shrinks 4x, the gathered layer inputs do not.
    let share = layer_bytes(&cfg, 0, &tp4) / layer_bytes(&cfg, 0, &one);
    assert!(share > 0.25 && share < 0.5, "{share}");
    // Logits are replicated before HF's loss: the f32 log-softmax stays whole-vocabulary.
    let logsoftmax = 4.0 * cfg.vocab_size as f64 * 8192.0;
    assert!(head_bytes(&cfg, &tp4) > logsoftmax);
    let parallel = SavedLayout {
        loss_parallel: true,
        ..tp4
    };
    assert!(head_bytes(&cfg, &parallel) < logsoftmax / 3.0);
}

/// Activation bytes allocated by the forward ops named `name.*` (recompute excluded).
fn forward_alloc(p: &StepProgram, prefix: &str) -> u64 {
    p.ops
        .iter()
        .filter(|o| {
            o.name
                .as_deref()
                .is_some_and(|n| n.starts_with(prefix) && !n.contains("recompute"))
        })
        .flat_map(|o| o.memory.iter())
        .filter(|m| m.tag == MemTag::Activations)
        .map(|m| m.alloc_bytes)
        .sum()
}

#[test]
fn experiment_b_programs_keep_the_measured_rules_per_layer() {
    let s = scenario("paper/exp-b.toml");
    let cfg = &s.model.config;
    let l = exp_b_layout();
    // 32 sequences over 16 ranks at micro batch 2: one micro-batch per step.
    for kind in [StrategyKind::HyperParallel, StrategyKind::Fsdp2] {
        let p = program(&s, kind);
        // Layers 0..26 recompute: they keep their input; layer 30 keeps what autograd saves.
        let recomputed = forward_alloc(&p, "layers.3.");
        let kept = forward_alloc(&p, "layers.30.");
        assert_eq!(recomputed, checkpoint_bytes(cfg, &l) as u64, "{kind:?}");
        assert_eq!(kept, layer_bytes(cfg, 30, &l).round() as u64, "{kind:?}");
    }
}

/// Activation bytes each forward stage of micro-batch 0 allocates, in forward order
/// (embedding, decoder and MTP layers, head).
fn stage_allocs_mb0(p: &StepProgram) -> Vec<u64> {
    p.ops
        .iter()
        .filter(|o| {
            o.name
                .as_deref()
                .is_some_and(|n| n.starts_with("mb0.") && n.ends_with(".fwd"))
        })
        .flat_map(|o| o.memory.iter())
        .filter(|m| m.tag == MemTag::Activations && m.alloc_bytes > 0)
        .map(|m| m.alloc_bytes)
        .collect()
}

/// Collectives of `p` whose name ends with `suffix`: (kind, input bytes, output bytes).
fn collectives(p: &StepProgram, suffix: &str) -> Vec<(CollectiveKind, u64, u64)> {
    p.ops
        .iter()
        .filter(|o| o.name.as_deref().is_some_and(|n| n.ends_with(suffix)))
        .filter_map(|o| o.payload.as_collective())
        .map(|c| (c.kind, c.input_bytes, c.output_bytes))
        .collect()
}

/// Experiment C's rank layout: 4 x 4096 tokens per micro-batch, TP4 with sequence
/// parallelism; `linear` the tokens a column-parallel linear's saved input covers.
fn exp_c_layout(linear: f64, loss_parallel: bool) -> SavedLayout {
    SavedLayout {
        local_tokens: 4096.0,
        sequence_tokens: 16384.0,
        linear_input_tokens: linear,
        tp: 4,
        act_bytes: 2,
        routed: None,
        loss_parallel,
        positions: 4096.0,
    }
}

#[test]
fn megatron_sequence_parallel_linears_keep_the_local_input_and_gather_it_again_in_backward() {
    let s = scenario("paper/exp-c.toml");
    let cfg = &s.model.config;
    let megatron = program(&s, StrategyKind::MegatronDdp);
    let hp = program(&s, StrategyKind::HyperParallel);
    let (m, h) = (stage_allocs_mb0(&megatron), stage_allocs_mb0(&hp));
    // Embedding, 39 decoder layers, 4 MTP layers, head.
    assert_eq!((m.len(), h.len()), (45, 45));
    // LinearWithGradAccumulationAndAsyncCommunication saves the [s/tp, b, h] input;
    // HyperParallel's q/k/v and gate/up nn.Linear save what the boundary gathered.
    let local = exp_c_layout(4096.0, true);
    let gathered = exp_c_layout(16384.0, false);
    assert_eq!(m[6], layer_bytes(cfg, 5, &local).round() as u64);
    assert_eq!(h[6], layer_bytes(cfg, 5, &gathered).round() as u64);
    // Two column-parallel inputs per dense layer (linear_qkv, linear_fc1), 3/4 of each.
    assert_eq!(h[6] - m[6], 2 * 2 * 4096 * (16384 - 4096));
    // The MTP layer's eh_proj input ([s, b, 2h]) too.
    assert_eq!(m[40], layer_bytes(cfg, 39, &local).round() as u64);
    // Backward gathers each input again: linear_qkv and linear_fc1 of the 43 layers and
    // the output layer, per micro-batch (3), at the forward gather's size.
    let regathers = collectives(&megatron, ".regather.hidden_states.tp.bwd");
    assert_eq!(regathers.len(), (43 * 2 + 1) * 3);
    let gathered_bytes = 16384 * 4096 * 2;
    assert!(regathers.iter().all(|&r| r
        == (
            CollectiveKind::AllGather,
            gathered_bytes / 4,
            gathered_bytes
        )));
    assert!(collectives(&hp, ".regather.hidden_states.tp.bwd").is_empty());
    assert!(collectives(&megatron, ".regather.hidden_states.tp.fwd").is_empty());
}

#[test]
fn megatron_loss_is_vocab_parallel_and_hyperparallel_gathers_the_logits_by_default() {
    let mut s = scenario("paper/exp-c.toml");
    assert!(
        s.file.train.loss_parallel,
        "exp C ships loss_parallel = true (inferred: see the scenario's comment)"
    );
    // HyperParallel's default (AcceleratorConfig.loss_parallel = False); Megatron's loss is
    // vocab-parallel whatever the flag says.
    s.file.train.loss_parallel = false;
    let cfg = &s.model.config;
    let megatron = program(&s, StrategyKind::MegatronDdp);
    let hp = program(&s, StrategyKind::HyperParallel);
    let (m, h) = (stage_allocs_mb0(&megatron), stage_allocs_mb0(&hp));
    // _VocabParallelCrossEntropy keeps the f32 softmax of the rank's V/4 columns;
    // HF's loss on HyperParallel's replicated logits the f32 log-softmax of all V.
    let head_m = head_bytes(cfg, &exp_c_layout(4096.0, true));
    let head_h = head_bytes(cfg, &exp_c_layout(16384.0, false));
    assert_eq!(m[44], head_m.round() as u64);
    assert_eq!(h[44], head_h.round() as u64);
    let v = cfg.vocab_size as f64;
    // Per token: f32 of V/4 columns + int64 target + bool mask; f32 of V + int64 labels.
    let norm = (4.0 * 4096.0 + 4.0 + 2.0 * 4096.0) * 4096.0;
    assert_eq!(
        head_m,
        norm + 2.0 * 4096.0 * 4096.0 + (4.0 * (v / 4.0).ceil() + 8.0 + 1.0) * 16384.0 + 4.0
    );
    assert_eq!(
        head_h,
        norm + 2.0 * 4096.0 * 16384.0 + (4.0 * v + 8.0) * 16384.0 + 4.0
    );
    // Megatron never gathers the logits: three f32 all-reduces per token row instead
    // (logits max, predicted logit, exp sum), forward only, per micro-batch.
    assert!(collectives(&megatron, ".out.logits.tp.fwd").is_empty());
    let reduces = collectives(&megatron, "lm_head.loss.logits_max.tp.fwd");
    assert_eq!(
        reduces,
        vec![(CollectiveKind::AllReduce, 16384 * 4, 16384 * 4); 3]
    );
    assert_eq!(
        collectives(&megatron, ".tp.fwd")
            .iter()
            .filter(|c| c.1 == 16384 * 4)
            .count(),
        9
    );
    // HyperParallel without loss_parallel gathers the bf16 logits and reduces nothing.
    let logits = collectives(&hp, "lm_head.out.logits.tp.fwd");
    let full = 16384 * cfg.vocab_size * 2;
    assert_eq!(logits.len(), 3);
    assert_eq!(logits[0].0, CollectiveKind::AllGather);
    assert_eq!(logits[0].2, full.div_ceil(4) * 4);
    assert!(collectives(&hp, "lm_head.loss.max.tp.fwd").is_empty());
}

#[test]
fn hyperparallel_loss_parallel_keeps_the_local_log_softmax_and_reduces_three_scalars() {
    let mut s = scenario("paper/exp-c.toml");
    s.file.train.loss_parallel = true;
    let cfg = s.model.config.clone();
    let hp = program(&s, StrategyKind::HyperParallel);
    let h = stage_allocs_mb0(&hp);
    // DistributedCrossEntropyFunction saves the f32 local log-probabilities, the int64
    // targets and the bool mask; the lm_head input stays gathered.
    assert_eq!(
        h[44],
        head_bytes(&cfg, &exp_c_layout(16384.0, true)).round() as u64
    );
    assert!(collectives(&hp, ".out.logits.tp.fwd").is_empty());
    // MAX and SUM per token row in distributed_log_softmax, then the summed loss.
    for (what, bytes) in [("max", 16384 * 4), ("sum_exp", 16384 * 4), ("loss_sum", 4)] {
        let c = collectives(&hp, &format!("lm_head.loss.{what}.tp.fwd"));
        assert_eq!(
            c,
            vec![(CollectiveKind::AllReduce, bytes, bytes); 3],
            "{what}"
        );
    }
}
