//! Mixture of experts: softmax router, top-k, fused SwiGLU experts, weighted combine.
//!
//! - Router: `probs = softmax(x · Wrᵀ)` per token (`Wr` = `mlp.gate.weight` `[E, H]`).
//! - Top-k: the `k` largest probabilities; equal values go to the **lower expert index**.
//!   With `norm_topk_prob` the selected weights are divided by their sum (summed in ascending
//!   expert order).
//! - Experts: fused `gate_up_proj` `[E, 2I, H]` (rows `[0, I)` gate, `[I, 2I)` up) and
//!   `down_proj` `[E, H, I]`; expert `e` computes `down_e(silu(gate_e x) ⊙ up_e x)` on the
//!   tokens routed to it, in ascending token order.
//! - Combine: `y_t = Σ_e w_te · expert_e(x_t)` accumulated over experts in **ascending expert
//!   index**, each step one fused multiply-add.
//! - Expert traffic ([`ExpertWire`]): with expert parallelism in a bf16 compute dtype the
//!   routed rows travel to the experts and back in bf16, so the same rounding is applied here
//!   at the same four points (expert inputs, expert outputs, their gradients both ways) and a
//!   single device reproduces the expert-parallel bits.

use super::activation::{silu, silu_grad, softmax_backward_row, softmax_in_place};
use crate::bf16::quantize_bf16;
use crate::error::{RefError, RefResult};
use crate::matmul::{MatRef, gemm, matmul, matmul_nt, matmul_tn};
use crate::real::Real;
use crate::reduce::dot;
use crate::tensor::Tensor;

/// MoE layer hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moe {
    /// Number of experts `E`.
    pub experts: usize,
    /// Experts per token `k`.
    pub top_k: usize,
    /// Expert intermediate size `I`.
    pub intermediate: usize,
    /// Renormalise the selected probabilities to sum to one.
    pub norm_topk_prob: bool,
}

/// How routed rows travel between tokens and experts: the rounding expert-parallel
/// all-to-alls apply, reproduced on one device (see `crate::runtime::wire`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertWire {
    /// No rounding (one device, or f32 activations).
    #[default]
    Exact,
    /// Rows rounded to bf16 (nearest, ties to even) where they would enter an all-to-all:
    /// each expert's gathered inputs and its outputs in forward; the weighted output
    /// gradients sent to the experts and each expert's input gradient in backward. Defined
    /// on f32 values (an f64 run rounds through f32 first).
    Bf16,
}

impl ExpertWire {
    /// Round `xs` in place as the wire would.
    pub fn apply<T: Real>(self, xs: &mut [T]) {
        if self == ExpertWire::Bf16 {
            for x in xs {
                *x = T::from_f32(quantize_bf16(x.to_f32()));
            }
        }
    }
}

/// The MoE weights.
#[derive(Debug, Clone, Copy)]
pub struct MoeParams<'a, T: Real> {
    /// Router `mlp.gate.weight` `[E, H]`.
    pub router: &'a Tensor<T>,
    /// `mlp.experts.gate_up_proj` `[E, 2I, H]`.
    pub gate_up: &'a Tensor<T>,
    /// `mlp.experts.down_proj` `[E, H, I]`.
    pub down: &'a Tensor<T>,
}

/// One expert's forward state.
#[derive(Debug, Clone)]
struct ExpertCache<T: Real> {
    /// Routed tokens (ascending) and their combine weights.
    tokens: Vec<usize>,
    weights: Vec<T>,
    /// Gathered inputs `[n, H]`, pre-activations `[n, 2I]`, activations `[n, I]`, outputs `[n, H]`.
    x: Vec<T>,
    gate_up: Vec<T>,
    act: Vec<T>,
    out: Vec<T>,
}

/// What [`Moe::backward`] needs.
#[derive(Debug, Clone)]
pub struct MoeCache<T: Real> {
    x: Tensor<T>,
    probs: Tensor<T>,
    /// Per token: selected experts in ascending index order.
    selected: Vec<Vec<usize>>,
    experts: Vec<ExpertCache<T>>,
    wire: ExpertWire,
}

