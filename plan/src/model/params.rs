//! Parameter naming per family: the exact HF names and global shapes of every parameter, in
//! model order.
//!
//! Order follows the HF modules' definition order (what `named_parameters()` yields):
//! `model.embed_tokens`, then each decoder layer (`self_attn.*`, `mlp.*`, `input_layernorm`,
//! `post_attention_layernorm`), then any MTP layers (`model.layers.{L+k}`), then `model.norm`
//! and `lm_head`. Inside a MoE block, Qwen3-MoE lists `gate` then `experts`; DeepSeek-V3 lists
//! `experts`, `gate` (weight, then the `e_score_correction_bias` buffer), `shared_experts`.
//! MTP layers (DeepSeek-V3 checkpoint naming) list `embed_tokens` (when stored), `enorm`,
//! `hnorm`, `eh_proj`, the decoder layer, `shared_head.norm`, `shared_head.head` (when stored).

use super::{DType, ExpertLayout, ModelConfig, ModelFamily, ModelOptions, ParamSpec};

/// Whether `param` is a routed-expert weight (`….mlp.experts.…`, fused or per expert).
pub(crate) fn is_routed_expert(param: &ParamSpec) -> bool {
    param.name.contains(".mlp.experts.")
}

/// Builds the full parameter list of `config` under `options`.
///
/// The config must have passed [`ModelConfig::validate`] (dimensions bounded, family consistent).
pub(crate) fn build_params(config: &ModelConfig, options: &ModelOptions) -> Vec<ParamSpec> {
    let mut b = Builder {
        config,
        layout: options.expert_layout,
        dtype: options.param_dtype,
        out: Vec::new(),
    };
    let h = config.hidden_size;
    let v = config.vocab_size;
    b.push("model.embed_tokens.weight", vec![v, h], None);
    for layer in 0..config.num_hidden_layers {
        b.decoder_layer(layer);
    }
    if options.include_mtp {
        for k in 0..config.mtp_layers {
            b.mtp_layer(config.num_hidden_layers + k);
        }
    }
    b.push("model.norm.weight", vec![h], None);
    if !config.tie_word_embeddings {
        b.push("lm_head.weight", vec![v, h], None);
    }
    b.out
}

/// Accumulates parameters of one model.
struct Builder<'a> {
    config: &'a ModelConfig,
    layout: ExpertLayout,
    dtype: DType,
    out: Vec<ParamSpec>,
}

