//! A small decoder-only transformer assembled from [`crate::ops`], with HuggingFace parameter
//! names, keyed initialisation and a whole-model backward pass.
//!
//! Block `i`: `h = x + attn(input_layernorm(x))`, `out = h + mlp(post_attention_layernorm(h))`,
//! where `attn` is GQA self-attention or MLA and `mlp` is SwiGLU or MoE (MoE from layer
//! `first_dense_layers` on). Then `model.norm`, `lm_head`, and mean cross-entropy.

use std::collections::HashMap;

use crate::error::{RefError, RefResult};
use crate::ops::{
    CrossEntropy, Embedding, EmbeddingCache, ExpertWire, Linear, LinearCache, Mla, MlaCache,
    MlaParams, Moe, MoeCache, MoeParams, RmsNorm, RmsNormCache, SelfAttention, SelfAttentionCache,
    SelfAttentionParams, SwiGlu, SwiGluCache, SwiGluParams,
};
use crate::real::Real;
use crate::rng::KeyedRng;
use crate::tensor::Tensor;

/// Mixture-of-experts settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// Routed experts `E`.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Expert intermediate size.
    pub intermediate: usize,
    /// Renormalise the top-k probabilities.
    pub norm_topk_prob: bool,
    /// Layers `0..first_dense_layers` keep a dense SwiGLU MLP.
    pub first_dense_layers: usize,
}

/// Multi-head latent attention settings (replaces GQA attention when present).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaConfig {
    /// q LoRA rank (`None`: plain `q_proj`).
    pub q_lora_rank: Option<usize>,
    /// Compressed KV width.
    pub kv_lora_rank: usize,
    /// Non-rotary q/k width per head.
    pub qk_nope_head_dim: usize,
    /// Rotary q/k width per head.
    pub qk_rope_head_dim: usize,
    /// Value width per head.
    pub v_head_dim: usize,
}

/// Shape of the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// KV heads (GQA; ignored by MLA).
    pub kv_heads: usize,
    /// Head width (GQA; ignored by MLA).
    pub head_dim: usize,
    /// Dense MLP intermediate size.
    pub intermediate: usize,
    /// Per-head q/k RMSNorm (Qwen3).
    pub qk_norm: bool,
    /// MoE layers, if any.
    pub moe: Option<MoeConfig>,
    /// MLA attention, if used.
    pub mla: Option<MlaConfig>,
    /// RoPE base.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// Standard deviation of the normal initialisation of every matrix.
    pub init_std: f64,
}

/// How a parameter is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// All ones (norm weights).
    Ones,
    /// Keyed normal values times this standard deviation.
    Normal(f64),
}

/// One named parameter of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// HuggingFace qualified name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Initialisation.
    pub init: Init,
}

impl ParamSpec {
    /// Element count.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Initial values of flat elements `[start, end)`, identical to the same slice of the full
    /// tensor under any sharding (keyed by seed, parameter name and element index).
    pub fn init_range(&self, seed: u64, start: u64, end: u64) -> Vec<f32> {
        match self.init {
            Init::Ones => vec![1.0; end.saturating_sub(start) as usize],
            Init::Normal(std) => {
                let std = std as f32;
                KeyedRng::named(seed, &self.name)
                    .normal_range(start, end)
                    .into_iter()
                    .map(|z| z * std)
                    .collect()
            }
        }
    }
}

impl ModelConfig {
    /// A tiny dense GQA model (Qwen3-like, with q/k norm) for tests.
    pub fn tiny() -> ModelConfig {
        ModelConfig {
            vocab: 32,
            hidden: 16,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 4,
            intermediate: 24,
            qk_norm: true,
            moe: None,
            mla: None,
            rope_theta: 10_000.0,
            rms_eps: 1e-6,
            init_std: 0.02,
        }
    }

