//! Scenario files (TOML): model, hardware profile name, meshes, topology, training shape,
//! FSDP strategy and options, optimizer and plan overrides. Unknown keys are rejected and
//! every error names the file, the line and the key.
//!
//! See docs/scenario-format.md for the full key list with units and defaults.

use crate::error::{PlanError, PlanResult};
use crate::limits;
use crate::mesh::DeviceMesh;
use crate::model::{DType, ExpertLayout, ModelIr, ModelOptions};
use crate::optimizer_numerics::{NumericsKeys, check_numerics_keys};
use crate::planner::PlannerInput;
use crate::planner::overrides::{PlanOverride, RawOverride};
use crate::planner::templates::PlanAxes;
use crate::toml_lines::find_key_line;
use crate::topology::Topology;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// FSDP strategies the simulator knows (the scenario's strategy and its baselines).
pub const FSDP_STRATEGIES: &[&str] = &["hyperparallel", "fsdp2", "megatron-ddp"];
/// Muon presets.
pub const MUON_PRESETS: &[&str] = &[
    "hyperparallel",
    "keller-jordan",
    "torch",
    "moonlight",
    "custom",
];
/// `[train] tp_comm_overlap` modes: TP collectives serialized with compute, or fused with the
/// neighbouring GEMM and pipelined in chunks (see `strategy::tp_overlap`).
pub const TP_COMM_OVERLAP_MODES: &[&str] = &["none", "fused"];
/// `[train] kernel_library` values.
pub const KERNEL_LIBRARIES: &[&str] = &["torch_cuda"];

/// `[train] loss_logits` values.
pub const LOSS_LOGITS_MODES: &[&str] = &["chunked", "whole_f32"];

fn default_loss_logits() -> String {
    "chunked".into()
}

/// Distributed-Muon baselines.
pub const MUON_BASELINES: &[&str] = &["naive", "moonlight", "dmuon", "matrixfsdp", "flexshard"];

/// `[model]`: where the model comes from and how its parameters are named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Path (relative to the scenario file) of a HuggingFace `config.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_config: Option<String>,
    /// Path of a compact TOML model description (for models without an HF config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact: Option<String>,
    /// `fused` (transformers v5 in-memory names) or `per_expert` (checkpoint names).
    #[serde(default)]
    pub expert_layout: ExpertLayout,
    /// Train the checkpoint's multi-token-prediction layers too.
    #[serde(default)]
    pub include_mtp: bool,
    /// Master dtype of the parameters (`bf16` or `f32`).
    #[serde(default = "default_bf16")]
    pub dtype: String,
    /// Train only the first N decoder layers of the config (as a measurement harness that
    /// sets `num_hidden_layers` on the HF config does); absent: the config's own count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_hidden_layers: Option<usize>,
    /// Override the config's `tie_word_embeddings` (an untied LM head is a parameter of its
    /// own); absent: the config's own value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tie_word_embeddings: Option<bool>,
    /// How the routed experts run ([`EXPERTS_IMPLEMENTATIONS`]): absent, the recipes the
    /// paper's runs were calibrated with; `grouped_mm`, transformers' `grouped_mm` experts
    /// (`experts_implementation="grouped_mm"`: sort, gathers, masked fills, `_grouped_mm`);
    /// `eager`, transformers' per-expert loop (`Qwen3MoeExperts.forward`: per hit expert a
    /// device -> host read-back, a gather, two GEMMs and an `index_add_`; backward a
    /// full-size gradient of each 3-D expert parameter per expert).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts_implementation: Option<String>,
}

/// `[model] experts_implementation` values.
pub const EXPERTS_IMPLEMENTATIONS: &[&str] = &["grouped_mm", "eager"];

fn default_bf16() -> String {
    "bf16".into()
}
fn one() -> usize {
    1
}
fn yes() -> bool {
    true
}

/// `[mesh]`: parallel degrees. The dense mesh is `dp_replicate x dp_shard x cp x tp`
/// (row-major, `tp` fastest); the expert mesh is `edp_replicate x edp_shard x ep x etp`
/// over the same ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeshSection {
    /// HSDP replicas of dense parameters.
    #[serde(default = "one")]
    pub dp_replicate: usize,
    /// FSDP shard group of dense parameters.
    #[serde(default = "one")]
    pub dp_shard: usize,
    /// Context parallelism.
    #[serde(default = "one")]
    pub cp: usize,
    /// Tensor parallelism of dense layers.
    #[serde(default = "one")]
    pub tp: usize,
    /// Expert parallelism.
    #[serde(default = "one")]
    pub ep: usize,
    /// Tensor parallelism inside experts.
    #[serde(default = "one")]
    pub etp: usize,
    /// HSDP replicas of expert parameters (default: as many as fit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edp_replicate: Option<usize>,
    /// FSDP shard group of expert parameters (default: the rest of the world).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edp_shard: Option<usize>,
}

/// `[topology]`: how ranks map to dies, machines and supernodes (contiguous blocks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySection {
    /// Ranks (dies) per machine.
    pub dies_per_machine: usize,
    /// Machines per supernode.
    pub machines_per_supernode: usize,
    /// Supernodes.
    pub supernodes: usize,
}

/// Activation recomputation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RecomputeSpec {
    /// `"off"` or `"full"` (all layers).
    Mode(String),
    /// `{ mode = "full", layers = "0..27" }` (half-open range of decoder layers).
    Layers {
        /// `full` or `selective`.
        mode: String,
        /// Half-open layer range `a..b`.
        layers: String,
    },
}

impl Default for RecomputeSpec {
    fn default() -> Self {
        RecomputeSpec::Mode("off".into())
    }
}

/// Resolved recomputation: which layers recompute their forward in backward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recompute {
    /// `off`, `full` or `selective`.
    pub mode: String,
    /// Half-open range of recomputed decoder layers.
    pub layers: std::ops::Range<usize>,
}

impl Recompute {
    /// True if layer `i` recomputes.
    pub fn covers(&self, layer: usize) -> bool {
        self.mode != "off" && self.layers.contains(&layer)
    }
}

