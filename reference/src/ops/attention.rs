//! Causal scaled-dot-product attention with grouped KV heads (GQA / MQA / MHA).
//!
//! Per sequence `b` and query head `h` (KV head `g = h / (heads / kv_heads)`):
//! `S = scale · Q_h K_gᵀ`, entries above the diagonal masked, `P = softmax(S)` row-wise
//! (max-subtracted, libm `exp`, ascending sums), `O_h = P V_g`. Heads run in parallel (each
//! head's outputs belong to one task); GQA gradients of a KV head are summed over its query heads
//! in ascending head order.

use rayon::prelude::*;

use super::activation::{softmax_backward_row, softmax_in_place};
use crate::error::{RefError, RefResult};
use crate::matmul::{MatRef, gemm};
use crate::real::Real;
use crate::tensor::Tensor;

/// Causal attention over packed sequences of `seq_len` tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CausalAttention {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Query/key width per head.
    pub qk_dim: usize,
    /// Value width per head.
    pub v_dim: usize,
    /// Score scale (usually `1 / sqrt(qk_dim)`).
    pub scale: f64,
}

/// What [`CausalAttention::backward`] needs.
#[derive(Debug, Clone)]
pub struct AttentionCache<T: Real> {
    q: Tensor<T>,
    k: Tensor<T>,
    v: Tensor<T>,
    /// Softmax probabilities per `(sequence, head)`, each `seq_len x seq_len` row-major.
    probs: Vec<Vec<T>>,
    seq_len: usize,
}

/// Gradients of attention with respect to its three inputs.
#[derive(Debug, Clone)]
pub struct AttentionGrads<T: Real> {
    /// `[tokens, heads * qk_dim]`.
    pub dq: Tensor<T>,
    /// `[tokens, kv_heads * qk_dim]`.
    pub dk: Tensor<T>,
    /// `[tokens, kv_heads * v_dim]`.
    pub dv: Tensor<T>,
}

impl CausalAttention {
    /// Attention with the standard scale `1 / sqrt(qk_dim)`.
    pub fn new(heads: usize, kv_heads: usize, qk_dim: usize, v_dim: usize) -> Self {
        CausalAttention {
            heads,
            kv_heads,
            qk_dim,
            v_dim,
            scale: 1.0 / (qk_dim as f64).sqrt(),
        }
    }

