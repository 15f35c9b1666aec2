//! Single-device Muon on full (unsharded) tensors: the definition the distributed executors
//! must match bit for bit. Newton-Schulz runs one matrix at a time.

use std::collections::BTreeMap;

use hpfsdp_plan::muon::OptimizerRoute;

use super::error::{MuonError, MuonResult};
use super::orthogonalize::{NsKernel, OrthoJob, lr_pattern, orthogonalize};
use super::presets::MuonConfig;
use super::routing::{MatrixStack, RoutedParam};
use super::update::{apply_update, momentum_step};
use crate::model::ParamSet;

/// Muon over full tensors on one device.
#[derive(Debug, Clone)]
pub struct SingleDeviceMuon {
    cfg: MuonConfig,
    routed: Vec<RoutedParam>,
    kernel: NsKernel,
    momentum: BTreeMap<String, Vec<f32>>,
}

impl SingleDeviceMuon {
    /// A single-device Muon over the Muon-routed parameters of `routed`.
    pub fn new(cfg: MuonConfig, routed: Vec<RoutedParam>) -> SingleDeviceMuon {
        SingleDeviceMuon {
            cfg,
            routed,
            kernel: NsKernel::PerMatrix,
            momentum: BTreeMap::new(),
        }
    }

    /// Uses another Newton-Schulz kernel (default: one matrix at a time).
    pub fn with_kernel(mut self, kernel: NsKernel) -> SingleDeviceMuon {
        self.kernel = kernel;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &MuonConfig {
        &self.cfg
    }

    /// The momentum buffer of a parameter, once it exists.
    pub fn momentum(&self, name: &str) -> Option<&[f32]> {
        self.momentum.get(name).map(Vec::as_slice)
    }

    /// One step on every Muon parameter of `params` with full gradients `grads`; returns the
    /// Newton-Schulz matrices run.
    pub fn step(
        &mut self,
        params: &mut crate::model::ParamSet<f32>,
        grads: &ParamSet<f32>,
    ) -> MuonResult<usize> {
        let mut ns = 0;
        for r in self
            .routed
            .iter()
            .filter(|r| r.route == OptimizerRoute::Muon)
        {
            let core = r
                .core
                .ok_or_else(|| MuonError::plan(format!("{} has no core shape", r.name)))?;
            let g = grads.get(&r.name)?;
            if g.shape() != r.shape.as_slice() {
                return Err(MuonError::plan(format!(
                    "{}: gradient {:?}, parameter {:?}",
                    r.name,
                    g.shape(),
                    r.shape
                )));
            }
            let buf = self
                .momentum
                .entry(r.name.clone())
                .or_insert_with(|| vec![0.0; g.len()]);
            let u = momentum_step(&self.cfg, g.as_slice(), buf);
            let stack = MatrixStack::of_local(&r.shape, core)?;
            let out = orthogonalize(
                &self.cfg,
                &[OrthoJob {
                    input: &u,
                    count: stack.count,
                    rows: stack.rows,
                    cols: stack.cols,
                    split: &r.split,
                }],
                self.kernel,
            )?;
            ns += out.ns_matrices;
            let pattern = lr_pattern(&self.cfg, stack.rows, stack.cols, &r.split)?;
            let scale = super::orthogonalize::lr_scale_at(&pattern, 0..u.len());
            let p = params.get_mut(&r.name)?;
            apply_update(&self.cfg, p.as_mut_slice(), &out.updates[0], &scale);
        }
        Ok(ns)
    }
}
