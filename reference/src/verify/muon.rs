//! Distributed Muon inside the verification step (`[optimizer] kind = "muon+adamw"`): the
//! scenario's Muon plan over exactly the shards the reference runtime holds, each rank's
//! optimizer (the deduplicated engine with AdamW chained first, plus naive distributed Muon on
//! its own copy of the parameters fed the same real gradients), and the single-device
//! optimizer the sharded runs are compared with.

use hpfsdp_backends::Collective;
use hpfsdp_plan::fsdp::DataDomain;
use hpfsdp_plan::muon::OptimizerRoute;
use hpfsdp_plan::toml_lines::find_key_line;
use hpfsdp_plan::{Layout, Placement};
use serde::Serialize;

use super::compare::shard_indices;
use super::error::VerifyError;
use super::setup::VerifySpec;
use crate::model::ParamSet;
use crate::muon::{
    AdamwPart, AdapterRules, ChainedOptimizer, DedupStats, DistributedMuon, MuonDomains, MuonError,
    MuonResult, MuonSetup, NaiveDistributedMuon, SingleDeviceChained, SingleDeviceMuon, StepReport,
    dedup_stats,
};
use crate::runtime::{RankTopo, RuntimeError};
use crate::tensor::Tensor;

/// Optimizer steps of a Muon verification (AdamW verifications run one): enough for the
/// momentum buffers to carry state into later steps.
pub const MUON_VERIFY_STEPS: usize = 3;

/// How the optimizer updates one parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Route {
    /// Element-wise AdamW (1-D parameters, embeddings, heads, or every parameter when the
    /// optimizer is AdamW).
    Adamw,
    /// Muon on matrices that shard axes cut: gathered, orthogonalized once per shard domain.
    Muon,
    /// Muon on whole local matrices (e.g. expert stacks sharded on the expert dim): no
    /// communication in the shard domain.
    LocalMuon,
}

impl Route {
    /// `adamw`, `muon` or `local-muon`.
    pub fn name(self) -> &'static str {
        match self {
            Route::Adamw => "adamw",
            Route::Muon => "muon",
            Route::LocalMuon => "local-muon",
        }
    }
}

/// The Muon side of a verification spec.
#[derive(Debug, Clone)]
pub struct MuonVerify {
    /// Configuration, Muon plan, domains (aligned with the runtime's shards) and routes.
    pub setup: MuonSetup,
    /// Index into the Muon plan of each FSDP-plan parameter.
    pub plan_index: Vec<usize>,
    /// Parameters whose Muon layout was replaced by the runtime's strided FSDP-over-TP/EP one.
    pub realigned: Vec<String>,
    /// Also run naive distributed Muon beside the deduplicated engine (production mode only).
    pub naive: bool,
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

    /// The route of FSDP-plan parameter `i`.
    pub fn route(&self, i: usize) -> Route {
        let j = self.plan_index[i];
        match self.setup.routed[j].route {
            OptimizerRoute::Adamw => Route::Adamw,
            OptimizerRoute::Muon if self.setup.plan.params[j].needs_gather => Route::Muon,
            OptimizerRoute::Muon => Route::LocalMuon,
        }
    }

    /// The largest shape factor of the update of FSDP-plan parameter `i` over the matrices
    /// Muon sees in it (adapter parts included): one element moves by at most about
    /// `lr · factor · σ_max(O)` per step. 1 for AdamW parameters.
    pub fn update_scale(&self, i: usize) -> f64 {
        let r = &self.setup.routed[self.plan_index[i]];
        let Some((rows, cols)) = r.core else {
            return 1.0;
        };
        let parts = r.split.parts(rows, cols).unwrap_or_default();
        parts
            .iter()
            .map(|p| {
                let (m, n) = p.dims(cols);
                self.setup.cfg.scale.factor(m, n)
            })
            .fold(self.setup.cfg.scale.factor(rows, cols), f64::max)
    }

    /// Per-rank momentum memory and Newton-Schulz work the plan predicts.
    pub fn predicted(&self) -> MuonResult<DedupStats> {
        dedup_stats(&self.setup.plan, &self.setup.domains, &self.setup.routed)
    }

    /// `rank`'s FSDP-order vectors as a parameter set in Muon local shapes.
    pub fn to_set(&self, rank: usize, vals: &[Vec<f32>]) -> MuonResult<ParamSet<f32>> {
        if vals.len() != self.plan_index.len() {
            return Err(MuonError::plan(format!(
                "{} vectors for {} parameters",
                vals.len(),
                self.plan_index.len()
            )));
        }
        let mut set = ParamSet::new();
        for (&j, v) in self.plan_index.iter().zip(vals) {
            let d = self.setup.domains.get(j)?;
            set.insert(
                d.name.clone(),
                Tensor::from_vec(&d.local_shape(rank), v.clone())?,
            );
        }
        Ok(set)
    }

