//! Newton-Schulz orthogonalization in emulated bf16: every operation computes in f32 (matrix
//! products with the crate's fixed-order FMA kernel) and rounds its result to bf16
//! round-to-nearest-even, as eager PyTorch does with bf16 tensors.
//!
//! One iteration with coefficients `(a, b, c)` on a wide `X` (`rows <= cols`):
//!
//! ```text
//! A = bf16(X·Xᵀ)
//! GramSquaredFirst:  B = bf16(bf16(b·A) + bf16(c·bf16(A·A)))      (HyperParallel)
//! ScaleThenMultiply: B = bf16(bf16(b·A) + bf16(bf16(c·A)·A))      (eager `b*A + c*A@A`)
//!                    X = bf16(bf16(a·X) + bf16(B·X))
//! Addmm:             B = bf16(fma(c, A·A, b·A))                     (`torch.addmm(A, A, A, beta=b, alpha=c)`)
//!                    X = bf16(fma(a, X, B·X))                       (`torch.addmm(X, B, X, beta=a)`)
//! ```
//!
//! In the `Addmm` order the products `A·A` and `B·X` stay in f32 (the GEMM's accumulator) and
//! the whole `addmm` is rounded to bf16 once, as torch's CPU and CUDA bf16 GEMMs do with
//! `beta`/`alpha` epilogues; it is also closer to exact Newton-Schulz than the eager form
//! (measured in `reference/tests/torch_golden.rs`).
//!
//! Before the loop the input is rounded to bf16, transposed when `rows > cols` (and back at
//! the end), and divided by `bf16(‖X‖_F + ε)` (or `bf16(max(‖X‖_F, ε))`) where the norm
//! accumulates `x²` in ascending order with fused multiply-adds and is rounded to bf16.
//!
//! The `AddmmCpublas` and `AddmmOnednn` orders are the `Addmm` operations with torch's own
//! CPU reduction orders and norm ([`super::torch_cpu`]).
//!
//! [`newton_schulz`] works on one matrix; [`newton_schulz_batched`] runs a stack of matrices
//! of one core shape through every stage together (matrices in parallel) with per-matrix
//! norms, and gives the same bits as the per-matrix form.

use rayon::prelude::*;

use super::error::{MuonError, MuonResult};
use super::presets::{NormMode, NsConfig, NsOpOrder};
use super::torch_cpu::newton_schulz_torch_cpu;
use crate::bf16::quantize_bf16 as q;
use crate::matmul::{MatRef, gemm, matmul, matmul_nt};
use crate::reduce::sum_squares;
use crate::tensor::Tensor;

/// The normalization denominator of a matrix (bf16 value held in f32).
fn denominator(x: &[f32], ns: &NsConfig) -> f32 {
    let norm = q(sum_squares(x).sqrt());
    match ns.norm {
        NormMode::AddEps => q(norm + ns.epsilon),
        NormMode::ClampEps => q(if norm >= ns.epsilon { norm } else { ns.epsilon }),
    }
}

fn transpose_into(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    for i in 0..rows {
        for j in 0..cols {
            dst[j * rows + i] = src[i * cols + j];
        }
    }
}

fn transposed(t: &Tensor<f32>, rows: usize, cols: usize) -> MuonResult<Tensor<f32>> {
    let mut out = vec![0.0f32; rows * cols];
    transpose_into(t.as_slice(), rows, cols, &mut out);
    Ok(Tensor::from_vec(&[cols, rows], out)?)
}

fn zip_map(a: &Tensor<f32>, b: &Tensor<f32>, f: impl Fn(f32, f32) -> f32) -> Tensor<f32> {
    let data = a
        .as_slice()
        .iter()
        .zip(b.as_slice())
        .map(|(&x, &y)| f(x, y))
        .collect();
    Tensor::from_vec(a.shape(), data).unwrap_or_else(|_| unreachable!("same shape"))
}

/// Whether `order` runs torch's own CPU kernels ([`super::torch_cpu`]).
fn is_torch_cpu(order: NsOpOrder) -> bool {
    matches!(order, NsOpOrder::AddmmCpublas | NsOpOrder::AddmmOnednn)
}

