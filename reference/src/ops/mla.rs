//! Multi-head latent attention (DeepSeek-V2/V3) projections around causal attention.
//!
//! ```text
//! q:  x → q_a_proj → q_a_layernorm → q_b_proj → per head [q_nope (dn) | q_pe (dr)]
//!     (or x → q_proj when there is no q LoRA)
//! kv: x → kv_a_proj_with_mqa → [c_kv (r_kv) | k_pe (dr, one shared head)]
//!     c_kv → kv_a_layernorm → kv_b_proj → per head [k_nope (dn) | v (dv)]
//! rope on q_pe (every head) and k_pe (shared), "rotate half" convention;
//! Q_h = [q_nope_h | rope(q_pe_h)], K_h = [k_nope_h | rope(k_pe)], scale 1/sqrt(dn + dr);
//! y = attention(Q, K, V) · o_projᵀ
//! ```
//! The shared `k_pe` gradient sums the heads in ascending order.

use super::attention::{AttentionCache, CausalAttention};
use super::linear::{Linear, LinearCache};
use super::rmsnorm::{RmsNorm, RmsNormCache};
use super::rope::{Rope, positions};
use crate::error::{RefError, RefResult};
use crate::real::Real;
use crate::tensor::Tensor;

/// MLA hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mla {
    /// Attention heads.
    pub heads: usize,
    /// q LoRA rank (`None`: a plain `q_proj`).
    pub q_lora_rank: Option<usize>,
    /// Compressed KV width `r_kv`.
    pub kv_lora_rank: usize,
    /// Non-rotary q/k width per head `dn`.
    pub qk_nope_dim: usize,
    /// Rotary q/k width per head `dr`.
    pub qk_rope_dim: usize,
    /// Value width per head `dv`.
    pub v_head_dim: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// Epsilon of the two latent RMSNorms.
    pub eps: f64,
}

/// MLA weights; `q_a`/`q_a_norm`/`q_b` with a q LoRA rank, `q` without.
#[derive(Debug, Clone, Copy)]
pub struct MlaParams<'a, T: Real> {
    /// `q_a_proj.weight` `[r_q, H]`.
    pub q_a: Option<&'a Tensor<T>>,
    /// `q_a_layernorm.weight` `[r_q]`.
    pub q_a_norm: Option<&'a Tensor<T>>,
    /// `q_b_proj.weight` `[heads*(dn+dr), r_q]`.
    pub q_b: Option<&'a Tensor<T>>,
    /// `q_proj.weight` `[heads*(dn+dr), H]`.
    pub q: Option<&'a Tensor<T>>,
    /// `kv_a_proj_with_mqa.weight` `[r_kv + dr, H]`.
    pub kv_a: &'a Tensor<T>,
    /// `kv_a_layernorm.weight` `[r_kv]`.
    pub kv_a_norm: &'a Tensor<T>,
    /// `kv_b_proj.weight` `[heads*(dn+dv), r_kv]`.
    pub kv_b: &'a Tensor<T>,
    /// `o_proj.weight` `[H, heads*dv]`.
    pub o: &'a Tensor<T>,
}

#[derive(Debug, Clone)]
enum QPathCache<T: Real> {
    Lora {
        a: LinearCache<T>,
        norm: RmsNormCache<T>,
        b: LinearCache<T>,
    },
    Direct(LinearCache<T>),
}

/// What [`Mla::backward`] needs.
#[derive(Debug, Clone)]
pub struct MlaCache<T: Real> {
    q_path: QPathCache<T>,
    kv_a: LinearCache<T>,
    kv_norm: RmsNormCache<T>,
    kv_b: LinearCache<T>,
    attn: AttentionCache<T>,
    o: LinearCache<T>,
    positions: Vec<usize>,
}

/// Gradients of MLA (same optional structure as [`MlaParams`]).
#[derive(Debug, Clone)]
pub struct MlaGrads<T: Real> {
    /// `dL/dx`.
    pub dx: Tensor<T>,
    /// `d q_a_proj.weight`.
    pub dq_a: Option<Tensor<T>>,
    /// `d q_a_layernorm.weight`.
    pub dq_a_norm: Option<Tensor<T>>,
    /// `d q_b_proj.weight`.
    pub dq_b: Option<Tensor<T>>,
    /// `d q_proj.weight`.
    pub dq: Option<Tensor<T>>,
    /// `d kv_a_proj_with_mqa.weight`.
    pub dkv_a: Tensor<T>,
    /// `d kv_a_layernorm.weight`.
    pub dkv_a_norm: Tensor<T>,
    /// `d kv_b_proj.weight`.
    pub dkv_b: Tensor<T>,
    /// `d o_proj.weight`.
    pub do_: Tensor<T>,
}

