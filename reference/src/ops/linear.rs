//! A bias-free linear layer with a HuggingFace-layout weight `[out, in]`: `y = x · Wᵀ`.

use crate::error::RefResult;
use crate::matmul::{matmul, matmul_nt, matmul_tn};
use crate::real::Real;
use crate::tensor::Tensor;

/// The linear operator (stateless).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Linear;

/// What [`Linear::backward`] needs: the input.
#[derive(Debug, Clone)]
pub struct LinearCache<T: Real> {
    /// The input `x` `[tokens, in]`.
    x: Tensor<T>,
}

/// Gradients of a linear layer.
#[derive(Debug, Clone)]
pub struct LinearGrads<T: Real> {
    /// `dL/dx` `[tokens, in]`.
    pub dx: Tensor<T>,
    /// `dL/dW` `[out, in]`.
    pub dweight: Tensor<T>,
}

impl Linear {
    /// `y = x · Wᵀ` for `x` `[tokens, in]` and `weight` `[out, in]`.
    pub fn forward<T: Real>(
        &self,
        weight: &Tensor<T>,
        x: &Tensor<T>,
    ) -> RefResult<(Tensor<T>, LinearCache<T>)> {
        let y = matmul_nt(x, weight)?;
        Ok((y, LinearCache { x: x.clone() }))
    }

    /// `dx = dy · W`, `dW = dyᵀ · x`.
    pub fn backward<T: Real>(
        &self,
        weight: &Tensor<T>,
        cache: &LinearCache<T>,
        dy: &Tensor<T>,
    ) -> RefResult<LinearGrads<T>> {
        Ok(LinearGrads {
            dx: matmul(dy, weight)?,
            dweight: matmul_tn(dy, &cache.x)?,
        })
    }
}