/// `[train]`: the training shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSection {
    /// Sequence length in tokens.
    pub seq_len: u64,
    /// Global batch in sequences.
    pub global_batch: u64,
    /// Micro batch in sequences per data-parallel rank.
    pub micro_batch: u64,
    /// Activation recomputation.
    #[serde(default)]
    pub recompute: RecomputeSpec,
    /// Sequence parallelism between TP regions.
    #[serde(default = "yes")]
    pub sequence_parallel: bool,
    /// Vocab-parallel loss.
    #[serde(default)]
    pub loss_parallel: bool,
    /// How the (non-vocab-parallel) loss holds the logits ([`LOSS_LOGITS_MODES`]):
    /// `chunked` (default: only what the loss saves, as HyperParallel's `ChunkedCausalLMLoss`
    /// or a fused kernel) or `whole_f32` (transformers' `ForCausalLMLoss`: the bf16 logits,
    /// their f32 upcast and two f32 vocabulary gradients at once).
    #[serde(default = "default_loss_logits")]
    pub loss_logits: String,
    /// Which kernels the eager step runs ([`KERNEL_LIBRARIES`]): absent, the fused-kernel
    /// census the paper's Ascend runs were calibrated with (one attention kernel each way,
    /// element-wise kernels at one bandwidth); `torch_cuda`, PyTorch eager on CUDA: torch
    /// SDPA's cuDNN backend (its backward adds a dO-dot-O preprocess, the dQ conversion and,
    /// under GQA, one head reduction each for dK and dV) and TensorIterator element-wise
    /// kernels, vectorized or strided (broadcast, non-contiguous or bf16-to-f32 operands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_library: Option<String>,
    /// Low-precision (fp8) training; gates `when = "low_precision"` overrides.
    #[serde(default)]
    pub low_precision: bool,
    /// Expert-parallel routing imbalance on top of uniform top-k routing: the busiest EP
    /// rank's routed token count is the expected maximum under uniform routing times this
    /// factor (>= 1.0; 1.0, the default, is perfectly random routing). See
    /// [`crate::strategy::routing`].
    #[serde(default = "unit_skew", skip_serializing_if = "is_unit_skew")]
    pub routing_skew: f64,
    /// How TP collectives run next to their GEMMs: `none` (serialized, the default) or
    /// `fused` (all-gather + GEMM and GEMM + reduce-scatter/all-reduce pipelined in chunks,
    /// as torch_npu's MC2 operators do).
    #[serde(default = "default_tp_comm_overlap")]
    pub tp_comm_overlap: String,
    /// Chunks of a fused pair (default: the TP degree); only with `tp_comm_overlap = "fused"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_comm_overlap_chunks: Option<u64>,
}

fn unit_skew() -> f64 {
    1.0
}

fn is_unit_skew(v: &f64) -> bool {
    *v == 1.0
}

fn default_tp_comm_overlap() -> String {
    "none".into()
}

/// Per-baseline changes to the FSDP options (e.g. FSDP2 with prefetch depth 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsdpVariant {
    /// Prefetch depth for this strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch_depth: Option<usize>,
    /// Reshard after forward for this strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshard_after_forward: Option<bool>,
    /// Gradient bucket size for megatron-ddp, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_bytes: Option<u64>,
}

/// `[fsdp]`: the FSDP strategy, the baselines to compare with, and options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsdpSection {
    /// `hyperparallel`, `fsdp2` or `megatron-ddp`.
    #[serde(default = "default_strategy")]
    pub strategy: String,
    /// Strategies to simulate beside it.
    #[serde(default)]
    pub baselines: Vec<String>,
    /// Free gathered parameters after forward (gather again in backward).
    #[serde(default = "yes")]
    pub reshard_after_forward: bool,
    /// Free gathered parameters after backward.
    #[serde(default = "yes")]
    pub reshard_after_backward: bool,
    /// Units prefetched ahead in forward and backward.
    #[serde(default = "one")]
    pub prefetch_depth: usize,
    /// Dtype of gathered parameters (compute dtype).
    #[serde(default = "default_bf16")]
    pub param_dtype: String,
    /// Dtype of gradient reduction.
    #[serde(default = "default_f32")]
    pub reduce_dtype: String,
    /// Keep reduced gradients in an FP32 `main_grad` (HyperParallel's
    /// `MixedPrecisionPolicy.apply_grad_on_fp32_main_grad`, default false) instead of casting
    /// each reduced shard back to the master dtype in `apply_reduced_grad`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fp32_main_grad: bool,
    /// Per-strategy option changes, e.g. `[fsdp.variant.fsdp2] prefetch_depth = 0`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub variant: IndexMap<String, FsdpVariant>,
}

fn default_strategy() -> String {
    "hyperparallel".into()
}
fn default_f32() -> String {
    "f32".into()
}

impl Default for FsdpSection {
    fn default() -> Self {
        toml::from_str("").unwrap_or_else(|_| unreachable!("all fields default"))
    }
}

/// Muon momentum: one coefficient or HyperParallel's two-coefficient form `(m1, m2)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Momentum {
    /// `u = g + m·buf`, `buf = m·buf + g`.
    One(f64),
    /// `u = g + m1·buf_old`, `buf = m2·buf_old + g`.
    Two([f64; 2]),
}

/// `[optimizer.muon]` options; absent keys take the preset's values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MuonOptions {
    /// Learning rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Decoupled weight decay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
    /// Momentum coefficient(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<Momentum>,
    /// Nesterov momentum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nesterov: Option<bool>,
    /// Newton-Schulz iterations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_steps: Option<usize>,
    /// Frobenius-normalization epsilon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_epsilon: Option<f64>,
    /// Update RMS matched to AdamW (scale = rms·sqrt(max(m,n))).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_adamw_rms: Option<f64>,
    /// Coefficient triples (a, b, c) per step for `preset = "custom"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coefficients: Option<Vec<[f64; 3]>>,
    /// Replica subgroup size for replica-domain dedup (default: from devices per machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_count: Option<usize>,
    /// How replica subgroups are cut: `launcher` (default; the paper's devices-per-machine
    /// rule) or `topology` (the replica-group members that share a machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_subgroups: Option<String>,
    /// Whether a shard-path NS memory batch first takes one matrix per shard-group rank
    /// before its 2^29 / S cap applies (HyperParallel's `min_batch_size = S`, commit 3ad2a77;
    /// default `true`). `false` is the earlier revision, where every matrix above the cap is
    /// a batch of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_batch_fill_owners: Option<bool>,
    /// Newton-Schulz rounding order (`gram_squared_first`, `eager`, `addmm`,
    /// `addmm_cpublas`, `addmm_onednn`; default: the preset's), see
    /// [`crate::optimizer_numerics::NsOpOrder`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_order: Option<String>,
    /// Element-wise form of the momentum and update (`unfused` or `torch_cpu_fma`; default:
    /// the preset's), see [`crate::optimizer_numerics::ElementwiseNumerics`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numerics: Option<String>,
}

