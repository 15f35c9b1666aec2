//! The Muon side of a verification spec ([`MuonVerify`]): the scenario's Muon plan over the
//! runtime's shards, each parameter's [`Route`], and the conversions between FSDP-order
//! vectors and Muon parameter sets. Built by the spec ([`super::setup`]); run by
//! [`super::muon`].

use hpfsdp_plan::muon::OptimizerRoute;
use serde::Serialize;

use crate::model::ParamSet;
use crate::muon::{
    AdamwPart, DedupStats, MuonError, MuonResult, MuonSetup, SingleDeviceChained, SingleDeviceMuon,
    dedup_stats,
};
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

impl MuonVerify {
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
