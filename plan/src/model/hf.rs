//! Reads an HF `config.json` (`model_type` `llama`, `qwen3`, `qwen3_moe`, `deepseek_v3`) into a
//! normalized [`ModelConfig`].
//!
//! HF configs carry many keys the IR does not need (token ids, rope scaling, quantization...):
//! those are ignored. Keys that decide parameter shapes are required; a missing key or a value
//! of the wrong type is an error naming the file, the key and (where it exists) its line and
//! column. Defaults follow transformers only where the key is commonly absent from real configs
//! (`num_key_value_heads`, Llama `head_dim`, `tie_word_embeddings`, `decoder_sparse_step`...).

use serde_json::{Map, Value};

use super::{MlaConfig, ModelConfig, ModelFamily, MoeConfig};
use crate::error::{PlanError, PlanResult};

/// Parses `text` (the contents of `file`) into a validated [`ModelConfig`].
pub(crate) fn parse_hf_config(text: &str, file: &str) -> PlanResult<ModelConfig> {
    let model_err = |message: String| PlanError::Model {
        file: file.to_string(),
        message,
    };
    let value: Value =
        serde_json::from_str(text).map_err(|e| model_err(format!("not valid JSON: {e}")))?;
    let Value::Object(map) = &value else {
        return Err(model_err(
            "the top level must be a JSON object (an HF config.json)".into(),
        ));
    };
    let fields = Fields {
        text,
        file,
        map,
        model_type: "",
    };
    let model_type = fields.req_str("model_type")?;
    let Some(family) = ModelFamily::from_model_type(model_type) else {
        let supported: Vec<&str> = ModelFamily::all().iter().map(|f| f.model_type()).collect();
        return Err(fields.key_err(
            "model_type",
            &format!(
                "unsupported model_type {model_type:?}; supported: {}",
                supported.join(", ")
            ),
        ));
    };
    let fields = Fields {
        model_type,
        ..fields
    };
    let config = match family {
        ModelFamily::Llama => parse_llama(&fields)?,
        ModelFamily::Qwen3 | ModelFamily::Qwen3Moe => parse_qwen3(&fields, family)?,
        ModelFamily::DeepseekV3 => parse_deepseek_v3(&fields)?,
    };
    config.validate().map_err(model_err)?;
    Ok(config)
}

/// Fields shared by every family: dims, vocabulary, tying, architecture.
struct Common {
    architecture: String,
    hidden_size: u64,
    num_hidden_layers: usize,
    num_attention_heads: u64,
    num_key_value_heads: u64,
    vocab_size: u64,
    tie_word_embeddings: bool,
}

fn parse_common(f: &Fields<'_>, family: ModelFamily) -> PlanResult<Common> {
    let num_attention_heads = f.req_u64("num_attention_heads")?;
    // Bounded before any per-layer list is built from it (a huge count would loop for hours).
    let num_hidden_layers = f.req_usize("num_hidden_layers")?;
    crate::limits::MODEL_LAYERS
        .check_usize(num_hidden_layers)
        .map_err(|e| f.key_err("num_hidden_layers", &e))?;
    Ok(Common {
        architecture: f
            .architecture()?
            .unwrap_or_else(|| family.default_architecture().to_string()),
        hidden_size: f.req_u64("hidden_size")?,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads: f
            .opt_u64("num_key_value_heads")?
            .unwrap_or(num_attention_heads),
        vocab_size: f.req_u64("vocab_size")?,
        tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
    })
}

fn dense_config(
    family: ModelFamily,
    c: Common,
    intermediate_size: u64,
    head_dim: u64,
) -> ModelConfig {
    ModelConfig {
        family,
        architecture: c.architecture,
        hidden_size: c.hidden_size,
        intermediate_size,
        num_hidden_layers: c.num_hidden_layers,
        num_attention_heads: c.num_attention_heads,
        num_key_value_heads: c.num_key_value_heads,
        head_dim,
        vocab_size: c.vocab_size,
        tie_word_embeddings: c.tie_word_embeddings,
        sliding_window: None,
        mtp_layers: 0,
        mtp_own_embeddings: false,
        moe: None,
        mla: None,
    }
}

