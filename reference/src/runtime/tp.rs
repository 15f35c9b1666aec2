//! Tensor parallelism on top of FSDP.
//!
//! Column- and row-parallel layers need no special kernels: a rank runs the ordinary
//! operator on its local weight shards (q/k/v and gate/up split on dim 0, o/down on dim 1,
//! so attention runs on `heads / tp` local heads) and the result is `Partial(sum)` over `tp`;
//! the boundary's precompiled `out_src → out_dst` transition (all-reduce) completes it, and in
//! backward the adjoint of the input transition all-reduces the partial input gradient. What
//! does need a kernel is the vocabulary-parallel embedding (rows outside the local vocabulary
//! range give zeros, so the all-reduce adds exactly one non-zero row per token), here.

use crate::error::{RefError, RefResult};
use crate::tensor::Tensor;

/// What [`embedding_backward`] needs.
#[derive(Debug, Clone)]
pub struct VocabParallelCache {
    ids: Vec<usize>,
    first_row: usize,
    rows: usize,
    hidden: usize,
}

/// Lookup of `ids` in the local rows `[first_row, first_row + rows)` of a `[vocab, hidden]`
/// table: tokens whose id falls outside give zero rows. With the whole table (`first_row = 0`)
/// this is the plain embedding.
pub fn embedding_forward(
    weight_local: &Tensor<f32>,
    ids: &[usize],
    first_row: usize,
    vocab: usize,
) -> RefResult<(Tensor<f32>, VocabParallelCache)> {
    let (rows, hidden) = weight_local.dims2("vocab-parallel embedding")?;
    let mut out = vec![0.0f32; ids.len() * hidden];
    for (t, &id) in ids.iter().enumerate() {
        if id >= vocab {
            return Err(RefError::invalid(
                "embedding",
                format!("token {t} has id {id} outside a vocabulary of {vocab}"),
            ));
        }
        if (first_row..first_row + rows).contains(&id) {
            out[t * hidden..(t + 1) * hidden].copy_from_slice(weight_local.row(id - first_row));
        }
    }
    Ok((
        Tensor::from_vec(&[ids.len(), hidden], out)?,
        VocabParallelCache {
            ids: ids.to_vec(),
            first_row,
            rows,
            hidden,
        },
    ))
}

/// Gradient of the local rows: `dW[id - first_row] += dy[t]`, tokens in ascending order
/// (the same order as the whole-table backward, so the local rows are its exact slice).
pub fn embedding_backward(cache: &VocabParallelCache, dy: &Tensor<f32>) -> RefResult<Tensor<f32>> {
    dy.expect_shape(
        "vocab-parallel embedding backward",
        &[cache.ids.len(), cache.hidden],
    )?;
    let mut dw = Tensor::zeros(&[cache.rows, cache.hidden]);
    for (t, &id) in cache.ids.iter().enumerate() {
        if (cache.first_row..cache.first_row + cache.rows).contains(&id) {
            for (d, &g) in dw.row_mut(id - cache.first_row).iter_mut().zip(dy.row(t)) {
                *d += g;
            }
        }
    }
    Ok(dw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Embedding;

    #[test]
    fn the_whole_table_is_the_plain_embedding_and_shards_are_slices() {
        let w = Tensor::from_fn(&[6, 3], |i| i as f32 * 0.5 - 2.0);
        let ids = [5, 0, 2, 5, 1];
        let (y, c) = embedding_forward(&w, &ids, 0, 6).unwrap();
        let (y_ref, c_ref) = Embedding.forward(&w, &ids).unwrap();
        assert!(y.bit_eq(&y_ref));
        let dy = Tensor::from_fn(&[5, 3], |i| (i as f32).sin());
        let full = Embedding.backward(&c_ref, &dy).unwrap();
        assert!(embedding_backward(&c, &dy).unwrap().bit_eq(&full));
        let lo = Tensor::from_vec(&[3, 3], w.as_slice()[9..].to_vec()).unwrap();
        let (_, cl) = embedding_forward(&lo, &ids, 3, 6).unwrap();
        let g = embedding_backward(&cl, &dy).unwrap();
        assert_eq!(g.as_slice(), &full.as_slice()[9..]);
        assert!(embedding_forward(&w, &[7], 0, 6).is_err());
    }
}