/// Orthogonalizes one `[rows, cols]` matrix (the result holds bf16 values in f32).
pub fn newton_schulz(g: &Tensor<f32>, ns: &NsConfig) -> MuonResult<Tensor<f32>> {
    if is_torch_cpu(ns.order) {
        return newton_schulz_torch_cpu(g, ns);
    }
    let (rows, cols) = g.dims2("newton_schulz")?;
    if rows == 0 || cols == 0 {
        return Ok(g.clone());
    }
    let tall = rows > cols;
    let mut x = if tall {
        transposed(g, rows, cols)?
    } else {
        g.clone()
    };
    x = x.map(q);
    let denom = denominator(x.as_slice(), ns);
    x = x.map(|v| q(v / denom));
    for &[a, b, c] in &ns.coefficients {
        let gram = matmul_nt(&x, &x)?.map(q);
        let poly = match ns.order {
            NsOpOrder::GramSquaredFirst => {
                let sq = matmul(&gram, &gram)?.map(q);
                zip_map(&gram, &sq, |g, s| q(q(b * g) + q(c * s)))
            }
            NsOpOrder::ScaleThenMultiply => {
                let cg = gram.map(|g| q(c * g));
                let cgg = matmul(&cg, &gram)?.map(q);
                zip_map(&gram, &cgg, |g, s| q(q(b * g) + s))
            }
            // The torch CPU orders returned above; they share `Addmm`'s operations.
            NsOpOrder::Addmm | NsOpOrder::AddmmCpublas | NsOpOrder::AddmmOnednn => {
                let sq = matmul(&gram, &gram)?;
                zip_map(&gram, &sq, |g, s| addmm_epilogue(c, s, b, g))
            }
        };
        x = match ns.order {
            NsOpOrder::Addmm => {
                let bx = matmul(&poly, &x)?;
                zip_map(&x, &bx, |v, w| addmm_epilogue(1.0, w, a, v))
            }
            _ => {
                let bx = matmul(&poly, &x)?.map(q);
                zip_map(&x, &bx, |v, w| q(q(a * v) + w))
            }
        };
    }
    if tall {
        let (r, c) = x.dims2("newton_schulz")?;
        x = transposed(&x, r, c)?;
    }
    Ok(x)
}

/// `bf16(alpha·product + beta·input)` with one bf16 rounding: the epilogue of
/// `torch.addmm(input, m1, m2, beta, alpha)` on the f32 accumulator `product`.
#[inline]
fn addmm_epilogue(alpha: f32, product: f32, beta: f32, input: f32) -> f32 {
    q(alpha.mul_add(product, beta * input))
}

/// `out_k = lhs_k · rhs_kᵀ` (or `· rhs_k` when `nt` is false) for every matrix `k`, rounded to
/// bf16 when `round` (left in f32 for an `addmm` epilogue otherwise); `lhs` is `[count, m, k]`, `rhs` `[count, n, k]` (or `[count, k, n]`).
#[allow(clippy::too_many_arguments)]
fn batched_product(
    lhs: &[f32],
    rhs: &[f32],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    nt: bool,
    round: bool,
) -> MuonResult<()> {
    let (ls, rs, os) = (m * k, k * n, m * n);
    out.par_chunks_mut(os)
        .enumerate()
        .try_for_each(|(i, o)| -> MuonResult<()> {
            let a = MatRef::row_major(&lhs[i * ls..(i + 1) * ls], m, k)?;
            let b = if nt {
                MatRef::row_major(&rhs[i * rs..(i + 1) * rs], n, k)?.t()
            } else {
                MatRef::row_major(&rhs[i * rs..(i + 1) * rs], k, n)?
            };
            gemm(a, b, o)?;
            if round {
                for v in o.iter_mut() {
                    *v = q(*v);
                }
            }
            Ok(())
        })
}