    /// Check the configuration for consistency.
    pub fn validate(&self) -> RefResult<()> {
        let bad = |d: String| Err(RefError::invalid("ModelConfig", d));
        if self.vocab == 0 || self.hidden == 0 || self.layers == 0 || self.heads == 0 {
            return bad("vocab, hidden, layers and heads must be positive".into());
        }
        if self.mla.is_none() {
            if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
                return bad(format!(
                    "{} heads vs {} kv heads",
                    self.heads, self.kv_heads
                ));
            }
            if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
                return bad(format!(
                    "head_dim {} must be even and positive",
                    self.head_dim
                ));
            }
        }
        if let Some(m) = self.mla
            && (m.qk_rope_head_dim == 0
                || !m.qk_rope_head_dim.is_multiple_of(2)
                || m.kv_lora_rank == 0
                || m.v_head_dim == 0
                || m.q_lora_rank == Some(0))
        {
            return bad(format!("invalid MLA dims {m:?}"));
        }
        if let Some(m) = self.moe
            && (m.experts == 0 || m.top_k == 0 || m.top_k > m.experts || m.intermediate == 0)
        {
            return bad(format!("invalid MoE settings {m:?}"));
        }
        Ok(())
    }

    /// Whether block `layer` uses the MoE MLP.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe.is_some_and(|m| layer >= m.first_dense_layers)
    }

    /// Every parameter in model order, with HuggingFace names.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let h = self.hidden;
        let n = Init::Normal(self.init_std);
        let mut v = Vec::new();
        let mut add =
            |name: String, shape: Vec<usize>, init: Init| v.push(ParamSpec { name, shape, init });
        add("model.embed_tokens.weight".into(), vec![self.vocab, h], n);
        for l in 0..self.layers {
            let p = format!("model.layers.{l}.");
            add(format!("{p}input_layernorm.weight"), vec![h], Init::Ones);
            let a = format!("{p}self_attn.");
            match self.mla {
                Some(m) => {
                    let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
                    match m.q_lora_rank {
                        Some(r) => {
                            add(format!("{a}q_a_proj.weight"), vec![r, h], n);
                            add(format!("{a}q_a_layernorm.weight"), vec![r], Init::Ones);
                            add(format!("{a}q_b_proj.weight"), vec![self.heads * qk, r], n);
                        }
                        None => add(format!("{a}q_proj.weight"), vec![self.heads * qk, h], n),
                    }
                    add(
                        format!("{a}kv_a_proj_with_mqa.weight"),
                        vec![m.kv_lora_rank + m.qk_rope_head_dim, h],
                        n,
                    );
                    add(
                        format!("{a}kv_a_layernorm.weight"),
                        vec![m.kv_lora_rank],
                        Init::Ones,
                    );
                    add(
                        format!("{a}kv_b_proj.weight"),
                        vec![
                            self.heads * (m.qk_nope_head_dim + m.v_head_dim),
                            m.kv_lora_rank,
                        ],
                        n,
                    );
                    add(
                        format!("{a}o_proj.weight"),
                        vec![h, self.heads * m.v_head_dim],
                        n,
                    );
                }
                None => {
                    let (qd, kvd) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
                    add(format!("{a}q_proj.weight"), vec![qd, h], n);
                    add(format!("{a}k_proj.weight"), vec![kvd, h], n);
                    add(format!("{a}v_proj.weight"), vec![kvd, h], n);
                    add(format!("{a}o_proj.weight"), vec![h, qd], n);
                    if self.qk_norm {
                        add(format!("{a}q_norm.weight"), vec![self.head_dim], Init::Ones);
                        add(format!("{a}k_norm.weight"), vec![self.head_dim], Init::Ones);
                    }
                }
            }
            add(
                format!("{p}post_attention_layernorm.weight"),
                vec![h],
                Init::Ones,
            );
            let m = format!("{p}mlp.");
            match self.moe {
                Some(moe) if self.is_moe_layer(l) => {
                    add(format!("{m}gate.weight"), vec![moe.experts, h], n);
                    add(
                        format!("{m}experts.gate_up_proj"),
                        vec![moe.experts, 2 * moe.intermediate, h],
                        n,
                    );
                    add(
                        format!("{m}experts.down_proj"),
                        vec![moe.experts, h, moe.intermediate],
                        n,
                    );
                }
                _ => {
                    add(
                        format!("{m}gate_proj.weight"),
                        vec![self.intermediate, h],
                        n,
                    );
                    add(format!("{m}up_proj.weight"), vec![self.intermediate, h], n);
                    add(
                        format!("{m}down_proj.weight"),
                        vec![h, self.intermediate],
                        n,
                    );
                }
            }
        }
        add("model.norm.weight".into(), vec![h], Init::Ones);
        add("lm_head.weight".into(), vec![self.vocab, h], n);
        v
    }

    /// All parameters, initialised from the keyed RNG (in f32, then converted to `T`).
    pub fn init_params<T: Real>(&self, seed: u64) -> RefResult<ParamSet<T>> {
        self.validate()?;
        let mut set = ParamSet::new();
        for spec in self.param_specs() {
            let vals = spec.init_range(seed, 0, spec.numel() as u64);
            let t = Tensor::from_vec(&spec.shape, vals.into_iter().map(T::from_f32).collect())?;
            set.insert(spec.name, t);
        }
        Ok(set)
    }
}

