//! Model IR: qualified parameter names (HuggingFace naming), shapes, dtypes and per-layer
//! compute descriptions, built from an HF `config.json` or a compact TOML description.
//!
//! Submodules: `config` (checks and queries on the normalized dimensions), `hf` (HF
//! `config.json` reader), `compact` (compact TOML description reader; its docs give the format),
//! `params` (parameter naming per family), `ir` (building the IR, totals, module tree),
//! `compute` (FLOPs and bytes per token per op).

use serde::{Deserialize, Serialize};

pub mod compact;
mod compute;
mod config;
mod hf;
mod ir;
mod op_shape;
mod params;

pub use compute::{ACT_BYTES, avg_causal_context};
pub use op_shape::{EagerRecipe, OpShape, RMSNORM_BWD_KERNELS, ROPE_BWD_KERNELS};

/// Element type of a parameter or buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
    /// 8-bit float e4m3 (DeepSeek-V3 checkpoints).
    F8e4m3,
}

impl DType {
    /// Size of one element in bytes.
    pub fn bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
            DType::F8e4m3 => 1,
        }
    }

    /// Parses `f32|fp32|float32`, `bf16|bfloat16`, `f16|fp16|float16`.
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Some(DType::F32),
            "bf16" | "bfloat16" => Some(DType::Bf16),
            "f16" | "fp16" | "float16" => Some(DType::F16),
            "f8e4m3" | "fp8" | "float8_e4m3" => Some(DType::F8e4m3),
            _ => None,
        }
    }
}

/// The model families the IR understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelFamily {
    /// `model_type = "llama"` (LlamaForCausalLM).
    Llama,
    /// `model_type = "qwen3"` (dense, per-head q/k norms).
    Qwen3,
    /// `model_type = "qwen3_moe"` (fused or per-expert routed experts).
    Qwen3Moe,
    /// `model_type = "deepseek_v3"` (MLA, dense first layers, routed + shared experts).
    DeepseekV3,
}

/// How routed-expert weights are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertLayout {
    /// transformers v5 in-memory names: `mlp.experts.gate_up_proj [E,2I,H]`, `mlp.experts.down_proj [E,H,I]`.
    #[default]
    Fused,
    /// Checkpoint names: `mlp.experts.{e}.{gate,up,down}_proj.weight`.
    PerExpert,
}

/// One parameter (or trainable buffer) of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamSpec {
    /// Fully qualified HF name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// Global shape.
    pub shape: Vec<u64>,
    /// Storage dtype of the master copy.
    pub dtype: DType,
    /// False for frozen parameters and non-trainable buffers (router correction bias).
    pub trainable: bool,
    /// Decoder layer index for parameters under `model.layers.{i}`; None for embedding/head/final norm.
    pub layer: Option<usize>,
}

impl ParamSpec {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// FQN of the owning module (the name without its last segment).
    pub fn module(&self) -> &str {
        self.name.rsplit_once('.').map_or("", |(m, _)| m)
    }

    /// The last name segment (`weight`, `bias`, `gate_up_proj`, ...).
    pub fn leaf(&self) -> &str {
        self.name.rsplit_once('.').map_or(&self.name, |(_, l)| l)
    }
}

/// Mixture-of-experts dimensions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    /// Routed experts per MoE layer (`num_experts` / `n_routed_experts`).
    pub num_experts: u64,
    /// Experts activated per token (`num_experts_per_tok`).
    pub experts_per_token: u64,
    /// Intermediate size of one routed expert (`moe_intermediate_size`).
    pub moe_intermediate_size: u64,
    /// Shared experts per MoE layer (`n_shared_experts`, 0 when absent).
    pub shared_experts: u64,
    /// Leading decoder layers that use a dense MLP instead (`first_k_dense_replace`).
    pub first_dense_layers: usize,
    /// Further main-model layers (at or after `first_dense_layers`) that use a dense MLP, sorted:
    /// Qwen3-MoE `mlp_only_layers` and `decoder_sparse_step`, DeepSeek `moe_layer_freq`.
    #[serde(default)]
    pub extra_dense_layers: Vec<usize>,
    /// Whether the router carries `e_score_correction_bias` (DeepSeek-V3 `noaux_tc`).
    pub router_correction_bias: bool,
}

/// Multi-head latent attention dimensions (DeepSeek-V3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlaConfig {
    /// Query low-rank dimension; None means a plain `q_proj`.
    pub q_lora_rank: Option<u64>,
    /// Compressed KV dimension.
    pub kv_lora_rank: u64,
    /// Rotary part of each query/key head.
    pub qk_rope_head_dim: u64,
    /// Non-rotary part of each query/key head.
    pub qk_nope_head_dim: u64,
    /// Value head dimension.
    pub v_head_dim: u64,
}

