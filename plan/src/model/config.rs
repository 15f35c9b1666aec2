//! Queries and consistency checks on the normalized [`ModelConfig`], whatever file it came from.

use super::{ModelConfig, ModelFamily};

/// Most decoder layers (main + MTP) a model may declare (see [`crate::limits::MODEL_LAYERS`]);
/// larger values are almost surely typos and would make planning take minutes.
const MAX_LAYERS: usize = crate::limits::MODEL_LAYERS.max as usize;

/// Most parameter entries the IR will enumerate (see [`crate::limits::MODEL_PARAM_ENTRIES`]).
const MAX_PARAM_ENTRIES: u128 = crate::limits::MODEL_PARAM_ENTRIES.max as u128;

/// Largest accepted single dimension (see [`crate::limits::MODEL_DIM`]).
const MAX_DIM: u64 = crate::limits::MODEL_DIM.max;

impl ModelFamily {
    /// The HF `model_type` string of the family.
    pub fn model_type(self) -> &'static str {
        match self {
            ModelFamily::Llama => "llama",
            ModelFamily::Qwen3 => "qwen3",
            ModelFamily::Qwen3Moe => "qwen3_moe",
            ModelFamily::DeepseekV3 => "deepseek_v3",
        }
    }

    /// The HF `architectures[0]` class name of the family's causal LM.
    pub fn default_architecture(self) -> &'static str {
        match self {
            ModelFamily::Llama => "LlamaForCausalLM",
            ModelFamily::Qwen3 => "Qwen3ForCausalLM",
            ModelFamily::Qwen3Moe => "Qwen3MoeForCausalLM",
            ModelFamily::DeepseekV3 => "DeepseekV3ForCausalLM",
        }
    }

    /// Every family, in a fixed order (used to list supported `model_type`s in errors).
    pub fn all() -> [ModelFamily; 4] {
        [
            ModelFamily::Llama,
            ModelFamily::Qwen3,
            ModelFamily::Qwen3Moe,
            ModelFamily::DeepseekV3,
        ]
    }

    /// Parses an HF `model_type` (`llama`, `qwen3`, `qwen3_moe`, `deepseek_v3`).
    pub fn from_model_type(model_type: &str) -> Option<Self> {
        Self::all()
            .into_iter()
            .find(|f| f.model_type() == model_type)
    }

    /// Whether the family names per-head `q_norm`/`k_norm` weights.
    pub fn has_qk_norm(self) -> bool {
        matches!(self, ModelFamily::Qwen3 | ModelFamily::Qwen3Moe)
    }
}

