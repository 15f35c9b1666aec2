//! Model IR integration tests: published parameter totals, HF names and shapes per family,
//! compact descriptions, compute profiles and error messages for bad inputs.

use std::path::{Path, PathBuf};

use hpfsdp_plan::model::{ComputeKind, LayerCompute, avg_causal_context};
use hpfsdp_plan::{DType, ExpertLayout, ModelFamily, ModelIr, ModelOptions, PlanError};

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/models")
}

fn load_with(file: &str, options: ModelOptions) -> ModelIr {
    ModelIr::load(&models_dir().join(file), options).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn load(file: &str) -> ModelIr {
    load_with(file, ModelOptions::default())
}

fn per_expert() -> ModelOptions {
    ModelOptions {
        expert_layout: ExpertLayout::PerExpert,
        ..ModelOptions::default()
    }
}

fn with_mtp() -> ModelOptions {
    ModelOptions {
        include_mtp: true,
        ..ModelOptions::default()
    }
}

fn shape(ir: &ModelIr, name: &str) -> Vec<u64> {
    ir.param(name)
        .unwrap_or_else(|| panic!("{}: no parameter {name}", ir.name))
        .shape
        .clone()
}

/// The `(file, message)` of a model error.
fn model_error(err: PlanError) -> (String, String) {
    match err {
        PlanError::Model { file, message } => (file, message),
        other => panic!("expected PlanError::Model, got {other:?}"),
    }
}

fn read_model(file: &str) -> String {
    std::fs::read_to_string(models_dir().join(file)).unwrap()
}

// ---------------------------------------------------------------- totals

#[test]
fn qwen3_30b_a3b_totals_match_published() {
    let ir = load("qwen3-30b-a3b.json");
    assert_eq!(ir.total_params(), 30_532_122_624);
    assert_eq!(ir.active_params(), 3_353_032_704);
    assert_eq!(ir.num_layers_total(), 48);
    assert_eq!(ir.config.family, ModelFamily::Qwen3Moe);
}

#[test]
fn qwen3_14b_total_matches_published() {
    let ir = load("qwen3-14b.json");
    assert_eq!(ir.total_params(), 14_768_307_200);
    assert_eq!(ir.active_params(), ir.total_params());
}

#[test]
fn llama_3_8b_total_matches_published() {
    let ir = load("llama-3-8b.json");
    assert_eq!(ir.total_params(), 8_030_261_248);
    assert_eq!(ir.config.head_dim, 128);
}

#[test]
fn deepseek_v3_totals_match_published() {
    let ir = load("deepseek-v3.json");
    assert_eq!(ir.total_params(), 671_026_419_200);
    assert_eq!(ir.active_params(), 37_552_297_472);
    assert_eq!(ir.num_layers_total(), 61);
    // The 58 correction-bias buffers count in the total but are not trainable.
    assert_eq!(ir.trainable_params(), ir.total_params() - 58 * 256);

    let mtp = load_with("deepseek-v3.json", with_mtp());
    assert_eq!(mtp.total_params(), 684_489_845_504);
    assert_eq!(mtp.total_params() - ir.total_params(), 13_463_426_304);
    assert_eq!(mtp.num_layers_total(), 62);
}

#[test]
fn fused_and_per_expert_layouts_have_equal_totals() {
    for file in ["qwen3-30b-a3b.json", "deepseek-v3.json", "505b-moe.toml"] {
        let fused = load(file);
        let split = load_with(file, per_expert());
        assert_eq!(fused.total_params(), split.total_params(), "{file}");
        assert_eq!(fused.active_params(), split.active_params(), "{file}");
        assert!(split.params.len() > fused.params.len());
    }
}

#[test]
fn param_dtype_follows_options() {
    let ir = load_with(
        "llama-3-8b.json",
        ModelOptions {
            param_dtype: DType::F32,
            ..ModelOptions::default()
        },
    );
    assert!(ir.params.iter().all(|p| p.dtype == DType::F32));
    assert_eq!(ir.total_param_bytes(), 4 * 8_030_261_248);
}

// ---------------------------------------------------------------- names and shapes

#[test]
fn llama_names_and_shapes() {
    let ir = load("llama-3-8b.json");
    assert_eq!(ir.params.first().unwrap().name, "model.embed_tokens.weight");
    assert_eq!(ir.params.last().unwrap().name, "lm_head.weight");
    assert_eq!(shape(&ir, "model.embed_tokens.weight"), [128_256, 4096]);
    assert_eq!(
        shape(&ir, "model.layers.0.self_attn.q_proj.weight"),
        [4096, 4096]
    );
    assert_eq!(
        shape(&ir, "model.layers.31.self_attn.k_proj.weight"),
        [1024, 4096]
    );
    assert_eq!(
        shape(&ir, "model.layers.7.self_attn.o_proj.weight"),
        [4096, 4096]
    );
    assert_eq!(
        shape(&ir, "model.layers.7.mlp.gate_proj.weight"),
        [14_336, 4096]
    );
    assert_eq!(
        shape(&ir, "model.layers.7.mlp.down_proj.weight"),
        [4096, 14_336]
    );
    assert_eq!(shape(&ir, "model.layers.7.input_layernorm.weight"), [4096]);
    assert_eq!(shape(&ir, "model.norm.weight"), [4096]);
    assert!(ir.param("model.layers.0.self_attn.q_norm.weight").is_none());
    assert!(
        ir.param("model.layers.32.self_attn.q_proj.weight")
            .is_none()
    );
    // 1 embedding + 32 x 9 + final norm + head.
    assert_eq!(ir.params.len(), 1 + 32 * 9 + 2);
    let layers: Vec<usize> = ir.params.iter().filter_map(|p| p.layer).collect();
    assert!(layers.windows(2).all(|w| w[0] <= w[1]), "layers in order");
}

#[test]
fn qwen3_dense_names_and_shapes() {
    let ir = load("qwen3-14b.json");
    assert_eq!(
        shape(&ir, "model.layers.0.self_attn.q_proj.weight"),
        [5120, 5120]
    );
    assert_eq!(
        shape(&ir, "model.layers.39.self_attn.v_proj.weight"),
        [1024, 5120]
    );
    assert_eq!(shape(&ir, "model.layers.39.self_attn.q_norm.weight"), [128]);
    assert_eq!(shape(&ir, "model.layers.39.self_attn.k_norm.weight"), [128]);
    assert_eq!(
        shape(&ir, "model.layers.12.mlp.up_proj.weight"),
        [17_408, 5120]
    );
    assert_eq!(shape(&ir, "lm_head.weight"), [151_936, 5120]);
}

#[test]
fn qwen3_moe_names_and_shapes() {
    let ir = load("qwen3-30b-a3b.json");
    assert_eq!(
        shape(&ir, "model.layers.0.self_attn.q_proj.weight"),
        [4096, 2048]
    );
    assert_eq!(
        shape(&ir, "model.layers.0.self_attn.k_proj.weight"),
        [512, 2048]
    );
    assert_eq!(
        shape(&ir, "model.layers.0.self_attn.o_proj.weight"),
        [2048, 4096]
    );
    assert_eq!(shape(&ir, "model.layers.47.mlp.gate.weight"), [128, 2048]);
    assert_eq!(
        shape(&ir, "model.layers.47.mlp.experts.gate_up_proj"),
        [128, 1536, 2048]
    );
    assert_eq!(
        shape(&ir, "model.layers.47.mlp.experts.down_proj"),
        [128, 2048, 768]
    );
    assert!(ir.param("model.layers.0.mlp.gate_proj.weight").is_none());
    assert!(
        ir.param("model.layers.0.mlp.gate.e_score_correction_bias")
            .is_none()
    );
    assert!(ir.params.iter().all(|p| p.trainable));

    let split = load_with("qwen3-30b-a3b.json", per_expert());
    assert_eq!(
        shape(&split, "model.layers.5.mlp.experts.127.gate_proj.weight"),
        [768, 2048]
    );
    assert_eq!(
        shape(&split, "model.layers.5.mlp.experts.0.down_proj.weight"),
        [2048, 768]
    );
    assert!(
        split
            .param("model.layers.5.mlp.experts.128.up_proj.weight")
            .is_none()
    );
    assert!(
        split
            .param("model.layers.5.mlp.experts.gate_up_proj")
            .is_none()
    );
}

#[test]
fn deepseek_v3_names_and_shapes() {
    let ir = load("deepseek-v3.json");
    let a = "model.layers.0.self_attn";
    assert_eq!(shape(&ir, &format!("{a}.q_a_proj.weight")), [1536, 7168]);
    assert_eq!(shape(&ir, &format!("{a}.q_a_layernorm.weight")), [1536]);
    assert_eq!(shape(&ir, &format!("{a}.q_b_proj.weight")), [24_576, 1536]);
    assert_eq!(
        shape(&ir, &format!("{a}.kv_a_proj_with_mqa.weight")),
        [576, 7168]
    );
    assert_eq!(shape(&ir, &format!("{a}.kv_a_layernorm.weight")), [512]);
    assert_eq!(shape(&ir, &format!("{a}.kv_b_proj.weight")), [32_768, 512]);
    assert_eq!(shape(&ir, &format!("{a}.o_proj.weight")), [7168, 16_384]);
    assert!(ir.param(&format!("{a}.q_proj.weight")).is_none());
    // Dense layers 0..=2, MoE from 3.
    assert_eq!(
        shape(&ir, "model.layers.2.mlp.gate_proj.weight"),
        [18_432, 7168]
    );
    assert!(ir.param("model.layers.2.mlp.gate.weight").is_none());
    assert!(ir.param("model.layers.3.mlp.gate_proj.weight").is_none());
    assert_eq!(shape(&ir, "model.layers.3.mlp.gate.weight"), [256, 7168]);
    let bias = ir
        .param("model.layers.3.mlp.gate.e_score_correction_bias")
        .unwrap();
    assert_eq!(bias.shape, [256]);
    assert!(!bias.trainable);
    assert_eq!(
        shape(&ir, "model.layers.60.mlp.experts.gate_up_proj"),
        [256, 4096, 7168]
    );
    assert_eq!(
        shape(&ir, "model.layers.60.mlp.experts.down_proj"),
        [256, 7168, 2048]
    );
    assert_eq!(
        shape(&ir, "model.layers.60.mlp.shared_experts.gate_proj.weight"),
        [2048, 7168]
    );
    assert_eq!(
        shape(&ir, "model.layers.60.mlp.shared_experts.down_proj.weight"),
        [7168, 2048]
    );
    assert!(ir.param("model.layers.61.eh_proj.weight").is_none());

    let split = load_with("deepseek-v3.json", per_expert());
    assert_eq!(
        shape(&split, "model.layers.3.mlp.experts.255.up_proj.weight"),
        [2048, 7168]
    );
}

#[test]
fn deepseek_v3_mtp_layer_names() {
    let ir = load_with("deepseek-v3.json", with_mtp());
    let p = "model.layers.61";
    for (leaf, expected) in [
        ("enorm.weight", vec![7168]),
        ("hnorm.weight", vec![7168]),
        ("eh_proj.weight", vec![7168, 14_336]),
        ("shared_head.norm.weight", vec![7168]),
        ("shared_head.head.weight", vec![129_280, 7168]),
        ("embed_tokens.weight", vec![129_280, 7168]),
        ("mlp.experts.gate_up_proj", vec![256, 4096, 7168]),
        ("mlp.gate.e_score_correction_bias", vec![256]),
        ("self_attn.kv_b_proj.weight", vec![32_768, 512]),
        ("input_layernorm.weight", vec![7168]),
    ] {
        let name = format!("{p}.{leaf}");
        let spec = ir.param(&name).unwrap_or_else(|| panic!("missing {name}"));
        assert_eq!(spec.shape, expected, "{name}");
        assert_eq!(spec.layer, Some(61), "{name}");
    }
    // MTP parameters sit between the last main layer and the final norm.
    let names: Vec<&str> = ir.params.iter().map(|p| p.name.as_str()).collect();
    let norm = names
        .iter()
        .position(|n| *n == "model.norm.weight")
        .unwrap();
    let eh = names
        .iter()
        .position(|n| *n == "model.layers.61.eh_proj.weight")
        .unwrap();
    assert!(eh < norm);
}

#[test]
fn modules_are_the_module_tree_in_model_order() {
    let ir = load("qwen3-30b-a3b.json");
    let m = ir.modules();
    assert_eq!(
        &m[..6],
        [
            "model",
            "model.embed_tokens",
            "model.layers",
            "model.layers.0",
            "model.layers.0.self_attn",
            "model.layers.0.self_attn.q_proj",
        ]
    );
    assert!(m.contains(&"model.layers.47.mlp.experts".to_string()));
    assert!(m.contains(&"model.layers.47.mlp.gate".to_string()));
    assert_eq!(m[m.len() - 2..], ["model.norm", "lm_head"]);
    let mut sorted = m.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), m.len(), "no duplicates");
    // Every parameter's owner is listed, and every listed module's parent is listed before it.
    for p in &ir.params {
        assert!(m.iter().any(|x| x == p.module()), "{}", p.name);
    }
    for (i, module) in m.iter().enumerate() {
        if let Some((parent, _)) = module.rsplit_once('.') {
            let at = m.iter().position(|x| x == parent).unwrap();
            assert!(at < i, "{parent} before {module}");
        }
    }
}