/// `[optimizer.adamw]` options (for 1-D parameters, embeddings and heads).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamwOptions {
    /// Learning rate.
    #[serde(default = "adamw_lr")]
    pub lr: f64,
    /// (beta1, beta2).
    #[serde(default = "adamw_betas")]
    pub betas: [f64; 2],
    /// Denominator epsilon.
    #[serde(default = "adamw_eps")]
    pub eps: f64,
    /// Decoupled weight decay.
    #[serde(default = "adamw_wd")]
    pub weight_decay: f64,
    /// Element-wise kernel form (`unfused`, the default, or `torch_cpu_fma`), see
    /// [`crate::optimizer_numerics::ElementwiseNumerics`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numerics: Option<String>,
}

fn adamw_lr() -> f64 {
    1e-3
}
fn adamw_betas() -> [f64; 2] {
    [0.9, 0.95]
}
fn adamw_eps() -> f64 {
    1e-8
}
fn adamw_wd() -> f64 {
    1e-2
}

impl Default for AdamwOptions {
    fn default() -> Self {
        Self {
            lr: adamw_lr(),
            betas: adamw_betas(),
            eps: adamw_eps(),
            weight_decay: adamw_wd(),
            numerics: None,
        }
    }
}

/// `[optimizer]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerSection {
    /// `muon+adamw` or `adamw`.
    #[serde(default = "default_opt_kind")]
    pub kind: String,
    /// Muon preset: hyperparallel, keller-jordan, torch, moonlight, custom.
    #[serde(default = "default_preset")]
    pub preset: String,
    /// Distributed-Muon baselines to simulate beside the hyperparallel optimizer.
    #[serde(default)]
    pub baselines: Vec<String>,
    /// Muon options.
    #[serde(default)]
    pub muon: MuonOptions,
    /// AdamW options.
    #[serde(default)]
    pub adamw: AdamwOptions,
}

fn default_opt_kind() -> String {
    "muon+adamw".into()
}
fn default_preset() -> String {
    "hyperparallel".into()
}

impl Default for OptimizerSection {
    fn default() -> Self {
        toml::from_str("").unwrap_or_else(|_| unreachable!("all fields default"))
    }
}

/// `[plan]`: planner switches and overrides.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSection {
    /// Downgrade uncovered trainable parameters from error to warning.
    #[serde(default)]
    pub allow_uncovered: bool,
    /// `[[plan.override]]` entries.
    #[serde(default, rename = "override")]
    pub overrides: Vec<RawOverride>,
}

/// The scenario file as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// Short name.
    pub name: String,
    /// One-line description.
    #[serde(default)]
    pub description: String,
    /// Hardware profile name (`scenarios/hardware/<name>.toml`).
    pub hardware: String,
    /// Model source.
    pub model: ModelSection,
    /// Parallel degrees.
    pub mesh: MeshSection,
    /// Physical topology.
    pub topology: TopologySection,
    /// Training shape.
    pub train: TrainSection,
    /// FSDP strategy.
    #[serde(default)]
    pub fsdp: FsdpSection,
    /// Optimizer.
    #[serde(default)]
    pub optimizer: OptimizerSection,
    /// Planner switches and overrides.
    #[serde(default)]
    pub plan: PlanSection,
    /// `[gate]`: the CI gate's options (its verification twin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<crate::scenario_gate::GateSection>,
    /// `[whatif]`: faults and heterogeneity to simulate (see [`crate::whatif`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whatif: Option<crate::whatif::WhatIfSection>,
}

/// A loaded, validated scenario with its model and meshes.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The scenario file path.
    pub path: PathBuf,
    /// The file as written.
    pub file: ScenarioFile,
    /// The model.
    pub model: ModelIr,
    /// Dense mesh `dp_replicate x dp_shard x cp x tp`.
    pub dense_mesh: DeviceMesh,
    /// Expert mesh `edp_replicate x edp_shard x ep x etp`.
    pub expert_mesh: DeviceMesh,
    /// Topology.
    pub topology: Topology,
    /// Resolved recomputation.
    pub recompute: Recompute,
    /// Micro-batches per step per data-parallel rank.
    pub grad_accum_steps: u64,
    /// Parsed overrides.
    pub overrides: Vec<PlanOverride>,
    /// Master parameter dtype.
    pub master_dtype: DType,
    /// Gathered-parameter dtype.
    pub param_dtype: DType,
    /// Gradient-reduction dtype.
    pub reduce_dtype: DType,
}

fn line_of_offset(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The dotted `section.key` of a `key = value` pair written on 1-based `line`, if any.
fn key_at_line(text: &str, line: usize) -> Option<String> {
    let written = text.lines().nth(line.checked_sub(1)?)?.trim();
    if written.starts_with('[') {
        return None;
    }
    let key = written.split_once('=')?.0.trim().trim_matches('"');
    let section = text
        .lines()
        .take(line)
        .filter_map(|l| l.trim().strip_prefix('['))
        .map(|h| {
            h.trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim()
        })
        .last()
        .unwrap_or("");
    Some(if section.is_empty() {
        key.to_string()
    } else {
        format!("{section}.{key}")
    })
}

/// Line of the `n`-th `[[plan.override]]` header (1-based lines, `n` from 0).
/// The first entry of `list` that appears in it twice.
fn listed_twice(list: &[String]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    list.iter()
        .find(|b| !seen.insert(b.as_str()))
        .map(String::as_str)
}

/// The 1-based line of every `[[plan.override]]` header, in order.
fn override_lines(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim().starts_with("[[plan.override]]"))
        .map(|(i, _)| i + 1)
        .collect()
}

/// A scenario dtype key: `bf16`, `f16` or `f32`. fp8 parses as a [`DType`] but is refused:
/// nothing models it (the simulator has no fp8 GEMM rate or scaling factors, the reference
/// executor no fp8 arithmetic), so a prediction would be bf16 compute with 1-byte buffers.
fn parse_dtype(text: &str, file: &str, src: &str, section: &str, key: &str) -> PlanResult<DType> {
    let err = |why: &str| PlanError::Scenario {
        file: file.into(),
        line: find_key_line(src, section, key),
        message: format!("[{section}] {key} = \"{text}\" {why}; use bf16, f16 or f32"),
    };
    match DType::parse(text) {
        Some(DType::F8e4m3) => Err(err(
            "is not modelled (no fp8 GEMM rate, scaling or arithmetic in the simulator or the reference executor)",
        )),
        Some(d) => Ok(d),
        None => Err(err("is not a dtype")),
    }
}

