//! From a scenario to what the harness executes: the reference model configuration, the
//! sharding and FSDP plans, the training shape, the optimizer (AdamW, or distributed Muon with
//! AdamW chained), the input data, and plan mutations.

use hpfsdp_plan::chunk_range;
use hpfsdp_plan::fsdp::{DataDomain, FsdpPlan, build_fsdp_plan};
use hpfsdp_plan::model::{DType, ExpertLayout, ModelFamily};
use hpfsdp_plan::planner::lint::Severity;
use hpfsdp_plan::planner::{ShardingPlan, plan};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_plan::toml_lines::find_key_line;
use hpfsdp_plan::{Layout, Placement};

use super::error::VerifyError;
use super::muon_spec::{MUON_VERIFY_STEPS, MuonVerify};
use crate::model::{MlaConfig, ModelConfig, MoeConfig};
use crate::muon::{AdapterRules, MuonDomains, MuonError, MuonSetup};
use crate::ops::ExpertWire;
use crate::optim::AdamW;
use crate::rng::KeyedRng;
use crate::runtime::ActDType;
use crate::runtime::RankTopo;

/// Seed of parameter initialisation and input tokens in every verification run.
pub const VERIFY_SEED: u64 = 20_260_501;

/// A plan mutation injected for the negative test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mutation {
    /// What `--mutate` named (module or parameter).
    pub target: String,
    /// The boundary (module) whose contract or parameter placement changed.
    pub module: String,
    /// What changed, in words.
    pub description: String,
}

/// Everything one verification needs.
#[derive(Debug, Clone)]
pub struct VerifySpec {
    /// The loaded scenario.
    pub scenario: Scenario,
    /// The reference model.
    pub model: ModelConfig,
    /// The sharding plan (possibly mutated).
    pub sharding: ShardingPlan,
    /// The FSDP/HSDP plan.
    pub fsdp: FsdpPlan,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per data-parallel rank per step.
    pub grad_accum: usize,
    /// Gather parameters in bf16 (mixed precision).
    pub param_bf16: bool,
    /// AdamW (every parameter, or the AdamW-routed ones under Muon).
    pub adamw: AdamW,
    /// Distributed Muon, when `[optimizer] kind = "muon+adamw"`.
    pub muon: Option<MuonVerify>,
    /// Training steps (forward, backward, optimizer) per run.
    pub steps: usize,
    /// Seed of initialisation and data.
    pub seed: u64,
    /// The injected mutation, if any.
    pub mutation: Option<Mutation>,
    /// Remarks shown in reports (simplifications that apply to this scenario).
    pub notes: Vec<String>,
}

fn unsupported(what: String, fix: &str) -> VerifyError {
    VerifyError::unsupported(what, fix)
}

