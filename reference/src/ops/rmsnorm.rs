//! RMSNorm over the last dimension: `y = x · (mean(x²) + eps)^-½ · w`.

use crate::error::{RefError, RefResult};
use crate::real::Real;
use crate::reduce::{dot, sum_squares};
use crate::tensor::Tensor;

/// RMSNorm with epsilon `eps`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNorm {
    /// Added to the mean square before the square root.
    pub eps: f64,
}

/// What [`RmsNorm::backward`] needs.
#[derive(Debug, Clone)]
pub struct RmsNormCache<T: Real> {
    /// The input `[rows, dim]`.
    x: Tensor<T>,
    /// `1 / sqrt(mean(x²) + eps)` per row.
    inv_rms: Vec<T>,
}

/// Gradients of RMSNorm.
#[derive(Debug, Clone)]
pub struct RmsNormGrads<T: Real> {
    /// `dL/dx` `[rows, dim]`.
    pub dx: Tensor<T>,
    /// `dL/dw` `[dim]`.
    pub dweight: Tensor<T>,
}

impl RmsNorm {
    fn dims<T: Real>(weight: &Tensor<T>, x: &Tensor<T>) -> RefResult<(usize, usize)> {
        let (rows, dim) = x.dims2("rmsnorm")?;
        if weight.shape() != [dim] {
            return Err(RefError::shape(
                "rmsnorm",
                format!("weight {:?} for rows of {dim}", weight.shape()),
            ));
        }
        Ok((rows, dim))
    }

    /// Normalise each row of `x` `[rows, dim]` and scale by `weight` `[dim]`.
    pub fn forward<T: Real>(
        &self,
        weight: &Tensor<T>,
        x: &Tensor<T>,
    ) -> RefResult<(Tensor<T>, RmsNormCache<T>)> {
        let (rows, dim) = Self::dims(weight, x)?;
        let eps = T::from_f64(self.eps);
        let n = T::from_f64(dim as f64);
        let w = weight.as_slice();
        let mut y = Tensor::zeros(&[rows, dim]);
        let mut inv_rms = Vec::with_capacity(rows);
        for r in 0..rows {
            let xr = x.row(r);
            let inv = T::ONE / (sum_squares(xr) / n + eps).sqrt();
            inv_rms.push(inv);
            for ((o, &xi), &wi) in y.row_mut(r).iter_mut().zip(xr).zip(w) {
                *o = xi * inv * wi;
            }
        }
        Ok((
            y,
            RmsNormCache {
                x: x.clone(),
                inv_rms,
            },
        ))
    }

    /// `g = dy·w`; `dx = inv·g − x·inv³·(g·x)/dim`; `dw = Σ_rows dy·x·inv` (rows ascending).
    pub fn backward<T: Real>(
        &self,
        weight: &Tensor<T>,
        cache: &RmsNormCache<T>,
        dy: &Tensor<T>,
    ) -> RefResult<RmsNormGrads<T>> {
        let (rows, dim) = Self::dims(weight, &cache.x)?;
        dy.expect_shape("rmsnorm backward", &[rows, dim])?;
        let n = T::from_f64(dim as f64);
        let w = weight.as_slice();
        let mut dx = Tensor::zeros(&[rows, dim]);
        let mut dw = Tensor::zeros(&[dim]);
        let mut g = vec![T::ZERO; dim];
        for r in 0..rows {
            let (xr, dyr, inv) = (cache.x.row(r), dy.row(r), cache.inv_rms[r]);
            for ((gi, &d), &wi) in g.iter_mut().zip(dyr).zip(w) {
                *gi = d * wi;
            }
            let s = dot(&g, xr);
            let coef = inv * inv * inv * s / n;
            for ((o, &gi), &xi) in dx.row_mut(r).iter_mut().zip(&g).zip(xr) {
                *o = inv * gi - xi * coef;
            }
            for ((o, &d), &xi) in dw.as_mut_slice().iter_mut().zip(dyr).zip(xr) {
                *o += d * xi * inv;
            }
        }
        Ok(RmsNormGrads { dx, dweight: dw })
    }
}
