//! Newton-Schulz in the exact operation order of `torch.optim.Muon` on an x86-64 CPU
//! (`_zeropower_via_newtonschulz` on bf16 tensors), for the `addmm_cpublas` and
//! `addmm_onednn` orders ([`NsOpOrder`]).
//!
//! Every GEMM multiplies bf16 values, so each product is exact in f32 (8 + 8 significand bits)
//! and only the order in which the f32 accumulator adds the products decides the bits; a
//! fused and an unfused multiply-add give the same result. torch picks the kernel per call
//! (read from ATen's `CPUBlas.cpp`, `cpu/BlasKernel.cpp`, `ReducedPrecisionFloatGemvFastPathKernel`
//! and `mkldnn/Matmul.cpp`, and measured against torch 2.15.0, `tools/torch_cpu_paths_golden.py`):
//!
//! | call in `_zeropower_via_newtonschulz` | native kernel (`cpublas`) | [`Reduction`] |
//! |---|---|---|
//! | `X @ X.T`, `X` contiguous | `gemm_transa_` → `bf16_dot_with_fp32_arith` | [`Reduction::Vec8`] |
//! | `X @ X.T`, `X` the transposed view of a tall input (first iteration) | `gemm_transb_` (f32 buffer) | [`Reduction::Ascending`] |
//! | `addmm(A, A, A)`, `addmm(X, B, X)` with `X` contiguous | `gemm_notrans_` → `sum` (4 partial sums) | [`Reduction::Ilp4`] |
//! | `addmm(X, B, X)`, `X` the transposed view (first iteration) | `gemm_transa_` | [`Reduction::Vec8`] |
//!
//! The AVX2 and AVX-512 builds of these kernels give the same bits (both reduce 8 f32 lanes;
//! measured); torch's `DEFAULT` build (x86 CPUs without AVX2) does not contract the epilogue
//! and reduces lanes in another order, and aarch64 has kernels of its own: neither is
//! reproduced. The epilogue `beta·C + alpha·dot` compiles to `fma(beta, C, alpha·dot)` with
//! `alpha·dot` rounded to f32 first; the sum is rounded to bf16 once.
//!
//! On a CPU with AVX-512BW/VL/DQ (or AVX-NE-CONVERT/AMX) torch sends a bf16 GEMM of more than
//! 4096 multiply-adds (`m·n·k`) to oneDNN instead ([`Reduction::OnednnPairs`]: the products in
//! pairs, the odd-index product first, as `vdpbf16ps` adds them; measured on AMD Zen 4 with
//! oneDNN 3.13's `avx512_core_bf16` and `avx512_core` kernels). oneDNN splits reductions longer
//! than 512 into blocks it picks at run time (measured: 512 for k = 768 and 1024, 1024 for
//! k = 2048, neither for 1536), so `addmm_onednn` is torch's order only while every GEMM's
//! reduction length (the matrix's shorter side and, for `X @ X.T`, its longer side) is at most
//! [`ONEDNN_VERIFIED_K`]; its AMX kernels (Sapphire Rapids and later) are not measured.
//!
//! The Frobenius norm is torch's vectorised bf16 `vector_norm` kernel ([`torch_sum_squares`]),
//! taken in the memory order of the input before the transpose of a tall matrix (torch
//! reduces the transposed view in storage order).

use rayon::prelude::*;

use super::error::MuonResult;
use super::presets::{NormMode, NsConfig, NsOpOrder};
use crate::bf16::quantize_bf16 as q;
use crate::tensor::Tensor;

/// Largest GEMM (`m·n·k` multiply-adds) torch keeps in its native kernels when oneDNN's bf16
/// path is available (`mkldnn_gemm`'s and `checksize`'s `16·16·16`).
pub const ONEDNN_MIN_MACS_EXCLUSIVE: usize = 16 * 16 * 16;

/// Longest reduction for which oneDNN's order was measured to be one block of pairs.
pub const ONEDNN_VERIFIED_K: usize = 512;

/// The order in which one torch CPU bf16 GEMM kernel adds the (exact) products of a dot
/// product into its f32 accumulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Index order, one accumulator (`gemm_transb_`'s f32 buffer).
    Ascending,
    /// `cpublas::sum`: four partial sums over `l mod 4` (the tail into the first), then
    /// `((s0 + s1) + s2) + s3` (`gemm_notrans_`, `gemm_transab_`).
    Ilp4,
    /// `bf16_dot_with_fp32_arith` with 8-lane f32 vectors (`gemm_transa_`): blocks of 64 over
    /// 8 registers, the registers added as a tree, the lanes as AVX2's `vec_reduce_all`, then
    /// 16-element blocks into one register, then the rest one by one.
    Vec8,
    /// oneDNN's bf16 brgemm: products in pairs `(l, l + 1)`, `l + 1` added first (a zero
    /// product pads an odd length).
    OnednnPairs,
}