/// Copy columns `[from, from + width)` of every row into a new `[rows, width]` tensor.
fn columns<T: Real>(x: &Tensor<T>, from: usize, width: usize) -> RefResult<Tensor<T>> {
    let rows = x.shape()[0];
    let mut out = Vec::with_capacity(rows * width);
    for r in 0..rows {
        out.extend_from_slice(&x.row(r)[from..from + width]);
    }
    Tensor::from_vec(&[rows, width], out)
}

/// Split each row's `heads` blocks of `a + b` into two tensors `[rows, heads*a]`, `[rows, heads*b]`.
fn split_heads<T: Real>(
    x: &Tensor<T>,
    heads: usize,
    a: usize,
    b: usize,
) -> RefResult<(Tensor<T>, Tensor<T>)> {
    let rows = x.shape()[0];
    let (mut left, mut right) = (Vec::new(), Vec::new());
    for r in 0..rows {
        for blk in x.row(r).chunks_exact(a + b) {
            left.extend_from_slice(&blk[..a]);
            right.extend_from_slice(&blk[a..]);
        }
    }
    Ok((
        Tensor::from_vec(&[rows, heads * a], left)?,
        Tensor::from_vec(&[rows, heads * b], right)?,
    ))
}

/// Inverse of [`split_heads`]: per head `[a_h | b_h]`.
fn join_heads<T: Real>(
    left: &Tensor<T>,
    right: &Tensor<T>,
    heads: usize,
    a: usize,
    b: usize,
) -> RefResult<Tensor<T>> {
    let rows = left.shape()[0];
    let mut out = Vec::with_capacity(rows * heads * (a + b));
    for r in 0..rows {
        for h in 0..heads {
            out.extend_from_slice(&left.row(r)[h * a..(h + 1) * a]);
            out.extend_from_slice(&right.row(r)[h * b..(h + 1) * b]);
        }
    }
    Tensor::from_vec(&[rows, heads * (a + b)], out)
}

impl Mla {
    fn norm(&self) -> RmsNorm {
        RmsNorm { eps: self.eps }
    }

    fn rope(&self) -> Rope {
        Rope {
            theta: self.rope_theta,
            dim: self.qk_rope_dim,
        }
    }

    fn core(&self) -> CausalAttention {
        CausalAttention::new(
            self.heads,
            self.heads,
            self.qk_nope_dim + self.qk_rope_dim,
            self.v_head_dim,
        )
    }

    fn missing(what: &str) -> RefError {
        RefError::invalid("mla", format!("missing weight {what}"))
    }

    /// Forward for `x` `[tokens, H]`, packed sequences of `seq_len`.
    pub fn forward<T: Real>(
        &self,
        p: MlaParams<'_, T>,
        x: &Tensor<T>,
        seq_len: usize,
    ) -> RefResult<(Tensor<T>, MlaCache<T>)> {
        let (tokens, _) = x.dims2("mla")?;
        let (h, dn, dr, dv, rkv) = (
            self.heads,
            self.qk_nope_dim,
            self.qk_rope_dim,
            self.v_head_dim,
            self.kv_lora_rank,
        );
        let pos = positions(tokens, seq_len);
        let lin = Linear;
        let (q, q_path) = match self.q_lora_rank {
            Some(_) => {
                let (wa, wn, wb) = (
                    p.q_a.ok_or_else(|| Self::missing("q_a_proj"))?,
                    p.q_a_norm.ok_or_else(|| Self::missing("q_a_layernorm"))?,
                    p.q_b.ok_or_else(|| Self::missing("q_b_proj"))?,
                );
                let (cq, a) = lin.forward(wa, x)?;
                let (cqn, norm) = self.norm().forward(wn, &cq)?;
                let (q, b) = lin.forward(wb, &cqn)?;
                (q, QPathCache::Lora { a, norm, b })
            }
            None => {
                let wq = p.q.ok_or_else(|| Self::missing("q_proj"))?;
                let (q, c) = lin.forward(wq, x)?;
                (q, QPathCache::Direct(c))
            }
        };
        q.expect_shape("mla q", &[tokens, h * (dn + dr)])?;
        let (q_nope, q_pe) = split_heads(&q, h, dn, dr)?;
        let q_pe = self.rope().forward(&q_pe, h, &pos)?;
        let query = join_heads(&q_nope, &q_pe, h, dn, dr)?;

        let (ckv_full, kv_a) = lin.forward(p.kv_a, x)?;
        ckv_full.expect_shape("mla kv_a", &[tokens, rkv + dr])?;
        let c_kv = columns(&ckv_full, 0, rkv)?;
        let k_pe = self
            .rope()
            .forward(&columns(&ckv_full, rkv, dr)?, 1, &pos)?;
        let (ckvn, kv_norm) = self.norm().forward(p.kv_a_norm, &c_kv)?;
        let (kv, kv_b) = lin.forward(p.kv_b, &ckvn)?;
        kv.expect_shape("mla kv_b", &[tokens, h * (dn + dv)])?;
        let (k_nope, v) = split_heads(&kv, h, dn, dv)?;
        let k_pe_all = Tensor::from_fn(&[tokens, h * dr], |i| {
            let (t, c) = (i / (h * dr), i % dr);
            k_pe.as_slice()[t * dr + c]
        });
        let key = join_heads(&k_nope, &k_pe_all, h, dn, dr)?;

        let (a, attn) = self.core().forward(&query, &key, &v, seq_len)?;
        let (y, o) = lin.forward(p.o, &a)?;
        Ok((
            y,
            MlaCache {
                q_path,
                kv_a,
                kv_norm,
                kv_b,
                attn,
                o,
                positions: pos,
            },
        ))
    }

