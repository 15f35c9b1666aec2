//! Kernel costs of the Muon optimizer stages: Newton-Schulz (NS) orthogonalization, the
//! momentum update and the slice-and-apply update (notes `hyper-parallel.md` 6.1-6.2, 6.6),
//! as kernel mixes ([`crate::kernel`]): every GEMM of an NS call is its own
//! [`KernelWork::gemm`] entry with its shape and batch, every element-wise step a memory-bound
//! entry, so the simulator rates each by its class and shape.
//!
//! **Standard NS** (HyperParallel, Moonlight, torch.optim.Muon, FlexShard), per iteration on
//! `batch` matrices `m x n` iterated in the wide orientation (`m <= n`, transpose-first rule
//! of 6.1), bf16: `A = X Xᵀ` (GEMM `m x m`, `k = n`), `A² = A A` (GEMM `m x m`, `k = m`),
//! `B = bA + cA²` (three element-wise kernels over `m²`), `C = B X` (GEMM `m x n`, `k = m`),
//! `X = aX + C` (two element-wise kernels over `mn`): `4m²n + 2m³` FLOPs per matrix and
//! iteration; plus 4 set-up kernels per call (transpose view, norm, divide, cast) reading
//! and writing X once (`3mn`).
//!
//! **Gram-space NS** (DMuon's default, `muon.md` 7.4: Dao-AILab gram-newton-schulz with a
//! restart at iteration 2; FP32 normalization, FP16 iterations). Our derivation of its work:
//! with `R = X Xᵀ` and `W_k = a_k I + b_k R + c_k R²` (a polynomial in `R`, so it commutes
//! with it), the iteration keeps `Q ← W_k Q` and `R ← W_k² R` on `m x m` matrices and forms
//! `X = Q X₀` only at the restart (then `R = X Xᵀ`, `Q = I`) and at the end. Symmetric
//! products (`X Xᵀ`, `R²`, `W²`) run as SYRK: a GEMM-class kernel of half the FLOPs. Per
//! matrix: `6m²n + 24m³` FLOPs for 5 iterations, against `20m²n + 10m³` for the standard
//! form: fewer when `n` is well above `m`.
//!
//! **NS workspace** (transient, 6.6 "workspace allocated once per batched invocation"): per
//! matrix the bf16 input/output X, the product C (2mn) and A, A² (2m²).

use crate::kernel::{KernelClass, KernelWork};
use crate::model::DType;

/// Bytes of a bf16 element (NS inputs are cast to bf16, notes 6.1).
pub const NS_ELEM_BYTES: u64 = 2;
/// Bytes of an FP16 element (DMuon's Gram-space iterations).
pub const FP16_BYTES: u64 = 2;
/// Bytes of an FP32 element (DMuon's normalization).
pub const FP32_BYTES: u64 = 4;
/// Kernel launches per standard NS iteration (3 GEMMs, 5 element-wise).
pub const NS_KERNELS_PER_ITER: u32 = 8;
/// Set-up kernel launches per NS call.
pub const NS_SETUP_KERNELS: u32 = 4;
/// Gram-space NS: the iteration after which `X = Q X₀` is formed and `R` recomputed.
pub const GRAM_RESTART_AFTER: u64 = 2;
/// FLOPs per element of the momentum update (`u = g + μ1·m`, `m = μ2·m + g`, Nesterov
/// `u = μ1·u + g`, bf16 cast: three fused multiply-adds and a cast, notes 6.2).
pub const MOMENTUM_FLOPS_PER_ELEM: u64 = 7;
/// FLOPs per element of the apply (`p *= 1 - lr·wd`, `p += alpha·scale·u`).
pub const APPLY_FLOPS_PER_ELEM: u64 = 4;

/// Wide orientation of a core shape: `(min, max)`.
fn wide(rows: u64, cols: u64) -> (u64, u64) {
    (rows.min(cols), rows.max(cols))
}

/// Standard NS FLOPs of one `rows x cols` matrix over `steps` iterations.
pub fn ns_flops(rows: u64, cols: u64, steps: u64) -> u64 {
    let (m, n) = wide(rows, cols);
    steps * (4 * m * m * n + 2 * m * m * m)
}

