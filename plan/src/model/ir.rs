//! Building a [`ModelIr`] from a config (HF `config.json`, compact TOML or in memory) and the
//! queries on it: totals, parameter lookup, the module tree.

use std::collections::HashSet;
use std::path::Path;

use super::compact::parse_compact;
use super::hf::parse_hf_config;
use super::params::{build_params, is_routed_expert};
use super::{ModelConfig, ModelIr, ModelOptions, ParamSpec};
use crate::error::{PlanError, PlanResult};

impl ModelIr {
    /// Builds the IR of an in-memory `config` (validated first) under `options`.
    pub fn from_config(
        name: impl Into<String>,
        config: ModelConfig,
        options: ModelOptions,
    ) -> PlanResult<ModelIr> {
        let name = name.into();
        let label = format!("<config {name}>");
        config.validate().map_err(|message| PlanError::Model {
            file: label.clone(),
            message,
        })?;
        build(name, config, options, &label)
    }

    /// Parses an HF `config.json` text; `file_label` names it in errors and its stem names the
    /// model.
    pub fn from_hf_config_str(
        text: &str,
        file_label: &str,
        options: ModelOptions,
    ) -> PlanResult<ModelIr> {
        let config = parse_hf_config(text, file_label)?;
        build(stem(file_label), config, options, file_label)
    }

    /// Reads and parses an HF `config.json` file.
    pub fn from_hf_config_file(path: &Path, options: ModelOptions) -> PlanResult<ModelIr> {
        let text = read(path)?;
        Self::from_hf_config_str(&text, &path.display().to_string(), options)
    }

    /// Parses a compact TOML description (format: see [`crate::model::compact`]);
    /// `file_label` names it in errors, the description's `name` names the model.
    pub fn from_compact_toml_str(
        text: &str,
        file_label: &str,
        options: ModelOptions,
    ) -> PlanResult<ModelIr> {
        let (name, config) = parse_compact(text, file_label)?;
        build(name, config, options, file_label)
    }

    /// Reads and parses a compact TOML description file.
    pub fn from_compact_toml_file(path: &Path, options: ModelOptions) -> PlanResult<ModelIr> {
        let text = read(path)?;
        Self::from_compact_toml_str(&text, &path.display().to_string(), options)
    }

    /// Loads a model file by extension: `.json` is an HF `config.json`, `.toml` a compact
    /// description.
    pub fn load(path: &Path, options: ModelOptions) -> PlanResult<ModelIr> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("json") => Self::from_hf_config_file(path, options),
            Some("toml") => Self::from_compact_toml_file(path, options),
            _ => Err(PlanError::Model {
                file: path.display().to_string(),
                message: "unknown model file type; accepted: .json (HF config.json) or .toml (compact description)".into(),
            }),
        }
    }

    /// Total elements of every parameter and stored buffer (the router correction bias
    /// included), i.e. the checkpoint's parameter count.
    pub fn total_params(&self) -> u64 {
        self.params.iter().map(ParamSpec::numel).sum()
    }

    /// Parameters used per token: everything except routed experts, plus `experts_per_token`
    /// routed experts in each MoE layer. Embedding, head, norms, routers (and the correction
    /// bias), shared experts and included MTP layers count in full.
    pub fn active_params(&self) -> u64 {
        let (mut routed, mut other) = (0u128, 0u128);
        for p in &self.params {
            let n = u128::from(p.numel());
            if is_routed_expert(p) {
                routed += n;
            } else {
                other += n;
            }
        }
        let active_routed = match &self.config.moe {
            Some(moe) => routed * u128::from(moe.experts_per_token) / u128::from(moe.num_experts),
            None => routed,
        };
        u64::try_from(other + active_routed).unwrap_or(u64::MAX)
    }

    /// Elements of the parameters the optimizer updates (`trainable == true`).
    pub fn trainable_params(&self) -> u64 {
        self.params
            .iter()
            .filter(|p| p.trainable)
            .map(ParamSpec::numel)
            .sum()
    }

    /// Bytes of every parameter in its master dtype.
    pub fn total_param_bytes(&self) -> u64 {
        self.params
            .iter()
            .map(|p| p.numel() * p.dtype.bytes())
            .sum()
    }

    /// The parameter with fully qualified name `name` (linear scan).
    pub fn param(&self, name: &str) -> Option<&ParamSpec> {
        self.params.iter().find(|p| p.name == name)
    }

    /// Every module FQN that owns a parameter, plus all its ancestors (`model`, `model.layers`,
    /// `model.layers.0`, ...), in model order, without duplicates; the root `""` is not listed.
    pub fn modules(&self) -> Vec<String> {
        let mut seen: HashSet<&str> = HashSet::new();
        let mut out = Vec::new();
        for p in &self.params {
            let module = p.module();
            if module.is_empty() {
                continue;
            }
            let ancestors = module
                .match_indices('.')
                .map(|(i, _)| &module[..i])
                .chain(std::iter::once(module));
            for m in ancestors {
                if seen.insert(m) {
                    out.push(m.to_string());
                }
            }
        }
        out
    }

    /// Decoder layers in the IR: the main model's plus the MTP layers when included.
    pub fn num_layers_total(&self) -> usize {
        let mtp = if self.options.include_mtp {
            self.config.mtp_layers
        } else {
            0
        };
        self.config.num_hidden_layers + mtp
    }
}

