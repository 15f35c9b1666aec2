//! The full 8 x 32 f32 tile of [`crate::matmul`] written with AVX-512 intrinsics: the same
//! fused multiply-add per step in the same order as the generic tile (`_mm512_fmadd_ps`
//! rounds once per lane, as `mul_add` does), so the bits do not change; the compiler's own
//! version of the generic tile spilled accumulators to the stack whenever the code around
//! the reduction loop changed, and ran 5-20% below ndarray's kernel at short reductions.

use std::mem::MaybeUninit;

use crate::matmul_pack::Strip;

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
    let (a_end, b_end) = (strip_end(&a, kc, MR), strip_end(&b, kc, NR));
    assert!(
        (kc == 0 || (a_end <= a.data.len() as u128 && b_end <= b.data.len() as u128))
            && c.len() >= (MR - 1) * ldc + NR
            && ldc >= NR,
        "tile operands too short"
    );
    assert_eq!(b.lane, 1, "B's lanes are contiguous");
    let (a_step, a_lane, b_step) = (a.step, a.lane, b.step);
    let (a, b, c) = (
        a.data.as_ptr(),
        b.data.as_ptr(),
        c.as_mut_ptr().cast::<f32>(),
    );
    if a_lane == 1 {
        // SAFETY: as this function's; the lengths are checked above.
        unsafe { tile_loop::<false>((a, a_step, 1), (b, b_step), kc, (c, ldc), first) }
    } else {
        // SAFETY: as above.
        unsafe { tile_loop::<true>((a, a_step, a_lane), (b, b_step), kc, (c, ldc), first) }
    }
}

/// One past the last element `kc` steps of `lanes` lanes of `s` read, in u128, where these
/// products cannot overflow (no closures or `Option` chains in the tile: they were left out
/// of line there, 3% of a 64-step tile's time).
#[inline(always)]
fn strip_end(s: &Strip<'_, f32>, kc: usize, lanes: usize) -> u128 {
    let last = kc.saturating_sub(1) as u128;
    last * s.step as u128 + (lanes as u128 - 1) * s.lane as u128 + 1
}

/// [`full_tile_f32`]'s loop on checked pointers: `a` lane `r` of step `p` at
/// `p * a_step + r * a_lane` (`a_lane` taken as 1 unless `STRIDED`), `b` at `p * b_step`.
///
/// # Safety
///
/// AVX-512F, and every access inside the operands (checked by [`full_tile_f32`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile_loop<const STRIDED: bool>(
    (a, a_step, a_lane): (*const f32, usize, usize),
    (b, b_step): (*const f32, usize),
    kc: usize,
    (c, ldc): (*mut f32, usize),
    first: bool,
) {
    use std::arch::x86_64::*;
    let a_lane = if STRIDED { a_lane } else { 1 };
    // SAFETY: every access below is inside the lengths `full_tile_f32` asserted:
    // `a[p * a_step + r * a_lane]` and `b[p * b_step + 16 * h + lane]` for p < kc, `c[r * ldc + 16 * h + lane]` for
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
                let av = _mm512_set1_ps(*a.add(p * a_step + r * a_lane));
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