    /// Copies a parameter set back into FSDP-order vectors.
    pub fn write_back(&self, set: &ParamSet<f32>, out: &mut [Vec<f32>]) -> MuonResult<()> {
        for (&j, o) in self.plan_index.iter().zip(out.iter_mut()) {
            let t = set.get(&self.setup.routed[j].name)?;
            o.clear();
            o.extend_from_slice(t.as_slice());
        }
        Ok(())
    }

    /// The single-device AdamW + Muon of the same configuration.
    pub fn single_device(&self) -> SingleDeviceChained {
        SingleDeviceChained {
            adamw: AdamwPart::new(self.setup.adamw, &self.setup.routed),
            muon: SingleDeviceMuon::new(self.setup.cfg.clone(), self.setup.routed.clone()),
        }
    }
}

/// What one rank's optimizer did in one step.
#[derive(Debug, Clone, Default)]
pub struct MuonStepRecord {
    /// The deduplicated engine's counters.
    pub dedup: StepReport,
    /// Naive distributed Muon's counters (when it ran).
    pub naive: Option<StepReport>,
    /// Parameters whose updated local piece differs in any bit between the two.
    pub naive_mismatch: Vec<String>,
    /// Positions in this rank's communication trace of the deduplicated engine's calls in
    /// this step (AdamW chained first issues none; naive Muon's calls come after).
    pub dedup_calls: std::ops::Range<usize>,
}

struct NaiveSide {
    adamw: AdamwPart,
    muon: NaiveDistributedMuon,
    params: ParamSet<f32>,
}

/// One rank's optimizer in a Muon verification run.
pub struct MuonRank<'a> {
    mv: &'a MuonVerify,
    rank: usize,
    dedup: ChainedOptimizer,
    naive: Option<NaiveSide>,
}

impl<'a> MuonRank<'a> {
    /// The optimizer of `rank`, starting from its FSDP-order master shards `initial`; with
    /// `naive`, naive distributed Muon runs beside on its own copy of the parameters.
    pub fn new(
        mv: &'a MuonVerify,
        rank: usize,
        initial: &[Vec<f32>],
        naive: bool,
    ) -> MuonResult<MuonRank<'a>> {
        let s = &mv.setup;
        let dedup = ChainedOptimizer {
            adamw: AdamwPart::new(s.adamw, &s.routed),
            muon: DistributedMuon::new(
                s.cfg.clone(),
                s.plan.clone(),
                s.domains.clone(),
                s.routed.clone(),
                rank,
            )?,
        };
        let naive = if naive {
            Some(NaiveSide {
                adamw: AdamwPart::new(s.adamw, &s.routed),
                muon: NaiveDistributedMuon::new(
                    s.cfg.clone(),
                    s.plan.clone(),
                    s.domains.clone(),
                    s.routed.clone(),
                    rank,
                )?,
                params: mv.to_set(rank, initial)?,
            })
        } else {
            None
        };
        Ok(MuonRank {
            mv,
            rank,
            dedup,
            naive,
        })
    }

    /// One optimizer step on this rank's master shards with its reduced shard gradients
    /// (FSDP order): AdamW then deduplicated Muon update `shards`; naive Muon (if any) takes
    /// the same gradients on its own copy, and the two are compared bit for bit.
    pub fn step(
        &mut self,
        comm: &dyn Collective,
        shards: &mut [Vec<f32>],
        grads: &[Vec<f32>],
    ) -> MuonResult<MuonStepRecord> {
        let g = self.mv.to_set(self.rank, grads)?;
        let mut p = self.mv.to_set(self.rank, shards)?;
        let start = comm.trace().len();
        let dedup = self.dedup.step(comm, &mut p, &g)?;
        let mut rec = MuonStepRecord {
            dedup,
            dedup_calls: start..comm.trace().len(),
            ..MuonStepRecord::default()
        };
        if let Some(n) = &mut self.naive {
            n.adamw.step(&mut n.params, &g)?;
            rec.naive = Some(n.muon.step(comm, &mut n.params, &g)?);
            for (name, t) in p.iter() {
                if !n.params.get(name)?.bit_eq(t) {
                    rec.naive_mismatch.push(name.to_string());
                }
            }
        }
        self.mv.write_back(&p, shards)?;
        Ok(rec)
    }
}

/// A Muon error inside a rank, as the runtime reports it (communication failures keep their
/// kind, so a peer's exit is told apart from the rank's own error).
pub fn runtime_error(e: MuonError) -> RuntimeError {
    match e {
        MuonError::Comm(c) => RuntimeError::Comm(c),
        MuonError::Tensor(t) => RuntimeError::Kernel(t),
        other => RuntimeError::plan(format!("distributed Muon: {other}")),
    }
}