/// Checks `[train] tp_comm_overlap` and `tp_comm_overlap_chunks`.
fn check_tp_comm_overlap(
    tr: &TrainSection,
    key_err: &dyn Fn(&str, &str, String) -> PlanError,
) -> PlanResult<()> {
    let mode = tr.tp_comm_overlap.as_str();
    if !TP_COMM_OVERLAP_MODES.contains(&mode) {
        return Err(key_err(
            "train",
            "tp_comm_overlap",
            format!(
                "[train] tp_comm_overlap = \"{mode}\"; use one of {} (none: TP collectives \
                 serialized with compute; fused: pipelined under the neighbouring GEMM)",
                TP_COMM_OVERLAP_MODES.join(", ")
            ),
        ));
    }
    match tr.tp_comm_overlap_chunks {
        Some(0) => Err(key_err(
            "train",
            "tp_comm_overlap_chunks",
            "[train] tp_comm_overlap_chunks = 0; it must be at least 1 (or left out: the TP \
             degree)"
                .into(),
        )),
        Some(c) if c > limits::TP_COMM_OVERLAP_CHUNKS.max => Err(key_err(
            "train",
            "tp_comm_overlap_chunks",
            limits::TP_COMM_OVERLAP_CHUNKS.check(c).unwrap_err(),
        )),
        Some(c) if mode != "fused" => Err(key_err(
            "train",
            "tp_comm_overlap_chunks",
            format!(
                "[train] tp_comm_overlap_chunks = {c} needs tp_comm_overlap = \"fused\" \
                 (it is \"{mode}\"); remove tp_comm_overlap_chunks or set tp_comm_overlap = \
                 \"fused\""
            ),
        )),
        _ => Ok(()),
    }
}

fn parse_range(text: &str) -> Option<std::ops::Range<usize>> {
    let (a, b) = text.split_once("..")?;
    Some(a.trim().parse().ok()?..b.trim().parse().ok()?)
}

/// An error builder at the line of `key` in `[section]`.
type KeyErr<'a> = dyn Fn(&str, &str, String) -> PlanError + 'a;

/// The scenario text and its file name, for errors that point at a line and key.
struct Source<'a> {
    text: &'a str,
    file_label: &'a str,
}

impl Source<'_> {
    /// An error at `line` of the file.
    fn err(&self, line: usize, message: String) -> PlanError {
        PlanError::Scenario {
            file: self.file_label.to_string(),
            line,
            message,
        }
    }

    /// An error at the line of `key` in `[section]`.
    fn key_err(&self, section: &str, key: &str, message: String) -> PlanError {
        self.err(find_key_line(self.text, section, key), message)
    }
}

/// Checks a hardware profile name (the scenario's `hardware` or a `--hardware` flag): a plain
/// file stem of `scenarios/hardware/`, not empty and not a path.
pub fn check_profile_name(name: &str) -> Result<(), String> {
    let plain = !name.trim().is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if plain {
        Ok(())
    } else {
        Err(format!(
            "hardware profile name \"{}\" is not a plain profile name; use the file stem of a \
             profile in scenarios/hardware/ (letters, digits, '-', '_', '.'; no path), e.g. \
             ascend-910c-a3",
            name.escape_debug()
        ))
    }
}

/// Checks the top-level `name` (not empty) and `hardware` (a plain profile name).
fn check_names(raw: &ScenarioFile, src: &Source) -> PlanResult<()> {
    if raw.name.trim().is_empty() || raw.name.chars().any(char::is_control) {
        return Err(src.key_err(
            "",
            "name",
            format!(
                "name = \"{}\"; give the scenario a short non-empty name without control \
                 characters (it labels every report)",
                raw.name.escape_debug()
            ),
        ));
    }
    check_profile_name(&raw.hardware).map_err(|e| src.key_err("", "hardware", e))
}

/// Loads the model named by `[model]` (relative to the scenario file) and its master dtype.
fn load_model(raw: &ScenarioFile, path: &Path, src: &Source) -> PlanResult<(ModelIr, DType)> {
    let (text, file_label) = (src.text, src.file_label);
    let key_err = |section: &str, key: &str, message: String| src.key_err(section, key, message);
    // Model.
    let dir = path.parent().unwrap_or(Path::new("."));
    let model_path = match (&raw.model.hf_config, &raw.model.compact) {
        (Some(p), None) | (None, Some(p)) => dir.join(p),
        (Some(_), Some(_)) => {
            return Err(key_err(
                "model",
                "compact",
                "[model] sets both hf_config and compact; keep one".into(),
            ));
        }
        (None, None) => {
            return Err(key_err(
                "model",
                "hf_config",
                "[model] needs hf_config = \"path/to/config.json\" or compact = \"path/to/model.toml\"".into(),
            ));
        }
    };
    let master_dtype = parse_dtype(&raw.model.dtype, file_label, text, "model", "dtype")?;
    let options = ModelOptions {
        expert_layout: raw.model.expert_layout,
        include_mtp: raw.model.include_mtp,
        param_dtype: master_dtype,
    };
    let model = ModelIr::load(&model_path, options).map_err(|e| {
        let key = if raw.model.hf_config.is_some() {
            "hf_config"
        } else {
            "compact"
        };
        key_err("model", key, format!("[model] {key}: {e}"))
    })?;
    let model = apply_config_overrides(model, &raw.model, &key_err)?;
    check_choice(
        "model",
        &raw.model.experts_implementation,
        "experts_implementation",
        EXPERTS_IMPLEMENTATIONS,
        " (transformers' `batched_mm` and kernel-hub experts are not modelled)",
        &key_err,
    )?;
    if raw.model.experts_implementation.as_deref() == Some("eager") && raw.mesh.ep > 1 {
        return Err(key_err(
            "model",
            "experts_implementation",
            format!(
                "[model] experts_implementation = \"eager\" is transformers' per-expert loop over \
                 one rank's experts, not modelled with [mesh] ep = {} (expert parallelism runs \
                 HyperParallel's expert modules); set ep = 1 or leave experts_implementation out",
                raw.mesh.ep
            ),
        ));
    }
    Ok((model, master_dtype))
}