/// The reference model of a scenario's model IR, or why it cannot be built.
pub fn reference_model(sc: &Scenario) -> Result<ModelConfig, VerifyError> {
    let c = &sc.model.config;
    let file = sc.path.display();
    let fix_model = "use a verify model under scenarios/verify/models/ (see its README notes)";
    if c.tie_word_embeddings {
        return Err(unsupported(
            format!("{file}: model '{}' ties word embeddings", sc.model.name),
            fix_model,
        ));
    }
    if c.sliding_window.is_some() {
        return Err(unsupported(
            format!("{file}: sliding-window attention"),
            fix_model,
        ));
    }
    if c.mtp_layers > 0 {
        return Err(unsupported(
            format!("{file}: {} MTP layers", c.mtp_layers),
            "set model.include_mtp = false",
        ));
    }
    if sc.model.options.expert_layout != ExpertLayout::Fused {
        return Err(unsupported(
            format!("{file}: [model] expert_layout is per-expert"),
            "set [model] expert_layout = \"fused\"",
        ));
    }
    let moe = match &c.moe {
        None => None,
        Some(m) => {
            if m.shared_experts > 0 || m.router_correction_bias || !m.extra_dense_layers.is_empty()
            {
                return Err(unsupported(
                    format!(
                        "{file}: model '{}' has shared experts, a router correction bias or extra dense layers",
                        sc.model.name
                    ),
                    "the reference MoE has routed experts only (softmax router, top-k); remove shared_experts/router_correction_bias from the model file",
                ));
            }
            Some(MoeConfig {
                experts: m.num_experts as usize,
                top_k: m.experts_per_token as usize,
                intermediate: m.moe_intermediate_size as usize,
                norm_topk_prob: true,
                first_dense_layers: m.first_dense_layers,
            })
        }
    };
    let mla = c.mla.as_ref().map(|m| MlaConfig {
        q_lora_rank: m.q_lora_rank.map(|r| r as usize),
        kv_lora_rank: m.kv_lora_rank as usize,
        qk_nope_head_dim: m.qk_nope_head_dim as usize,
        qk_rope_head_dim: m.qk_rope_head_dim as usize,
        v_head_dim: m.v_head_dim as usize,
    });
    let cfg = ModelConfig {
        vocab: c.vocab_size as usize,
        hidden: c.hidden_size as usize,
        layers: c.num_hidden_layers,
        heads: c.num_attention_heads as usize,
        kv_heads: c.num_key_value_heads as usize,
        head_dim: c.head_dim as usize,
        intermediate: c.intermediate_size as usize,
        qk_norm: matches!(c.family, ModelFamily::Qwen3 | ModelFamily::Qwen3Moe),
        moe,
        mla,
        rope_theta: 10_000.0,
        rms_eps: 1e-6,
        init_std: 0.02,
    };
    cfg.validate()
        .map_err(|e| unsupported(format!("{file}: {e}"), fix_model))?;
    // The reference model must have exactly the plan's trainable parameters.
    let mine: Vec<(String, Vec<u64>)> = cfg
        .param_specs()
        .into_iter()
        .map(|p| (p.name, p.shape.iter().map(|&d| d as u64).collect()))
        .collect();
    let theirs: Vec<(String, Vec<u64>)> = sc
        .model
        .params
        .iter()
        .filter(|p| p.trainable)
        .map(|p| (p.name.clone(), p.shape.clone()))
        .collect();
    let mut a = mine.clone();
    let mut b = theirs.clone();
    a.sort();
    b.sort();
    if a != b {
        let first = a
            .iter()
            .zip(&b)
            .find(|(x, y)| x != y)
            .map(|(x, y)| format!("reference {} {:?} vs plan {} {:?}", x.0, x.1, y.0, y.1))
            .unwrap_or_else(|| format!("{} vs {} parameters", a.len(), b.len()));
        return Err(unsupported(
            format!("{file}: the reference model does not match the model IR ({first})"),
            fix_model,
        ));
    }
    Ok(cfg)
}