impl Builder<'_> {
    fn push(&mut self, name: impl Into<String>, shape: Vec<u64>, layer: Option<usize>) {
        self.push_with(name, shape, layer, true);
    }

    fn push_with(
        &mut self,
        name: impl Into<String>,
        shape: Vec<u64>,
        layer: Option<usize>,
        trainable: bool,
    ) {
        self.out.push(ParamSpec {
            name: name.into(),
            shape,
            dtype: self.dtype,
            trainable,
            layer,
        });
    }

    /// One decoder layer `model.layers.{layer}`: attention, MLP, the two norms.
    fn decoder_layer(&mut self, layer: usize) {
        let prefix = format!("model.layers.{layer}");
        self.decoder_body(&prefix, layer);
    }

    fn decoder_body(&mut self, prefix: &str, layer: usize) {
        let h = self.config.hidden_size;
        if self.config.mla.is_some() {
            self.mla_attention(prefix, layer);
        } else {
            self.gqa_attention(prefix, layer);
        }
        if self.config.is_moe_layer(layer) {
            self.moe(prefix, layer);
        } else {
            let i = self.config.intermediate_size;
            self.swiglu(&format!("{prefix}.mlp"), i, layer);
        }
        self.push(
            format!("{prefix}.input_layernorm.weight"),
            vec![h],
            Some(layer),
        );
        self.push(
            format!("{prefix}.post_attention_layernorm.weight"),
            vec![h],
            Some(layer),
        );
    }

    /// Llama/Qwen3 attention: q/k/v/o projections (+ per-head q/k norms for Qwen3).
    fn gqa_attention(&mut self, prefix: &str, layer: usize) {
        let c = self.config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let q = c.num_attention_heads * hd;
        let kv = c.num_key_value_heads * hd;
        let l = Some(layer);
        self.push(format!("{prefix}.self_attn.q_proj.weight"), vec![q, h], l);
        self.push(format!("{prefix}.self_attn.k_proj.weight"), vec![kv, h], l);
        self.push(format!("{prefix}.self_attn.v_proj.weight"), vec![kv, h], l);
        self.push(format!("{prefix}.self_attn.o_proj.weight"), vec![h, q], l);
        if c.family.has_qk_norm() {
            self.push(format!("{prefix}.self_attn.q_norm.weight"), vec![hd], l);
            self.push(format!("{prefix}.self_attn.k_norm.weight"), vec![hd], l);
        }
    }

    /// DeepSeek multi-head latent attention.
    fn mla_attention(&mut self, prefix: &str, layer: usize) {
        let c = self.config;
        let Some(mla) = &c.mla else { return };
        let (h, heads) = (c.hidden_size, c.num_attention_heads);
        let qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
        let l = Some(layer);
        let a = format!("{prefix}.self_attn");
        match mla.q_lora_rank {
            Some(r) => {
                self.push(format!("{a}.q_a_proj.weight"), vec![r, h], l);
                self.push(format!("{a}.q_a_layernorm.weight"), vec![r], l);
                self.push(format!("{a}.q_b_proj.weight"), vec![heads * qk, r], l);
            }
            None => self.push(format!("{a}.q_proj.weight"), vec![heads * qk, h], l),
        }
        let kvr = mla.kv_lora_rank;
        self.push(
            format!("{a}.kv_a_proj_with_mqa.weight"),
            vec![kvr + mla.qk_rope_head_dim, h],
            l,
        );
        self.push(format!("{a}.kv_a_layernorm.weight"), vec![kvr], l);
        self.push(
            format!("{a}.kv_b_proj.weight"),
            vec![heads * (mla.qk_nope_head_dim + mla.v_head_dim), kvr],
            l,
        );
        self.push(
            format!("{a}.o_proj.weight"),
            vec![h, heads * mla.v_head_dim],
            l,
        );
    }

    /// A gated MLP `{module}.{gate,up,down}_proj.weight` with intermediate size `i`.
    fn swiglu(&mut self, module: &str, i: u64, layer: usize) {
        let h = self.config.hidden_size;
        let l = Some(layer);
        self.push(format!("{module}.gate_proj.weight"), vec![i, h], l);
        self.push(format!("{module}.up_proj.weight"), vec![i, h], l);
        self.push(format!("{module}.down_proj.weight"), vec![h, i], l);
    }

    /// Router, routed experts and shared experts of one MoE layer.
    fn moe(&mut self, prefix: &str, layer: usize) {
        let c = self.config;
        let Some(moe) = &c.moe else { return };
        let mlp = format!("{prefix}.mlp");
        match c.family {
            ModelFamily::DeepseekV3 => {
                self.routed_experts(&mlp, layer);
                self.router(&mlp, layer);
            }
            _ => {
                self.router(&mlp, layer);
                self.routed_experts(&mlp, layer);
            }
        }
        if moe.shared_experts > 0 {
            let i = c.shared_expert_intermediate_size();
            self.swiglu(&format!("{mlp}.shared_experts"), i, layer);
        }
    }

    fn router(&mut self, mlp: &str, layer: usize) {
        let c = self.config;
        let Some(moe) = &c.moe else { return };
        let (e, h) = (moe.num_experts, c.hidden_size);
        self.push(format!("{mlp}.gate.weight"), vec![e, h], Some(layer));
        if moe.router_correction_bias {
            // A registered buffer, stored in the checkpoint; not updated by the optimizer.
            self.push_with(
                format!("{mlp}.gate.e_score_correction_bias"),
                vec![e],
                Some(layer),
                false,
            );
        }
    }

    fn routed_experts(&mut self, mlp: &str, layer: usize) {
        let c = self.config;
        let Some(moe) = &c.moe else { return };
        let (e, i, h) = (moe.num_experts, moe.moe_intermediate_size, c.hidden_size);
        let l = Some(layer);
        match self.layout {
            ExpertLayout::Fused => {
                self.push(format!("{mlp}.experts.gate_up_proj"), vec![e, 2 * i, h], l);
                self.push(format!("{mlp}.experts.down_proj"), vec![e, h, i], l);
            }
            ExpertLayout::PerExpert => {
                for expert in 0..e {
                    self.swiglu(&format!("{mlp}.experts.{expert}"), i, layer);
                }
            }
        }
    }

    /// One multi-token-prediction layer `model.layers.{layer}` (DeepSeek-V3 checkpoint naming).
    fn mtp_layer(&mut self, layer: usize) {
        let c = self.config;
        let (h, v) = (c.hidden_size, c.vocab_size);
        let p = format!("model.layers.{layer}");
        let l = Some(layer);
        if c.mtp_own_embeddings {
            self.push(format!("{p}.embed_tokens.weight"), vec![v, h], l);
        }
        self.push(format!("{p}.enorm.weight"), vec![h], l);
        self.push(format!("{p}.hnorm.weight"), vec![h], l);
        self.push(format!("{p}.eh_proj.weight"), vec![h, 2 * h], l);
        self.decoder_body(&p, layer);
        self.push(format!("{p}.shared_head.norm.weight"), vec![h], l);
        if c.mtp_own_embeddings {
            self.push(format!("{p}.shared_head.head.weight"), vec![v, h], l);
        }
    }
}
