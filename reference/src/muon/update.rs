//! The element-wise stages of a Muon step on local tensors: momentum (three forms), the
//! in-update shape scale, and the decoupled-weight-decay apply. Each is element-wise, so a
//! shard gives the same bits as the same elements of the full tensor.
//!
//! Scalars enter as f32 (Python floats meet f32 kernels as f32), in the operation order of the
//! reference code. Every arithmetic operation is rounded separately (no fused multiply-add),
//! except under [`ElementwiseNumerics::TorchCpuFma`] (the `torch` preset), where the EMA
//! momentum's `lerp_`/`lerp` and the update's `param.add_(update, alpha=−lr)` are one fused
//! multiply-add each, as torch's CPU kernels compute them (bitwise against
//! `torch.optim.Muon`, `reference/tests/torch_golden.rs`).

use super::presets::{MomentumForm, MuonConfig};
use crate::bf16::quantize_bf16 as q;
use hpfsdp_plan::optimizer_numerics::ElementwiseNumerics;

pub use crate::optim::{lerp, lerp_fma};

/// Updates the momentum buffer `buf` with gradient `grad` and returns the Newton-Schulz input
/// (rounded to bf16, held in f32).
pub fn momentum_step(cfg: &MuonConfig, grad: &[f32], buf: &mut [f32]) -> Vec<f32> {
    let nesterov = cfg.nesterov;
    match cfg.momentum {
        MomentumForm::TwoCoefficient { m1, m2 } => {
            let (m1, m2) = (m1 as f32, m2 as f32);
            grad.iter()
                .zip(buf.iter_mut())
                .map(|(&g, b)| {
                    let old = *b;
                    let mut u = g + m1 * old;
                    *b = old * m2 + g;
                    if nesterov {
                        u = u * m1 + g;
                    }
                    q(u)
                })
                .collect()
        }
        MomentumForm::Ema { beta } => {
            let w_buf = (1.0 - beta) as f32;
            let w_nesterov = beta as f32;
            let lerp_of: fn(f32, f32, f32) -> f32 = match cfg.elementwise {
                ElementwiseNumerics::Unfused => lerp,
                ElementwiseNumerics::TorchCpuFma => lerp_fma::<f32>,
            };
            grad.iter()
                .zip(buf.iter_mut())
                .map(|(&g, b)| {
                    *b = lerp_of(*b, g, w_buf);
                    q(if nesterov {
                        lerp_of(g, *b, w_nesterov)
                    } else {
                        *b
                    })
                })
                .collect()
        }
        MomentumForm::HeavyBall { mu } => {
            let mu = mu as f32;
            grad.iter()
                .zip(buf.iter_mut())
                .map(|(&g, b)| {
                    *b = *b * mu + g;
                    q(if nesterov { g + mu * *b } else { *b })
                })
                .collect()
        }
    }
}

/// Multiplies a bf16 update by a shape factor in place, rounding to bf16 (`update.mul_(s)`).
pub fn scale_in_place(update: &mut [f32], factor: f64) {
    let s = factor as f32;
    for v in update {
        *v = q(*v * s);
    }
}

/// The per-element learning-rate multiplier of an update: one value for the whole tensor, or
/// one per element (matrix splits with their own lr-folded shape factors).
#[derive(Debug, Clone, PartialEq)]
pub enum LrScale {
    /// The same factor for every element.
    Uniform(f64),
    /// One factor per element of the local tensor.
    PerElement(Vec<f64>),
}

/// `p ← p·(1 − lr·λ)` (skipped when λ = 0), then `p ← p + (−lr·s)·u`, in f32 (one fused
/// multiply-add under `torch_cpu_fma`).
pub fn apply_update(cfg: &MuonConfig, param: &mut [f32], update: &[f32], lr_scale: &LrScale) {
    if cfg.weight_decay != 0.0 {
        let decay = (1.0 - cfg.lr * cfg.weight_decay) as f32;
        for p in param.iter_mut() {
            *p *= decay;
        }
    }
    let add: fn(f32, f32, f32) -> f32 = match cfg.elementwise {
        ElementwiseNumerics::Unfused => |p, alpha, u| p + alpha * u,
        ElementwiseNumerics::TorchCpuFma => |p, alpha, u| alpha.mul_add(u, p),
    };
    match lr_scale {
        LrScale::Uniform(s) => {
            let alpha = (-cfg.lr * s) as f32;
            for (p, &u) in param.iter_mut().zip(update) {
                *p = add(*p, alpha, u);
            }
        }
        LrScale::PerElement(s) => {
            for ((p, &u), &s) in param.iter_mut().zip(update).zip(s) {
                *p = add(*p, (-cfg.lr * s) as f32, u);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::muon::presets::MuonPreset;

    #[test]
    fn momentum_forms_follow_their_formulas() {
        let mut hp = MuonConfig::preset(MuonPreset::HyperParallel);
        let mut buf = vec![1.0f32];
        let u = momentum_step(&hp, &[2.0], &mut buf);
        // u = 2 + 0.95·1 = 2.95; buf = 0.95 + 2 = 2.95; nesterov u = 2.95·0.95 + 2.
        assert_eq!(buf, vec![0.95f32 + 2.0]);
        assert_eq!(u, vec![q((2.0f32 + 0.95) * 0.95 + 2.0)]);
        hp.nesterov = false;
        let mut buf = vec![1.0f32];
        assert_eq!(momentum_step(&hp, &[2.0], &mut buf), vec![q(2.95)]);
        let kj = MuonConfig::preset(MuonPreset::KellerJordan);
        let mut buf = vec![0.0f32];
        let u = momentum_step(&kj, &[1.0], &mut buf);
        assert_eq!(buf, vec![(1.0 - 0.95f64) as f32]);
        assert_eq!(u, vec![q(buf[0] - (buf[0] - 1.0) * (1.0 - 0.95f32))]);
        let ml = MuonConfig::preset(MuonPreset::Moonlight);
        let mut buf = vec![1.0f32];
        let u = momentum_step(&ml, &[1.0], &mut buf);
        assert_eq!(buf, vec![1.95]);
        assert_eq!(u, vec![q(1.0 + 0.95f32 * 1.95)]);
    }

    #[test]
    fn apply_decays_with_the_unadjusted_lr() {
        let cfg = MuonConfig::preset(MuonPreset::Moonlight);
        let mut p = vec![1.0f32];
        apply_update(&cfg, &mut p, &[1.0], &LrScale::Uniform(2.0));
        let decay = (1.0 - 1e-3 * 0.1f64) as f32;
        assert_eq!(p, vec![decay + (-2e-3f64) as f32]);
    }
}