/// Transient NS workspace bytes of `matrices` matrices of one core shape.
pub fn ns_workspace_bytes(matrices: u64, rows: u64, cols: u64) -> u64 {
    let (m, n) = wide(rows, cols);
    matrices * (2 * m * n + 2 * m * m) * NS_ELEM_BYTES
}

/// One element-wise kernel over `elems` elements per matrix of `batch`, reading `reads` and
/// writing `writes` operands of `elem_bytes` each (one FLOP per element).
fn elementwise(batch: u64, elems: u64, reads: u64, writes: u64, elem_bytes: u64) -> KernelWork {
    let e = batch.saturating_mul(elems);
    KernelWork::memory_bound(1, e, e.saturating_mul((reads + writes) * elem_bytes))
}

/// A SYRK launch: `batch` symmetric products `C[m, m] = A[m, k] · A[m, k]ᵀ`, half the FLOPs of
/// the GEMM of that shape (one triangle), reading A once and writing C.
pub fn syrk(m: u64, k: u64, batch: u64, elem_bytes: u64) -> KernelWork {
    let flops = m.saturating_mul(m).saturating_mul(k).saturating_mul(batch);
    let elems = (m.saturating_mul(k).saturating_add(m.saturating_mul(m))).saturating_mul(batch);
    KernelWork {
        class: KernelClass::Gemm { m, n: m, k, batch },
        count: 1,
        flops,
        hbm_bytes: elems.saturating_mul(elem_bytes),
    }
}

/// The kernels of one standard (bf16) NS call over `batch` matrices of core shape
/// `rows x cols`: set-up, then per iteration three GEMMs batched over the matrices and five
/// element-wise kernels.
pub fn ns_call_kernels(batch: u64, rows: u64, cols: u64, steps: u64) -> Vec<KernelWork> {
    let (m, n) = wide(rows, cols);
    let b = NS_ELEM_BYTES;
    let mut k = vec![KernelWork::memory_bound(
        NS_SETUP_KERNELS,
        batch * 3 * m * n,
        batch * 3 * m * n * b,
    )];
    for _ in 0..steps {
        k.push(KernelWork::gemm(m, m, n, batch, b)); // A = X Xᵀ
        k.push(KernelWork::gemm(m, m, m, batch, b)); // A² = A A
        k.push(elementwise(batch, m * m, 1, 1, b).repeated(2)); // bA, cA²
        k.push(elementwise(batch, m * m, 2, 1, b)); // B = bA + cA²
        k.push(KernelWork::gemm(m, n, m, batch, b)); // C = B X
        k.push(elementwise(batch, m * n, 1, 1, b)); // aX
        k.push(elementwise(batch, m * n, 2, 1, b)); // X = aX + C
    }
    k
}

/// The kernels of one Gram-space NS call (DMuon) over `batch` matrices of core shape
/// `rows x cols`: FP32 normalization (cast up, norm, divide, cast to FP16), `R = X Xᵀ`
/// (SYRK), per iteration `R²` (SYRK), `W = aI + bR + cR²` (element-wise), `Q ← W Q` (GEMM),
/// and, unless it is the last iteration, `W²` (SYRK) and `R ← W² R` (GEMM); a restart after
/// [`GRAM_RESTART_AFTER`] iterations (`X = Q X₀`, `R = X Xᵀ`, `Q = I`) and `X = Q X₀` at the end.
pub fn gram_ns_call_kernels(batch: u64, rows: u64, cols: u64, steps: u64) -> Vec<KernelWork> {
    let (m, n) = wide(rows, cols);
    let h = FP16_BYTES;
    let mn = m * n;
    let mut k = vec![
        elementwise(batch, mn, NS_ELEM_BYTES, FP32_BYTES, 1), // bf16 -> fp32
        elementwise(batch, mn, FP32_BYTES, 0, 1),             // Frobenius norm
        elementwise(batch, mn, FP32_BYTES, FP32_BYTES, 1),    // divide
        elementwise(batch, mn, FP32_BYTES, FP16_BYTES, 1),    // fp32 -> fp16
        syrk(m, n, batch, h),                                 // R = X Xᵀ
    ];
    for step in 1..=steps {
        k.push(syrk(m, m, batch, h)); // R²
        k.push(elementwise(batch, m * m, 2, 1, h).repeated(2)); // W = aI + bR + cR²
        k.push(KernelWork::gemm(m, m, m, batch, h)); // Q ← W Q
        if step == GRAM_RESTART_AFTER && step < steps {
            k.push(KernelWork::gemm(m, n, m, batch, h)); // X = Q X₀
            k.push(syrk(m, n, batch, h)); // R = X Xᵀ
            k.push(elementwise(batch, m * m, 0, 1, h)); // Q = I
        } else if step < steps {
            k.push(syrk(m, m, batch, h)); // W²
            k.push(KernelWork::gemm(m, m, m, batch, h)); // R ← W² R
        }
    }
    k.push(KernelWork::gemm(m, n, m, batch, h)); // X = Q X₀
    k
}