/// Refuses an optional `[section] <key>` choice (an implementation or library the model
/// knows) that is not one of `allowed`; `note` explains the values or what is missing.
fn check_choice(
    section: &str,
    value: &Option<String>,
    key: &str,
    allowed: &[&str],
    note: &str,
    key_err: &KeyErr,
) -> PlanResult<()> {
    match value {
        Some(v) if !allowed.contains(&v.as_str()) => Err(key_err(
            section,
            key,
            format!(
                "[{section}] {key} = \"{v}\" is not modelled; use one of {}{note} or leave it out",
                allowed.join(", ")
            ),
        )),
        _ => Ok(()),
    }
}

/// Rebuilds `model` with `[model] num_hidden_layers` / `tie_word_embeddings` applied to its
/// config (validated again, so a count the config cannot take is an error on that key).
fn apply_config_overrides(
    model: ModelIr,
    section: &ModelSection,
    key_err: &dyn Fn(&str, &str, String) -> PlanError,
) -> PlanResult<ModelIr> {
    if section.num_hidden_layers.is_none() && section.tie_word_embeddings.is_none() {
        return Ok(model);
    }
    let mut config = model.config.clone();
    let key = if section.num_hidden_layers.is_some() {
        "num_hidden_layers"
    } else {
        "tie_word_embeddings"
    };
    if let Some(layers) = section.num_hidden_layers {
        config.num_hidden_layers = layers;
    }
    if let Some(tie) = section.tie_word_embeddings {
        config.tie_word_embeddings = tie;
    }
    ModelIr::from_config(model.name.clone(), config, model.options).map_err(|e| {
        key_err(
            "model",
            key,
            format!("[model] {key}: the overridden config is not valid: {e}"),
        )
    })
}

/// Checks `[mesh]` and `[topology]` and builds the dense mesh, the expert mesh and the topology.
fn build_meshes(
    raw: &ScenarioFile,
    src: &Source,
) -> PlanResult<(DeviceMesh, DeviceMesh, Topology)> {
    let key_err = |section: &str, key: &str, message: String| src.key_err(section, key, message);
    let m = &raw.mesh;
    let world = dense_world(m, &key_err)?;
    let dense_mesh = DeviceMesh::new([
        ("dp_replicate", m.dp_replicate),
        ("dp_shard", m.dp_shard),
        ("cp", m.cp),
        ("tp", m.tp),
    ])
    .map_err(|e| key_err("mesh", "dp_shard", e.to_string()))?;
    let (edp_replicate, edp_shard) = expert_degrees(m, world, &key_err)?;
    let expert_mesh = DeviceMesh::new([
        ("edp_replicate", edp_replicate),
        ("edp_shard", edp_shard),
        ("ep", m.ep),
        ("etp", m.etp),
    ])
    .map_err(|e| key_err("mesh", "ep", e.to_string()))?;
    check_topology_limits(&raw.topology, &key_err)?;
    let t = &raw.topology;
    let topology = Topology::new(t.dies_per_machine, t.machines_per_supernode, t.supernodes)
        .map_err(|e| key_err("topology", "dies_per_machine", e.to_string()))?;
    topology
        .check_world_size(world)
        .map_err(|e| key_err("topology", "supernodes", e.to_string()))?;
    Ok((dense_mesh, expert_mesh, topology))
}

/// Checks every `[mesh]` degree against [`limits::MESH_DEGREE`]; returns the dense world size
/// `dp_replicate x dp_shard x cp x tp`, checked against [`limits::WORLD_SIZE`].
fn dense_world(m: &MeshSection, key_err: &KeyErr) -> PlanResult<usize> {
    for (key, v) in [
        ("dp_replicate", Some(m.dp_replicate)),
        ("dp_shard", Some(m.dp_shard)),
        ("cp", Some(m.cp)),
        ("tp", Some(m.tp)),
        ("ep", Some(m.ep)),
        ("etp", Some(m.etp)),
        ("edp_replicate", m.edp_replicate),
        ("edp_shard", m.edp_shard),
    ] {
        if let Some(v) = v {
            let written = format!("[mesh] {key}");
            limits::MESH_DEGREE
                .check_as(&written, v as u64)
                .map_err(|e| {
                    key_err("mesh", key, format!("{e}; every degree must be at least 1"))
                })?;
        }
    }
    let world = limits::checked_product(
        &limits::WORLD_SIZE,
        &[
            ("dp_replicate", m.dp_replicate as u64),
            ("dp_shard", m.dp_shard as u64),
            ("cp", m.cp as u64),
            ("tp", m.tp as u64),
        ],
    )
    .map_err(|e| key_err("mesh", "dp_shard", format!("[mesh] {e}")))?;
    Ok(world as usize)
}

/// The expert mesh's `(edp_replicate, edp_shard)` over `world` ranks (defaults: as many
/// replicas as fit, the rest sharded), with every product checked.
fn expert_degrees(m: &MeshSection, world: usize, key_err: &KeyErr) -> PlanResult<(usize, usize)> {
    let expert_block = m.ep.checked_mul(m.etp).filter(|b| world.is_multiple_of(*b));
    let Some(expert_block) = expert_block else {
        return Err(key_err(
            "mesh",
            "ep",
            format!(
                "[mesh] ep {} x etp {} does not divide the {world} ranks of the dense mesh; choose ep and etp dividing it",
                m.ep, m.etp
            ),
        ));
    };
    let edp = world / expert_block;
    let edp_replicate = m.edp_replicate.unwrap_or_else(|| {
        m.edp_shard
            .map_or(m.dp_replicate.min(edp), |s| edp / s.max(1))
    });
    let edp_shard = m.edp_shard.unwrap_or(edp / edp_replicate.max(1));
    let ranks = edp_replicate
        .checked_mul(edp_shard)
        .and_then(|r| r.checked_mul(expert_block));
    if ranks != Some(world) {
        return Err(key_err(
            "mesh",
            if m.edp_shard.is_some() {
                "edp_shard"
            } else {
                "edp_replicate"
            },
            format!(
                "expert mesh edp_replicate {edp_replicate} x edp_shard {edp_shard} x ep {} x etp {} = {} ranks, but the dense mesh has {world}; make the products equal",
                m.ep,
                m.etp,
                ranks.map_or("more than 2^64".into(), |r| r.to_string())
            ),
        ));
    }
    Ok((edp_replicate, edp_shard))
}