/// Orthogonalizes `count` independent `[rows, cols]` matrices stored back to back in `data`
/// (a `[count, rows, cols]` stack); bitwise equal to [`newton_schulz`] on each matrix.
pub fn newton_schulz_batched(
    data: &[f32],
    count: usize,
    rows: usize,
    cols: usize,
    ns: &NsConfig,
) -> MuonResult<Vec<f32>> {
    let size = rows * cols;
    if data.len() != count * size {
        return Err(MuonError::Tensor(crate::error::RefError::shape(
            "newton_schulz_batched",
            format!(
                "{} elements for {count} matrices of {rows}x{cols}",
                data.len()
            ),
        )));
    }
    if size == 0 || count == 0 {
        return Ok(data.to_vec());
    }
    if is_torch_cpu(ns.order) {
        return torch_cpu_per_matrix(data, rows, cols, ns);
    }
    let tall = rows > cols;
    let (r, c) = if tall { (cols, rows) } else { (rows, cols) };
    let mut x = vec![0.0f32; count * size];
    if tall {
        x.par_chunks_mut(size)
            .zip(data.par_chunks(size))
            .for_each(|(dst, src)| transpose_into(src, rows, cols, dst));
    } else {
        x.copy_from_slice(data);
    }
    x.par_iter_mut().for_each(|v| *v = q(*v));
    x.par_chunks_mut(size).for_each(|m| {
        let denom = denominator(m, ns);
        for v in m.iter_mut() {
            *v = q(*v / denom);
        }
    });
    let mut gram = vec![0.0f32; count * r * r];
    let mut tmp = vec![0.0f32; count * r * r];
    let mut bx = vec![0.0f32; count * size];
    let addmm = ns.order == NsOpOrder::Addmm;
    for &[a, b, cc] in &ns.coefficients {
        batched_product(&x, &x, &mut gram, r, c, r, true, true)?;
        match ns.order {
            NsOpOrder::GramSquaredFirst => {
                batched_product(&gram, &gram, &mut tmp, r, r, r, false, true)?;
                tmp.par_iter_mut()
                    .zip(gram.par_iter())
                    .for_each(|(s, &g)| *s = q(q(b * g) + q(cc * *s)));
            }
            NsOpOrder::ScaleThenMultiply => {
                let cg: Vec<f32> = gram.par_iter().map(|&g| q(cc * g)).collect();
                batched_product(&cg, &gram, &mut tmp, r, r, r, false, true)?;
                tmp.par_iter_mut()
                    .zip(gram.par_iter())
                    .for_each(|(s, &g)| *s = q(q(b * g) + *s));
            }
            NsOpOrder::Addmm | NsOpOrder::AddmmCpublas | NsOpOrder::AddmmOnednn => {
                batched_product(&gram, &gram, &mut tmp, r, r, r, false, false)?;
                tmp.par_iter_mut()
                    .zip(gram.par_iter())
                    .for_each(|(s, &g)| *s = addmm_epilogue(cc, *s, b, g));
            }
        }
        batched_product(&tmp, &x, &mut bx, r, r, c, false, !addmm)?;
        if addmm {
            x.par_iter_mut()
                .zip(bx.par_iter())
                .for_each(|(v, &w)| *v = addmm_epilogue(1.0, w, a, *v));
        } else {
            x.par_iter_mut()
                .zip(bx.par_iter())
                .for_each(|(v, &w)| *v = q(q(a * *v) + w));
        }
    }
    if tall {
        let mut out = vec![0.0f32; count * size];
        out.par_chunks_mut(size)
            .zip(x.par_chunks(size))
            .for_each(|(dst, src)| transpose_into(src, r, c, dst));
        Ok(out)
    } else {
        Ok(x)
    }
}

/// torch's CPU orders on a stack: each matrix on its own (its kernels are per matrix), the
/// matrices in parallel.
fn torch_cpu_per_matrix(
    data: &[f32],
    rows: usize,
    cols: usize,
    ns: &NsConfig,
) -> MuonResult<Vec<f32>> {
    let size = rows * cols;
    let outs = data
        .par_chunks(size)
        .map(|m| {
            let t = Tensor::from_vec(&[rows, cols], m.to_vec())?;
            Ok(newton_schulz_torch_cpu(&t, ns)?.as_slice().to_vec())
        })
        .collect::<MuonResult<Vec<Vec<f32>>>>()?;
    Ok(outs.concat())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::muon::presets::{MuonConfig, MuonPreset};

    #[test]
    fn zero_matrix_stays_zero_and_tall_is_transposed_back() {
        let ns = MuonConfig::preset(MuonPreset::HyperParallel).ns;
        let z = Tensor::<f32>::zeros(&[3, 5]);
        assert_eq!(newton_schulz(&z, &ns).unwrap(), z);
        let g = Tensor::<f32>::from_fn(&[5, 3], |i| (i as f32 * 0.37).sin());
        let o = newton_schulz(&g, &ns).unwrap();
        assert_eq!(o.shape(), &[5, 3]);
        let b = newton_schulz_batched(g.as_slice(), 1, 5, 3, &ns).unwrap();
        assert_eq!(b, o.as_slice());
    }

    /// Every order: the batched form equals the per-matrix form bit for bit, and the orders
    /// really differ on a matrix big enough for rounding to matter.
    #[test]
    fn batched_equals_single_for_every_order_and_orders_differ() {
        let mut ns = MuonConfig::preset(MuonPreset::Torch).ns;
        let (count, rows, cols) = (3, 6, 11);
        let data: Vec<f32> = (0..count * rows * cols)
            .map(|i| ((i as f32) * 0.731).sin() + 0.1 * ((i % 7) as f32))
            .collect();
        let mut outs = Vec::new();
        for order in NsOpOrder::ALL {
            ns.order = order;
            let batched = newton_schulz_batched(&data, count, rows, cols, &ns).unwrap();
            for k in 0..count {
                let m = &data[k * rows * cols..(k + 1) * rows * cols];
                let t = Tensor::from_vec(&[rows, cols], m.to_vec()).unwrap();
                let single = newton_schulz(&t, &ns).unwrap();
                assert_eq!(
                    single.as_slice(),
                    &batched[k * rows * cols..(k + 1) * rows * cols],
                    "{order:?} matrix {k}"
                );
            }
            outs.push(batched);
        }
        assert_ne!(outs[0], outs[1]);
        assert_ne!(outs[1], outs[2]);
        assert_ne!(outs[0], outs[2]);
    }
}
