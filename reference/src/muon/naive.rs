//! Naive distributed Muon: every rank keeps momentum for every piece it holds, all-gathers
//! every matrix-plane-sharded NS input over its whole shard domain (one all-gather per
//! parameter), orthogonalizes every matrix itself, and keeps its own slice. Replicas repeat
//! the same work. The baseline the deduplicated engine must match bit for bit.

use std::collections::BTreeMap;

use hpfsdp_backends::{Buffer, Collective, Group, bf16};
use hpfsdp_plan::muon::{MuonPlan, OptimizerRoute};

use super::distributed::StepReport;
use super::domains::MuonDomains;
use super::error::{MuonError, MuonResult};
use super::orthogonalize::{NsKernel, OrthoJob, lr_pattern, lr_scale_at, orthogonalize};
use super::presets::MuonConfig;
use super::routing::{MatrixStack, RoutedParam};
use super::update::{apply_update, momentum_step};
use crate::model::ParamSet;

/// The naive distributed Muon of one rank.
#[derive(Debug, Clone)]
pub struct NaiveDistributedMuon {
    cfg: MuonConfig,
    plan: MuonPlan,
    domains: MuonDomains,
    routed: Vec<RoutedParam>,
    rank: usize,
    momentum: BTreeMap<usize, Vec<f32>>,
}

impl NaiveDistributedMuon {
    /// The naive engine of `rank`.
    pub fn new(
        cfg: MuonConfig,
        plan: MuonPlan,
        domains: MuonDomains,
        routed: Vec<RoutedParam>,
        rank: usize,
    ) -> MuonResult<NaiveDistributedMuon> {
        if routed.len() != plan.params.len() || domains.all().len() != plan.params.len() {
            return Err(MuonError::plan(
                "routes, domains and plan list different parameters",
            ));
        }
        Ok(NaiveDistributedMuon {
            cfg,
            plan,
            domains,
            routed,
            rank,
            momentum: BTreeMap::new(),
        })
    }

    /// Momentum elements held on this rank.
    pub fn momentum_elems(&self) -> usize {
        self.momentum.values().map(Vec::len).sum()
    }

    /// One step over every Muon parameter this rank holds, in plan order.
    pub fn step(
        &mut self,
        comm: &dyn Collective,
        params: &mut ParamSet<f32>,
        grads: &ParamSet<f32>,
    ) -> MuonResult<StepReport> {
        let rank = self.rank;
        let mut report = StepReport::default();
        for (i, r) in self.routed.iter().enumerate() {
            let d = self.domains.get(i)?;
            if r.route != OptimizerRoute::Muon || !d.holds(rank) {
                continue;
            }
            let core = r
                .core
                .ok_or_else(|| MuonError::plan(format!("{} has no core shape", r.name)))?;
            let g = grads.get(&r.name)?;
            let buf = self.momentum.entry(i).or_insert_with(|| vec![0.0; g.len()]);
            let u = momentum_step(&self.cfg, g.as_slice(), buf);
            let (update, positions): (Vec<f32>, Vec<usize>) = if self.plan.params[i].needs_gather {
                let members = d.shard_domain(rank);
                let group = Group::new(format!("muon-naive/{}", r.name), members.clone())?;
                let most = members.iter().map(|&m| d.local_numel(m)).max().unwrap_or(0);
                let mut packed: Vec<bf16> = u.iter().map(|&x| bf16::from_f32(x)).collect();
                packed.resize(most, bf16::ZERO);
                let out: Vec<bf16> = comm.all_gather(&group, Buffer::Bf16(packed))?.wait_vec()?;
                report.collectives += 1;
                report.gather_bytes += (out.len() * 2) as u64;
                let mut full = vec![0.0f32; d.numel()];
                for (j, &m) in members.iter().enumerate() {
                    for (k, idx) in d.local_indices(m).into_iter().enumerate() {
                        full[idx] = out[j * most + k].to_f32();
                    }
                }
                let stack = MatrixStack::of_local(&r.shape, core)?;
                let out = orthogonalize(
                    &self.cfg,
                    &[OrthoJob {
                        input: &full,
                        count: stack.count,
                        rows: stack.rows,
                        cols: stack.cols,
                        split: &r.split,
                    }],
                    NsKernel::Batched,
                )?;
                report.ns_matrices += out.ns_matrices;
                let idx = d.local_indices(rank);
                (idx.iter().map(|&k| out.updates[0][k]).collect(), idx)
            } else {
                let stack = MatrixStack::of_local(&d.local_shape(rank), core)?;
                let out = orthogonalize(
                    &self.cfg,
                    &[OrthoJob {
                        input: &u,
                        count: stack.count,
                        rows: stack.rows,
                        cols: stack.cols,
                        split: &r.split,
                    }],
                    NsKernel::Batched,
                )?;
                report.ns_matrices += out.ns_matrices;
                let n = u.len();
                (
                    out.updates.into_iter().next().unwrap_or_default(),
                    (0..n).collect(),
                )
            };
            let pattern = lr_pattern(&self.cfg, core.0, core.1, &r.split)?;
            let scale = lr_scale_at(&pattern, positions.into_iter());
            let p = params.get_mut(&r.name)?;
            apply_update(&self.cfg, p.as_mut_slice(), &update, &scale);
        }
        report.momentum_elems = self.momentum_elems();
        Ok(report)
    }
}
