//! Multi-head self-attention with GQA, RoPE and optional per-head q/k RMSNorm (Qwen3):
//! `q = rope(norm_q(x Wqᵀ))`, `k = rope(norm_k(x Wkᵀ))`, `v = x Wvᵀ`,
//! `y = attention(q, k, v) Woᵀ`.

use super::attention::{AttentionCache, CausalAttention};
use super::linear::{Linear, LinearCache};
use super::rmsnorm::{RmsNorm, RmsNormCache};
use super::rope::{Rope, positions};
use crate::error::{RefError, RefResult};
use crate::real::Real;
use crate::tensor::Tensor;

/// The q/k RMSNorm and its two weights, when enabled.
type QkNorm<'a, T> = (RmsNorm, &'a Tensor<T>, &'a Tensor<T>);

/// Self-attention hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelfAttention {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of each head.
    pub head_dim: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// Per-head RMSNorm on q and k with this epsilon (Qwen3), or none.
    pub qk_norm_eps: Option<f64>,
}

/// The self-attention weights (`q_norm`/`k_norm` only with `qk_norm_eps`).
#[derive(Debug, Clone, Copy)]
pub struct SelfAttentionParams<'a, T: Real> {
    /// `q_proj.weight` `[heads * head_dim, H]`.
    pub q: &'a Tensor<T>,
    /// `k_proj.weight` `[kv_heads * head_dim, H]`.
    pub k: &'a Tensor<T>,
    /// `v_proj.weight` `[kv_heads * head_dim, H]`.
    pub v: &'a Tensor<T>,
    /// `o_proj.weight` `[H, heads * head_dim]`.
    pub o: &'a Tensor<T>,
    /// `q_norm.weight` `[head_dim]`.
    pub q_norm: Option<&'a Tensor<T>>,
    /// `k_norm.weight` `[head_dim]`.
    pub k_norm: Option<&'a Tensor<T>>,
}

/// What [`SelfAttention::backward`] needs.
#[derive(Debug, Clone)]
pub struct SelfAttentionCache<T: Real> {
    x: LinearCache<T>,
    q_norm: Option<RmsNormCache<T>>,
    k_norm: Option<RmsNormCache<T>>,
    attn: AttentionCache<T>,
    o: LinearCache<T>,
    positions: Vec<usize>,
}

/// Gradients of self-attention.
#[derive(Debug, Clone)]
pub struct SelfAttentionGrads<T: Real> {
    /// `dL/dx`.
    pub dx: Tensor<T>,
    /// `d q_proj.weight`.
    pub dq: Tensor<T>,
    /// `d k_proj.weight`.
    pub dk: Tensor<T>,
    /// `d v_proj.weight`.
    pub dv: Tensor<T>,
    /// `d o_proj.weight`.
    pub do_: Tensor<T>,
    /// `d q_norm.weight`.
    pub dq_norm: Option<Tensor<T>>,
    /// `d k_norm.weight`.
    pub dk_norm: Option<Tensor<T>>,
}

impl SelfAttention {
    fn core(&self) -> CausalAttention {
        CausalAttention::new(self.heads, self.kv_heads, self.head_dim, self.head_dim)
    }

    fn rope(&self) -> Rope {
        Rope {
            theta: self.rope_theta,
            dim: self.head_dim,
        }
    }