// ---------------------------------------------------------------- HF config variants

const QWEN3_MOE_SMALL: &str = r#"{
  "architectures": ["Qwen3MoeForCausalLM"],
  "model_type": "qwen3_moe",
  "hidden_size": 64,
  "intermediate_size": 96,
  "head_dim": 32,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "num_hidden_layers": 6,
  "decoder_sparse_step": 2,
  "mlp_only_layers": [3],
  "num_experts": 8,
  "num_experts_per_tok": 2,
  "moe_intermediate_size": 16,
  "tie_word_embeddings": true,
  "vocab_size": 100
}"#;

#[test]
fn qwen3_moe_sparse_step_mlp_only_layers_and_tied_embeddings() {
    let ir = ModelIr::from_hf_config_str(QWEN3_MOE_SMALL, "small.json", ModelOptions::default())
        .unwrap();
    assert_eq!(ir.name, "small");
    // Sparse iff (i + 1) % 2 == 0 and i not in [3]: layers 1 and 5.
    let moe: Vec<usize> = (0..6).filter(|&l| ir.config.is_moe_layer(l)).collect();
    assert_eq!(moe, [1, 5]);
    assert_eq!(shape(&ir, "model.layers.0.mlp.gate_proj.weight"), [96, 64]);
    assert_eq!(shape(&ir, "model.layers.3.mlp.down_proj.weight"), [64, 96]);
    assert_eq!(
        shape(&ir, "model.layers.5.mlp.experts.gate_up_proj"),
        [8, 32, 64]
    );
    assert_eq!(
        shape(&ir, "model.layers.1.self_attn.q_proj.weight"),
        [128, 64]
    );
    assert!(ir.param("lm_head.weight").is_none());
    assert_eq!(ir.params.last().unwrap().name, "model.norm.weight");
}