/// One dot product of two equal-length slices of bf16 values (held in f32) in `order`.
pub fn dot(order: Reduction, x: &[f32], y: &[f32]) -> f32 {
    match order {
        Reduction::Ascending => x.iter().zip(y).fold(0.0, |acc, (a, b)| acc + a * b),
        Reduction::Ilp4 => dot_ilp4(x, y),
        Reduction::Vec8 => dot_vec8(x, y),
        Reduction::OnednnPairs => dot_pairs(x, y),
    }
}

fn dot_ilp4(x: &[f32], y: &[f32]) -> f32 {
    let k = x.len();
    let mut s = [0.0f32; 4];
    let mut l = 0;
    while l + 4 <= k {
        for (q, acc) in s.iter_mut().enumerate() {
            *acc += x[l + q] * y[l + q];
        }
        l += 4;
    }
    for i in l..k {
        s[0] += x[i] * y[i];
    }
    ((s[0] + s[1]) + s[2]) + s[3]
}

/// AVX2's `vec_reduce_all(plus)`: `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
fn lanes_sum8(l: &[f32; 8]) -> f32 {
    let v = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (v[0] + v[2]) + (v[1] + v[3])
}

fn dot_vec8(x: &[f32], y: &[f32]) -> f32 {
    let k = x.len();
    let p = |l: usize| x[l] * y[l];
    let mut regs = [[0.0f32; 8]; 8];
    let main = k & !63;
    for j in (0..main).step_by(64) {
        for (r, reg) in regs.iter_mut().enumerate() {
            for (t, lane) in reg.iter_mut().enumerate() {
                *lane += p(j + 8 * r + t);
            }
        }
    }
    for offset in [4, 2, 1] {
        for i in 0..offset {
            for t in 0..8 {
                regs[i][t] += regs[i + offset][t];
            }
        }
    }
    let mut sum = lanes_sum8(&regs[0]);
    let mut tail = [0.0f32; 8];
    let vec_end = k & !15;
    for j in (main..vec_end).step_by(16) {
        for (t, lane) in tail.iter_mut().enumerate() {
            *lane += p(j + t);
        }
        for (t, lane) in tail.iter_mut().enumerate() {
            *lane += p(j + 8 + t);
        }
    }
    sum += lanes_sum8(&tail);
    for l in vec_end..k {
        sum += p(l);
    }
    sum
}

fn dot_pairs(x: &[f32], y: &[f32]) -> f32 {
    let k = x.len();
    let mut acc = 0.0f32;
    for l in (0..k).step_by(2) {
        acc += if l + 1 < k { x[l + 1] * y[l + 1] } else { 0.0 };
        acc += x[l] * y[l];
    }
    acc
}

/// torch's bf16 `vector_norm(·, 2)` accumulation (`norm_two_reduce_step`): one 8-lane f32
/// register takes 16 elements per step (the first 8, then the next 8), its lanes are added in
/// lane order, then the remaining elements one by one. Squares of bf16 values are exact.
pub fn torch_sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let steps = x.len() / 16 * 16;
    for block in x[..steps].chunks_exact(16) {
        for half in block.chunks_exact(8) {
            for (lane, v) in acc.iter_mut().zip(half) {
                *lane += v * v;
            }
        }
    }
    let mut sum = acc[0];
    for lane in &acc[1..] {
        sum += lane;
    }
    for v in &x[steps..] {
        sum += v * v;
    }
    sum
}

/// `out[i][j] = dot(a_i, b_j)` for row-major `a` (`m x k`) and `b` (`n x k`), rows in parallel.
fn gemm_rows(order: Reduction, a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    if k == 0 {
        return out;
    }
    out.par_chunks_mut(n.max(1))
        .zip(a.par_chunks(k))
        .take(m)
        .for_each(|(row, ai)| {
            for (o, bj) in row.iter_mut().zip(b.chunks(k)) {
                *o = dot(order, ai, bj);
            }
        });
    out
}

fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut dst = vec![0.0f32; rows * cols];
    for i in 0..rows {
        for j in 0..cols {
            dst[j * rows + i] = src[i * cols + j];
        }
    }
    dst
}

/// The kernel torch runs for a GEMM of `macs` multiply-adds whose native kernel is `native`.
fn kernel(order: NsOpOrder, macs: usize, native: Reduction) -> Reduction {
    if order == NsOpOrder::AddmmOnednn && macs > ONEDNN_MIN_MACS_EXCLUSIVE {
        Reduction::OnednnPairs
    } else {
        native
    }
}