/// Momentum update over `elems` local elements in `tensors` tensors: reads the gradient and
/// the momentum, writes the momentum and the bf16 NS input (4 foreach launches, one more per
/// further 64 tensors); one memory-bound entry.
pub fn momentum_kernels(elems: u64, tensors: u32, grad: DType) -> Vec<KernelWork> {
    let g = grad.bytes();
    vec![KernelWork::memory_bound(
        4 + tensors.saturating_sub(1) / 64,
        MOMENTUM_FLOPS_PER_ELEM * elems,
        (3 * g + NS_ELEM_BYTES) * elems,
    )]
}

/// Slice-and-apply over `elems` local elements in `tensors` tensors: reads the parameter and
/// the bf16 update, writes the parameter (`foreach_mul` + `foreach_add`); one memory-bound
/// entry.
pub fn apply_kernels(elems: u64, tensors: u32, master: DType) -> Vec<KernelWork> {
    vec![KernelWork::memory_bound(
        2 + tensors.saturating_sub(1) / 64,
        APPLY_FLOPS_PER_ELEM * elems,
        (2 * master.bytes() + NS_ELEM_BYTES) * elems,
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::totals;

    #[test]
    fn ns_flops_by_hand() {
        // 2 x 4: m = 2, n = 4: per iteration 4·4·4 + 2·8 = 80; tall 4 x 2 transposes first.
        assert_eq!(ns_flops(2, 4, 1), 80);
        assert_eq!(ns_flops(4, 2, 5), 400);
        // q_proj 4096 x 2048, 5 steps: m = 2048, n = 4096.
        let m = 2048u64;
        assert_eq!(
            ns_flops(4096, 2048, 5),
            5 * (4 * m * m * 4096 + 2 * m * m * m)
        );
        assert_eq!(ns_workspace_bytes(1, 2, 4), (16 + 8) * 2);
    }

    #[test]
    fn standard_call_is_three_batched_gemms_per_iteration() {
        let k = ns_call_kernels(3, 4, 2, 5);
        let (flops, _, launches) = totals(&k);
        let gemm_flops: u64 = k
            .iter()
            .filter(|w| w.class.name() == "gemm")
            .map(|w| w.flops)
            .sum();
        assert_eq!(gemm_flops, 3 * ns_flops(4, 2, 5));
        assert!(flops > gemm_flops, "element-wise FLOPs come on top");
        assert_eq!(launches, NS_SETUP_KERNELS + 5 * NS_KERNELS_PER_ITER);
        // Shapes in the wide orientation (m = 2, n = 4), batched over the 3 matrices.
        assert!(k.contains(&KernelWork::gemm(2, 2, 4, 3, 2)));
        assert!(k.contains(&KernelWork::gemm(2, 4, 2, 3, 2)));
    }

    #[test]
    fn gram_call_flops_by_hand() {
        // 5 iterations, restart after 2: SYRK XXᵀ m²n; iterations: 5 x (R² m³ + Q 2m³),
        // W² + R update (3m³) in iterations 1, 3, 4; restart X = QX₀ 2m²n + SYRK m²n; final
        // 2m²n: 6m²n + 24m³.
        let (m, n) = (512u64, 2048u64);
        let k = gram_ns_call_kernels(1, n, m, 5);
        let gemm: u64 = k
            .iter()
            .filter(|w| w.class.name() == "gemm")
            .map(|w| w.flops)
            .sum();
        assert_eq!(gemm, 6 * m * m * n + 24 * m * m * m);
        assert!(
            gemm < ns_flops(m, n, 5),
            "fewer FLOPs than standard NS at n = 4m"
        );
        // FP16 operands.
        assert!(k.contains(&syrk(m, n, 1, FP16_BYTES)));
    }
}