impl VerifySpec {
    /// Build the spec of a loaded scenario.
    pub fn from_scenario(scenario: &Scenario) -> Result<VerifySpec, VerifyError> {
        let m = &scenario.file.mesh;
        let file = scenario.path.display().to_string();
        if m.cp > 1 || m.etp > 1 {
            return Err(unsupported(
                format!(
                    "{file}: [mesh] cp = {} / etp = {}: context and expert-tensor parallelism",
                    m.cp, m.etp
                ),
                "set [mesh] cp = 1 and etp = 1 for verification",
            ));
        }
        if scenario.file.train.sequence_parallel && m.tp > 1 {
            return Err(unsupported(
                format!(
                    "{file}: [train] sequence_parallel = true with tp = {}",
                    m.tp
                ),
                "set [train] sequence_parallel = false (the reference runtime executes TP regions with replicated activations)",
            ));
        }
        if scenario.file.train.loss_parallel && m.tp > 1 {
            return Err(unsupported(
                format!("{file}: [train] loss_parallel = true"),
                "set [train] loss_parallel = false",
            ));
        }
        if scenario.master_dtype != DType::F32 || scenario.reduce_dtype != DType::F32 {
            return Err(unsupported(
                format!(
                    "{file}: master dtype {:?} / reduce dtype {:?}",
                    scenario.master_dtype, scenario.reduce_dtype
                ),
                "set [model] dtype = \"f32\" and [fsdp] reduce_dtype = \"f32\" (param_dtype may be bf16)",
            ));
        }
        let param_bf16 = match scenario.param_dtype {
            DType::F32 => false,
            DType::Bf16 => true,
            other => {
                return Err(unsupported(
                    format!("{file}: [fsdp] param_dtype {other:?}"),
                    "use param_dtype = \"f32\" or \"bf16\"",
                ));
            }
        };
        let model = reference_model(scenario)?;
        let sharding = plan(&scenario.model, &scenario.planner_input());
        let errors: Vec<String> = sharding
            .lints
            .iter()
            .filter(|l| l.severity == Severity::Error)
            .map(|l| format!("{}: {} (fix: {})", l.code, l.message, l.fix))
            .collect();
        if !errors.is_empty() {
            return Err(VerifyError::Scenario(format!(
                "{file}: the sharding plan has lint errors:\n  {}",
                errors.join("\n  ")
            )));
        }
        let fsdp = build_fsdp_plan(scenario, &sharding);
        let o = &scenario.file.optimizer;
        let notes = Vec::new();
        let muon = o.kind == "muon+adamw";
        let tr = &scenario.file.train;
        let mut spec = VerifySpec {
            scenario: scenario.clone(),
            model,
            sharding,
            fsdp,
            seq_len: tr.seq_len as usize,
            micro_batch: tr.micro_batch as usize,
            grad_accum: scenario.grad_accum_steps as usize,
            param_bf16,
            adamw: AdamW::from_options(&o.adamw)
                .map_err(|e| VerifyError::Scenario(e.to_string()))?,
            muon: None,
            steps: if muon { MUON_VERIFY_STEPS } else { 1 },
            seed: VERIFY_SEED,
            mutation: None,
            notes,
        };
        if muon {
            spec.muon = Some(MuonVerify::new(&spec)?);
        }
        Ok(spec)
    }

    /// The optimizer in words (`adamw`, `muon+adamw (hyperparallel)`).
    pub fn optimizer_name(&self) -> String {
        match &self.muon {
            None => "adamw".into(),
            Some(m) => format!("muon+adamw ({})", m.setup.cfg.preset.name()),
        }
    }

    /// World size.
    pub fn world(&self) -> usize {
        self.scenario.dense_mesh.world_size()
    }

    /// Data-parallel streams (`dp_replicate x dp_shard`).
    pub fn dp_streams(&self) -> usize {
        let m = &self.scenario.file.mesh;
        m.dp_replicate * m.dp_shard
    }

    /// Micro-batches per optimizer step (all streams).
    pub fn micro_batches(&self) -> usize {
        self.dp_streams() * self.grad_accum
    }

    /// Tokens per micro-batch.
    pub fn tokens(&self) -> usize {
        self.seq_len * self.micro_batch
    }

    /// The global micro-batch id of data-parallel stream `dp` at accumulation step `a`.
    pub fn micro_batch_id(&self, dp: usize, a: usize) -> usize {
        dp * self.grad_accum + a
    }

    /// The data id of micro-batch `id` (as [`Self::micro_batch_id`] numbers them) in training
    /// step `step`: every step reads new micro-batches.
    pub fn step_data_id(&self, step: usize, id: usize) -> usize {
        step * self.micro_batches() + id
    }

    /// Token ids and next-token targets of micro-batch `id` (keyed by the seed and `id`, so
    /// every executor sees the same data).
    pub fn data(&self, id: usize) -> (Vec<usize>, Vec<usize>) {
        let t = self.tokens();
        let rng = KeyedRng::named(self.seed, "verify.tokens");
        let start = (id * (t + 1)) as u64;
        let v = self.model.vocab;
        let all: Vec<usize> = rng
            .uniform_range(start, start + t as u64 + 1)
            .into_iter()
            .map(|u| ((u * v as f32) as usize).min(v - 1))
            .collect();
        (all[..t].to_vec(), all[1..].to_vec())
    }