/// Checks each `[topology]` count and their product against the limits.
fn check_topology_limits(t: &TopologySection, key_err: &KeyErr) -> PlanResult<()> {
    for (key, v, limit) in [
        (
            "dies_per_machine",
            t.dies_per_machine,
            limits::DIES_PER_MACHINE,
        ),
        (
            "machines_per_supernode",
            t.machines_per_supernode,
            limits::MACHINES_PER_SUPERNODE,
        ),
        ("supernodes", t.supernodes, limits::SUPERNODES),
    ] {
        limit
            .check_usize(v)
            .map_err(|e| key_err("topology", key, e))?;
    }
    limits::checked_product(
        &limits::WORLD_SIZE,
        &[
            ("dies_per_machine", t.dies_per_machine as u64),
            ("machines_per_supernode", t.machines_per_supernode as u64),
            ("supernodes", t.supernodes as u64),
        ],
    )
    .map_err(|e| key_err("topology", "supernodes", format!("[topology] {e}")))?;
    Ok(())
}

/// Checks `[train]` against the mesh and the model: gradient-accumulation steps and the recompute range.
fn training_shape(
    raw: &ScenarioFile,
    model: &ModelIr,
    src: &Source,
) -> PlanResult<(u64, Recompute)> {
    let key_err = |section: &str, key: &str, message: String| src.key_err(section, key, message);
    let tr = &raw.train;
    let grad_accum_steps = batch_shape(raw, model, &key_err)?;
    if limits::check_f64("", tr.routing_skew, 1.0, limits::MAX_ROUTING_SKEW).is_err() {
        return Err(key_err(
            "train",
            "routing_skew",
            format!(
                "[train] routing_skew = {}; it must be a number >= 1.0 and <= {} (1.0 = uniform \
                 random routing, 1.2 = the busiest expert-parallel rank gets 20% more tokens)",
                tr.routing_skew,
                limits::MAX_ROUTING_SKEW
            ),
        ));
    }
    let layers = model.config.num_hidden_layers;
    let recompute = match &tr.recompute {
        RecomputeSpec::Mode(mode) => match mode.as_str() {
            "off" => Recompute {
                mode: "off".into(),
                layers: 0..0,
            },
            "full" | "selective" => Recompute {
                mode: mode.clone(),
                layers: 0..layers,
            },
            other => {
                return Err(key_err(
                    "train",
                    "recompute",
                    format!(
                        "[train] recompute = \"{other}\"; use off, full, selective or {{ mode, layers = \"a..b\" }}"
                    ),
                ));
            }
        },
        RecomputeSpec::Layers {
            mode,
            layers: range,
        } => {
            if !["full", "selective"].contains(&mode.as_str()) {
                return Err(key_err(
                    "train",
                    "recompute",
                    format!("[train] recompute.mode = \"{mode}\"; use full or selective"),
                ));
            }
            let r = parse_range(range).filter(|r| r.start <= r.end && r.end <= layers).ok_or_else(|| {
                key_err("train", "recompute", format!("[train] recompute.layers = \"{range}\" is not a half-open range a..b within 0..{layers}"))
            })?;
            Recompute {
                mode: mode.clone(),
                layers: r,
            }
        }
    };

    check_tp_comm_overlap(tr, &key_err)?;
    if !LOSS_LOGITS_MODES.contains(&tr.loss_logits.as_str()) {
        return Err(key_err(
            "train",
            "loss_logits",
            format!(
                "[train] loss_logits = \"{}\"; use one of {} (chunked: the loss keeps only what \
                 it saves; whole_f32: transformers' ForCausalLMLoss upcasts every logit to f32)",
                tr.loss_logits,
                LOSS_LOGITS_MODES.join(", ")
            ),
        ));
    }
    check_choice(
        "train",
        &tr.kernel_library,
        "kernel_library",
        KERNEL_LIBRARIES,
        " (PyTorch eager on CUDA; absent: the fused-kernel census)",
        &key_err,
    )?;
    Ok((grad_accum_steps, recompute))
}

/// Checks `seq_len`, `global_batch` and `micro_batch` and the sizes they multiply into
/// against [`limits`]; returns the gradient-accumulation steps per data-parallel rank.
fn batch_shape(raw: &ScenarioFile, model: &ModelIr, key_err: &KeyErr) -> PlanResult<u64> {
    let (tr, m) = (&raw.train, &raw.mesh);
    for (key, v, limit) in [
        ("seq_len", tr.seq_len, limits::SEQ_LEN),
        ("global_batch", tr.global_batch, limits::GLOBAL_BATCH),
        ("micro_batch", tr.micro_batch, limits::MICRO_BATCH),
    ] {
        limit.check(v).map_err(|e| key_err("train", key, e))?;
    }
    let seq = ("seq_len", tr.seq_len);
    limits::checked_product(
        &limits::MICRO_BATCH_TOKENS,
        &[("micro_batch", tr.micro_batch), seq],
    )
    .map_err(|e| key_err("train", "micro_batch", e))?;
    limits::checked_product(
        &limits::TOKENS_PER_STEP,
        &[("global_batch", tr.global_batch), seq],
    )
    .map_err(|e| key_err("train", "global_batch", e))?;
    // Both degrees are within the mesh limits, so these products fit in u64.
    let dp = (m.dp_replicate as u64) * (m.dp_shard as u64);
    let per_pass = tr.micro_batch * dp;
    if !tr.global_batch.is_multiple_of(per_pass) {
        return Err(key_err(
            "train",
            "global_batch",
            format!(
                "[train] global_batch {} is not a multiple of micro_batch {} x data-parallel ranks {dp}; \
                 gradient accumulation needs a whole number of micro-batches",
                tr.global_batch, tr.micro_batch
            ),
        ));
    }
    let accum = tr.global_batch / per_pass;
    limits::GRAD_ACCUM_STEPS.check(accum).map_err(|e| {
        key_err(
            "train",
            "global_batch",
            format!("{e}; raise micro_batch or lower global_batch"),
        )
    })?;
    let layers = model.num_layers_total() as u64;
    limits::checked_product(
        &limits::STEP_LAYER_PASSES,
        &[
            ("gradient-accumulation steps", accum),
            ("decoder layers", layers),
        ],
    )
    .map_err(|e| {
        key_err(
            "train",
            "global_batch",
            format!("{e}; raise micro_batch or lower global_batch"),
        )
    })?;
    Ok(accum)
}

