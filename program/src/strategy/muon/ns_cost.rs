//! Kernel costs of the Muon optimizer stages: Newton-Schulz (NS) orthogonalization, the
//! momentum update and the slice-and-apply update (notes `hyper-parallel.md` 6.1-6.2, 6.6),
//! as kernel mixes ([`hpfsdp_plan::kernel`]): every GEMM of an NS call is its own
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
//! restart at iteration 2; FP32 normalization, FP16 iterations), as DMuon runs it **on an
//! Ascend NPU** (`dmuon/optim/newton_schulz.py`, `gram_newton_schulz_local`): its SYRK kernels
//! are CuTe-DSL kernels for CUDA SM80+ (`dmuon/kernels/syrk_sm80.py`, imported by
//! `optim/syrk_dispatch.py`), and the SYRK branch is taken only when
//! `_HAS_SYRK and X.is_cuda`, so on an NPU tensor every product is a plain `torch.mm` /
//! `torch.addmm` (full GEMM, both triangles). With `R = X Xᵀ`, per coefficient set `i` the
//! code forms `Z = bR + cR²` (one `addmm`), `Q = Z + aI` (first iteration after a start or
//! restart: two element-wise kernels) or `Q = aQ + Z Q` (`addmm`), and, unless the next
//! iteration is the last or a restart, evolves `R ← (aR + R Z)`, `R ← a(RZ) + Z (RZ)` (two
//! `addmm`); at the restart `X = Q X`, `R = X Xᵀ`; at the end `X = Q X`. Per matrix for 5
//! coefficient sets and a restart at 2: `8m²n + 28m³` FLOPs (against `20m²n + 10m³` for the
//! standard form: fewer when `n > 1.8m`, more for square matrices).
//!
//! **NS workspace** (transient, 6.6 "workspace allocated once per batched invocation"): per
//! matrix the bf16 input/output X, the product C (2mn) and A, A² (2m²).

use hpfsdp_plan::kernel::KernelWork;
use hpfsdp_plan::model::DType;

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
/// DMuon's Newton-Schulz iterations: its default `POLAR_EXPRESS_COEFFICIENTS` holds five
/// `(a, b, c)` sets and `gram_newton_schulz_local` iterates over that list, ignoring its
/// `steps` argument (`dmuon/optim/newton_schulz.py`), so a scenario's `ns_steps` does not
/// change DMuon's work.
pub const DMUON_COEFFICIENT_SETS: u64 = 5;
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