    /// Whether routed experts are split over `ep`.
    pub fn expert_parallel(&self) -> bool {
        self.scenario.file.mesh.ep > 1
    }

    /// Element type of activations in model-parallel collectives: the compute dtype, as the
    /// step program sizes them (bf16 when parameters are gathered in bf16).
    pub fn act_dtype(&self) -> ActDType {
        if self.param_bf16 {
            ActDType::Bf16
        } else {
            ActDType::F32
        }
    }

    /// The expert-traffic rounding the single device applies: that of the expert-parallel
    /// all-to-alls when experts are split over `ep`, none otherwise (no all-to-all runs).
    pub fn single_device_expert_wire(&self) -> ExpertWire {
        if self.expert_parallel() {
            self.act_dtype().expert_wire()
        } else {
            ExpertWire::Exact
        }
    }

    /// Whether any axis changes summation order relative to one device (row-parallel TP).
    pub fn order_changing(&self) -> bool {
        self.scenario.file.mesh.tp > 1
    }

    /// Inject a wrong placement: `target` names a module with a boundary (its `out_src`
    /// contract flips on `tp`: Replicate ↔ Partial) or a parameter (its placement on `tp`
    /// changes: `S(0)` ↔ `S(1)`, Replicate → `S(0)`). The FSDP plan is rebuilt from the
    /// mutated plan, as production would build it.
    pub fn mutate(&mut self, target: &str) -> Result<(), VerifyError> {
        let bad = |reason: String| VerifyError::Mutation {
            target: target.to_string(),
            reason,
        };
        let flip = |p: Option<&Placement>| match p {
            Some(Placement::Shard { dim: 0 }) => Placement::shard(1),
            Some(Placement::Shard { .. }) => Placement::shard(0),
            Some(Placement::Partial { .. }) => Placement::Replicate,
            _ => Placement::partial_sum(),
        };
        let (module, description) = if let Some(b) = self
            .sharding
            .boundaries
            .iter_mut()
            .find(|b| b.module == target)
        {
            let Some(out) = b.out_src.as_mut() else {
                return Err(bad(format!(
                    "boundary '{target}' declares no output contract"
                )));
            };
            let tensor = out
                .keys()
                .next()
                .cloned()
                .unwrap_or_else(|| "hidden_states".to_string());
            let entry = out.entry(tensor.clone()).or_default();
            let old = entry.get("tp").cloned();
            let new = flip(old.as_ref());
            entry.insert("tp".to_string(), new.clone());
            (
                target.to_string(),
                format!(
                    "out_src '{tensor}' on tp: {} -> {new}",
                    old.map_or("R".to_string(), |p| p.to_string())
                ),
            )
        } else if let Some(pi) = self.sharding.params.iter().position(|p| p.name == target) {
            let Some(module) = self.sharding.params[pi].boundary.clone() else {
                return Err(bad("the parameter belongs to no boundary".into()));
            };
            let old = self.sharding.params[pi].placements.get("tp").cloned();
            let new = match old {
                Some(Placement::Shard { dim: 0 }) => Placement::shard(1),
                Some(Placement::Shard { .. }) => Placement::shard(0),
                _ => Placement::shard(0),
            };
            self.sharding.params[pi]
                .placements
                .insert("tp".to_string(), new.clone());
            if let Some(b) = self
                .sharding
                .boundaries
                .iter_mut()
                .find(|b| b.module == module)
                && let Some(pl) = b.params.get_mut(target)
            {
                pl.insert("tp".to_string(), new.clone());
            }
            (
                module,
                format!(
                    "parameter placement on tp: {} -> {new}",
                    old.map_or("R".to_string(), |p| p.to_string())
                ),
            )
        } else {
            let close: Vec<&str> = self
                .sharding
                .boundaries
                .iter()
                .map(|b| b.module.as_str())
                .filter(|m| m.ends_with(target.rsplit('.').next().unwrap_or(target)))
                .take(3)
                .collect();
            return Err(bad(format!(
                "no module boundary or parameter has that name; try a module such as {} or a full parameter FQN",
                close.first().copied().unwrap_or("model.layers.0.self_attn")
            )));
        };
        self.fsdp = build_fsdp_plan(&self.scenario, &self.sharding);
        if self.muon.is_some() {
            self.muon = Some(MuonVerify::new(self)?);
        }
        self.mutation = Some(Mutation {
            target: target.to_string(),
            module,
            description,
        });
        Ok(())
    }