/// The numerics keys of `[optimizer]`, as [`check_numerics_keys`] reads them.
fn numerics_keys(o: &OptimizerSection) -> NumericsKeys<'_> {
    NumericsKeys {
        ns_order: o.muon.ns_order.as_deref(),
        adamw_numerics: o.adamw.numerics.as_deref(),
        muon_numerics: o.muon.numerics.as_deref(),
    }
}

/// Checks the `[fsdp]` and `[optimizer]` names; returns the gathered-parameter and reduction dtypes.
fn check_fsdp_and_optimizer(raw: &ScenarioFile, src: &Source) -> PlanResult<(DType, DType)> {
    let (text, file_label) = (src.text, src.file_label);
    let key_err = |section: &str, key: &str, message: String| src.key_err(section, key, message);
    let err = |line: usize, message: String| src.err(line, message);
    // FSDP and optimizer names.
    let f = &raw.fsdp;
    for (key, s) in std::iter::once(("strategy", &f.strategy))
        .chain(f.baselines.iter().map(|b| ("baselines", b)))
    {
        if !FSDP_STRATEGIES.contains(&s.as_str()) {
            return Err(key_err(
                "fsdp",
                key,
                format!(
                    "[fsdp] {key}: unknown strategy '{s}'; known: {}",
                    FSDP_STRATEGIES.join(", ")
                ),
            ));
        }
    }
    for (section, list) in [
        ("fsdp", &f.baselines),
        ("optimizer", &raw.optimizer.baselines),
    ] {
        if let Some(twice) = listed_twice(list) {
            return Err(key_err(
                section,
                "baselines",
                format!(
                    "[{section}] baselines lists '{twice}' twice (each is simulated); list it once"
                ),
            ));
        }
    }
    for name in f.variant.keys() {
        if !FSDP_STRATEGIES.contains(&name.as_str()) {
            return Err(err(
                find_key_line(text, &format!("fsdp.variant.{name}"), ""),
                format!(
                    "[fsdp.variant.{name}]: unknown strategy '{name}'; known: {}",
                    FSDP_STRATEGIES.join(", ")
                ),
            ));
        }
    }
    let param_dtype = parse_dtype(&f.param_dtype, file_label, text, "fsdp", "param_dtype")?;
    let reduce_dtype = parse_dtype(&f.reduce_dtype, file_label, text, "fsdp", "reduce_dtype")?;
    let o = &raw.optimizer;
    if !["muon+adamw", "adamw"].contains(&o.kind.as_str()) {
        return Err(key_err(
            "optimizer",
            "kind",
            format!("[optimizer] kind = \"{}\"; use muon+adamw or adamw", o.kind),
        ));
    }
    if !MUON_PRESETS.contains(&o.preset.as_str()) {
        return Err(key_err(
            "optimizer",
            "preset",
            format!(
                "[optimizer] preset = \"{}\"; known presets: {}",
                o.preset,
                MUON_PRESETS.join(", ")
            ),
        ));
    }
    if (o.preset == "custom") != o.muon.coefficients.is_some() {
        return Err(key_err(
            "optimizer.muon",
            "coefficients",
            "[optimizer.muon] coefficients must be given exactly when preset = \"custom\"".into(),
        ));
    }
    if let Some(rule) = &o.muon.replica_subgroups {
        let names: Vec<&str> = crate::replica_subgroup_rule::ReplicaSubgroupRule::ALL
            .iter()
            .map(|r| r.name())
            .collect();
        if crate::replica_subgroup_rule::ReplicaSubgroupRule::parse(rule).is_none() {
            return Err(key_err(
                "optimizer.muon",
                "replica_subgroups",
                format!(
                    "[optimizer.muon] replica_subgroups = \"{rule}\"; use one of {} \
                     (launcher: the paper's devices-per-machine rule; topology: the \
                     replica-group members that share a machine)",
                    names.join(", ")
                ),
            ));
        }
        if rule == "topology"
            && let Some(c) = o.muon.replica_count
        {
            return Err(key_err(
                "optimizer.muon",
                "replica_count",
                format!(
                    "[optimizer.muon] replica_count = {c} and replica_subgroups = \
                     \"topology\" both size the replica subgroups; remove replica_count \
                     or use replica_subgroups = \"launcher\""
                ),
            ));
        }
    }
    check_numerics_keys(&numerics_keys(o)).map_err(|e| key_err(e.section, e.key, e.message))?;
    for b in &o.baselines {
        if !MUON_BASELINES.contains(&b.as_str()) {
            return Err(key_err(
                "optimizer",
                "baselines",
                format!(
                    "[optimizer] baselines: unknown Muon baseline '{b}'; known: {}",
                    MUON_BASELINES.join(", ")
                ),
            ));
        }
    }
    Ok((param_dtype, reduce_dtype))
}

/// Checks the numbers of `[fsdp]` (prefetch depths, bucket sizes) against [`limits`].
fn check_fsdp_numbers(f: &FsdpSection, src: &Source) -> PlanResult<()> {
    limits::PREFETCH_DEPTH
        .check_usize(f.prefetch_depth)
        .map_err(|e| src.key_err("fsdp", "prefetch_depth", e))?;
    for (name, v) in &f.variant {
        let section = format!("fsdp.variant.{name}");
        if let Some(d) = v.prefetch_depth {
            limits::PREFETCH_DEPTH
                .check_usize(d)
                .map_err(|e| src.key_err(&section, "prefetch_depth", format!("[{section}] {e}")))?;
        }
        if let Some(b) = v.bucket_bytes {
            limits::BUCKET_BYTES
                .check(b)
                .map_err(|e| src.key_err(&section, "bucket_bytes", format!("[{section}] {e}")))?;
        }
    }
    Ok(())
}

