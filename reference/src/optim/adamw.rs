//! AdamW (decoupled weight decay, bias correction), element-wise on a shard, deterministic:
//! f32 arithmetic in torch's operation order without fused multiply-adds, scalar factors
//! computed once in f64 with `libm` and rounded to f32 (Python floats meet the f32 kernel as
//! f32). Element-wise, so a shard's update is bit-identical to the same slice of the whole
//! tensor's update.
//!
//! For step `t`, torch's `_single_tensor_adam` with decoupled weight decay (notes `muon.md`
//! 3.4), each line one rounded f32 operation sequence, left to right:
//! ```text
//! p ← p · (1 − lr·wd)                                  param.mul_(1 - lr*wd)
//! m ← lerp(m, g, 1 − β1) = m + (1 − β1)·(g − m)        exp_avg.lerp_(grad, 1 - beta1)
//! v ← (v · β2) + ((1 − β2) · g) · g                    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//! p ← p + ((−lr / (1 − β1^t)) · m) / (sqrt(v) / sqrt(1 − β2^t) + eps)
//!                                                      param.addcdiv_(exp_avg, denom, value=-step_size)
//! ```
//! (ATen's `lerp` takes `m + w·(g − m)` for `|w| < 0.5`, see [`lerp`].)

use serde::Serialize;

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
    /// One step on `param` with `grad` (same length as the state).
    pub fn step(&self, param: &mut [f32], grad: &[f32], state: &mut AdamState) {
        state.step += 1;
        let t = state.step as f64;
        let decay = (1.0 - self.lr * self.weight_decay) as f32;
        let b2 = self.beta2 as f32;
        let (c1, c2) = ((1.0 - self.beta1) as f32, (1.0 - self.beta2) as f32);
        let step_size = (self.lr / (1.0 - libm::pow(self.beta1, t))) as f32;
        let bc2_sqrt = libm::sqrt(1.0 - libm::pow(self.beta2, t)) as f32;
        let eps = self.eps as f32;
        for (((p, &g), m), v) in param
            .iter_mut()
            .zip(grad)
            .zip(state.m.iter_mut())
            .zip(state.v.iter_mut())
        {
            *p *= decay;
            *m = lerp(*m, g, c1);
            *v = *v * b2 + c2 * g * g;
            let denom = v.sqrt() / bc2_sqrt + eps;
            *p += -step_size * *m / denom;
        }
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