fn parse_llama(f: &Fields<'_>) -> PlanResult<ModelConfig> {
    f.reject_true("attention_bias", "the IR has no attention bias parameters")?;
    f.reject_true("mlp_bias", "the IR has no MLP bias parameters")?;
    let c = parse_common(f, ModelFamily::Llama)?;
    let head_dim = match f.opt_u64("head_dim")? {
        Some(d) => d,
        None => {
            if c.num_attention_heads == 0 || !c.hidden_size.is_multiple_of(c.num_attention_heads) {
                return Err(f.key_err(
                    "num_attention_heads",
                    &format!(
                        "hidden_size {} is not a multiple of num_attention_heads {}; give head_dim explicitly",
                        c.hidden_size, c.num_attention_heads
                    ),
                ));
            }
            c.hidden_size / c.num_attention_heads
        }
    };
    let intermediate = f.req_u64("intermediate_size")?;
    Ok(dense_config(ModelFamily::Llama, c, intermediate, head_dim))
}

fn parse_qwen3(f: &Fields<'_>, family: ModelFamily) -> PlanResult<ModelConfig> {
    f.reject_true("attention_bias", "the IR has no attention bias parameters")?;
    let c = parse_common(f, family)?;
    let layers = c.num_hidden_layers;
    let head_dim = f.req_u64("head_dim")?;
    let intermediate = f.req_u64("intermediate_size")?;
    let sliding_window = if f.opt_bool("use_sliding_window")?.unwrap_or(false) {
        Some(f.req_u64("sliding_window")?)
    } else {
        None
    };
    let mut config = dense_config(family, c, intermediate, head_dim);
    config.sliding_window = sliding_window;
    if family == ModelFamily::Qwen3Moe {
        let num_experts = match f.opt_u64("num_experts")? {
            Some(n) => n,
            None => f.req_u64_named("num_local_experts", "num_experts")?,
        };
        let step = f.opt_u64("decoder_sparse_step")?.unwrap_or(1);
        if step == 0 {
            return Err(f.key_err("decoder_sparse_step", "must be at least 1"));
        }
        // A set: a file may repeat indices (millions of them within the file cap).
        let mlp_only: std::collections::BTreeSet<usize> =
            f.opt_index_list("mlp_only_layers")?.into_iter().collect();
        if let Some(&bad) = mlp_only.iter().find(|&&l| l >= layers) {
            return Err(f.key_err(
                "mlp_only_layers",
                &format!("layer index {bad} is out of range 0..{layers}"),
            ));
        }
        // transformers: a layer is sparse iff not in mlp_only_layers and (i+1) % step == 0.
        let extra_dense_layers = (0..layers)
            .filter(|&l| mlp_only.contains(&l) || !(l as u64 + 1).is_multiple_of(step))
            .collect();
        config.moe = Some(MoeConfig {
            num_experts,
            experts_per_token: f.req_u64("num_experts_per_tok")?,
            moe_intermediate_size: f.req_u64("moe_intermediate_size")?,
            shared_experts: 0,
            first_dense_layers: 0,
            extra_dense_layers,
            router_correction_bias: false,
        });
    }
    Ok(config)
}

fn parse_deepseek_v3(f: &Fields<'_>) -> PlanResult<ModelConfig> {
    f.reject_true("attention_bias", "the IR has no attention bias parameters")?;
    let c = parse_common(f, ModelFamily::DeepseekV3)?;
    let layers = c.num_hidden_layers;
    let mla = MlaConfig {
        q_lora_rank: f.nullable_u64("q_lora_rank")?,
        kv_lora_rank: f.req_u64("kv_lora_rank")?,
        qk_rope_head_dim: f.req_u64("qk_rope_head_dim")?,
        qk_nope_head_dim: f.req_u64("qk_nope_head_dim")?,
        v_head_dim: f.req_u64("v_head_dim")?,
    };
    let head_dim = mla.qk_nope_head_dim.saturating_add(mla.qk_rope_head_dim);
    let intermediate = f.req_u64("intermediate_size")?;
    let mut config = dense_config(ModelFamily::DeepseekV3, c, intermediate, head_dim);
    config.mla = Some(mla);
    config.mtp_layers = f.opt_usize("num_nextn_predict_layers")?.unwrap_or(0);
    config.mtp_own_embeddings = true;
    if let Some(num_experts) = f.nullable_u64("n_routed_experts")? {
        let first_dense = f.req_usize("first_k_dense_replace")?;
        let freq = f.opt_u64("moe_layer_freq")?.unwrap_or(1);
        if freq == 0 {
            return Err(f.key_err("moe_layer_freq", "must be at least 1"));
        }
        // transformers: a layer is sparse iff i >= first_k_dense_replace and i % moe_layer_freq == 0.
        let extra_dense_layers = (first_dense.min(layers)..layers)
            .filter(|&l| !(l as u64).is_multiple_of(freq))
            .collect();
        config.moe = Some(MoeConfig {
            num_experts,
            experts_per_token: f.req_u64("num_experts_per_tok")?,
            moe_intermediate_size: f.req_u64("moe_intermediate_size")?,
            shared_experts: f.nullable_u64("n_shared_experts")?.unwrap_or(0),
            first_dense_layers: first_dense,
            extra_dense_layers,
            router_correction_bias: true,
        });
    }
    Ok(config)
}