    /// The layout of parameter `name` on the plan mesh `mesh` (global shape, plan placements).
    pub fn param_layout(
        &self,
        name: &str,
        mesh: &hpfsdp_plan::DeviceMesh,
    ) -> Result<Layout, VerifyError> {
        let p = self
            .sharding
            .param(name)
            .ok_or_else(|| VerifyError::Scenario(format!("parameter {name} is not in the plan")))?;
        let placements = mesh
            .axes()
            .iter()
            .map(|a| {
                p.placements
                    .get(&a.name)
                    .cloned()
                    .unwrap_or(Placement::Replicate)
            })
            .collect();
        let layout = Layout {
            global_shape: p.shape.clone(),
            placements,
        };
        layout.validate(mesh).map_err(|e| {
            VerifyError::Scenario(format!(
                "parameter {name}: placement does not fit the mesh: {e}"
            ))
        })?;
        Ok(layout)
    }
}

/// Global flat indices of `rank`'s FSDP shard of plan parameter `i`, in shard order.
pub fn shard_indices(
    spec: &VerifySpec,
    i: usize,
    topo: &RankTopo,
) -> Result<Vec<u64>, VerifyError> {
    let p = &spec.fsdp.params[i];
    let layout = spec.param_layout(&p.name, &topo.plan_mesh)?;
    let plan_local = layout.local_element_indices(&topo.plan_mesh, topo.plan_rank);
    let shape: Vec<usize> = layout
        .local_shape(&topo.plan_mesh, topo.plan_rank)
        .into_iter()
        .map(|d| d as usize)
        .collect();
    let g = match p.domain {
        DataDomain::Dense => &topo.dense_shard,
        DataDomain::Expert => &topo.expert_shard,
    };
    let dim = if shape.is_empty() { 0 } else { p.shard_dim };
    let outer: usize = shape[..dim.min(shape.len())].iter().product();
    let n = shape.get(dim).copied().unwrap_or(1);
    let inner: usize = shape.get(dim + 1..).map_or(1, |s| s.iter().product());
    let r = chunk_range(n as u64, g.size() as u64, g.index as u64);
    let mut out = Vec::new();
    for o in 0..outer {
        for row in r.start as usize..r.end as usize {
            let base = o * n * inner + row * inner;
            out.extend_from_slice(&plan_local[base..base + inner]);
        }
    }
    Ok(out)
}

/// A Muon setup error with the scenario file (and, for a bad option, the line of its key).
fn scenario_err(spec: &VerifySpec, e: MuonError) -> VerifyError {
    let path = &spec.scenario.path;
    let line = match &e {
        MuonError::Config { section, key, .. } => {
            hpfsdp_plan::input_file::read_text(path, &hpfsdp_plan::limits::SCENARIO_FILE)
                .ok()
                .map(|text| find_key_line(&text, section, key))
                .filter(|&l| l > 0)
        }
        _ => None,
    };
    VerifyError::Scenario(match line {
        Some(l) => format!("{}:{l}: distributed Muon: {e}", path.display()),
        None => format!("{}: distributed Muon: {e}", path.display()),
    })
}