/// Builds the parameter list of a validated config and checks that all counts fit in `u64`.
fn build(
    name: String,
    config: ModelConfig,
    options: ModelOptions,
    file: &str,
) -> PlanResult<ModelIr> {
    let params = build_params(&config, &options);
    let mut total: u64 = 0;
    for p in &params {
        let bytes = p
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .and_then(|n| n.checked_mul(p.dtype.bytes()));
        match bytes.and_then(|b| total.checked_add(b)) {
            Some(t) => total = t,
            None => {
                return Err(PlanError::Model {
                    file: file.to_string(),
                    message: format!(
                        "parameter {} {:?} makes the model's size overflow 64 bits; check the dimensions",
                        p.name, p.shape
                    ),
                });
            }
        }
    }
    Ok(ModelIr {
        name,
        config,
        options,
        params,
    })
}

fn read(path: &Path) -> PlanResult<String> {
    crate::input_file::read_text(path, &crate::limits::MODEL_FILE).map_err(|e| PlanError::Model {
        file: e.file,
        message: format!("cannot read the file: {}", e.reason),
    })
}

/// The file stem of a label (`dir/qwen3-14b.json` -> `qwen3-14b`), or the label itself.
fn stem(label: &str) -> String {
    Path::new(label)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(label)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"
name = "tiny-moe"
family = "deepseek_v3"
hidden_size = 32
num_hidden_layers = 3
num_attention_heads = 2
vocab_size = 50
intermediate_size = 64
mtp_layers = 1

[moe]
num_experts = 4
experts_per_token = 2
moe_intermediate_size = 8
shared_experts = 1
first_dense_layers = 1

[mla]
kv_lora_rank = 16
qk_rope_head_dim = 4
qk_nope_head_dim = 8
v_head_dim = 8
"#;

    #[test]
    fn stem_of_labels() {
        assert_eq!(stem("a/b/qwen3-14b.json"), "qwen3-14b");
        assert_eq!(stem("<inline>"), "<inline>");
    }

    #[test]
    fn modules_list_ancestors_once_in_order() {
        let ir =
            ModelIr::from_compact_toml_str(TINY, "tiny.toml", ModelOptions::default()).unwrap();
        let m = ir.modules();
        assert_eq!(
            &m[..4],
            [
                "model",
                "model.embed_tokens",
                "model.layers",
                "model.layers.0"
            ]
        );
        assert_eq!(m.last().map(String::as_str), Some("lm_head"));
        let unique: HashSet<&String> = m.iter().collect();
        assert_eq!(unique.len(), m.len());
        assert!(m.contains(&"model.layers.1.mlp.experts".to_string()));
        assert!(!m.contains(&String::new()));
    }

    #[test]
    fn mtp_layers_only_when_asked() {
        let opts = ModelOptions::default();
        let ir = ModelIr::from_compact_toml_str(TINY, "tiny.toml", opts.clone()).unwrap();
        assert_eq!(ir.num_layers_total(), 3);
        assert!(ir.param("model.layers.3.eh_proj.weight").is_none());
        let with = ModelOptions {
            include_mtp: true,
            ..opts
        };
        let ir_mtp = ModelIr::from_compact_toml_str(TINY, "tiny.toml", with).unwrap();
        assert_eq!(ir_mtp.num_layers_total(), 4);
        assert_eq!(
            ir_mtp.param("model.layers.3.eh_proj.weight").unwrap().shape,
            [32, 64]
        );
        assert!(ir_mtp.total_params() > ir.total_params());
    }

    #[test]
    fn load_rejects_unknown_extensions() {
        let err = ModelIr::load(Path::new("model.yaml"), ModelOptions::default()).unwrap_err();
        assert!(err.to_string().contains(".json") && err.to_string().contains(".toml"));
        let err =
            ModelIr::load(Path::new("/nonexistent/m.json"), ModelOptions::default()).unwrap_err();
        assert!(err.to_string().contains("cannot read"));
    }

    #[test]
    fn overflowing_tensors_are_errors() {
        let text = TINY
            .replace("vocab_size = 50", "vocab_size = 2147483648")
            .replace("hidden_size = 32", "hidden_size = 2147483648");
        let err =
            ModelIr::from_compact_toml_str(&text, "big.toml", ModelOptions::default()).unwrap_err();
        assert!(err.to_string().contains("overflow"), "{err}");
    }
}