impl<T: Real> MoeCache<T> {
    /// The experts chosen for each token, ascending.
    pub fn routing(&self) -> &[Vec<usize>] {
        &self.selected
    }
}

/// Gradients of the MoE layer.
#[derive(Debug, Clone)]
pub struct MoeGrads<T: Real> {
    /// `dL/dx` `[tokens, H]`.
    pub dx: Tensor<T>,
    /// `[E, H]`.
    pub drouter: Tensor<T>,
    /// `[E, 2I, H]`.
    pub dgate_up: Tensor<T>,
    /// `[E, H, I]`.
    pub ddown: Tensor<T>,
}

/// Indices of the `k` largest values, ties to the lower index, returned in ascending index order.
pub fn top_k_lowest_index_ties<T: Real>(values: &[T], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    // Stable sort by descending value keeps equal values in ascending index order.
    order.sort_by(|&a, &b| {
        values[b]
            .partial_cmp(&values[a])
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    order.truncate(k);
    order.sort_unstable();
    order
}

impl Moe {
    fn check<T: Real>(&self, p: &MoeParams<'_, T>, x: &Tensor<T>) -> RefResult<(usize, usize)> {
        let (tokens, hidden) = x.dims2("moe")?;
        let (e, i) = (self.experts, self.intermediate);
        if e == 0 || self.top_k == 0 || self.top_k > e {
            return Err(RefError::invalid(
                "moe",
                format!("top_k {} of {e} experts", self.top_k),
            ));
        }
        p.router.expect_shape("moe router", &[e, hidden])?;
        p.gate_up
            .expect_shape("moe gate_up_proj", &[e, 2 * i, hidden])?;
        p.down.expect_shape("moe down_proj", &[e, hidden, i])?;
        Ok((tokens, hidden))
    }

    /// Forward for `x` `[tokens, H]`.
    pub fn forward<T: Real>(
        &self,
        p: MoeParams<'_, T>,
        x: &Tensor<T>,
    ) -> RefResult<(Tensor<T>, MoeCache<T>)> {
        self.forward_wire(p, x, ExpertWire::Exact)
    }

    /// Forward for `x` `[tokens, H]` with the expert traffic rounded as `wire` says (the
    /// backward of the returned cache rounds the same way).
    pub fn forward_wire<T: Real>(
        &self,
        p: MoeParams<'_, T>,
        x: &Tensor<T>,
        wire: ExpertWire,
    ) -> RefResult<(Tensor<T>, MoeCache<T>)> {
        let (tokens, hidden) = self.check(&p, x)?;
        let inter = self.intermediate;
        let mut probs = matmul_nt(x, p.router)?;
        for t in 0..tokens {
            softmax_in_place(probs.row_mut(t));
        }
        let selected: Vec<Vec<usize>> = (0..tokens)
            .map(|t| top_k_lowest_index_ties(probs.row(t), self.top_k))
            .collect();
        let weights: Vec<Vec<T>> = selected
            .iter()
            .enumerate()
            .map(|(t, sel)| {
                let pr = probs.row(t);
                let mut w: Vec<T> = sel.iter().map(|&e| pr[e]).collect();
                if self.norm_topk_prob {
                    let mut s = T::ZERO;
                    for &v in &w {
                        s += v;
                    }
                    for v in &mut w {
                        *v /= s;
                    }
                }
                w
            })
            .collect();

        let mut y = Tensor::zeros(&[tokens, hidden]);
        let mut experts = Vec::with_capacity(self.experts);
        for e in 0..self.experts {
            let mut ex = ExpertCache {
                tokens: Vec::new(),
                weights: Vec::new(),
                x: Vec::new(),
                gate_up: Vec::new(),
                act: Vec::new(),
                out: Vec::new(),
            };
            for (t, sel) in selected.iter().enumerate() {
                if let Some(slot) = sel.iter().position(|&s| s == e) {
                    ex.tokens.push(t);
                    ex.weights.push(weights[t][slot]);
                    ex.x.extend_from_slice(x.row(t));
                }
            }
            let n = ex.tokens.len();
            wire.apply(&mut ex.x);
            if n > 0 {
                let gu_w = expert_matrix(p.gate_up, e)?;
                let down_w = expert_matrix(p.down, e)?;
                let xm = MatRef::row_major(&ex.x, n, hidden)?;
                ex.gate_up = vec![T::ZERO; n * 2 * inter];
                gemm(xm, gu_w.t(), &mut ex.gate_up)?;
                ex.act = ex
                    .gate_up
                    .chunks_exact(2 * inter)
                    .flat_map(|r| (0..inter).map(move |j| silu(r[j]) * r[inter + j]))
                    .collect();
                ex.out = vec![T::ZERO; n * hidden];
                gemm(
                    MatRef::row_major(&ex.act, n, inter)?,
                    down_w.t(),
                    &mut ex.out,
                )?;
                wire.apply(&mut ex.out);
                for (row, (&t, &w)) in ex.tokens.iter().zip(&ex.weights).enumerate() {
                    let src = &ex.out[row * hidden..(row + 1) * hidden];
                    for (o, &h) in y.row_mut(t).iter_mut().zip(src) {
                        *o = w.mul_add(h, *o);
                    }
                }
            }
            experts.push(ex);
        }
        Ok((
            y,
            MoeCache {
                x: x.clone(),
                probs,
                selected,
                experts,
                wire,
            },
        ))
    }

    /// Backward through experts, combine weights, top-k renormalisation and the router softmax.
    /// `dx` = expert contributions (ascending expert order) + router contribution.
    pub fn backward<T: Real>(
        &self,
        p: MoeParams<'_, T>,
        cache: &MoeCache<T>,
        dy: &Tensor<T>,
    ) -> RefResult<MoeGrads<T>> {
        let (tokens, hidden) = self.check(&p, &cache.x)?;
        dy.expect_shape("moe backward", &[tokens, hidden])?;
        if cache.experts.len() != self.experts || cache.selected.len() != tokens {
            return Err(RefError::invalid(
                "moe backward",
                "cache was produced by a MoE layer with another expert count",
            ));
        }
        let (e_count, inter) = (self.experts, self.intermediate);
        let mut dx = Tensor::zeros(&[tokens, hidden]);
        let mut dgate_up = Tensor::zeros(&[e_count, 2 * inter, hidden]);
        let mut ddown = Tensor::zeros(&[e_count, hidden, inter]);
        // dL/dw for each (token, expert) combine weight, dense [tokens, E].
        let mut dw = Tensor::zeros(&[tokens, e_count]);

        for (e, ex) in cache.experts.iter().enumerate() {
            let n = ex.tokens.len();
            if n == 0 {
                continue;
            }
            let gu_w = expert_matrix(p.gate_up, e)?;
            let down_w = expert_matrix(p.down, e)?;
            // dH rows = w · dy[t]; dw = dy[t] · out_row.
            let mut dh = vec![T::ZERO; n * hidden];
            for (row, (&t, &w)) in ex.tokens.iter().zip(&ex.weights).enumerate() {
                let dyt = dy.row(t);
                for (d, &g) in dh[row * hidden..(row + 1) * hidden].iter_mut().zip(dyt) {
                    *d = w * g;
                }
                dw.row_mut(t)[e] = dot(dyt, &ex.out[row * hidden..(row + 1) * hidden]);
            }
            cache.wire.apply(&mut dh);
            let dhm = MatRef::row_major(&dh, n, hidden)?;
            let actm = MatRef::row_major(&ex.act, n, inter)?;
            // ddown_e = dHᵀ · act  [H, I]
            let dd = &mut ddown.as_mut_slice()[e * hidden * inter..(e + 1) * hidden * inter];
            gemm(dhm.t(), actm, dd)?;
            // dact = dH · down_e  [n, I]
            let mut dact = vec![T::ZERO; n * inter];
            gemm(dhm, down_w, &mut dact)?;
            let mut dgu = vec![T::ZERO; n * 2 * inter];
            for ((dr, gr), dar) in dgu
                .chunks_exact_mut(2 * inter)
                .zip(ex.gate_up.chunks_exact(2 * inter))
                .zip(dact.chunks_exact(inter))
            {
                for j in 0..inter {
                    let (g, u, d) = (gr[j], gr[inter + j], dar[j]);
                    dr[j] = d * u * silu_grad(g);
                    dr[inter + j] = d * silu(g);
                }
            }
            let dgum = MatRef::row_major(&dgu, n, 2 * inter)?;
            // dgate_up_e = dguᵀ · x_e  [2I, H]
            let dg =
                &mut dgate_up.as_mut_slice()[e * 2 * inter * hidden..(e + 1) * 2 * inter * hidden];
            gemm(dgum.t(), MatRef::row_major(&ex.x, n, hidden)?, dg)?;
            // dx_e = dgu · gate_up_e  [n, H], added to dx in ascending expert order.
            let mut dxe = vec![T::ZERO; n * hidden];
            gemm(dgum, gu_w, &mut dxe)?;
            cache.wire.apply(&mut dxe);
            for (row, &t) in ex.tokens.iter().enumerate() {
                for (o, &v) in dx
                    .row_mut(t)
                    .iter_mut()
                    .zip(&dxe[row * hidden..(row + 1) * hidden])
                {
                    *o += v;
                }
            }
        }

        // Through the top-k (renormalisation) into dL/dprobs, then the softmax.
        let mut dlogits = Tensor::zeros(&[tokens, e_count]);
        let mut dp = vec![T::ZERO; e_count];
        for t in 0..tokens {
            let (pr, sel, dwr) = (cache.probs.row(t), &cache.selected[t], dw.row(t));
            dp.fill(T::ZERO);
            if self.norm_topk_prob {
                let mut s = T::ZERO;
                for &e in sel {
                    s += pr[e];
                }
                // w_e = p_e / s  ⇒  dp_e = (dw_e − Σ_j dw_j w_j) / s for selected e.
                let mut c = T::ZERO;
                for &e in sel {
                    c = dwr[e].mul_add(pr[e] / s, c);
                }
                for &e in sel {
                    dp[e] = (dwr[e] - c) / s;
                }
            } else {
                for &e in sel {
                    dp[e] = dwr[e];
                }
            }
            softmax_backward_row(pr, &dp, dlogits.row_mut(t));
        }
        let drouter = matmul_tn(&dlogits, &cache.x)?;
        let dx = dx.add(&matmul(&dlogits, p.router)?)?;
        Ok(MoeGrads {
            dx,
            drouter,
            dgate_up,
            ddown,
        })
    }
}

/// Expert `e`'s `[rows, cols]` matrix inside an `[E, rows, cols]` tensor.
fn expert_matrix<T: Real>(t: &Tensor<T>, e: usize) -> RefResult<MatRef<'_, T>> {
    let (rows, cols) = (t.shape()[1], t.shape()[2]);
    MatRef::row_major(&t.as_slice()[e * rows * cols..], rows, cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_ties_go_to_the_lower_index() {
        assert_eq!(
            top_k_lowest_index_ties(&[0.1f32, 0.3, 0.3, 0.3], 2),
            vec![1, 2]
        );
        assert_eq!(top_k_lowest_index_ties(&[0.5f32, 0.2, 0.5], 1), vec![0]);
        assert_eq!(
            top_k_lowest_index_ties(&[0.1f64, 0.2, 0.7, 0.0], 3),
            vec![0, 1, 2]
        );
    }
}