impl ModelConfig {
    /// Whether decoder layer `layer` (main or MTP) has a routed-expert MLP.
    ///
    /// MTP layers (index >= `num_hidden_layers`) are MoE whenever the model has experts, as in
    /// DeepSeek-V3.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        match &self.moe {
            None => false,
            Some(moe) => {
                layer >= moe.first_dense_layers && !moe.extra_dense_layers.contains(&layer)
            }
        }
    }

    /// Number of main-model decoder layers with routed experts.
    pub fn num_moe_layers(&self) -> usize {
        (0..self.num_hidden_layers)
            .filter(|&l| self.is_moe_layer(l))
            .count()
    }

    /// Query/key dimension of one attention head (MLA: nope + rope).
    pub fn qk_head_dim(&self) -> u64 {
        match &self.mla {
            Some(mla) => mla.qk_nope_head_dim + mla.qk_rope_head_dim,
            None => self.head_dim,
        }
    }

    /// Value dimension of one attention head.
    pub fn v_head_dim(&self) -> u64 {
        match &self.mla {
            Some(mla) => mla.v_head_dim,
            None => self.head_dim,
        }
    }

    /// Intermediate size of the shared-expert MLP of a MoE layer (0 when there is none).
    pub fn shared_expert_intermediate_size(&self) -> u64 {
        self.moe.as_ref().map_or(0, |m| {
            m.moe_intermediate_size.saturating_mul(m.shared_experts)
        })
    }

    /// Checks that the dimensions describe a buildable model of its family.
    ///
    /// Returns a message naming the offending field and the fix; the caller adds the file.
    pub fn validate(&self) -> Result<(), String> {
        let positive: [(&str, u64); 5] = [
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        if self.num_hidden_layers == 0 {
            return Err("num_hidden_layers must be at least 1".into());
        }
        if self.num_hidden_layers.saturating_add(self.mtp_layers) > MAX_LAYERS {
            return Err(format!(
                "num_hidden_layers + mtp_layers = {} exceeds the limit of {MAX_LAYERS}",
                self.num_hidden_layers.saturating_add(self.mtp_layers)
            ));
        }
        if self.mla.is_none()
            && !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
        {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.sliding_window == Some(0) {
            return Err("sliding_window must be at least 1 (omit it for full attention)".into());
        }
        self.validate_family()?;
        self.validate_moe()?;
        self.validate_mla()?;
        let any_dense =
            (0..self.num_hidden_layers + self.mtp_layers).any(|l| !self.is_moe_layer(l));
        if any_dense && self.intermediate_size == 0 {
            return Err(
                "intermediate_size must be at least 1 (the model has dense MLP layers)".into(),
            );
        }
        self.validate_size()
    }

    fn validate_family(&self) -> Result<(), String> {
        let family = self.family.model_type();
        match self.family {
            ModelFamily::Llama | ModelFamily::Qwen3 => {
                if self.moe.is_some() {
                    return Err(format!(
                        "family {family} has no routed-expert naming; use qwen3_moe or deepseek_v3 for MoE models"
                    ));
                }
                if self.mla.is_some() {
                    return Err(format!(
                        "family {family} has no MLA naming; use deepseek_v3 for multi-head latent attention"
                    ));
                }
            }
            ModelFamily::Qwen3Moe => {
                if self.moe.is_none() {
                    return Err("family qwen3_moe needs MoE dimensions (num_experts, num_experts_per_tok, moe_intermediate_size)".into());
                }
                if self.mla.is_some() {
                    return Err("family qwen3_moe has no MLA naming; use deepseek_v3".into());
                }
            }
            ModelFamily::DeepseekV3 => {
                if self.mla.is_none() {
                    return Err("family deepseek_v3 needs MLA dimensions (kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim)".into());
                }
            }
        }
        Ok(())
    }

    fn validate_moe(&self) -> Result<(), String> {
        let Some(moe) = &self.moe else { return Ok(()) };
        if moe.num_experts == 0 {
            return Err("num_experts must be at least 1".into());
        }
        if moe.experts_per_token == 0 || moe.experts_per_token > moe.num_experts {
            return Err(format!(
                "experts per token ({}) must be between 1 and the number of experts ({})",
                moe.experts_per_token, moe.num_experts
            ));
        }
        if moe.moe_intermediate_size == 0 {
            return Err("moe_intermediate_size must be at least 1".into());
        }
        if moe.first_dense_layers > self.num_hidden_layers {
            return Err(format!(
                "first dense layers ({}) exceed num_hidden_layers ({})",
                moe.first_dense_layers, self.num_hidden_layers
            ));
        }
        if let Some(&bad) = moe
            .extra_dense_layers
            .iter()
            .find(|&&l| l >= self.num_hidden_layers)
        {
            return Err(format!(
                "dense layer index {bad} is out of range 0..{}",
                self.num_hidden_layers
            ));
        }
        Ok(())
    }

    fn validate_mla(&self) -> Result<(), String> {
        let Some(mla) = &self.mla else { return Ok(()) };
        let dims = [
            ("kv_lora_rank", mla.kv_lora_rank),
            ("qk_rope_head_dim", mla.qk_rope_head_dim),
            ("qk_nope_head_dim", mla.qk_nope_head_dim),
            ("v_head_dim", mla.v_head_dim),
        ];
        for (key, value) in dims {
            if value == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        if mla.q_lora_rank == Some(0) {
            return Err(
                "q_lora_rank must be at least 1 (use null / omit it for a plain q_proj)".into(),
            );
        }
        Ok(())
    }

    /// Bounds every raw dimension (so derived shape entries fit in `u64`) and the length of the
    /// parameter list. Element-count overflow of whole tensors is checked when the IR is built.
    fn validate_size(&self) -> Result<(), String> {
        let mut dims = vec![
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("sliding_window", self.sliding_window.unwrap_or(0)),
        ];
        if let Some(moe) = &self.moe {
            dims.extend([
                ("num_experts", moe.num_experts),
                ("experts_per_token", moe.experts_per_token),
                ("moe_intermediate_size", moe.moe_intermediate_size),
                ("shared_experts", moe.shared_experts),
            ]);
        }
        if let Some(mla) = &self.mla {
            dims.extend([
                ("q_lora_rank", mla.q_lora_rank.unwrap_or(0)),
                ("kv_lora_rank", mla.kv_lora_rank),
                ("qk_rope_head_dim", mla.qk_rope_head_dim),
                ("qk_nope_head_dim", mla.qk_nope_head_dim),
                ("v_head_dim", mla.v_head_dim),
            ]);
        }
        if let Some((key, value)) = dims.into_iter().find(|&(_, v)| v > MAX_DIM) {
            return Err(format!("{key} = {value} exceeds the limit of {MAX_DIM}"));
        }
        let layers = (self.num_hidden_layers + self.mtp_layers) as u128;
        let experts = self.moe.as_ref().map_or(0, |m| u128::from(m.num_experts));
        let entries = layers * (40 + 3 * experts);
        if entries > MAX_PARAM_ENTRIES {
            return Err(format!(
                "the model would have about {entries} parameter entries (limit {MAX_PARAM_ENTRIES}); check num_hidden_layers and num_experts"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MlaConfig, MoeConfig};
    use super::*;

    fn dense() -> ModelConfig {
        ModelConfig {
            family: ModelFamily::Llama,
            architecture: "LlamaForCausalLM".into(),
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            vocab_size: 100,
            tie_word_embeddings: false,
            sliding_window: None,
            mtp_layers: 0,
            mtp_own_embeddings: false,
            moe: None,
            mla: None,
        }
    }

    #[test]
    fn model_type_round_trip() {
        for f in ModelFamily::all() {
            assert_eq!(ModelFamily::from_model_type(f.model_type()), Some(f));
        }
        assert_eq!(ModelFamily::from_model_type("mistral"), None);
    }

    #[test]
    fn dense_config_is_valid_and_has_no_moe_layers() {
        let c = dense();
        assert_eq!(c.validate(), Ok(()));
        assert!(!c.is_moe_layer(0));
        assert_eq!(c.num_moe_layers(), 0);
        assert_eq!(c.qk_head_dim(), 16);
    }

    #[test]
    fn gqa_must_divide() {
        let mut c = dense();
        c.num_key_value_heads = 3;
        assert!(c.validate().unwrap_err().contains("num_key_value_heads"));
    }

    #[test]
    fn moe_layers_follow_first_dense_and_extra_dense() {
        let mut c = dense();
        c.family = ModelFamily::Qwen3Moe;
        c.num_hidden_layers = 6;
        c.mtp_layers = 1;
        c.moe = Some(MoeConfig {
            num_experts: 4,
            experts_per_token: 2,
            moe_intermediate_size: 32,
            shared_experts: 0,
            first_dense_layers: 1,
            extra_dense_layers: vec![3],
            router_correction_bias: false,
        });
        assert_eq!(c.validate(), Ok(()));
        let moe: Vec<bool> = (0..7).map(|l| c.is_moe_layer(l)).collect();
        assert_eq!(moe, [false, true, true, false, true, true, true]);
        assert_eq!(c.num_moe_layers(), 4);
    }

    #[test]
    fn family_consistency_is_checked() {
        let mut c = dense();
        c.mla = Some(MlaConfig {
            q_lora_rank: None,
            kv_lora_rank: 8,
            qk_rope_head_dim: 4,
            qk_nope_head_dim: 8,
            v_head_dim: 8,
        });
        assert!(c.validate().unwrap_err().contains("deepseek_v3"));
        c.family = ModelFamily::DeepseekV3;
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.qk_head_dim(), 12);
    }

    #[test]
    fn absurd_sizes_are_rejected_without_overflow() {
        let mut c = dense();
        c.hidden_size = u64::MAX / 2;
        c.vocab_size = u64::MAX / 2;
        assert!(c.validate().unwrap_err().contains("exceeds the limit"));
        let mut c = dense();
        c.num_hidden_layers = usize::MAX;
        assert!(c.validate().is_err());
    }
}