/// Typed, key-naming access to the top-level object of a config file.
struct Fields<'a> {
    text: &'a str,
    file: &'a str,
    map: &'a Map<String, Value>,
    model_type: &'a str,
}

impl Fields<'_> {
    /// An error about `key`, with the key's line and column when it is present in the text.
    fn key_err(&self, key: &str, what: &str) -> PlanError {
        let at = locate_top_level_key(self.text, key)
            .map(|(line, col)| format!(" at line {line}, column {col}"))
            .unwrap_or_default();
        PlanError::Model {
            file: self.file.to_string(),
            message: format!("key \"{key}\"{at}: {what}"),
        }
    }

    fn missing(&self, key: &str) -> PlanError {
        let context = if self.model_type.is_empty() {
            String::new()
        } else {
            format!(" (needed for model_type \"{}\")", self.model_type)
        };
        PlanError::Model {
            file: self.file.to_string(),
            message: format!("missing required key \"{key}\"{context}"),
        }
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &Value) -> PlanError {
        self.key_err(
            key,
            &format!("expected {expected}, found {}", describe(found)),
        )
    }

    /// The value of `key`, treating JSON `null` as absent.
    fn present(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn req_str(&self, key: &str) -> PlanResult<&str> {
        match self.present(key) {
            None => Err(self.missing(key)),
            Some(Value::String(s)) => Ok(s),
            Some(other) => Err(self.wrong_type(key, "a string", other)),
        }
    }

    fn as_u64(&self, key: &str, value: &Value) -> PlanResult<u64> {
        value
            .as_u64()
            .ok_or_else(|| self.wrong_type(key, "a non-negative integer", value))
    }

    fn opt_u64(&self, key: &str) -> PlanResult<Option<u64>> {
        self.present(key).map(|v| self.as_u64(key, v)).transpose()
    }

    fn req_u64(&self, key: &str) -> PlanResult<u64> {
        self.opt_u64(key)?.ok_or_else(|| self.missing(key))
    }

    /// `key` is required; `missing_as` is the name reported when neither form is present.
    fn req_u64_named(&self, key: &str, missing_as: &str) -> PlanResult<u64> {
        self.opt_u64(key)?.ok_or_else(|| self.missing(missing_as))
    }

    /// A key that must be present but may be `null` (`q_lora_rank`, `n_shared_experts`).
    fn nullable_u64(&self, key: &str) -> PlanResult<Option<u64>> {
        if !self.map.contains_key(key) {
            return Err(self.missing(key));
        }
        self.opt_u64(key)
    }

    fn to_usize(&self, key: &str, value: u64) -> PlanResult<usize> {
        usize::try_from(value).map_err(|_| self.key_err(key, &format!("{value} is too large")))
    }

    fn opt_usize(&self, key: &str) -> PlanResult<Option<usize>> {
        self.opt_u64(key)?
            .map(|v| self.to_usize(key, v))
            .transpose()
    }

    fn req_usize(&self, key: &str) -> PlanResult<usize> {
        let v = self.req_u64(key)?;
        self.to_usize(key, v)
    }

    fn opt_bool(&self, key: &str) -> PlanResult<Option<bool>> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong_type(key, "true or false", other)),
        }
    }

    /// Errors when boolean `key` is `true`: a feature whose parameters the IR does not model.
    fn reject_true(&self, key: &str, why: &str) -> PlanResult<()> {
        if self.opt_bool(key)? == Some(true) {
            return Err(self.key_err(key, &format!("true is not supported: {why}")));
        }
        Ok(())
    }

    fn opt_index_list(&self, key: &str) -> PlanResult<Vec<usize>> {
        let Some(value) = self.present(key) else {
            return Ok(Vec::new());
        };
        let expected = "an array of layer indices";
        let Value::Array(items) = value else {
            return Err(self.wrong_type(key, expected, value));
        };
        items
            .iter()
            .map(|item| {
                let v = item
                    .as_u64()
                    .ok_or_else(|| self.wrong_type(key, expected, item))?;
                self.to_usize(key, v)
            })
            .collect()
    }

    /// `architectures[0]`, if the key is present.
    fn architecture(&self) -> PlanResult<Option<String>> {
        let Some(value) = self.present("architectures") else {
            return Ok(None);
        };
        let expected = "an array of class-name strings";
        let Value::Array(items) = value else {
            return Err(self.wrong_type("architectures", expected, value));
        };
        match items.first() {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.wrong_type("architectures", expected, other)),
        }
    }
}