/// Checks the numbers of `[optimizer.muon]` and `[optimizer.adamw]`: iteration counts against
/// [`limits`], replica counts against the world size, every coefficient finite and in range.
fn check_optimizer_numbers(o: &OptimizerSection, world: usize, src: &Source) -> PlanResult<()> {
    let muon_err =
        |key: &str, e: String| src.key_err("optimizer.muon", key, format!("[optimizer.muon] {e}"));
    let mu = &o.muon;
    if let Some(n) = mu.ns_steps {
        limits::NS_STEPS
            .check_usize(n)
            .map_err(|e| muon_err("ns_steps", e))?;
    }
    if let Some(c) = mu.replica_count {
        limits::Limit {
            key: "replica_count",
            min: 1,
            max: world as u64,
            why: "a replica subgroup holds at most every rank",
        }
        .check_usize(c)
        .map_err(|e| muon_err("replica_count", e))?;
    }
    if let Some(coefficients) = &mu.coefficients {
        limits::NS_COEFFICIENT_STEPS
            .check_usize(coefficients.len())
            .map_err(|e| muon_err("coefficients", e))?;
        for v in coefficients.iter().flatten() {
            limits::check_f64("coefficients entry", *v, -1e6, 1e6)
                .map_err(|e| muon_err("coefficients", e))?;
        }
    }
    let momentum: Vec<f64> = match &mu.momentum {
        Some(Momentum::One(m)) => vec![*m],
        Some(Momentum::Two(m)) => m.to_vec(),
        None => vec![],
    };
    let unbounded = f64::MAX;
    let muon_floats = [
        ("lr", mu.lr, 0.0, unbounded),
        ("weight_decay", mu.weight_decay, 0.0, unbounded),
        ("ns_epsilon", mu.ns_epsilon, 0.0, 1.0),
        ("matched_adamw_rms", mu.matched_adamw_rms, 0.0, unbounded),
    ]
    .into_iter()
    .chain(
        momentum
            .into_iter()
            .map(|m| ("momentum", Some(m), 0.0, 1.0)),
    );
    for (key, v, min, max) in muon_floats {
        if let Some(v) = v {
            limits::check_f64(key, v, min, max).map_err(|e| muon_err(key, e))?;
        }
    }
    let a = &o.adamw;
    for (key, v, min, max) in [
        ("lr", a.lr, 0.0, unbounded),
        ("betas", a.betas[0], 0.0, 1.0 - f64::EPSILON),
        ("betas", a.betas[1], 0.0, 1.0 - f64::EPSILON),
        ("eps", a.eps, f64::MIN_POSITIVE, 1.0),
        ("weight_decay", a.weight_decay, 0.0, unbounded),
    ] {
        limits::check_f64(key, v, min, max)
            .map_err(|e| src.key_err("optimizer.adamw", key, format!("[optimizer.adamw] {e}")))?;
    }
    Ok(())
}

/// Parses every `[[plan.override]]`, each error naming its line.
fn parse_overrides(raw: &ScenarioFile, src: &Source) -> PlanResult<Vec<PlanOverride>> {
    let (text, file_label) = (src.text, src.file_label);
    let err = |line: usize, message: String| src.err(line, message);
    // Overrides.
    let lines = override_lines(text);
    limits::PLAN_OVERRIDES
        .check(raw.plan.overrides.len() as u64)
        .map_err(|e| err(lines.first().copied().unwrap_or(0), e))?;
    let mut overrides = Vec::new();
    for (i, ov) in raw.plan.overrides.iter().enumerate() {
        let line = lines.get(i).copied().unwrap_or(0);
        let origin = format!("{file_label}:{line}");
        overrides.push(
            PlanOverride::parse(ov, &origin)
                .map_err(|msg| err(line, format!("[[plan.override]] #{}: {msg}", i + 1)))?,
        );
    }
    Ok(overrides)
}

impl Scenario {
    /// Reads, parses and validates a scenario file, loading its model relative to it.
    pub fn load(path: &Path) -> PlanResult<Self> {
        let text = crate::input_file::read_text(path, &limits::SCENARIO_FILE).map_err(|e| {
            PlanError::Scenario {
                file: e.file,
                line: 0,
                message: format!("cannot read the scenario file: {}", e.reason),
            }
        })?;
        Self::from_str_at(&text, path)
    }

    /// Parses scenario `text` as if read from `path` (model paths resolve relative to it).
    pub fn from_str_at(text: &str, path: &Path) -> PlanResult<Self> {
        let file_label = path.display().to_string();
        let src = Source {
            text,
            file_label: &file_label,
        };
        let raw: ScenarioFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| line_of_offset(text, s.start));
            let message = e.message().trim();
            // Type errors do not name their key; add the one written on that line.
            let at = key_at_line(text, line)
                .filter(|k| !message.contains(&format!("`{}`", k.rsplit('.').next().unwrap_or(k))))
                .map(|k| format!(" (key `{k}`)"))
                .unwrap_or_default();
            src.err(
                line,
                format!("{message}{at}; see docs/scenario-format.md for the keys"),
            )
        })?;
        check_names(&raw, &src)?;
        let (model, master_dtype) = load_model(&raw, path, &src)?;
        let (dense_mesh, expert_mesh, topology) = build_meshes(&raw, &src)?;
        let (grad_accum_steps, recompute) = training_shape(&raw, &model, &src)?;
        let (param_dtype, reduce_dtype) = check_fsdp_and_optimizer(&raw, &src)?;
        check_fsdp_numbers(&raw.fsdp, &src)?;
        check_optimizer_numbers(&raw.optimizer, dense_mesh.world_size(), &src)?;
        let overrides = parse_overrides(&raw, &src)?;
        if let Some(w) = &raw.whatif {
            w.validate(&topology, dense_mesh.world_size(), text, &file_label)?;
        }

        Ok(Scenario {
            path: path.to_path_buf(),
            file: raw,
            model,
            dense_mesh,
            expert_mesh,
            topology,
            recompute,
            grad_accum_steps,
            overrides,
            master_dtype,
            param_dtype,
            reduce_dtype,
        })
    }

    /// World size (ranks).
    pub fn world_size(&self) -> usize {
        self.dense_mesh.world_size()
    }

    /// Tokens processed per optimizer step.
    pub fn tokens_per_step(&self) -> u64 {
        self.file.train.global_batch * self.file.train.seq_len
    }

    /// The planner input of this scenario.
    pub fn planner_input(&self) -> PlannerInput {
        let m = &self.file.mesh;
        PlannerInput {
            axes: PlanAxes {
                tp: m.tp,
                cp: m.cp,
                ep: m.ep,
                etp: m.etp,
                sequence_parallel: self.file.train.sequence_parallel,
                loss_parallel: self.file.train.loss_parallel,
            },
            overrides: self.overrides.clone(),
            low_precision: self.file.train.low_precision,
            seq_len: self.file.train.seq_len,
            allow_uncovered: self.file.plan.allow_uncovered,
        }
    }
}
