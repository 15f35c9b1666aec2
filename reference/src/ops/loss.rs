//! Cross-entropy over the vocabulary, averaged over tokens.

use crate::error::{RefError, RefResult};
use crate::real::Real;
use crate::reduce::max;
use crate::tensor::Tensor;

/// Mean token cross-entropy `(1/N) Σ_t (logsumexp(z_t) − z_t[y_t])`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrossEntropy;

/// What [`CrossEntropy::backward`] needs.
#[derive(Debug, Clone)]
pub struct CrossEntropyCache<T: Real> {
    /// Softmax of the logits `[tokens, vocab]`.
    probs: Tensor<T>,
    /// Target ids.
    targets: Vec<usize>,
}

impl<T: Real> CrossEntropyCache<T> {
    /// Softmax of the logits `[tokens, vocab]`.
    pub fn probs(&self) -> &Tensor<T> {
        &self.probs
    }
}

impl CrossEntropy {
    /// Loss of `logits` `[tokens, vocab]` against `targets` (one id per token).
    /// `logsumexp = m + ln Σ exp(z − m)` with `m` the row max, sums ascending; the token
    /// losses are summed in ascending order and divided once by the token count.
    pub fn forward<T: Real>(
        &self,
        logits: &Tensor<T>,
        targets: &[usize],
    ) -> RefResult<(T, CrossEntropyCache<T>)> {
        let (tokens, vocab) = logits.dims2("cross_entropy")?;
        if targets.len() != tokens || tokens == 0 {
            return Err(RefError::shape(
                "cross_entropy",
                format!("{} targets for {tokens} tokens", targets.len()),
            ));
        }
        if let Some((t, &y)) = targets.iter().enumerate().find(|&(_, &y)| y >= vocab) {
            return Err(RefError::invalid(
                "cross_entropy",
                format!("target {y} of token {t} outside a vocabulary of {vocab}"),
            ));
        }
        let mut probs = Tensor::zeros(&[tokens, vocab]);
        let mut total = T::ZERO;
        for t in 0..tokens {
            let z = logits.row(t);
            let m = max(z);
            let mut s = T::ZERO;
            let pr = probs.row_mut(t);
            for (p, &zi) in pr.iter_mut().zip(z) {
                *p = (zi - m).exp();
                s += *p;
            }
            for p in pr.iter_mut() {
                *p /= s;
            }
            total += m + s.ln() - z[targets[t]];
        }
        let loss = total / T::from_f64(tokens as f64);
        Ok((
            loss,
            CrossEntropyCache {
                probs,
                targets: targets.to_vec(),
            },
        ))
    }

    /// `dz = (softmax(z) − onehot(y)) · dloss / N`.
    pub fn backward<T: Real>(
        &self,
        cache: &CrossEntropyCache<T>,
        dloss: T,
    ) -> RefResult<Tensor<T>> {
        let tokens = cache.targets.len();
        let coef = dloss / T::from_f64(tokens as f64);
        let mut dz = cache.probs.clone();
        for (t, &y) in cache.targets.iter().enumerate() {
            let row = dz.row_mut(t);
            row[y] -= T::ONE;
            for x in row.iter_mut() {
                *x *= coef;
            }
        }
        Ok(dz)
    }
}
