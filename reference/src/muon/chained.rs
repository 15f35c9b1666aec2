//! AdamW chaining: the AdamW-routed parameters (1-D, embeddings, heads) step with the
//! crate's element-wise AdamW on their local pieces, then the Muon parameters step with
//! Muon (HyperParallel's `ChainedOptimizer` order: adamw, then muon).

use std::collections::BTreeMap;

use hpfsdp_backends::Collective;
use hpfsdp_plan::muon::OptimizerRoute;
use hpfsdp_plan::scenario::AdamwOptions;

use super::distributed::{DistributedMuon, StepReport};
use super::error::MuonResult;
use super::routing::RoutedParam;
use super::single::SingleDeviceMuon;
use crate::model::ParamSet;
use crate::optim::{AdamState, AdamW};

/// The AdamW of a scenario's `[optimizer.adamw]` section (an unknown `numerics` form is an
/// error naming the key).
pub fn adamw_from_options(o: &AdamwOptions) -> MuonResult<AdamW> {
    Ok(AdamW::from_options(o)?)
}

/// AdamW over the AdamW-routed parameters of `routed` (whatever pieces `params` holds).
#[derive(Debug, Clone)]
pub struct AdamwPart {
    adamw: AdamW,
    names: Vec<String>,
    states: BTreeMap<String, AdamState>,
}

impl AdamwPart {
    /// AdamW for the parameters `routed` sends to AdamW.
    pub fn new(adamw: AdamW, routed: &[RoutedParam]) -> AdamwPart {
        AdamwPart {
            adamw,
            names: routed
                .iter()
                .filter(|r| r.route == OptimizerRoute::Adamw)
                .map(|r| r.name.clone())
                .collect(),
            states: BTreeMap::new(),
        }
    }

    /// One AdamW step on every AdamW parameter.
    pub fn step(&mut self, params: &mut ParamSet<f32>, grads: &ParamSet<f32>) -> MuonResult<()> {
        for name in &self.names {
            let g = grads.get(name)?;
            let state = self
                .states
                .entry(name.clone())
                .or_insert_with(|| AdamState::zeros(g.len()));
            self.adamw
                .step(params.get_mut(name)?.as_mut_slice(), g.as_slice(), state);
        }
        Ok(())
    }
}

/// Distributed AdamW + Muon of one rank.
#[derive(Debug, Clone)]
pub struct ChainedOptimizer {
    /// The AdamW part.
    pub adamw: AdamwPart,
    /// The Muon part.
    pub muon: DistributedMuon,
}

impl ChainedOptimizer {
    /// One step: AdamW first, then Muon.
    pub fn step(
        &mut self,
        comm: &dyn Collective,
        params: &mut ParamSet<f32>,
        grads: &ParamSet<f32>,
    ) -> MuonResult<StepReport> {
        self.adamw.step(params, grads)?;
        self.muon.step(comm, params, grads)
    }
}

/// Single-device AdamW + Muon.
#[derive(Debug, Clone)]
pub struct SingleDeviceChained {
    /// The AdamW part.
    pub adamw: AdamwPart,
    /// The Muon part.
    pub muon: SingleDeviceMuon,
}

impl SingleDeviceChained {
    /// One step: AdamW first, then Muon; returns the NS matrices run.
    pub fn step(&mut self, params: &mut ParamSet<f32>, grads: &ParamSet<f32>) -> MuonResult<usize> {
        self.adamw.step(params, grads)?;
        self.muon.step(params, grads)
    }
}