#[test]
fn transformers_v5_num_local_experts_is_accepted() {
    let text = QWEN3_MOE_SMALL.replace("\"num_experts\"", "\"num_local_experts\"");
    let ir = ModelIr::from_hf_config_str(&text, "v5.json", ModelOptions::default()).unwrap();
    assert_eq!(ir.config.moe.as_ref().unwrap().num_experts, 8);
}

#[test]
fn deepseek_without_q_lora_uses_q_proj() {
    let text =
        read_model("deepseek-v3.json").replace("\"q_lora_rank\": 1536", "\"q_lora_rank\": null");
    let ir = ModelIr::from_hf_config_str(&text, "ds.json", ModelOptions::default()).unwrap();
    assert_eq!(
        shape(&ir, "model.layers.0.self_attn.q_proj.weight"),
        [24_576, 7168]
    );
    assert!(
        ir.param("model.layers.0.self_attn.q_a_proj.weight")
            .is_none()
    );
}

// ---------------------------------------------------------------- compact descriptions

#[test]
fn compact_7bv2_is_about_7b_with_39_layers_and_4_mtp() {
    let ir = load("7bv2-dense.toml");
    assert_eq!(ir.name, "7bv2-dense");
    assert_eq!(ir.config.num_hidden_layers, 39);
    assert_eq!(ir.config.mtp_layers, 4);
    assert!(
        ir.config.num_key_value_heads < ir.config.num_attention_heads,
        "GQA"
    );
    assert!(ir.config.sliding_window.is_some(), "SWA");
    let total = ir.total_params() as f64;
    assert!((total / 7.0e9 - 1.0).abs() < 0.01, "{total}");
    let mtp = load_with("7bv2-dense.toml", with_mtp());
    assert_eq!(mtp.num_layers_total(), 43);
    assert!(mtp.param("model.layers.42.eh_proj.weight").is_some());
    assert!(
        mtp.param("model.layers.42.self_attn.q_norm.weight")
            .is_some()
    );
    assert!(
        mtp.param("model.layers.42.shared_head.head.weight")
            .is_none()
    );
}