    fn norms<'a, T: Real>(
        &self,
        p: &SelfAttentionParams<'a, T>,
    ) -> RefResult<Option<QkNorm<'a, T>>> {
        match (self.qk_norm_eps, p.q_norm, p.k_norm) {
            (None, _, _) => Ok(None),
            (Some(eps), Some(q), Some(k)) => Ok(Some((RmsNorm { eps }, q, k))),
            _ => Err(RefError::invalid(
                "self_attention",
                "qk_norm is on but q_norm/k_norm weights are missing",
            )),
        }
    }

    /// Per-head RMSNorm: view `[tokens, heads*d]` as `[tokens*heads, d]`.
    fn head_norm<T: Real>(
        norm: RmsNorm,
        w: &Tensor<T>,
        x: Tensor<T>,
        heads: usize,
        d: usize,
    ) -> RefResult<(Tensor<T>, RmsNormCache<T>)> {
        let tokens = x.shape()[0];
        let (y, c) = norm.forward(w, &x.reshape(&[tokens * heads, d])?)?;
        Ok((y.reshape(&[tokens, heads * d])?, c))
    }

    /// Forward for `x` `[tokens, H]`, packed sequences of `seq_len`.
    pub fn forward<T: Real>(
        &self,
        p: SelfAttentionParams<'_, T>,
        x: &Tensor<T>,
        seq_len: usize,
    ) -> RefResult<(Tensor<T>, SelfAttentionCache<T>)> {
        let (tokens, _) = x.dims2("self_attention")?;
        let pos = positions(tokens, seq_len);
        let (d, lin) = (self.head_dim, Linear);
        let (q, x_cache) = lin.forward(p.q, x)?;
        let (k, _) = lin.forward(p.k, x)?;
        let (v, _) = lin.forward(p.v, x)?;
        let (q, k, q_norm, k_norm) = match self.norms(&p)? {
            Some((norm, wq, wk)) => {
                let (q, qc) = Self::head_norm(norm, wq, q, self.heads, d)?;
                let (k, kc) = Self::head_norm(norm, wk, k, self.kv_heads, d)?;
                (q, k, Some(qc), Some(kc))
            }
            None => (q, k, None, None),
        };
        let q = self.rope().forward(&q, self.heads, &pos)?;
        let k = self.rope().forward(&k, self.kv_heads, &pos)?;
        let (a, attn) = self.core().forward(&q, &k, &v, seq_len)?;
        let (y, o) = lin.forward(p.o, &a)?;
        Ok((
            y,
            SelfAttentionCache {
                x: x_cache,
                q_norm,
                k_norm,
                attn,
                o,
                positions: pos,
            },
        ))
    }

    /// Backward; `dx` adds the q, k and v input gradients in that order.
    pub fn backward<T: Real>(
        &self,
        p: SelfAttentionParams<'_, T>,
        cache: &SelfAttentionCache<T>,
        dy: &Tensor<T>,
    ) -> RefResult<SelfAttentionGrads<T>> {
        let (d, lin) = (self.head_dim, Linear);
        let go = lin.backward(p.o, &cache.o, dy)?;
        let ga = self.core().backward(&cache.attn, &go.dx)?;
        let mut dq = self.rope().backward(&ga.dq, self.heads, &cache.positions)?;
        let mut dk = self
            .rope()
            .backward(&ga.dk, self.kv_heads, &cache.positions)?;
        let (mut dq_norm, mut dk_norm) = (None, None);
        if let (Some((norm, wq, wk)), Some(qc), Some(kc)) =
            (self.norms(&p)?, &cache.q_norm, &cache.k_norm)
        {
            let tokens = dq.shape()[0];
            let gq = norm.backward(wq, qc, &dq.reshape(&[tokens * self.heads, d])?)?;
            let gk = norm.backward(wk, kc, &dk.reshape(&[tokens * self.kv_heads, d])?)?;
            dq = gq.dx.reshape(&[tokens, self.heads * d])?;
            dk = gk.dx.reshape(&[tokens, self.kv_heads * d])?;
            dq_norm = Some(gq.dweight);
            dk_norm = Some(gk.dweight);
        }
        let gq = lin.backward(p.q, &cache.x, &dq)?;
        let gk = lin.backward(p.k, &cache.x, &dk)?;
        let gv = lin.backward(p.v, &cache.x, &ga.dv)?;
        let dx = gq.dx.add(&gk.dx)?.add(&gv.dx)?;
        Ok(SelfAttentionGrads {
            dx,
            dq: gq.dweight,
            dk: gk.dweight,
            dv: gv.dweight,
            do_: go.dweight,
            dq_norm,
            dk_norm,
        })
    }
}
