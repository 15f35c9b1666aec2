//! A harness that builds the Muon plan of a scenario, makes keyed random parameters and
//! gradients, and runs single-device, naive distributed and deduplicated distributed Muon on
//! in-process ranks, so their results can be compared bit for bit.

use hpfsdp_backends::{Collective, InProcWorld};
use hpfsdp_plan::fsdp::{FsdpPlan, build_fsdp_plan};
use hpfsdp_plan::muon::{MuonPlan, build_muon_plan};
use hpfsdp_plan::planner::{ShardingPlan, plan as build_sharding_plan};
use hpfsdp_plan::scenario::Scenario;

use super::adapters::AdapterRules;
use super::chained::{AdamwPart, ChainedOptimizer, SingleDeviceChained, adamw_from_options};
use super::distributed::{DistributedMuon, StepReport};
use super::domains::MuonDomains;
use super::error::{MuonError, MuonResult};
use super::naive::NaiveDistributedMuon;
use super::presets::MuonConfig;
use super::routing::{RoutedParam, route_params};
use super::single::SingleDeviceMuon;
use crate::model::ParamSet;
use crate::optim::AdamW;
use crate::rng::KeyedRng;
use crate::tensor::Tensor;

/// Everything a Muon run of one scenario needs.
#[derive(Debug, Clone)]
pub struct MuonSetup {
    /// Resolved configuration.
    pub cfg: MuonConfig,
    /// The scenario's Muon plan.
    pub plan: MuonPlan,
    /// Per-parameter domains.
    pub domains: MuonDomains,
    /// Routes and splits.
    pub routed: Vec<RoutedParam>,
    /// AdamW for the non-matrix parameters (chained before Muon).
    pub adamw: AdamW,
}

impl MuonSetup {
    /// Plans a scenario (sharding, FSDP and Muon plans) and resolves its optimizer section.
    pub fn from_scenario(scenario: &Scenario, adapters: &AdapterRules) -> MuonResult<MuonSetup> {
        let sharding = build_sharding_plan(&scenario.model, &scenario.planner_input());
        if sharding.has_errors() {
            return Err(MuonError::plan(format!(
                "the sharding plan has lint errors: {:?}",
                sharding.lints
            )));
        }
        let fsdp = build_fsdp_plan(scenario, &sharding);
        MuonSetup::from_plans(scenario, &sharding, &fsdp, adapters)
    }

    /// Builds the Muon plan from a scenario's already built sharding and FSDP plans (e.g. a
    /// verification run's, which may carry a mutation) and resolves its optimizer section.
    pub fn from_plans(
        scenario: &Scenario,
        sharding: &ShardingPlan,
        fsdp: &FsdpPlan,
        adapters: &AdapterRules,
    ) -> MuonResult<MuonSetup> {
        let plan = build_muon_plan(scenario, sharding, fsdp);
        let cfg = MuonConfig::from_section(&scenario.file.optimizer)?;
        let domains = MuonDomains::from_scenario(scenario, sharding, &plan)?;
        let routed = route_params(&plan, adapters)?;
        Ok(MuonSetup {
            cfg,
            plan,
            domains,
            routed,
            adamw: adamw_from_options(&scenario.file.optimizer.adamw)?,
        })
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.domains.world_size()
    }

    /// Full tensors of every plan parameter: keyed normal values times `std`, stream
    /// `(seed, name)`.
    pub fn random_set(&self, seed: u64, std: f32) -> MuonResult<ParamSet<f32>> {
        let mut set = ParamSet::new();
        for r in &self.routed {
            let n: usize = r.shape.iter().product();
            let vals = KeyedRng::named(seed, &r.name)
                .normal_range(0, n as u64)
                .into_iter()
                .map(|z| z * std)
                .collect();
            set.insert(r.name.clone(), Tensor::from_vec(&r.shape, vals)?);
        }
        Ok(set)
    }