#[test]
fn compact_505b_is_about_505b_with_mla_and_384_experts() {
    let ir = load("505b-moe.toml");
    assert_eq!(ir.config.num_hidden_layers, 51);
    assert!(ir.config.mla.is_some());
    let moe = ir.config.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token), (384, 8));
    let total = ir.total_params() as f64;
    assert!((total / 505.0e9 - 1.0).abs() < 0.01, "{total}");
    assert_eq!(
        shape(&ir, "model.layers.50.mlp.experts.gate_up_proj"),
        [384, 2816, 6144]
    );
    assert!(
        ir.param("model.layers.50.mlp.gate.e_score_correction_bias")
            .is_some()
    );
}

#[test]
fn compact_and_hf_descriptions_of_the_same_model_agree() {
    let compact = r#"
name = "qwen3-30b-a3b"
family = "qwen3_moe"
hidden_size = 2048
num_hidden_layers = 48
num_attention_heads = 32
num_key_value_heads = 4
head_dim = 128
vocab_size = 151936
intermediate_size = 6144

[moe]
num_experts = 128
experts_per_token = 8
moe_intermediate_size = 768
"#;
    let a = ModelIr::from_compact_toml_str(compact, "q.toml", ModelOptions::default()).unwrap();
    let b = load("qwen3-30b-a3b.json");
    assert_eq!(a.params, b.params);
    assert_eq!(a.config, b.config);
}

