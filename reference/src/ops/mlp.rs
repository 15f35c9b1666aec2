//! SwiGLU feed-forward: `y = down(silu(gate(x)) ⊙ up(x))`, HF weights `[I,H]`, `[I,H]`, `[H,I]`.

use super::activation::{silu, silu_grad};
use crate::error::RefResult;
use crate::matmul::{matmul, matmul_nt, matmul_tn};
use crate::real::Real;
use crate::tensor::Tensor;

/// The SwiGLU MLP (stateless).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwiGlu;

/// The three projection weights.
#[derive(Debug, Clone, Copy)]
pub struct SwiGluParams<'a, T: Real> {
    /// `gate_proj.weight` `[I, H]`.
    pub gate: &'a Tensor<T>,
    /// `up_proj.weight` `[I, H]`.
    pub up: &'a Tensor<T>,
    /// `down_proj.weight` `[H, I]`.
    pub down: &'a Tensor<T>,
}

/// What [`SwiGlu::backward`] needs.
#[derive(Debug, Clone)]
pub struct SwiGluCache<T: Real> {
    x: Tensor<T>,
    gate: Tensor<T>,
    up: Tensor<T>,
    act: Tensor<T>,
}

/// Gradients of the SwiGLU MLP.
#[derive(Debug, Clone)]
pub struct SwiGluGrads<T: Real> {
    /// `dL/dx` `[tokens, H]`.
    pub dx: Tensor<T>,
    /// `[I, H]`.
    pub dgate: Tensor<T>,
    /// `[I, H]`.
    pub dup: Tensor<T>,
    /// `[H, I]`.
    pub ddown: Tensor<T>,
}

impl SwiGlu {
    /// Forward for `x` `[tokens, H]`.
    pub fn forward<T: Real>(
        &self,
        p: SwiGluParams<'_, T>,
        x: &Tensor<T>,
    ) -> RefResult<(Tensor<T>, SwiGluCache<T>)> {
        let gate = matmul_nt(x, p.gate)?;
        let up = matmul_nt(x, p.up)?;
        let act = gate.zip_map("swiglu", &up, |g, u| silu(g) * u)?;
        let y = matmul_nt(&act, p.down)?;
        Ok((
            y,
            SwiGluCache {
                x: x.clone(),
                gate,
                up,
                act,
            },
        ))
    }

    /// Backward: `da = dy·Wd`, `dg = da ⊙ u ⊙ silu'(g)`, `du = da ⊙ silu(g)`,
    /// `dx = dg·Wg + du·Wu` (the two products added element-wise in that order).
    pub fn backward<T: Real>(
        &self,
        p: SwiGluParams<'_, T>,
        cache: &SwiGluCache<T>,
        dy: &Tensor<T>,
    ) -> RefResult<SwiGluGrads<T>> {
        let (hidden, _) = p.down.dims2("swiglu down_proj")?;
        dy.expect_shape("swiglu backward", &[cache.x.shape()[0], hidden])?;
        let ddown = matmul_tn(dy, &cache.act)?;
        let da = matmul(dy, p.down)?;
        let mut dg = Tensor::zeros(da.shape());
        let mut du = Tensor::zeros(da.shape());
        for i in 0..da.len() {
            let (d, g, u) = (
                da.as_slice()[i],
                cache.gate.as_slice()[i],
                cache.up.as_slice()[i],
            );
            dg.as_mut_slice()[i] = d * u * silu_grad(g);
            du.as_mut_slice()[i] = d * silu(g);
        }
        let dx = matmul(&dg, p.gate)?.add(&matmul(&du, p.up)?)?;
        Ok(SwiGluGrads {
            dx,
            dgate: matmul_tn(&dg, &cache.x)?,
            dup: matmul_tn(&du, &cache.x)?,
            ddown,
        })
    }
}
