//! Compact TOML model description, for models that have no public HF `config.json`.
//!
//! The description gives the dimensions directly and names a `family`, which decides the
//! parameter naming scheme (`llama`, `qwen3`, `qwen3_moe` or `deepseek_v3`, exactly as for an
//! HF config of that `model_type`). Unknown keys are errors (typos must not silently change a
//! model); the message carries the file, line, column and key.
//!
//! ```toml
//! name = "505b-moe"                  # display name (required)
//! family = "deepseek_v3"             # naming scheme: llama | qwen3 | qwen3_moe | deepseek_v3
//! architecture = "DeepseekV3ForCausalLM"  # optional; default: the family's HF class
//! hidden_size = 6144
//! num_hidden_layers = 51
//! num_attention_heads = 64
//! num_key_value_heads = 64           # optional; default num_attention_heads (GQA when smaller)
//! head_dim = 128                     # optional; default hidden_size / num_attention_heads
//!                                    # (ignored with [mla]: the head dims come from there)
//! vocab_size = 129280
//! intermediate_size = 18432          # dense MLP (and dense layers of MoE models)
//! tie_word_embeddings = false        # optional; default false
//! sliding_window = 4096              # optional; every layer attends to at most this many tokens
//! mtp_layers = 0                     # optional; multi-token-prediction layers, default 0
//! mtp_own_embeddings = true          # optional; MTP layers store their own embed/head copies
//!                                    # (DeepSeek-V3 checkpoints do); default true for
//!                                    # deepseek_v3, false otherwise (as HF configs give)
//!
//! [moe]                              # optional; required for qwen3_moe
//! num_experts = 384                  # routed experts per MoE layer
//! experts_per_token = 8              # top-k
//! moe_intermediate_size = 1408       # one routed expert's intermediate size
//! shared_experts = 1                 # optional; default 0 (intermediate = moe size x count)
//! first_dense_layers = 1             # optional; leading dense layers, default 0
//! dense_layers = []                  # optional; further dense layer indices, default []
//! router_correction_bias = true      # optional; `gate.e_score_correction_bias` buffer,
//!                                    # default true for deepseek_v3, false otherwise
//!
//! [mla]                              # required for deepseek_v3, not allowed otherwise
//! q_lora_rank = 1536                 # optional; omit for a plain q_proj
//! kv_lora_rank = 512
//! qk_rope_head_dim = 64
//! qk_nope_head_dim = 128
//! v_head_dim = 128
//! ```

use serde::Deserialize;

use super::{MlaConfig, ModelConfig, ModelFamily, MoeConfig};
use crate::error::{PlanError, PlanResult};

/// The top-level table of a compact description.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompactModel {
    name: String,
    family: ModelFamily,
    architecture: Option<String>,
    hidden_size: u64,
    num_hidden_layers: usize,
    num_attention_heads: u64,
    num_key_value_heads: Option<u64>,
    head_dim: Option<u64>,
    vocab_size: u64,
    intermediate_size: u64,
    #[serde(default)]
    tie_word_embeddings: bool,
    sliding_window: Option<u64>,
    #[serde(default)]
    mtp_layers: usize,
    mtp_own_embeddings: Option<bool>,
    moe: Option<CompactMoe>,
    mla: Option<CompactMla>,
}

/// The `[moe]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompactMoe {
    num_experts: u64,
    experts_per_token: u64,
    moe_intermediate_size: u64,
    #[serde(default)]
    shared_experts: u64,
    #[serde(default)]
    first_dense_layers: usize,
    #[serde(default)]
    dense_layers: Vec<usize>,
    router_correction_bias: Option<bool>,
}

/// The `[mla]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompactMla {
    q_lora_rank: Option<u64>,
    kv_lora_rank: u64,
    qk_rope_head_dim: u64,
    qk_nope_head_dim: u64,
    v_head_dim: u64,
}