// ---------------------------------------------------------------- bad inputs

#[test]
fn unsupported_model_type_lists_supported_ones() {
    let text = read_model("llama-3-8b.json").replace("\"llama\"", "\"mistral\"");
    let (file, msg) = model_error(
        ModelIr::from_hf_config_str(&text, "mistral.json", ModelOptions::default()).unwrap_err(),
    );
    assert_eq!(file, "mistral.json");
    assert!(msg.contains("\"mistral\""), "{msg}");
    assert!(
        msg.contains("llama, qwen3, qwen3_moe, deepseek_v3"),
        "{msg}"
    );
    assert!(msg.contains("line 14"), "{msg}");
}

#[test]
fn missing_key_names_file_and_key() {
    let text = read_model("deepseek-v3.json").replace("\"kv_lora_rank\": 512,", "");
    let (file, msg) = model_error(
        ModelIr::from_hf_config_str(&text, "ds.json", ModelOptions::default()).unwrap_err(),
    );
    assert_eq!(file, "ds.json");
    assert!(
        msg.contains("missing required key \"kv_lora_rank\""),
        "{msg}"
    );
}

#[test]
fn wrong_type_names_file_key_line_and_column() {
    let text =
        read_model("qwen3-30b-a3b.json").replace("\"num_experts\": 128", "\"num_experts\": 12.5");
    let (file, msg) = model_error(
        ModelIr::from_hf_config_str(&text, "q.json", ModelOptions::default()).unwrap_err(),
    );
    assert_eq!(file, "q.json");
    assert!(
        msg.contains("key \"num_experts\" at line 22, column 3"),
        "{msg}"
    );
    assert!(msg.contains("12.5"), "{msg}");
}

#[test]
fn file_errors_name_the_path() {
    let path = models_dir().join("no-such-model.json");
    let (file, msg) = model_error(ModelIr::load(&path, ModelOptions::default()).unwrap_err());
    assert!(file.ends_with("no-such-model.json"));
    assert!(msg.contains("cannot read"));
    let (_, msg) =
        model_error(ModelIr::load(Path::new("m.yaml"), ModelOptions::default()).unwrap_err());
    assert!(msg.contains(".json") && msg.contains(".toml"), "{msg}");
}

#[test]
fn unknown_key_in_compact_toml_names_file_line_and_key() {
    let text = read_model("505b-moe.toml").replace("kv_lora_rank = 512", "kv_lora_rnk = 512");
    let (file, msg) = model_error(
        ModelIr::from_compact_toml_str(&text, "505b-moe.toml", ModelOptions::default())
            .unwrap_err(),
    );
    assert_eq!(file, "505b-moe.toml");
    assert!(msg.contains("kv_lora_rnk"), "{msg}");
    assert!(msg.contains("line 30"), "{msg}");
}