/// A short description of a JSON value for error messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// 1-based (line, column) of the first occurrence of `key` as a key of the top-level object.
///
/// `text` must be valid JSON (it has already been parsed).
fn locate_top_level_key(text: &str, key: &str) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut line = 1usize;
    let mut line_start = 0usize;
    let mut i = 0usize;
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => {
                line += 1;
                line_start = i + 1;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                let content = text.get(start + 1..i)?;
                if depth == 1 && content == key && text.get(i + 1..)?.trim_start().starts_with(':')
                {
                    let column = text.get(line_start..start)?.chars().count() + 1;
                    return Some((line, column));
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY_LLAMA: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_attention_heads": 4,
  "num_hidden_layers": 2,
  "num_key_value_heads": 2,
  "rope_scaling": {"hidden_size": "not the top level"},
  "vocab_size": 100
}"#;

    fn message(err: PlanError) -> String {
        match err {
            PlanError::Model { file, message } => format!("{file}: {message}"),
            other => panic!("expected a model error, got {other:?}"),
        }
    }

    #[test]
    fn llama_defaults_head_dim_and_ignores_unknown_keys() {
        let c = parse_hf_config(TINY_LLAMA, "tiny.json").unwrap();
        assert_eq!(c.family, ModelFamily::Llama);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.num_key_value_heads, 2);
        assert!(!c.tie_word_embeddings);
    }

    #[test]
    fn locates_top_level_keys_only() {
        assert_eq!(
            locate_top_level_key(TINY_LLAMA, "hidden_size"),
            Some((4, 3))
        );
        assert_eq!(
            locate_top_level_key(TINY_LLAMA, "vocab_size"),
            Some((10, 3))
        );
        assert_eq!(locate_top_level_key(TINY_LLAMA, "not the top level"), None);
        assert_eq!(
            locate_top_level_key(r#"{"a\"b": 1, "c": 2}"#, "c"),
            Some((1, 13))
        );
    }

    #[test]
    fn wrong_type_names_key_and_position() {
        let text = TINY_LLAMA.replace("\"hidden_size\": 64", "\"hidden_size\": \"64\"");
        let m = message(parse_hf_config(&text, "tiny.json").unwrap_err());
        assert!(
            m.starts_with("tiny.json: key \"hidden_size\" at line 4, column 3"),
            "{m}"
        );
        assert!(m.contains("string \"64\""), "{m}");
    }

    #[test]
    fn missing_key_is_named() {
        let text = TINY_LLAMA.replace("\"vocab_size\": 100", "\"vocab\": 100");
        let m = message(parse_hf_config(&text, "tiny.json").unwrap_err());
        assert!(m.contains("missing required key \"vocab_size\""), "{m}");
        assert!(m.contains("llama"), "{m}");
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        let m = message(
            parse_hf_config("{\n  \"model_type\": \"llama\",,\n}", "bad.json").unwrap_err(),
        );
        assert!(m.contains("line 2 column"), "{m}");
    }

    #[test]
    fn unsupported_model_type_lists_supported() {
        let text = TINY_LLAMA.replace("\"llama\"", "\"mistral\"");
        let m = message(parse_hf_config(&text, "m.json").unwrap_err());
        assert!(
            m.contains("mistral") && m.contains("llama, qwen3, qwen3_moe, deepseek_v3"),
            "{m}"
        );
    }

    #[test]
    fn attention_bias_true_is_rejected() {
        let text = TINY_LLAMA.replace("\"model_type\"", "\"attention_bias\": true, \"model_type\"");
        let m = message(parse_hf_config(&text, "b.json").unwrap_err());
        assert!(m.contains("attention_bias"), "{m}");
    }

    #[test]
    fn non_object_top_level_is_rejected() {
        assert!(message(parse_hf_config("[1, 2]", "a.json").unwrap_err()).contains("JSON object"));
    }
}