/// The layout the runtime's FSDP shards follow when FSDP splits a dim that a later mesh axis
/// (TP or EP) already splits: the FSDP axis becomes strided inside the later axes' pieces.
fn strided_candidate(d: &crate::muon::ParamDomain, domain: DataDomain) -> Option<Layout> {
    let fsdp_axis = match domain {
        DataDomain::Dense => "dp_shard",
        DataDomain::Expert => "edp_shard",
    };
    let a = d.mesh.axis_index(fsdp_axis)?;
    let Placement::Shard { dim } = d.layout.placements[a] else {
        return None;
    };
    let factor: usize = (a + 1..d.mesh.ndim())
        .filter(|&b| d.layout.placements[b] == Placement::Shard { dim })
        .map(|b| d.mesh.axes()[b].size)
        .product();
    if factor <= 1 {
        return None;
    }
    let mut placements = d.layout.placements.clone();
    placements[a] = Placement::StridedShard {
        dim,
        split_factor: factor,
    };
    Layout::new(d.layout.global_shape.clone(), placements, &d.mesh).ok()
}

impl MuonVerify {
    /// The Muon plan of `spec` (its possibly mutated sharding and FSDP plans), with every
    /// parameter's Muon layout checked to address exactly the runtime's FSDP shard on every
    /// rank (realigned to a strided layout where FSDP splits inside TP/EP pieces).
    pub fn new(spec: &VerifySpec) -> Result<MuonVerify, VerifyError> {
        let sc = &spec.scenario;
        let setup = MuonSetup::from_plans(
            sc,
            &spec.sharding,
            &spec.fsdp,
            &AdapterRules::for_model(&spec.model),
        )
        .map_err(|e| scenario_err(spec, e))?;
        let mut plan_index = Vec::with_capacity(spec.fsdp.params.len());
        for p in &spec.fsdp.params {
            let i = setup
                .routed
                .iter()
                .position(|r| r.name == p.name)
                .ok_or_else(|| {
                    VerifyError::Scenario(format!("{} is missing from the Muon plan", p.name))
                })?;
            plan_index.push(i);
        }
        if plan_index.len() != setup.routed.len() {
            return Err(VerifyError::Scenario(format!(
                "the Muon plan has {} parameters, the FSDP plan {}",
                setup.routed.len(),
                plan_index.len()
            )));
        }
        let topos: Vec<RankTopo> = (0..spec.world())
            .map(|r| {
                RankTopo::new(r, &sc.dense_mesh, &sc.expert_mesh)
                    .map_err(|e| VerifyError::Scenario(e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        let mut domains: MuonDomains = setup.domains.clone();
        let mut realigned = Vec::new();
        for (i, p) in spec.fsdp.params.iter().enumerate() {
            let runtime: Vec<Vec<usize>> = topos
                .iter()
                .map(|t| {
                    shard_indices(spec, i, t).map(|v| v.into_iter().map(|x| x as usize).collect())
                })
                .collect::<Result<_, _>>()?;
            let first_bad = |d: &MuonDomains| -> Result<Option<usize>, VerifyError> {
                let d = d.get(plan_index[i]).map_err(|e| scenario_err(spec, e))?;
                Ok((0..topos.len()).find(|&r| d.local_indices(r) != runtime[r]))
            };
            let Some(rank) = first_bad(&domains)? else {
                continue;
            };
            let d = domains
                .get(plan_index[i])
                .map_err(|e| scenario_err(spec, e))?;
            let layout = d.layout.clone();
            let aligned = strided_candidate(d, p.domain)
                .and_then(|l| domains.clone().with_layout(&p.name, l).ok());
            match aligned {
                Some(a) if first_bad(&a)?.is_none() => {
                    domains = a;
                    realigned.push(p.name.clone());
                }
                _ => {
                    return Err(VerifyError::unsupported(
                        format!(
                            "{}: the reference runtime's FSDP shard of {} on rank {rank} is not \
                             a piece of its Muon layout {layout} (nor of the strided FSDP-over-TP/EP layout)",
                            sc.path.display(),
                            p.name
                        ),
                        "shard that parameter evenly, or run the scenario with [optimizer] kind = \"adamw\"",
                    ));
                }
            }
        }
        Ok(MuonVerify {
            setup: MuonSetup { domains, ..setup },
            plan_index,
            realigned,
            naive: true,
        })
    }
}