#[test]
fn missing_and_mistyped_compact_keys_are_errors() {
    let text = read_model("7bv2-dense.toml").replace("vocab_size = 151936\n", "");
    let (_, msg) = model_error(
        ModelIr::from_compact_toml_str(&text, "7b.toml", ModelOptions::default()).unwrap_err(),
    );
    assert!(msg.contains("vocab_size"), "{msg}");
    let text = read_model("7bv2-dense.toml").replace("hidden_size = 4096", "hidden_size = -4096");
    let (_, msg) = model_error(
        ModelIr::from_compact_toml_str(&text, "7b.toml", ModelOptions::default()).unwrap_err(),
    );
    assert!(msg.contains("line 12"), "{msg}");
}

#[test]
fn garbage_inputs_never_panic() {
    let inputs = [
        "",
        "{",
        "null",
        "{\"model_type\": 3}",
        "{\"model_type\": \"llama\"}",
        "{\"model_type\": \"llama\", \"hidden_size\": 0, \"intermediate_size\": 1, \"num_attention_heads\": 1, \"num_hidden_layers\": 1, \"vocab_size\": 1}",
        "{\"model_type\": \"llama\", \"hidden_size\": 18446744073709551615, \"intermediate_size\": 18446744073709551615, \"num_attention_heads\": 1, \"num_hidden_layers\": 1, \"vocab_size\": 18446744073709551615}",
        "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 8, \"intermediate_size\": 8, \"head_dim\": 2, \"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"vocab_size\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 9, \"moe_intermediate_size\": 4}",
        "{\"model_type\": \"llama\", \"hidden_size\": 8, \"intermediate_size\": 8, \"num_attention_heads\": 3, \"num_hidden_layers\": 1, \"vocab_size\": 8}",
        "{\"model_type\": \"llama\", \"hidden_size\": 8, \"intermediate_size\": 8, \"num_attention_heads\": 2, \"num_hidden_layers\": 99999999999, \"vocab_size\": 8}",
    ];
    for text in inputs {
        let err = ModelIr::from_hf_config_str(text, "g.json", ModelOptions::default()).unwrap_err();
        let (file, _) = model_error(err);
        assert_eq!(file, "g.json", "{text}");
        assert!(ModelIr::from_compact_toml_str(text, "g.toml", ModelOptions::default()).is_err());
    }
}

// ---------------------------------------------------------------- compute

fn sum_kind(layer: &LayerCompute, kinds: &[ComputeKind]) -> f64 {
    layer
        .ops
        .iter()
        .filter(|o| kinds.contains(&o.kind))
        .map(|o| o.fwd_flops_per_token)
        .sum()
}

const LINEAR: &[ComputeKind] = &[
    ComputeKind::Matmul,
    ComputeKind::ExpertMatmul,
    ComputeKind::Router,
];

/// `active_params` minus the embedding table and every 1-D parameter (norms, router bias):
/// what the linear layers of the forward pass multiply per token.
fn active_matmul_params(ir: &ModelIr) -> f64 {
    let embed = ir.param("model.embed_tokens.weight").unwrap().numel();
    let one_d: u64 = ir
        .params
        .iter()
        .filter(|p| p.shape.len() == 1)
        .map(|p| p.numel())
        .sum();
    (ir.active_params() - embed - one_d) as f64
}

#[test]
fn llama_compute_matches_hand_calculation() {
    let ir = load("llama-3-8b.json");
    let profile = ir.compute_profile(4096);
    assert_eq!(profile.len(), 1 + 32 + 1);
    assert_eq!(profile[0].name, "model.embed_tokens");
    assert_eq!(profile[1].name, "model.layers.0");
    assert_eq!(profile[1].layer, Some(0));
    assert_eq!(profile[33].name, "lm_head");
    let layer = &profile[5];
    let linear = 2.0 * (4096.0 * 4096.0 * 2.0 + 4096.0 * 1024.0 * 2.0 + 3.0 * 4096.0 * 14336.0);
    assert_eq!(sum_kind(layer, &[ComputeKind::Matmul]), linear);
    let attention = 2.0 * 32.0 * 128.0 * 2048.5 * 2.0;
    assert_eq!(sum_kind(layer, &[ComputeKind::Attention]), attention);
    assert_eq!(
        sum_kind(&profile[33], &[ComputeKind::Matmul]),
        2.0 * 4096.0 * 128_256.0
    );
    assert_eq!(profile[0].fwd_flops_per_token(), 0.0);
    // Every op moves some activation bytes; q_proj reads H and writes H elements of 2 bytes.
    let q = layer
        .ops
        .iter()
        .find(|o| o.name == "model.layers.4.self_attn.q_proj")
        .unwrap();
    assert_eq!(q.fwd_bytes_per_token, 2.0 * (4096.0 + 4096.0));
    assert!(layer.ops.iter().all(|o| o.fwd_bytes_per_token > 0.0));
}

