//! Rotary position embedding, "rotate half" convention (pairs `(i, i + dim/2)`).
//!
//! Angles are `pos · theta^(-2i/dim)`, computed in f64 with `libm` (`pow`, `sin`, `cos`) and
//! rounded once to the working type, so the tables are identical on every machine.

use crate::error::{RefError, RefResult};
use crate::real::Real;
use crate::tensor::Tensor;

/// RoPE over the last `dim` features of each head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// Base of the frequencies (e.g. 10000 or 1e6).
    pub theta: f64,
    /// Rotary dimension per head (even).
    pub dim: usize,
}

impl Rope {
    /// `(cos, sin)` of position `pos` for pair `i`.
    fn angle<T: Real>(&self, pos: usize, i: usize) -> (T, T) {
        let inv_freq = libm::pow(self.theta, -(2.0 * i as f64) / self.dim as f64);
        let a = pos as f64 * inv_freq;
        (T::from_f64(libm::cos(a)), T::from_f64(libm::sin(a)))
    }

    fn check<T: Real>(&self, x: &Tensor<T>, heads: usize, positions: &[usize]) -> RefResult<usize> {
        if self.dim == 0 || !self.dim.is_multiple_of(2) {
            return Err(RefError::invalid(
                "rope",
                format!("rotary dim {} must be even and positive", self.dim),
            ));
        }
        let (tokens, width) = x.dims2("rope")?;
        if width != heads * self.dim || positions.len() != tokens {
            return Err(RefError::shape(
                "rope",
                format!(
                    "x {:?} with {heads} heads of {} and {} positions",
                    x.shape(),
                    self.dim,
                    positions.len()
                ),
            ));
        }
        Ok(tokens)
    }

    fn rotate<T: Real>(
        &self,
        x: &Tensor<T>,
        heads: usize,
        positions: &[usize],
        sign: T,
    ) -> RefResult<Tensor<T>> {
        let tokens = self.check(x, heads, positions)?;
        let half = self.dim / 2;
        let table: Vec<Vec<(T, T)>> = positions
            .iter()
            .map(|&p| (0..half).map(|i| self.angle::<T>(p, i)).collect())
            .collect();
        let mut y = Tensor::zeros(x.shape());
        for (t, angles) in table.iter().enumerate().take(tokens) {
            let (xr, yr) = (x.row(t), y.row_mut(t));
            for h in 0..heads {
                let base = h * self.dim;
                for (i, &(c, s)) in angles.iter().enumerate() {
                    let s = sign * s;
                    let (a, b) = (xr[base + i], xr[base + half + i]);
                    yr[base + i] = a * c - b * s;
                    yr[base + half + i] = b * c + a * s;
                }
            }
        }
        Ok(y)
    }

    /// Rotate `x` `[tokens, heads * dim]`; token `t` sits at `positions[t]`.
    pub fn forward<T: Real>(
        &self,
        x: &Tensor<T>,
        heads: usize,
        positions: &[usize],
    ) -> RefResult<Tensor<T>> {
        self.rotate(x, heads, positions, T::ONE)
    }

    /// The gradient of [`Rope::forward`]: rotation by the opposite angle (RoPE is orthogonal).
    pub fn backward<T: Real>(
        &self,
        dy: &Tensor<T>,
        heads: usize,
        positions: &[usize],
    ) -> RefResult<Tensor<T>> {
        self.rotate(dy, heads, positions, -T::ONE)
    }
}

/// Positions `0..seq_len` repeated for each sequence of a packed batch of `tokens` tokens.
pub fn positions(tokens: usize, seq_len: usize) -> Vec<usize> {
    (0..tokens).map(|t| t % seq_len.max(1)).collect()
}