/// Named tensors in a fixed order (model order), with lookup by name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParamSet<T: Real> {
    entries: Vec<(String, Tensor<T>)>,
    index: HashMap<String, usize>,
}

impl<T: Real> ParamSet<T> {
    /// An empty set.
    pub fn new() -> Self {
        ParamSet {
            entries: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Add `name` at the end, or replace its tensor if present.
    pub fn insert(&mut self, name: impl Into<String>, t: Tensor<T>) {
        let name = name.into();
        match self.index.get(&name) {
            Some(&i) => self.entries[i].1 = t,
            None => {
                self.index.insert(name.clone(), self.entries.len());
                self.entries.push((name, t));
            }
        }
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> RefResult<&Tensor<T>> {
        self.index
            .get(name)
            .map(|&i| &self.entries[i].1)
            .ok_or_else(|| RefError::MissingParam(name.to_string()))
    }

    /// The tensor named `name`, mutably.
    pub fn get_mut(&mut self, name: &str) -> RefResult<&mut Tensor<T>> {
        match self.index.get(name) {
            Some(&i) => Ok(&mut self.entries[i].1),
            None => Err(RefError::MissingParam(name.to_string())),
        }
    }

    /// `(name, tensor)` pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor<T>)> {
        self.entries.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// Names in order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Total element count.
    pub fn numel(&self) -> usize {
        self.entries.iter().map(|(_, t)| t.len()).sum()
    }

    /// Element-wise conversion of every tensor.
    pub fn cast<U: Real>(&self) -> ParamSet<U> {
        let mut out = ParamSet::new();
        for (n, t) in &self.entries {
            out.insert(n.clone(), t.cast());
        }
        out
    }

    /// Whether both sets have the same names in the same order and the same bits.
    pub fn bit_eq(&self, other: &ParamSet<T>) -> bool {
        self.entries.len() == other.entries.len()
            && self
                .entries
                .iter()
                .zip(&other.entries)
                .all(|((na, ta), (nb, tb))| na == nb && ta.bit_eq(tb))
    }

    /// A digest over names and tensor digests, in order.
    pub fn digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (n, t) in &self.entries {
            for b in n.bytes().chain(t.digest().to_le_bytes()) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }
}

enum AttnCache<T: Real> {
    Gqa(SelfAttentionCache<T>),
    Mla(MlaCache<T>),
}

enum MlpCache<T: Real> {
    Dense(SwiGluCache<T>),
    Moe(MoeCache<T>),
}

struct BlockCache<T: Real> {
    norm1: RmsNormCache<T>,
    attn: AttnCache<T>,
    norm2: RmsNormCache<T>,
    mlp: MlpCache<T>,
}

/// Everything the backward pass needs from a forward pass.
pub struct ModelCache<T: Real> {
    embed: EmbeddingCache,
    blocks: Vec<BlockCache<T>>,
    final_norm: RmsNormCache<T>,
    head: LinearCache<T>,
}

/// The model: a validated configuration; parameters are passed in as a [`ParamSet`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TinyModel {
    config: ModelConfig,
    expert_wire: ExpertWire,
}

impl TinyModel {
    /// A model with `config` (validated).
    pub fn new(config: ModelConfig) -> RefResult<TinyModel> {
        config.validate()?;
        Ok(TinyModel {
            config,
            expert_wire: ExpertWire::Exact,
        })
    }

    /// The same model with its MoE layers rounding the expert traffic as `wire` says: what a
    /// single device needs to reproduce an expert-parallel run whose all-to-alls carry bf16.
    pub fn with_expert_wire(mut self, wire: ExpertWire) -> TinyModel {
        self.expert_wire = wire;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn norm(&self) -> RmsNorm {
        RmsNorm {
            eps: self.config.rms_eps,
        }
    }

    fn gqa(&self) -> SelfAttention {
        let c = &self.config;
        SelfAttention {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            rope_theta: c.rope_theta,
            qk_norm_eps: c.qk_norm.then_some(c.rms_eps),
        }
    }

    fn mla(&self, m: MlaConfig) -> Mla {
        let c = &self.config;
        Mla {
            heads: c.heads,
            q_lora_rank: m.q_lora_rank,
            kv_lora_rank: m.kv_lora_rank,
            qk_nope_dim: m.qk_nope_head_dim,
            qk_rope_dim: m.qk_rope_head_dim,
            v_head_dim: m.v_head_dim,
            rope_theta: c.rope_theta,
            eps: c.rms_eps,
        }
    }

    fn moe(m: MoeConfig) -> Moe {
        Moe {
            experts: m.experts,
            top_k: m.top_k,
            intermediate: m.intermediate,
            norm_topk_prob: m.norm_topk_prob,
        }
    }

    fn gqa_params<'a, T: Real>(
        &self,
        ps: &'a ParamSet<T>,
        a: &str,
    ) -> RefResult<SelfAttentionParams<'a, T>> {
        let opt = |n: &str| -> RefResult<Option<&'a Tensor<T>>> {
            if self.config.qk_norm {
                ps.get(&format!("{a}{n}")).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(SelfAttentionParams {
            q: ps.get(&format!("{a}q_proj.weight"))?,
            k: ps.get(&format!("{a}k_proj.weight"))?,
            v: ps.get(&format!("{a}v_proj.weight"))?,
            o: ps.get(&format!("{a}o_proj.weight"))?,
            q_norm: opt("q_norm.weight")?,
            k_norm: opt("k_norm.weight")?,
        })
    }

    fn mla_params<'a, T: Real>(
        &self,
        ps: &'a ParamSet<T>,
        a: &str,
        m: MlaConfig,
    ) -> RefResult<MlaParams<'a, T>> {
        let lora = m.q_lora_rank.is_some();
        let opt = |n: &str, want: bool| -> RefResult<Option<&'a Tensor<T>>> {
            if want {
                ps.get(&format!("{a}{n}")).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(MlaParams {
            q_a: opt("q_a_proj.weight", lora)?,
            q_a_norm: opt("q_a_layernorm.weight", lora)?,
            q_b: opt("q_b_proj.weight", lora)?,
            q: opt("q_proj.weight", !lora)?,
            kv_a: ps.get(&format!("{a}kv_a_proj_with_mqa.weight"))?,
            kv_a_norm: ps.get(&format!("{a}kv_a_layernorm.weight"))?,
            kv_b: ps.get(&format!("{a}kv_b_proj.weight"))?,
            o: ps.get(&format!("{a}o_proj.weight"))?,
        })
    }

    fn moe_params<'a, T: Real>(ps: &'a ParamSet<T>, m: &str) -> RefResult<MoeParams<'a, T>> {
        Ok(MoeParams {
            router: ps.get(&format!("{m}gate.weight"))?,
            gate_up: ps.get(&format!("{m}experts.gate_up_proj"))?,
            down: ps.get(&format!("{m}experts.down_proj"))?,
        })
    }

    fn dense_params<'a, T: Real>(ps: &'a ParamSet<T>, m: &str) -> RefResult<SwiGluParams<'a, T>> {
        Ok(SwiGluParams {
            gate: ps.get(&format!("{m}gate_proj.weight"))?,
            up: ps.get(&format!("{m}up_proj.weight"))?,
            down: ps.get(&format!("{m}down_proj.weight"))?,
        })
    }

    /// Logits `[tokens, vocab]` for `ids` (packed sequences of `seq_len` tokens).
    pub fn forward<T: Real>(
        &self,
        ps: &ParamSet<T>,
        ids: &[usize],
        seq_len: usize,
    ) -> RefResult<(Tensor<T>, ModelCache<T>)> {
        if seq_len == 0 || ids.is_empty() || !ids.len().is_multiple_of(seq_len) {
            return Err(RefError::invalid(
                "TinyModel::forward",
                format!("{} tokens do not form sequences of {seq_len}", ids.len()),
            ));
        }
        let c = &self.config;
        let (mut x, embed) = Embedding.forward(ps.get("model.embed_tokens.weight")?, ids)?;
        let mut blocks = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let p = format!("model.layers.{l}.");
            let a = format!("{p}self_attn.");
            let m = format!("{p}mlp.");
            let (hn, norm1) = self
                .norm()
                .forward(ps.get(&format!("{p}input_layernorm.weight"))?, &x)?;
            let (ao, attn) = match c.mla {
                Some(cfg) => {
                    let (y, cache) =
                        self.mla(cfg)
                            .forward(self.mla_params(ps, &a, cfg)?, &hn, seq_len)?;
                    (y, AttnCache::Mla(cache))
                }
                None => {
                    let (y, cache) = self.gqa().forward(self.gqa_params(ps, &a)?, &hn, seq_len)?;
                    (y, AttnCache::Gqa(cache))
                }
            };
            let h = x.add(&ao)?;
            let (hn2, norm2) = self
                .norm()
                .forward(ps.get(&format!("{p}post_attention_layernorm.weight"))?, &h)?;
            let (mo, mlp) = match c.moe {
                Some(cfg) if c.is_moe_layer(l) => {
                    let (y, cache) = Self::moe(cfg).forward_wire(
                        Self::moe_params(ps, &m)?,
                        &hn2,
                        self.expert_wire,
                    )?;
                    (y, MlpCache::Moe(cache))
                }
                _ => {
                    let (y, cache) = SwiGlu.forward(Self::dense_params(ps, &m)?, &hn2)?;
                    (y, MlpCache::Dense(cache))
                }
            };
            x = h.add(&mo)?;
            blocks.push(BlockCache {
                norm1,
                attn,
                norm2,
                mlp,
            });
        }
        let (xn, final_norm) = self.norm().forward(ps.get("model.norm.weight")?, &x)?;
        let (logits, head) = Linear.forward(ps.get("lm_head.weight")?, &xn)?;
        Ok((
            logits,
            ModelCache {
                embed,
                blocks,
                final_norm,
                head,
            },
        ))
    }

    /// Gradients of every parameter given `dlogits`, in the parameter set's order.
    pub fn backward<T: Real>(
        &self,
        ps: &ParamSet<T>,
        cache: &ModelCache<T>,
        dlogits: &Tensor<T>,
    ) -> RefResult<ParamSet<T>> {
        let c = &self.config;
        if cache.blocks.len() != c.layers {
            return Err(RefError::invalid(
                "TinyModel::backward",
                format!(
                    "cache has {} blocks, model {} layers",
                    cache.blocks.len(),
                    c.layers
                ),
            ));
        }
        let mut grads: ParamSet<T> = ParamSet::new();
        for (n, t) in ps.iter() {
            grads.insert(n, Tensor::zeros(t.shape()));
        }
        let mut set = |name: String, g: Tensor<T>| -> RefResult<()> {
            *grads.get_mut(&name)? = g;
            Ok(())
        };
        let gh = Linear.backward(ps.get("lm_head.weight")?, &cache.head, dlogits)?;
        set("lm_head.weight".into(), gh.dweight)?;
        let gn = self
            .norm()
            .backward(ps.get("model.norm.weight")?, &cache.final_norm, &gh.dx)?;
        set("model.norm.weight".into(), gn.dweight)?;
        let mut dx = gn.dx;
        for l in (0..c.layers).rev() {
            let bc = &cache.blocks[l];
            let p = format!("model.layers.{l}.");
            let a = format!("{p}self_attn.");
            let m = format!("{p}mlp.");
            // out = h + mlp(norm2(h))
            let dmlp_in = match &bc.mlp {
                MlpCache::Moe(mc) => {
                    let cfg = c.moe.ok_or_else(|| {
                        RefError::invalid("backward", "MoE cache without MoE config")
                    })?;
                    let g = Self::moe(cfg).backward(Self::moe_params(ps, &m)?, mc, &dx)?;
                    set(format!("{m}gate.weight"), g.drouter)?;
                    set(format!("{m}experts.gate_up_proj"), g.dgate_up)?;
                    set(format!("{m}experts.down_proj"), g.ddown)?;
                    g.dx
                }
                MlpCache::Dense(dc) => {
                    let g = SwiGlu.backward(Self::dense_params(ps, &m)?, dc, &dx)?;
                    set(format!("{m}gate_proj.weight"), g.dgate)?;
                    set(format!("{m}up_proj.weight"), g.dup)?;
                    set(format!("{m}down_proj.weight"), g.ddown)?;
                    g.dx
                }
            };
            let n2 = format!("{p}post_attention_layernorm.weight");
            let g2 = self.norm().backward(ps.get(&n2)?, &bc.norm2, &dmlp_in)?;
            set(n2, g2.dweight)?;
            let dh = dx.add(&g2.dx)?;
            // h = x + attn(norm1(x))
            let dattn_in = match &bc.attn {
                AttnCache::Mla(mc) => {
                    let cfg = c.mla.ok_or_else(|| {
                        RefError::invalid("backward", "MLA cache without MLA config")
                    })?;
                    let g = self
                        .mla(cfg)
                        .backward(self.mla_params(ps, &a, cfg)?, mc, &dh)?;
                    for (name, t) in [
                        ("q_a_proj.weight", g.dq_a),
                        ("q_a_layernorm.weight", g.dq_a_norm),
                        ("q_b_proj.weight", g.dq_b),
                        ("q_proj.weight", g.dq),
                    ] {
                        if let Some(t) = t {
                            set(format!("{a}{name}"), t)?;
                        }
                    }
                    set(format!("{a}kv_a_proj_with_mqa.weight"), g.dkv_a)?;
                    set(format!("{a}kv_a_layernorm.weight"), g.dkv_a_norm)?;
                    set(format!("{a}kv_b_proj.weight"), g.dkv_b)?;
                    set(format!("{a}o_proj.weight"), g.do_)?;
                    g.dx
                }
                AttnCache::Gqa(sc) => {
                    let g = self.gqa().backward(self.gqa_params(ps, &a)?, sc, &dh)?;
                    set(format!("{a}q_proj.weight"), g.dq)?;
                    set(format!("{a}k_proj.weight"), g.dk)?;
                    set(format!("{a}v_proj.weight"), g.dv)?;
                    set(format!("{a}o_proj.weight"), g.do_)?;
                    if let (Some(q), Some(k)) = (g.dq_norm, g.dk_norm) {
                        set(format!("{a}q_norm.weight"), q)?;
                        set(format!("{a}k_norm.weight"), k)?;
                    }
                    g.dx
                }
            };
            let n1 = format!("{p}input_layernorm.weight");
            let g1 = self.norm().backward(ps.get(&n1)?, &bc.norm1, &dattn_in)?;
            set(n1, g1.dweight)?;
            dx = dh.add(&g1.dx)?;
        }
        let de = Embedding.backward(&cache.embed, &dx)?;
        set("model.embed_tokens.weight".into(), de)?;
        Ok(grads)
    }

    /// Mean cross-entropy of next-token `targets`.
    pub fn loss<T: Real>(
        &self,
        ps: &ParamSet<T>,
        ids: &[usize],
        targets: &[usize],
        seq_len: usize,
    ) -> RefResult<T> {
        let (logits, _) = self.forward(ps, ids, seq_len)?;
        Ok(CrossEntropy.forward(&logits, targets)?.0)
    }

    /// Loss and the gradient of every parameter (one forward and one backward pass).
    pub fn loss_and_grads<T: Real>(
        &self,
        ps: &ParamSet<T>,
        ids: &[usize],
        targets: &[usize],
        seq_len: usize,
    ) -> RefResult<(T, ParamSet<T>)> {
        let (logits, cache) = self.forward(ps, ids, seq_len)?;
        let (loss, ce) = CrossEntropy.forward(&logits, targets)?;
        let dlogits = CrossEntropy.backward(&ce, T::ONE)?;
        let grads = self.backward(ps, &cache, &dlogits)?;
        Ok((loss, grads))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_huggingface_and_counts_add_up() {
        let c = ModelConfig {
            moe: Some(MoeConfig {
                experts: 4,
                top_k: 2,
                intermediate: 8,
                norm_topk_prob: true,
                first_dense_layers: 1,
            }),
            ..ModelConfig::tiny()
        };
        let specs = c.param_specs();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names[0], "model.embed_tokens.weight");
        assert!(names.contains(&"model.layers.0.mlp.gate_proj.weight"));
        assert!(names.contains(&"model.layers.1.mlp.experts.gate_up_proj"));
        assert!(names.contains(&"model.layers.1.self_attn.q_norm.weight"));
        assert_eq!(*names.last().unwrap(), "lm_head.weight");
        let gu = specs
            .iter()
            .find(|s| s.name.ends_with("gate_up_proj"))
            .unwrap();
        assert_eq!(gu.shape, vec![4, 16, 16]);
        let total: usize = specs.iter().map(ParamSpec::numel).sum();
        let ps = c.init_params::<f32>(0).unwrap();
        assert_eq!(ps.numel(), total);
        assert_eq!(ps.len(), specs.len());
    }

    #[test]
    fn sharded_init_equals_the_slice_of_the_full_init() {
        let c = ModelConfig::tiny();
        let full = c.init_params::<f32>(11).unwrap();
        for spec in c.param_specs() {
            let t = full.get(&spec.name).unwrap().as_slice();
            let n = spec.numel() as u64;
            for shards in [2u64, 3, 5] {
                let chunk = n.div_ceil(shards);
                for s in 0..shards {
                    let (a, b) = ((s * chunk).min(n), ((s + 1) * chunk).min(n));
                    assert_eq!(spec.init_range(11, a, b), t[a as usize..b as usize]);
                }
            }
        }
        assert_ne!(full.digest(), c.init_params::<f32>(12).unwrap().digest());
    }

    #[test]
    fn bad_configs_and_inputs_are_errors() {
        let bad = ModelConfig {
            kv_heads: 3,
            ..ModelConfig::tiny()
        };
        assert!(TinyModel::new(bad).is_err());
        let bad_moe = ModelConfig {
            moe: Some(MoeConfig {
                experts: 2,
                top_k: 3,
                intermediate: 4,
                norm_topk_prob: true,
                first_dense_layers: 0,
            }),
            ..ModelConfig::tiny()
        };
        assert!(bad_moe.validate().is_err());
        let c = ModelConfig::tiny();
        let m = TinyModel::new(c).unwrap();
        let ps = c.init_params::<f32>(0).unwrap();
        assert!(m.forward(&ps, &[1, 2, 3], 2).is_err(), "3 tokens, seq 2");
        assert!(m.forward(&ps, &[1, 99], 2).is_err(), "id outside vocab");
        assert!(m.loss(&ps, &[1, 2], &[0], 2).is_err(), "target count");
        let mut missing = ParamSet::new();
        missing.insert(
            "model.embed_tokens.weight",
            ps.get("model.embed_tokens.weight").unwrap().clone(),
        );
        assert!(matches!(
            m.forward(&missing, &[1, 2], 2),
            Err(RefError::MissingParam(_))
        ));
    }
}