/// Parses a compact description (`text`, the contents of `file`) into its name and a validated
/// [`ModelConfig`].
pub(crate) fn parse_compact(text: &str, file: &str) -> PlanResult<(String, ModelConfig)> {
    let model_err = |message: String| PlanError::Model {
        file: file.to_string(),
        message,
    };
    let raw: CompactModel =
        toml::from_str(text).map_err(|e| model_err(e.to_string().trim_end().to_string()))?;
    let head_dim = match (&raw.mla, raw.head_dim) {
        (Some(mla), _) => mla.qk_nope_head_dim.saturating_add(mla.qk_rope_head_dim),
        (None, Some(d)) => d,
        (None, None) => {
            if raw.num_attention_heads == 0
                || !raw.hidden_size.is_multiple_of(raw.num_attention_heads)
            {
                return Err(model_err(format!(
                    "hidden_size {} is not a multiple of num_attention_heads {}; give head_dim explicitly",
                    raw.hidden_size, raw.num_attention_heads
                )));
            }
            raw.hidden_size / raw.num_attention_heads
        }
    };
    let family = raw.family;
    let moe = raw.moe.map(|m| {
        let mut extra = m.dense_layers;
        extra.sort_unstable();
        extra.dedup();
        extra.retain(|&l| l >= m.first_dense_layers);
        MoeConfig {
            num_experts: m.num_experts,
            experts_per_token: m.experts_per_token,
            moe_intermediate_size: m.moe_intermediate_size,
            shared_experts: m.shared_experts,
            first_dense_layers: m.first_dense_layers,
            extra_dense_layers: extra,
            router_correction_bias: m
                .router_correction_bias
                .unwrap_or(family == ModelFamily::DeepseekV3),
        }
    });
    let config = ModelConfig {
        family,
        architecture: raw
            .architecture
            .unwrap_or_else(|| family.default_architecture().to_string()),
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        num_hidden_layers: raw.num_hidden_layers,
        num_attention_heads: raw.num_attention_heads,
        num_key_value_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
        head_dim,
        vocab_size: raw.vocab_size,
        tie_word_embeddings: raw.tie_word_embeddings,
        sliding_window: raw.sliding_window,
        mtp_layers: raw.mtp_layers,
        mtp_own_embeddings: raw
            .mtp_own_embeddings
            .unwrap_or(family == ModelFamily::DeepseekV3),
        moe,
        mla: raw.mla.map(|m| MlaConfig {
            q_lora_rank: m.q_lora_rank,
            kv_lora_rank: m.kv_lora_rank,
            qk_rope_head_dim: m.qk_rope_head_dim,
            qk_nope_head_dim: m.qk_nope_head_dim,
            v_head_dim: m.v_head_dim,
        }),
    };
    config.validate().map_err(model_err)?;
    Ok((raw.name, config))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"
name = "tiny"
family = "qwen3_moe"
hidden_size = 64
num_hidden_layers = 4
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 32
vocab_size = 100
intermediate_size = 128

[moe]
num_experts = 8
experts_per_token = 2
moe_intermediate_size = 16
dense_layers = [2, 0, 2]
"#;

    fn message(err: PlanError) -> String {
        match err {
            PlanError::Model { file, message } => format!("{file}: {message}"),
            other => panic!("expected a model error, got {other:?}"),
        }
    }

    #[test]
    fn parses_with_defaults() {
        let (name, c) = parse_compact(TINY, "tiny.toml").unwrap();
        assert_eq!(name, "tiny");
        assert_eq!(c.architecture, "Qwen3MoeForCausalLM");
        assert_eq!(c.head_dim, 32);
        let moe = c.moe.as_ref().unwrap();
        assert_eq!(moe.extra_dense_layers, [0, 2]);
        assert!(!moe.router_correction_bias);
        assert!(c.is_moe_layer(1) && !c.is_moe_layer(2));
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let text = TINY.replace("vocab_size = 100", "vocab_sise = 100");
        let m = message(parse_compact(&text, "tiny.toml").unwrap_err());
        assert!(m.starts_with("tiny.toml: "), "{m}");
        assert!(m.contains("line 9") && m.contains("vocab_sise"), "{m}");
    }

    #[test]
    fn unknown_key_in_subtable_is_rejected() {
        let text = TINY.replace("experts_per_token", "experts_per_tok");
        let m = message(parse_compact(&text, "tiny.toml").unwrap_err());
        assert!(m.contains("experts_per_tok"), "{m}");
    }

    #[test]
    fn wrong_type_and_bad_family_are_errors() {
        let m = message(parse_compact(&TINY.replace("= 64", "= \"64\""), "t.toml").unwrap_err());
        assert!(m.contains("line 4"), "{m}");
        let m =
            message(parse_compact(&TINY.replace("qwen3_moe", "mixtral"), "t.toml").unwrap_err());
        assert!(m.contains("mixtral") && m.contains("deepseek_v3"), "{m}");
    }

    #[test]
    fn family_needs_its_tables() {
        let text = TINY.replace("family = \"qwen3_moe\"", "family = \"llama\"");
        let m = message(parse_compact(&text, "t.toml").unwrap_err());
        assert!(m.contains("qwen3_moe or deepseek_v3"), "{m}");
    }
}