    /// Backward; `dx` adds the q-path and kv-path input gradients in that order.
    pub fn backward<T: Real>(
        &self,
        p: MlaParams<'_, T>,
        cache: &MlaCache<T>,
        dy: &Tensor<T>,
    ) -> RefResult<MlaGrads<T>> {
        let (h, dn, dr, dv, rkv) = (
            self.heads,
            self.qk_nope_dim,
            self.qk_rope_dim,
            self.v_head_dim,
            self.kv_lora_rank,
        );
        let lin = Linear;
        let go = lin.backward(p.o, &cache.o, dy)?;
        let ga = self.core().backward(&cache.attn, &go.dx)?;
        let tokens = ga.dq.shape()[0];
        let pos = &cache.positions;

        // Query side.
        let (dq_nope, dq_pe_rot) = split_heads(&ga.dq, h, dn, dr)?;
        let dq_pe = self.rope().backward(&dq_pe_rot, h, pos)?;
        let dq_full = join_heads(&dq_nope, &dq_pe, h, dn, dr)?;

        // Key side: k_nope per head, shared k_pe summed over heads in ascending order.
        let (dk_nope, dk_pe_all) = split_heads(&ga.dk, h, dn, dr)?;
        let mut dk_pe_rot = Tensor::zeros(&[tokens, dr]);
        for t in 0..tokens {
            let src = dk_pe_all.row(t);
            let dst = dk_pe_rot.row_mut(t);
            for hh in 0..h {
                for (o, &g) in dst.iter_mut().zip(&src[hh * dr..(hh + 1) * dr]) {
                    *o += g;
                }
            }
        }
        let dk_pe = self.rope().backward(&dk_pe_rot, 1, pos)?;
        let dkv = join_heads(&dk_nope, &ga.dv, h, dn, dv)?;
        let gkvb = lin.backward(p.kv_b, &cache.kv_b, &dkv)?;
        let gnorm = self
            .norm()
            .backward(p.kv_a_norm, &cache.kv_norm, &gkvb.dx)?;
        let mut dckv_full = Tensor::zeros(&[tokens, rkv + dr]);
        for t in 0..tokens {
            let row = dckv_full.row_mut(t);
            row[..rkv].copy_from_slice(gnorm.dx.row(t));
            row[rkv..].copy_from_slice(dk_pe.row(t));
        }
        let gkva = lin.backward(p.kv_a, &cache.kv_a, &dckv_full)?;

        let mut grads = MlaGrads {
            dx: Tensor::zeros(&[0]),
            dq_a: None,
            dq_a_norm: None,
            dq_b: None,
            dq: None,
            dkv_a: gkva.dweight,
            dkv_a_norm: gnorm.dweight,
            dkv_b: gkvb.dweight,
            do_: go.dweight,
        };
        let dx_q = match &cache.q_path {
            QPathCache::Lora { a, norm, b } => {
                let (wa, wn, wb) = (
                    p.q_a.ok_or_else(|| Self::missing("q_a_proj"))?,
                    p.q_a_norm.ok_or_else(|| Self::missing("q_a_layernorm"))?,
                    p.q_b.ok_or_else(|| Self::missing("q_b_proj"))?,
                );
                let gb = lin.backward(wb, b, &dq_full)?;
                let gn = self.norm().backward(wn, norm, &gb.dx)?;
                let ga = lin.backward(wa, a, &gn.dx)?;
                grads.dq_b = Some(gb.dweight);
                grads.dq_a_norm = Some(gn.dweight);
                grads.dq_a = Some(ga.dweight);
                ga.dx
            }
            QPathCache::Direct(c) => {
                let wq = p.q.ok_or_else(|| Self::missing("q_proj"))?;
                let g = lin.backward(wq, c, &dq_full)?;
                grads.dq = Some(g.dweight);
                g.dx
            }
        };
        grads.dx = dx_q.add(&gkva.dx)?;
        Ok(grads)
    }
}
