//! AdamW (decoupled weight decay, bias correction), element-wise on a shard, deterministic:
//! arithmetic in torch's operation order, scalar factors computed once in f64 with `libm` and
//! rounded to the parameter type (Python floats meet the kernel as its dtype). Element-wise,
//! so a shard's update is bit-identical to the same slice of the whole tensor's update.
//!
//! For step `t`, torch's `_single_tensor_adam` with decoupled weight decay (notes `muon.md`
//! 3.4), each line one rounded operation sequence, left to right:
//! ```text
//! p ← p · (1 − lr·wd)                                  param.mul_(1 - lr*wd)
//! m ← lerp(m, g, 1 − β1) = m + (1 − β1)·(g − m)        exp_avg.lerp_(grad, 1 - beta1)
//! v ← (v · β2) + ((1 − β2) · g) · g                    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//! p ← p + ((−lr / (1 − β1^t)) · m) / (sqrt(v) / sqrt(1 − β2^t) + eps)
//!                                                      param.addcdiv_(exp_avg, denom, value=-step_size)
//! ```
//! (ATen's `lerp` takes `m + w·(g − m)` for `|w| < 0.5`, see [`lerp`].)
//!
//! Two arithmetic forms ([`ElementwiseNumerics`], `[optimizer.adamw] numerics`):
//! - `unfused` (default): every operation above rounded separately. Platform-independent; the
//!   verify goldens are recorded in it.
//! - `torch_cpu_fma`: what torch's CPU kernels compute: `lerp_` is `fma(w, g − m, m)`
//!   ([`lerp_fma`]) and `addcmul_` is `fma((1 − β2)·g, g, β2·v)`; the rest as above.
//!
//! The square root is IEEE correctly rounded in both forms. torch's CPU `sqrt` kernel is not:
//! on an AVX-512 x86 CPU with torch 2.15, 17.5% of random f32 inputs (183,062 of 1,048,576) and
//! 1.3% of f64 inputs (2,603 of 200,000) come out 1 ulp off the correctly rounded root
//! (`reference/tests/data/torch/sqrt.toml`, `tools/torch_golden.py`). The reference keeps
//! the correctly rounded root (deterministic everywhere); `torch_cpu_fma` therefore equals
//! `torch.optim.AdamW` bitwise in `m` and `v`, and in `p` wherever torch's root was correctly
//! rounded; elsewhere one step's `p` differs by the rounding of one 1-ulp-different
//! denominator: at most `2^(4−P)·|u| + 1 ulp(p)` with `u` the step's update and `P` the
//! precision (24, 53). The bound is relative to the update, not to `p`: where weight decay and
//! the update nearly cancel, `p` is tiny and the difference is many of its ulps
//! (`reference/tests/torch_golden.rs`, `param_bound`; measured at most 2.8e-7·|u| in f32 and
//! 3.5e-16·|u| in f64 on `adamw_cancel.toml`).

use hpfsdp_plan::optimizer_numerics::ElementwiseNumerics;
use hpfsdp_plan::scenario::AdamwOptions;
use serde::Serialize;

use crate::error::{RefError, RefResult};
use crate::real::Real;

/// ATen's `lerp(self, end, w)`: `self + w·(end − self)` when `|w| < 0.5`, else
/// `end − (end − self)·(1 − w)`, in f32 without fused multiply-add (the exact form torch's
/// momentum buffers use; bit-exactness depends on it).
#[inline]
pub fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    if weight.abs() < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (1.0 - weight)
    }
}

/// ATen's vectorised CPU `lerp(self, end, w)`: `fma(w, end − self, self)` when `|w| < 0.5`,
/// else `fma(w − 1, end − self, end)` (one rounding each; the scalar tail compiles to the same
/// fused form). Generic over f32 and f64.
#[inline]
pub fn lerp_fma<T: Real>(start: T, end: T, weight: T) -> T {
    if weight.abs().to_f64() < 0.5 {
        weight.mul_add(end - start, start)
    } else {
        (weight - T::ONE).mul_add(end - start, end)
    }
}

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Arithmetic form of the element-wise update (unfused, or torch's CPU FMA kernels).
    #[serde(
        serialize_with = "serialize_numerics",
        skip_serializing_if = "is_unfused"
    )]
    pub numerics: ElementwiseNumerics,
}

fn is_unfused(n: &ElementwiseNumerics) -> bool {
    *n == ElementwiseNumerics::Unfused
}

fn serialize_numerics<S: serde::Serializer>(
    n: &ElementwiseNumerics,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(n.name())
}

/// The per-step scalars, computed once in f64 and rounded to the parameter type.
struct StepScalars<T> {
    decay: T,
    w_m: T,
    beta2: T,
    one_minus_beta2: T,
    step_size: T,
    bc2_sqrt: T,
    eps: T,
}

/// Optimizer state of one (shard of a) parameter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdamState {
    /// First moment.
    pub m: Vec<f32>,
    /// Second moment.
    pub v: Vec<f32>,
    /// Steps taken.
    pub step: u64,
}

impl AdamState {
    /// Zero state for `n` elements.
    pub fn zeros(n: usize) -> AdamState {
        AdamState {
            m: vec![0.0; n],
            v: vec![0.0; n],
            step: 0,
        }
    }
}