#[test]
fn linear_flops_are_twice_the_active_matmul_params() {
    for file in [
        "llama-3-8b.json",
        "qwen3-14b.json",
        "qwen3-30b-a3b.json",
        "deepseek-v3.json",
        "505b-moe.toml",
    ] {
        let ir = load(file);
        let profile = ir.compute_profile(4096);
        let linear: f64 = profile.iter().map(|l| sum_kind(l, LINEAR)).sum();
        assert_eq!(linear, 2.0 * active_matmul_params(&ir), "{file}");
        // Forward ~ 2 * (active params without the embedding lookup table) per token, plus
        // attention, plus a little element-wise work.
        let total: f64 = profile.iter().map(LayerCompute::fwd_flops_per_token).sum();
        let attention: f64 = profile
            .iter()
            .map(|l| sum_kind(l, &[ComputeKind::Attention]))
            .sum();
        let embed = ir.param("model.embed_tokens.weight").unwrap().numel() as f64;
        let ratio = (total - attention) / (2.0 * (ir.active_params() as f64 - embed));
        assert!((1.0..1.01).contains(&ratio), "{file}: {ratio}");
    }
}

#[test]
fn moe_compute_counts_only_activated_experts() {
    let ir = load("qwen3-30b-a3b.json");
    let layer = &ir.compute_profile(4096)[10];
    let experts = sum_kind(layer, &[ComputeKind::ExpertMatmul]);
    assert_eq!(experts, 8.0 * 3.0 * 2.0 * 2048.0 * 768.0);
    assert_eq!(
        sum_kind(layer, &[ComputeKind::Router]),
        2.0 * 2048.0 * 128.0
    );
    // 32 heads x 128 for scores and for values over the causal average context.
    assert_eq!(
        sum_kind(layer, &[ComputeKind::Attention]),
        4.0 * 32.0 * 128.0 * 2048.5
    );
}

#[test]
fn mla_compute_uses_its_projections() {
    let ir = load("deepseek-v3.json");
    let profile = ir.compute_profile(4096);
    let dense = &profile[1];
    let mla = 2.0
        * (7168.0 * 1536.0
            + 1536.0 * 128.0 * 192.0
            + 7168.0 * 576.0
            + 512.0 * 128.0 * 256.0
            + 128.0 * 128.0 * 7168.0);
    let mlp = 2.0 * 3.0 * 7168.0 * 18432.0;
    assert_eq!(sum_kind(dense, &[ComputeKind::Matmul]), mla + mlp);
    let attention = 2.0 * 128.0 * 192.0 * 2048.5 + 2.0 * 128.0 * 128.0 * 2048.5;
    assert_eq!(sum_kind(dense, &[ComputeKind::Attention]), attention);
    let moe = &profile[4];
    let shared = 2.0 * 3.0 * 7168.0 * 2048.0;
    assert_eq!(sum_kind(moe, &[ComputeKind::Matmul]), mla + shared);
    assert_eq!(
        sum_kind(moe, &[ComputeKind::ExpertMatmul]),
        8.0 * 2.0 * 3.0 * 7168.0 * 2048.0
    );
}

#[test]
fn mtp_and_sliding_window_in_compute() {
    let ir = load_with("deepseek-v3.json", with_mtp());
    let profile = ir.compute_profile(4096);
    assert_eq!(profile.len(), 1 + 62 + 1);
    let mtp = &profile[62];
    assert_eq!(mtp.name, "model.layers.61");
    assert!(mtp.ops.iter().any(|o| o.name == "model.layers.61.eh_proj"));
    assert!(mtp.ops.iter().any(|o| o.kind == ComputeKind::Loss));
    assert!(mtp.fwd_flops_per_token() > profile[61].fwd_flops_per_token());

    let swa = load("7bv2-dense.toml");
    let window = swa.config.sliding_window.unwrap();
    let layer = &swa.compute_profile(4096)[1];
    let ctx = avg_causal_context(4096, Some(window));
    assert!(ctx < 2048.5);
    assert_eq!(
        sum_kind(layer, &[ComputeKind::Attention]),
        4.0 * 32.0 * 128.0 * ctx
    );
}