/// The normalization denominator: torch's norm of the bf16 input in storage order.
fn denominator(x: &[f32], ns: &NsConfig) -> f32 {
    let norm = q(torch_sum_squares(x).sqrt());
    match ns.norm {
        NormMode::AddEps => q(norm + ns.epsilon),
        NormMode::ClampEps => q(if norm >= ns.epsilon { norm } else { ns.epsilon }),
    }
}

/// Orthogonalizes one `[rows, cols]` matrix in torch's CPU order (`ns.order` is
/// `addmm_cpublas` or `addmm_onednn`; any other order is taken as `addmm_cpublas`).
pub fn newton_schulz_torch_cpu(g: &Tensor<f32>, ns: &NsConfig) -> MuonResult<Tensor<f32>> {
    let (rows, cols) = g.dims2("newton_schulz")?;
    if rows == 0 || cols == 0 {
        return Ok(g.clone());
    }
    let mut x: Vec<f32> = g.as_slice().iter().map(|&v| q(v)).collect();
    let denom = denominator(&x, ns);
    x.iter_mut().for_each(|v| *v = q(*v / denom));
    let tall = rows > cols;
    let (r, c) = if tall { (cols, rows) } else { (rows, cols) };
    if tall {
        x = transpose(&x, rows, cols);
    }
    for (it, &[a, b, cc]) in ns.coefficients.iter().enumerate() {
        let view = tall && it == 0;
        let macs = r * r * c;
        let gram_order = kernel(
            ns.order,
            macs,
            if view {
                Reduction::Ascending
            } else {
                Reduction::Vec8
            },
        );
        let gram: Vec<f32> = gemm_rows(gram_order, &x, &x, r, r, c)
            .into_iter()
            .map(q)
            .collect();
        let sq = gemm_rows(
            kernel(ns.order, r * r * r, Reduction::Ilp4),
            &gram,
            &transpose(&gram, r, r),
            r,
            r,
            r,
        );
        let poly: Vec<f32> = gram
            .iter()
            .zip(&sq)
            .map(|(&g, &s)| q(b.mul_add(g, cc * s)))
            .collect();
        let upd_order = kernel(
            ns.order,
            macs,
            if view {
                Reduction::Vec8
            } else {
                Reduction::Ilp4
            },
        );
        let bx = gemm_rows(upd_order, &poly, &transpose(&x, r, c), r, c, r);
        x.iter_mut()
            .zip(&bx)
            .for_each(|(v, &w)| *v = q(a.mul_add(*v, w)));
    }
    if tall {
        x = transpose(&x, r, c);
    }
    Ok(Tensor::from_vec(&[rows, cols], x)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values whose order of summation shows: two large terms that cancel and small ones.
    fn cancelling(k: usize, seed: u32) -> (Vec<f32>, Vec<f32>) {
        let x: Vec<f32> = (0..k)
            .map(|i| if (i as u32 ^ seed) % 3 == 0 { 2.0 } else { 1.0 })
            .collect();
        let mut y: Vec<f32> = (0..k)
            .map(|i| q(((i as f32 + seed as f32) * 0.618).sin() * 0.0156))
            .collect();
        y[1] = 4096.0;
        y[k - 2] = -4096.0;
        (x, y)
    }

    #[test]
    fn reductions_differ_where_order_matters_and_agree_on_exact_sums() {
        let (x, y) = cancelling(131, 7);
        let orders = [
            Reduction::Ascending,
            Reduction::Ilp4,
            Reduction::Vec8,
            Reduction::OnednnPairs,
        ];
        let sums: Vec<u32> = orders.iter().map(|&o| dot(o, &x, &y).to_bits()).collect();
        for i in 0..sums.len() {
            for j in i + 1..sums.len() {
                assert_ne!(sums[i], sums[j], "{:?} and {:?}", orders[i], orders[j]);
            }
        }
        // Small integers sum exactly in any order.
        let ones = vec![1.0f32; 77];
        for o in orders {
            assert_eq!(dot(o, &ones, &ones), 77.0, "{o:?}");
        }
        assert_eq!(torch_sum_squares(&ones), 77.0);
    }

    #[test]
    fn vec8_lane_layout_follows_the_register_blocks() {
        // One non-zero product at each position lands in the sum exactly once.
        for k in [1, 15, 16, 17, 63, 64, 65, 130, 200] {
            for pos in 0..k {
                let mut x = vec![0.0f32; k];
                x[pos] = 3.0;
                let y = vec![0.5f32; k];
                assert_eq!(dot_vec8(&x, &y), 1.5, "k {k} position {pos}");
            }
        }
    }
}
