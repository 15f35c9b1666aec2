//! The full 8 x 32 f32 tile of [`crate::matmul`] written with AVX-512 intrinsics: the same
//! fused multiply-add per step in the same order as the generic tile (`_mm512_fmadd_ps`
//! rounds once per lane, as `mul_add` does), so the bits do not change; the compiler's own
//! version of the generic tile spilled accumulators to the stack whenever the code around
//! the reduction loop changed, and ran 5-20% below ndarray's kernel at short reductions.

use std::mem::MaybeUninit;

use crate::matmul::Strip;

/// Tile height (rows of A per tile).
pub(crate) const MR: usize = 8;
/// Tile width (columns of B per tile): two 16-lane registers.
pub(crate) const NR: usize = 32;

/// One full `MR x NR` tile over `kc` reduction steps of `a` (`MR` lanes a step) and `b`
/// (`NR` lanes a step), each packed or read in place ([`Strip`]): `c` (row stride `ldc`)
/// becomes, per element, the fma chain over `p = 0..kc` started from zero (`first`) or from
/// `c`'s value (which must then be initialized).
///
/// # Safety
///
/// The CPU must support AVX-512F (the caller checked [`crate::matmul::Isa::Avx512`]).
///
/// # Panics
///
/// When `a`, `b` and `c` are too short for a full tile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn full_tile_f32(
    a: Strip<'_, f32>,
    b: Strip<'_, f32>,
    kc: usize,
    c: &mut [MaybeUninit<f32>],
    ldc: usize,
    first: bool,
) {
    use std::arch::x86_64::*;
    // In u128, where these products cannot overflow (no closures or `Option` chains: they
    // were left out of line here, 3% of a short tile's time).
    let last = kc.saturating_sub(1) as u128;
    let (a_end, b_end) = (
        last * a.step as u128 + MR as u128,
        last * b.step as u128 + NR as u128,
    );
    assert!(
        (kc == 0 || (a_end <= a.data.len() as u128 && b_end <= b.data.len() as u128))
            && c.len() >= (MR - 1) * ldc + NR
            && ldc >= NR,
        "tile operands too short"
    );
    let (a_step, b_step) = (a.step, b.step);
    let (a, b, c) = (
        a.data.as_ptr(),
        b.data.as_ptr(),
        c.as_mut_ptr().cast::<f32>(),
    );
    // SAFETY: every access below is inside the lengths asserted above: `a[p * a_step + r]`
    // and `b[p * b_step + 16 * h + lane]` for p < kc, `c[r * ldc + 16 * h + lane]` for
    // r < MR; `c` is only read when not `first`, where the caller stored it.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        if !first {
            for (r, row) in acc.iter_mut().enumerate() {
                row[0] = _mm512_loadu_ps(c.add(r * ldc));
                row[1] = _mm512_loadu_ps(c.add(r * ldc + 16));
            }
        }
        for p in 0..kc {
            let b0 = _mm512_loadu_ps(b.add(p * b_step));
            let b1 = _mm512_loadu_ps(b.add(p * b_step + 16));
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(p * a_step + r));
                row[0] = _mm512_fmadd_ps(av, b0, row[0]);
                row[1] = _mm512_fmadd_ps(av, b1, row[1]);
            }
        }
        for (r, row) in acc.iter().enumerate() {
            _mm512_storeu_ps(c.add(r * ldc), row[0]);
            _mm512_storeu_ps(c.add(r * ldc + 16), row[1]);
        }
    }
}