/// Normalized model dimensions, whatever file they came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Model family (decides parameter naming).
    pub family: ModelFamily,
    /// `architectures[0]` of the HF config (or the compact description's `architecture`).
    pub architecture: String,
    /// Hidden size H.
    pub hidden_size: u64,
    /// Dense MLP intermediate size I.
    pub intermediate_size: u64,
    /// Decoder layers of the main model.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: u64,
    /// Key/value heads (GQA).
    pub num_key_value_heads: u64,
    /// Per-head dimension of non-MLA attention; for MLA models the query/key head dimension
    /// (`qk_nope_head_dim + qk_rope_head_dim`), informational only.
    pub head_dim: u64,
    /// Vocabulary size V.
    pub vocab_size: u64,
    /// Whether `lm_head.weight` is tied to `model.embed_tokens.weight` (no separate head parameter).
    pub tie_word_embeddings: bool,
    /// Sliding-window size for attention FLOPs, if the model uses one on every layer.
    pub sliding_window: Option<u64>,
    /// Multi-token-prediction layers in the checkpoint (`num_nextn_predict_layers`).
    pub mtp_layers: usize,
    /// Whether each MTP layer stores its own `embed_tokens.weight` and `shared_head.head.weight`
    /// copies (DeepSeek-V3 checkpoints do); false means MTP layers reuse the main embedding/head.
    #[serde(default)]
    pub mtp_own_embeddings: bool,
    /// MoE dimensions, if the model has routed experts.
    pub moe: Option<MoeConfig>,
    /// MLA dimensions, if attention is multi-head latent attention.
    pub mla: Option<MlaConfig>,
}

/// Choices that change the parameter list without changing the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelOptions {
    /// Fused (`[E,2I,H]`) or per-expert routed-expert names.
    pub expert_layout: ExpertLayout,
    /// Include the checkpoint's MTP layers (`model.layers.{L}...`) as trainable parameters.
    pub include_mtp: bool,
    /// Master dtype of every parameter.
    pub param_dtype: DType,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            expert_layout: ExpertLayout::Fused,
            include_mtp: false,
            param_dtype: DType::Bf16,
        }
    }
}

/// Kind of a forward compute op, used by the simulator's cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeKind {
    /// Token embedding lookup (memory bound).
    Embedding,
    /// Dense matmul (linear layer).
    Matmul,
    /// Grouped expert matmuls (only activated experts count).
    ExpertMatmul,
    /// Attention core (scores + softmax + weighted values; causal triangle counted).
    Attention,
    /// RMSNorm / LayerNorm.
    Norm,
    /// Element-wise work (activation, residual add, RoPE).
    Elementwise,
    /// MoE router (gate matmul + softmax/sigmoid + top-k).
    Router,
    /// Output projection + cross-entropy loss.
    Loss,
}

/// One forward op of a layer, costed per token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeOp {
    /// Module FQN or descriptive name (`model.layers.0.self_attn.q_proj`).
    pub name: String,
    /// Op kind.
    pub kind: ComputeKind,
    /// Forward FLOPs per token (backward is costed by the simulator as 2x).
    pub fwd_flops_per_token: f64,
    /// Forward HBM bytes moved per token (activations read + written, weights amortized out).
    pub fwd_bytes_per_token: f64,
    /// The op's shape: which kernels it launches and their dimensions (see [`OpShape`]).
    #[serde(default)]
    pub shape: OpShape,
}

/// The compute of one FSDP-unit-sized piece of the model (embedding, a decoder layer, head).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerCompute {
    /// Module FQN of the piece (`model.embed_tokens`, `model.layers.3`, `lm_head`).
    pub name: String,
    /// Decoder layer index, if any.
    pub layer: Option<usize>,
    /// Ops in forward order.
    pub ops: Vec<ComputeOp>,
}

impl LayerCompute {
    /// Total forward FLOPs per token of this piece.
    pub fn fwd_flops_per_token(&self) -> f64 {
        self.ops.iter().map(|o| o.fwd_flops_per_token).sum()
    }

    /// Total forward activation bytes per token of this piece.
    pub fn fwd_bytes_per_token(&self) -> f64 {
        self.ops.iter().map(|o| o.fwd_bytes_per_token).sum()
    }
}

/// A model: its configuration and every parameter with its HF name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelIr {
    /// Display name (file stem or the description's `name`).
    pub name: String,
    /// Normalized dimensions.
    pub config: ModelConfig,
    /// Options used to build the parameter list.
    pub options: ModelOptions,
    /// Every parameter in module order (embedding, layers in order, final norm, head).
    pub params: Vec<ParamSpec>,
}
