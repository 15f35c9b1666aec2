//! Kernel costs of the Muon optimizer stages: Newton-Schulz (NS) orthogonalization, the
//! momentum update and the slice-and-apply update (notes `hyper-parallel.md` 6.1-6.2, 6.6).
//!
//! **NS FLOPs.** Per iteration on an `m x n` matrix iterated in its wide orientation
//! (`m <= n`, transpose-first rule of 6.1): `A = X Xᵀ` (2m²n), `B = bA + cA²` (the `A @ A`
//! product, 2m³; the scalings and the add are element-wise and counted in HBM traffic only),
//! `X = aX + B X` (2m²n): `4m²n + 2m³` per iteration, times the iteration count.
//!
//! **NS HBM traffic** (bf16, each op separately rounded as in 6.3's in-place form): per
//! iteration `X Xᵀ` reads X twice and writes A (2mn + m²), `A @ A` reads A twice and writes A²
//! (3m²), the scalings and the add read and write A and A² (6m²), `B @ X` reads B and X and
//! writes C (m² + 2mn), `aX + C` reads X and C and writes X (3mn): `7mn + 10m²` elements;
//! plus the Frobenius normalization once (read X twice, write it: 3mn).
//!
//! **NS kernels**: 8 per iteration (3 GEMMs, 2 scalings, 1 add, 1 scaling and 1 add of the
//! update) plus 4 set-up kernels (transpose, norm, divide, cast), for one batched call over a
//! core-shape group (6.6) or one per matrix when the implementation is not batched.
//!
//! **NS workspace** (transient, 6.6 "workspace allocated once per batched invocation"): per
//! matrix the bf16 input/output X, the product C (2mn) and A, A² (2m²).

use crate::model::DType;
use crate::program::ComputeWork;

/// Bytes of a bf16 element (NS inputs are cast to bf16, notes 6.1).
pub const NS_ELEM_BYTES: u64 = 2;
/// Kernel launches per NS iteration.
pub const NS_KERNELS_PER_ITER: u32 = 8;
/// Set-up kernel launches per NS call.
pub const NS_SETUP_KERNELS: u32 = 4;
/// FLOPs per element of the momentum update (`u = g + μ1·m`, `m = μ2·m + g`, Nesterov
/// `u = μ1·u + g`, bf16 cast: three fused multiply-adds and a cast, notes 6.2).
pub const MOMENTUM_FLOPS_PER_ELEM: u64 = 7;
/// FLOPs per element of the apply (`p *= 1 - lr·wd`, `p += alpha·scale·u`).
pub const APPLY_FLOPS_PER_ELEM: u64 = 4;

/// Wide orientation of a core shape: `(min, max)`.
fn wide(rows: u64, cols: u64) -> (u64, u64) {
    (rows.min(cols), rows.max(cols))
}

/// NS FLOPs of one `rows x cols` matrix over `steps` iterations.
pub fn ns_flops(rows: u64, cols: u64, steps: u64) -> u64 {
    let (m, n) = wide(rows, cols);
    steps * (4 * m * m * n + 2 * m * m * m)
}

/// NS HBM bytes of one `rows x cols` matrix over `steps` iterations.
pub fn ns_hbm_bytes(rows: u64, cols: u64, steps: u64) -> u64 {
    let (m, n) = wide(rows, cols);
    (steps * (7 * m * n + 10 * m * m) + 3 * m * n) * NS_ELEM_BYTES
}

/// Transient NS workspace bytes of `matrices` matrices of one core shape.
pub fn ns_workspace_bytes(matrices: u64, rows: u64, cols: u64) -> u64 {
    let (m, n) = wide(rows, cols);
    matrices * (2 * m * n + 2 * m * m) * NS_ELEM_BYTES
}

/// Kernel launches of one NS call.
pub fn ns_kernels(steps: u64) -> u32 {
    NS_KERNELS_PER_ITER * steps as u32 + NS_SETUP_KERNELS
}

/// One batched NS call over `matrices` matrices of core shape `rows x cols`.
pub fn ns_work(matrices: u64, rows: u64, cols: u64, steps: u64) -> ComputeWork {
    ComputeWork {
        flops: matrices * ns_flops(rows, cols, steps),
        hbm_bytes: matrices * ns_hbm_bytes(rows, cols, steps),
        kernels: ns_kernels(steps),
        mix: None,
    }
}

/// Momentum update over `elems` local elements in `tensors` tensors: reads the gradient and
/// the momentum, writes the momentum and the bf16 NS input (4 foreach launches, one more per
/// further 64 tensors).
pub fn momentum_work(elems: u64, tensors: u32, grad: DType) -> ComputeWork {
    let g = grad.bytes();
    ComputeWork {
        flops: MOMENTUM_FLOPS_PER_ELEM * elems,
        hbm_bytes: (3 * g + NS_ELEM_BYTES) * elems,
        kernels: 4 + tensors.saturating_sub(1) / 64,
        mix: None,
    }
}

/// Slice-and-apply over `elems` local elements in `tensors` tensors: reads the parameter and
/// the bf16 update, writes the parameter (`foreach_mul` + `foreach_add`).
pub fn apply_work(elems: u64, tensors: u32, master: DType) -> ComputeWork {
    ComputeWork {
        flops: APPLY_FLOPS_PER_ELEM * elems,
        hbm_bytes: (2 * master.bytes() + NS_ELEM_BYTES) * elems,
        kernels: 2 + tensors.saturating_sub(1) / 64,
        mix: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let w = ns_work(3, 4, 2, 5);
        assert_eq!(w.flops, 1200);
        assert_eq!(w.kernels, 44);
        assert_eq!(ns_workspace_bytes(1, 2, 4), (16 + 8) * 2);
    }
}