    fn check<T: Real>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        seq_len: usize,
    ) -> RefResult<usize> {
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(RefError::invalid(
                "attention",
                format!(
                    "{} heads cannot share {} kv heads",
                    self.heads, self.kv_heads
                ),
            ));
        }
        let tokens = q.shape().first().copied().unwrap_or(0);
        if seq_len == 0 || !tokens.is_multiple_of(seq_len) {
            return Err(RefError::invalid(
                "attention",
                format!("{tokens} tokens do not split into sequences of {seq_len}"),
            ));
        }
        q.expect_shape("attention q", &[tokens, self.heads * self.qk_dim])?;
        k.expect_shape("attention k", &[tokens, self.kv_heads * self.qk_dim])?;
        v.expect_shape("attention v", &[tokens, self.kv_heads * self.v_dim])?;
        Ok(tokens / seq_len)
    }

    /// View of head `h` of sequence `b` in a `[tokens, heads * dim]` tensor, as `seq x dim`.
    fn head<'a, T: Real>(
        t: &'a Tensor<T>,
        b: usize,
        h: usize,
        seq: usize,
        dim: usize,
    ) -> RefResult<MatRef<'a, T>> {
        let width = t.row_len();
        MatRef::new(
            &t.as_slice()[b * seq * width + h * dim..],
            seq,
            dim,
            width,
            1,
        )
    }

    /// Write a `seq x dim` row-major block into head `h` of sequence `b` of `out`.
    fn scatter<T: Real>(
        out: &mut Tensor<T>,
        block: &[T],
        b: usize,
        h: usize,
        seq: usize,
        dim: usize,
    ) {
        for s in 0..seq {
            let row = out.row_mut(b * seq + s);
            row[h * dim..(h + 1) * dim].copy_from_slice(&block[s * dim..(s + 1) * dim]);
        }
    }

    /// `O = softmax(scale · Q Kᵀ + causal mask) V` for packed sequences of `seq_len`.
    pub fn forward<T: Real>(
        &self,
        q: &Tensor<T>,
        k: &Tensor<T>,
        v: &Tensor<T>,
        seq_len: usize,
    ) -> RefResult<(Tensor<T>, AttentionCache<T>)> {
        let batch = self.check(q, k, v, seq_len)?;
        let (s, group) = (seq_len, self.heads / self.kv_heads);
        let scale = T::from_f64(self.scale);
        let per_head: Vec<(Vec<T>, Vec<T>)> = (0..batch * self.heads)
            .into_par_iter()
            .map(|bh| -> RefResult<(Vec<T>, Vec<T>)> {
                let (b, h) = (bh / self.heads, bh % self.heads);
                let g = h / group;
                let qh = Self::head(q, b, h, s, self.qk_dim)?;
                let kh = Self::head(k, b, g, s, self.qk_dim)?;
                let vh = Self::head(v, b, g, s, self.v_dim)?;
                let mut p = vec![T::ZERO; s * s];
                gemm(qh, kh.t(), &mut p)?;
                for (i, row) in p.chunks_exact_mut(s).enumerate() {
                    for (j, x) in row.iter_mut().enumerate() {
                        *x = if j <= i { *x * scale } else { T::NEG_INFINITY };
                    }
                    softmax_in_place(row);
                }
                let mut o = vec![T::ZERO; s * self.v_dim];
                gemm(MatRef::row_major(&p, s, s)?, vh, &mut o)?;
                Ok((p, o))
            })
            .collect::<RefResult<_>>()?;
        let tokens = batch * s;
        let mut out = Tensor::zeros(&[tokens, self.heads * self.v_dim]);
        let mut probs = Vec::with_capacity(per_head.len());
        for (bh, (p, o)) in per_head.into_iter().enumerate() {
            Self::scatter(
                &mut out,
                &o,
                bh / self.heads,
                bh % self.heads,
                s,
                self.v_dim,
            );
            probs.push(p);
        }
        Ok((
            out,
            AttentionCache {
                q: q.clone(),
                k: k.clone(),
                v: v.clone(),
                probs,
                seq_len,
            },
        ))
    }

    /// `dP = dO Vᵀ`, `dV = Pᵀ dO`, `dS = scale · P ⊙ (dP − rowsum(P ⊙ dP))`, `dQ = dS K`,
    /// `dK = dSᵀ Q`; KV-head gradients summed over their query heads in ascending order.
    pub fn backward<T: Real>(
        &self,
        cache: &AttentionCache<T>,
        dout: &Tensor<T>,
    ) -> RefResult<AttentionGrads<T>> {
        let (q, k, v, s) = (&cache.q, &cache.k, &cache.v, cache.seq_len);
        let batch = self.check(q, k, v, s)?;
        if cache.probs.len() != batch * self.heads {
            return Err(RefError::invalid(
                "attention backward",
                "cache was produced by an attention with another head count",
            ));
        }
        let tokens = batch * s;
        dout.expect_shape("attention backward", &[tokens, self.heads * self.v_dim])?;
        let group = self.heads / self.kv_heads;
        let scale = T::from_f64(self.scale);
        type HeadGrads<T> = (Vec<T>, Vec<T>, Vec<T>);
        let per_head: Vec<HeadGrads<T>> = (0..batch * self.heads)
            .into_par_iter()
            .map(|bh| -> RefResult<HeadGrads<T>> {
                let (b, h) = (bh / self.heads, bh % self.heads);
                let g = h / group;
                let p = &cache.probs[bh];
                let pm = MatRef::row_major(p, s, s)?;
                let qh = Self::head(q, b, h, s, self.qk_dim)?;
                let kh = Self::head(k, b, g, s, self.qk_dim)?;
                let vh = Self::head(v, b, g, s, self.v_dim)?;
                let doh = Self::head(dout, b, h, s, self.v_dim)?;
                let mut dp = vec![T::ZERO; s * s];
                gemm(doh, vh.t(), &mut dp)?;
                let mut dv = vec![T::ZERO; s * self.v_dim];
                gemm(pm.t(), doh, &mut dv)?;
                let mut ds = vec![T::ZERO; s * s];
                for ((pr, dpr), dsr) in p
                    .chunks_exact(s)
                    .zip(dp.chunks_exact(s))
                    .zip(ds.chunks_exact_mut(s))
                {
                    softmax_backward_row(pr, dpr, dsr);
                    for x in dsr.iter_mut() {
                        *x *= scale;
                    }
                }
                let dsm = MatRef::row_major(&ds, s, s)?;
                let mut dq = vec![T::ZERO; s * self.qk_dim];
                gemm(dsm, kh, &mut dq)?;
                let mut dk = vec![T::ZERO; s * self.qk_dim];
                gemm(dsm.t(), qh, &mut dk)?;
                Ok((dq, dk, dv))
            })
            .collect::<RefResult<_>>()?;
        let mut dq = Tensor::zeros(q.shape());
        let mut dk = Tensor::zeros(k.shape());
        let mut dv = Tensor::zeros(v.shape());
        // Sum each KV head's contributions in ascending query-head order.
        let mut acc_k = vec![T::ZERO; s * self.qk_dim];
        let mut acc_v = vec![T::ZERO; s * self.v_dim];
        for b in 0..batch {
            for g in 0..self.kv_heads {
                acc_k.fill(T::ZERO);
                acc_v.fill(T::ZERO);
                for h in g * group..(g + 1) * group {
                    let (dqh, dkh, dvh) = &per_head[b * self.heads + h];
                    Self::scatter(&mut dq, dqh, b, h, s, self.qk_dim);
                    for (a, &x) in acc_k.iter_mut().zip(dkh) {
                        *a += x;
                    }
                    for (a, &x) in acc_v.iter_mut().zip(dvh) {
                        *a += x;
                    }
                }
                Self::scatter(&mut dk, &acc_k, b, g, s, self.qk_dim);
                Self::scatter(&mut dv, &acc_v, b, g, s, self.v_dim);
            }
        }
        Ok(AttentionGrads { dq, dk, dv })
    }
}
