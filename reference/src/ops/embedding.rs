//! Token embedding: row lookup in a `[vocab, hidden]` table.

use crate::error::{RefError, RefResult};
use crate::real::Real;
use crate::tensor::Tensor;

/// The embedding operator (stateless).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Embedding;

/// What [`Embedding::backward`] needs: the token ids and the table shape.
#[derive(Debug, Clone)]
pub struct EmbeddingCache {
    /// The token ids looked up.
    ids: Vec<usize>,
    /// `[vocab, hidden]`.
    table_shape: [usize; 2],
}

impl EmbeddingCache {
    /// The token ids looked up.
    pub fn ids(&self) -> &[usize] {
        &self.ids
    }
}

impl Embedding {
    /// `y[t] = weight[ids[t]]`; fails on an id outside the vocabulary.
    pub fn forward<T: Real>(
        &self,
        weight: &Tensor<T>,
        ids: &[usize],
    ) -> RefResult<(Tensor<T>, EmbeddingCache)> {
        let (vocab, hidden) = weight.dims2("embedding")?;
        let mut out = Vec::with_capacity(ids.len() * hidden);
        for (t, &id) in ids.iter().enumerate() {
            if id >= vocab {
                return Err(RefError::invalid(
                    "embedding",
                    format!("token {t} has id {id} outside a vocabulary of {vocab}"),
                ));
            }
            out.extend_from_slice(weight.row(id));
        }
        let y = Tensor::from_vec(&[ids.len(), hidden], out)?;
        Ok((
            y,
            EmbeddingCache {
                ids: ids.to_vec(),
                table_shape: [vocab, hidden],
            },
        ))
    }

    /// `dW[v] = Σ_{t: ids[t] = v} dy[t]`, tokens added in ascending order.
    pub fn backward<T: Real>(
        &self,
        cache: &EmbeddingCache,
        dy: &Tensor<T>,
    ) -> RefResult<Tensor<T>> {
        let [vocab, hidden] = cache.table_shape;
        // The cache comes from `forward`, so every id is below `vocab`.
        dy.expect_shape("embedding backward", &[cache.ids.len(), hidden])?;
        let mut dw = Tensor::zeros(&[vocab, hidden]);
        for (t, &id) in cache.ids.iter().enumerate() {
            for (d, &g) in dw.row_mut(id).iter_mut().zip(dy.row(t)) {
                *d += g;
            }
        }
        Ok(dw)
    }
}