    /// `rank`'s local pieces of a full set (parameters it does not hold have a zero-size
    /// leading dim).
    pub fn local_set(&self, full: &ParamSet<f32>, rank: usize) -> MuonResult<ParamSet<f32>> {
        let mut set = ParamSet::new();
        for d in self.domains.all() {
            let local = self
                .domains
                .shard(d.index, full.get(&d.name)?.as_slice(), rank)?;
            set.insert(
                d.name.clone(),
                Tensor::from_vec(&d.local_shape(rank), local)?,
            );
        }
        Ok(set)
    }

    /// Rebuilds full tensors from every rank's pieces; fails if replicas differ in any bit.
    pub fn gather_set(&self, locals: &[ParamSet<f32>]) -> MuonResult<ParamSet<f32>> {
        let mut set = ParamSet::new();
        for d in self.domains.all() {
            let pieces = locals
                .iter()
                .map(|l| Ok(l.get(&d.name)?.as_slice().to_vec()))
                .collect::<MuonResult<Vec<_>>>()?;
            let shape: Vec<usize> = d.layout.global_shape.iter().map(|&x| x as usize).collect();
            set.insert(
                d.name.clone(),
                Tensor::from_vec(&shape, self.domains.gather(d.index, &pieces)?)?,
            );
        }
        Ok(set)
    }

    /// Single-device AdamW + Muon for `grads.len()` steps from `params`; returns the
    /// parameters and the NS matrices run per step.
    pub fn run_single(
        &self,
        params: &ParamSet<f32>,
        grads: &[ParamSet<f32>],
    ) -> MuonResult<(ParamSet<f32>, Vec<usize>)> {
        let mut p = params.clone();
        let mut opt = SingleDeviceChained {
            adamw: AdamwPart::new(self.adamw, &self.routed),
            muon: SingleDeviceMuon::new(self.cfg.clone(), self.routed.clone()),
        };
        let ns = grads
            .iter()
            .map(|g| opt.step(&mut p, g))
            .collect::<MuonResult<Vec<_>>>()?;
        Ok((p, ns))
    }

    /// Runs AdamW + the deduplicated (`naive = false`) or naive distributed Muon on in-process
    /// ranks.
    pub fn run_distributed(
        &self,
        params: &ParamSet<f32>,
        grads: &[ParamSet<f32>],
        naive: bool,
    ) -> MuonResult<DistributedRun> {
        let world = InProcWorld::run(self.world_size(), |comm| -> MuonResult<_> {
            let rank = comm.rank();
            let mut local = self.local_set(params, rank)?;
            let local_grads = grads
                .iter()
                .map(|g| self.local_set(g, rank))
                .collect::<MuonResult<Vec<_>>>()?;
            let mut reports = Vec::new();
            let mut adamw = AdamwPart::new(self.adamw, &self.routed);
            if naive {
                let mut opt = NaiveDistributedMuon::new(
                    self.cfg.clone(),
                    self.plan.clone(),
                    self.domains.clone(),
                    self.routed.clone(),
                    rank,
                )?;
                for g in &local_grads {
                    adamw.step(&mut local, g)?;
                    reports.push(opt.step(comm, &mut local, g)?);
                }
            } else {
                let mut opt = ChainedOptimizer {
                    adamw,
                    muon: DistributedMuon::new(
                        self.cfg.clone(),
                        self.plan.clone(),
                        self.domains.clone(),
                        self.routed.clone(),
                        rank,
                    )?,
                };
                for g in &local_grads {
                    reports.push(opt.step(comm, &mut local, g)?);
                }
            }
            Ok((local, reports))
        })?;
        let mut locals = Vec::new();
        let mut reports = Vec::new();
        for r in world.results {
            let (l, rep) = r?;
            locals.push(l);
            reports.push(rep);
        }
        Ok(DistributedRun { locals, reports })
    }
}

/// The per-rank results of a distributed run.
#[derive(Debug, Clone)]
pub struct DistributedRun {
    /// Each rank's local parameters after the last step.
    pub locals: Vec<ParamSet<f32>>,
    /// Each rank's step reports (`reports[rank][step]`).
    pub reports: Vec<Vec<StepReport>>,
}