impl AdamW {
    /// The AdamW of a scenario's `[optimizer.adamw]` section; an unknown `numerics` name is an
    /// error naming the key and the accepted names.
    pub fn from_options(o: &AdamwOptions) -> RefResult<AdamW> {
        let numerics = match &o.numerics {
            None => ElementwiseNumerics::default(),
            Some(name) => ElementwiseNumerics::parse(name).ok_or_else(|| {
                let names: Vec<&str> = ElementwiseNumerics::ALL.iter().map(|v| v.name()).collect();
                RefError::Invalid {
                    op: "[optimizer.adamw] numerics",
                    detail: format!("unknown form \"{name}\"; use one of {}", names.join(", ")),
                }
            })?,
        };
        Ok(AdamW {
            lr: o.lr,
            beta1: o.betas[0],
            beta2: o.betas[1],
            eps: o.eps,
            weight_decay: o.weight_decay,
            numerics,
        })
    }

    fn scalars<T: Real>(&self, step: u64) -> StepScalars<T> {
        let t = step as f64;
        StepScalars {
            decay: T::from_f64(1.0 - self.lr * self.weight_decay),
            w_m: T::from_f64(1.0 - self.beta1),
            beta2: T::from_f64(self.beta2),
            one_minus_beta2: T::from_f64(1.0 - self.beta2),
            step_size: T::from_f64(self.lr / (1.0 - libm::pow(self.beta1, t))),
            bc2_sqrt: T::from_f64(libm::sqrt(1.0 - libm::pow(self.beta2, t))),
            eps: T::from_f64(self.eps),
        }
    }

    /// One step on `param` with `grad` (same length as the state).
    pub fn step(&self, param: &mut [f32], grad: &[f32], state: &mut AdamState) {
        state.step += 1;
        self.update(state.step, param, grad, &mut state.m, &mut state.v);
    }

    /// Step number `step` (1-based: the state's step count after this update) on plain
    /// slices of either float type: `m` and `v` are the moments, updated in place. [`step`]
    /// is this on f32 with an [`AdamState`]; f64 exists for comparisons with torch's f64
    /// optimizer.
    ///
    /// [`step`]: AdamW::step
    pub fn update<T: Real>(
        &self,
        step: u64,
        param: &mut [T],
        grad: &[T],
        m: &mut [T],
        v: &mut [T],
    ) {
        let k = self.scalars::<T>(step);
        let fused = self.numerics == ElementwiseNumerics::TorchCpuFma;
        let neg_step_size = -k.step_size;
        for (((p, &g), m), v) in param
            .iter_mut()
            .zip(grad)
            .zip(m.iter_mut())
            .zip(v.iter_mut())
        {
            *p *= k.decay;
            if fused {
                *m = lerp_fma(*m, g, k.w_m);
                *v = (k.one_minus_beta2 * g).mul_add(g, *v * k.beta2);
            } else {
                *m = lerp_real(*m, g, k.w_m);
                *v = *v * k.beta2 + k.one_minus_beta2 * g * g;
            }
            let denom = v.sqrt() / k.bc2_sqrt + k.eps;
            *p += neg_step_size * *m / denom;
        }
    }
}

/// [`lerp`] for either float type (the unfused two-branch form).
#[inline]
fn lerp_real<T: Real>(start: T, end: T, weight: T) -> T {
    if weight.abs().to_f64() < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (T::ONE - weight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first moment is torch's `lerp_` (`m + w·(g − m)`), not `β1·m + (1 − β1)·g`: the two
    /// round differently, and only the former reproduces torch's bits.
    #[test]
    fn moments_follow_torch_operation_order() {
        let opt = AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            numerics: ElementwiseNumerics::Unfused,
        };
        let (m0, v0, g, p0) = (0.3f32, 0.02f32, 2.5f32, 1.25f32);
        let mut st = AdamState {
            m: vec![m0],
            v: vec![v0],
            step: 4,
        };
        let mut p = [p0];
        opt.step(&mut p, &[g], &mut st);
        let w = (1.0f64 - 0.9) as f32;
        let m = m0 + w * (g - m0);
        let v = v0 * 0.95f32 + ((1.0f64 - 0.95) as f32) * g * g;
        assert_eq!(st.m[0].to_bits(), m.to_bits());
        assert_eq!(st.v[0].to_bits(), v.to_bits());
        assert_ne!(
            m.to_bits(),
            (0.9f32 * m0 + w * g).to_bits(),
            "order must matter here"
        );
        let step_size = (1e-3 / (1.0 - libm::pow(0.9, 5.0))) as f32;
        let denom = v.sqrt() / (libm::sqrt(1.0 - libm::pow(0.95, 5.0)) as f32) + 1e-8f32;
        let want = p0 * ((1.0f64 - 1e-3 * 0.1) as f32) + -step_size * m / denom;
        assert_eq!(p[0].to_bits(), want.to_bits());
    }

    #[test]
    fn first_step_moves_by_about_lr_against_the_gradient() {
        let opt = AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
            numerics: ElementwiseNumerics::Unfused,
        };
        let mut p = vec![1.0f32, -2.0, 0.5];
        let g = [0.3f32, -4.0, 0.0];
        let mut s = AdamState::zeros(3);
        opt.step(&mut p, &g, &mut s);
        assert!((p[0] - (1.0 - 1e-3)).abs() < 1e-6);
        assert!((p[1] - (-2.0 + 1e-3)).abs() < 1e-6);
        assert_eq!(p[2], 0.5, "zero gradient, no decay: unchanged");
        // Shard == slice of the whole.
        let mut whole = vec![1.0f32, -2.0, 0.5];
        let mut s2 = AdamState::zeros(3);
        let mut part = vec![-2.0f32, 0.5];
        let mut s3 = AdamState::zeros(2);
        opt.step(&mut whole, &g, &mut s2);
        opt.step(&mut part, &g[1..], &mut s3);
        assert_eq!(whole[1].to_bits(), part[0].to_bits());
    }
}