/// One dtype cast over `elems` elements per matrix of `batch`: reads `from_bytes` and writes
/// `to_bytes` per element.
fn cast(batch: u64, elems: u64, from_bytes: u64, to_bytes: u64) -> KernelWork {
    let e = batch.saturating_mul(elems);
    KernelWork::memory_bound(1, e, e.saturating_mul(from_bytes + to_bytes))
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

/// The kernels of one Gram-space NS call (DMuon on an NPU, module docs) over `batch` matrices
/// of core shape `rows x cols` with `steps` coefficient sets, whose input (the Nesterov
/// momentum, in the gradient's dtype) is `input`:
/// - FP32 normalization: `G.float()` (a cast unless the input is FP32 already), the Frobenius
///   norm, `+ eps` (one scalar kernel), the division, `.half()`; a tall matrix
///   (`rows > cols`) is iterated transposed, so its FP16 copy is made contiguous (one more
///   copy); `R = X Xᵀ`; `torch.eye(m)`;
/// - the iterations (module docs), restart after [`GRAM_RESTART_AFTER`];
/// - `X = Q X`, then `X.to(original_dtype)` back to the input dtype.
pub fn gram_ns_call_kernels(
    batch: u64,
    rows: u64,
    cols: u64,
    steps: u64,
    input: DType,
) -> Vec<KernelWork> {
    let (m, n) = wide(rows, cols);
    let (h, f, g) = (FP16_BYTES, FP32_BYTES, input.bytes());
    let mn = m * n;
    let mut k = Vec::new();
    if input != DType::F32 {
        k.push(cast(batch, mn, g, f)); // .float()
    }
    k.push(elementwise(batch, mn, 1, 0, f)); // Frobenius norm (a reduction read)
    k.push(KernelWork::memory_bound(1, batch, batch * 2 * f)); // norm + eps
    k.push(elementwise(batch, mn, 1, 1, f)); // X / (norm + eps)
    k.push(cast(batch, mn, f, h)); // .half()
    if rows > cols {
        k.push(elementwise(batch, mn, 1, 1, h)); // .contiguous() of the transposed view
    }
    k.push(KernelWork::gemm(m, m, n, batch, h)); // R = X Xᵀ
    k.push(elementwise(batch, m * m, 0, 1, h)); // I = eye(m)
    let mut q_started = false;
    for i in 0..steps {
        if i == GRAM_RESTART_AFTER && i > 0 {
            k.push(KernelWork::gemm(m, n, m, batch, h)); // X = Q X
            k.push(KernelWork::gemm(m, m, n, batch, h)); // R = X Xᵀ
            q_started = false;
        }
        k.push(addmm(m, batch, h)); // Z = bR + cR²
        if q_started {
            k.push(addmm(m, batch, h)); // Q = aQ + Z Q
        } else {
            k.push(elementwise(batch, m * m, 1, 1, h)); // a I
            k.push(elementwise(batch, m * m, 2, 1, h)); // Q = Z + aI
            q_started = true;
        }
        if i + 1 < steps && i + 1 != GRAM_RESTART_AFTER {
            k.push(addmm(m, batch, h)); // RZ = aR + R Z
            k.push(addmm(m, batch, h)); // R = a RZ + Z RZ
        }
    }
    k.push(KernelWork::gemm(m, n, m, batch, h)); // X = Q X
    k.push(cast(batch, mn, h, g)); // .to(input dtype)
    k
}

/// One `torch.addmm(C, A, B)` of `m x m` operands: a GEMM that also reads the `m x m` bias.
fn addmm(m: u64, batch: u64, elem_bytes: u64) -> KernelWork {
    let mut w = KernelWork::gemm(m, m, m, batch, elem_bytes);
    w.hbm_bytes = w.hbm_bytes.saturating_add(
        m.saturating_mul(m)
            .saturating_mul(batch)
            .saturating_mul(elem_bytes),
    );
    w
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
    use hpfsdp_plan::kernel::totals;

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
        // DMuon's torch.mm path, 5 coefficient sets, restart at 2 (module docs): initial
        // R = XXᵀ 2m²n; i0: Z 2m³ + evolve 4m³; i1: Z + Q 4m³; i2: restart X = QX and R = XXᵀ
        // 4m²n, Z 2m³, evolve 4m³; i3: Z + Q + evolve 8m³; i4: Z + Q 4m³; final X = QX 2m²n.
        let (m, n) = (512u64, 2048u64);
        let k = gram_ns_call_kernels(1, n, m, 5, DType::F32);
        let gemm: u64 = k
            .iter()
            .filter(|w| w.class.name() == "gemm")
            .map(|w| w.flops)
            .sum();
        assert_eq!(gemm, 8 * m * m * n + 28 * m * m * m);
        assert!(
            gemm < ns_flops(m, n, 5),
            "fewer FLOPs than standard NS at n = 4m"
        );
        // Square matrices: the Gram form does more work than the standard one.
        let sq: u64 = gram_ns_call_kernels(1, m, m, 5, DType::F32)
            .iter()
            .filter(|w| w.class.name() == "gemm")
            .map(|w| w.flops)
            .sum();
        assert!(sq > ns_flops(m, m, 5));
        // FP16 operands, full (not half-triangle) GEMMs: no CUDA SYRK on the NPU.
        assert!(k.contains(&KernelWork::gemm(m, m, n, 1, FP16_BYTES)));
    }

    #[test]
    fn gram_call_prologue_follows_input_dtype_and_orientation() {
        let (_, _, launches_f32_tall) = totals(&gram_ns_call_kernels(1, 2048, 512, 5, DType::F32));
        let (_, _, launches_f32_wide) = totals(&gram_ns_call_kernels(1, 512, 2048, 5, DType::F32));
        let (_, _, launches_bf16_wide) =
            totals(&gram_ns_call_kernels(1, 512, 2048, 5, DType::Bf16));
        // A tall matrix iterates transposed: one contiguous copy more.
        assert_eq!(launches_f32_tall, launches_f32_wide + 1);
        // A non-FP32 input is cast up first (`G.float()`).
        assert_eq!(launches_bf16_wide, launches_f32_wide + 1);
        // By hand (wide, FP32 input): norm, +eps, divide, half, R = XXᵀ, eye (6); i0: Z, aI,
        // Z + aI, 2 evolve (5); i1: Z, Q (2); i2: X, R, Z, aI, Z + aI, 2 evolve (7); i3: 4;
        // i4: 2; X = QX, cast back (2): 28.
        assert_eq!(launches_f32_wide, 28);
    }
}
