//! Matrix multiplication with a fixed accumulation order.
//!
//! Every output element is `c[i][j] = fma(a[i][k-1], b[k-1][j], ... fma(a[i][1], b[1][j],
//! fma(a[i][0], b[0][j], 0)))`: the reduction index runs upward and **every step is one IEEE
//! fused multiply-add** (`mul_add`). A correctly rounded fma gives the same bits everywhere, so
//! the result is identical to the naive triple loop ([`matmul_reference`]) on every machine, at
//! every thread count and for every kernel variant:
//!
//! - the work is split over blocks of output rows only (rayon), never over the reduction index;
//! - the reduction index is cut into cache blocks of [`KC`]; a block's partial results are stored
//!   to `C` as f32/f64 values and reloaded exactly, so blocking does not change the order;
//! - packing pads partial tiles with zeros, but padded rows/columns are never stored;
//! - the kernel is compiled three times: with `avx512f+fma`, with `avx2+fma` (hardware fma) and
//!   without target features (where `mul_add` is the correctly rounded software `fma`), chosen
//!   at run time by [`Isa::detect`]; tile sizes differ per variant, the bits do not;
//! - the AVX-512 f32 variant runs its tiles through an intrinsic 8 x 32 kernel (a partial tile
//!   in a full-size copy whose padding is never stored);
//! - operands are packed or read where they lie (`matmul_pack.rs`): a row-major `B` in place
//!   unless its stride crowds the L2 sets or (when reused) puts every step on its own page,
//!   else packed a row at a time, in groups of panels just before use for a single row block
//!   or whole beforehand; `A` stored by columns in place under the same rule, else packed;
//!   row-major `A` in place for the AVX-512 tile (each lane broadcast from its own row);
//!   reading in place or packing only moves values, never an fma;
//! - [`product`] hands the kernels an unzeroed output: the first reduction block stores every
//!   element before any block reads one.

use std::mem::MaybeUninit;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use rayon::prelude::*;

use crate::error::{RefError, RefResult};
use crate::real::Real;
use crate::tensor::Tensor;

pub use crate::mat_ref::MatRef;
use crate::matmul_pack::{BSource, PackBuffer, Strip, pack_a_block, pack_b_group, reads_in_place};

/// Reduction-dimension cache block.
pub const KC: usize = 256;
/// Largest row block handed to one task (a multiple of every micro-tile height used).
const MC_MAX: usize = 96;
/// Below this many multiply-adds the product runs on the calling thread.
const PAR_THRESHOLD: usize = 1 << 16;

/// Which compiled kernel variant runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// x86-64 with AVX-512F and FMA.
    Avx512,
    /// x86-64 with AVX2 and FMA.
    Avx2Fma,
    /// No target features: portable code, software `fma` where the CPU has none.
    Portable,
}

/// Process-wide kernel override (0 = none), see [`Isa::force`].
static FORCED: AtomicU8 = AtomicU8::new(0);

impl Isa {
    /// The variant [`gemm`] uses: the forced one if any, else [`Isa::detect`].
    pub fn active() -> Isa {
        match FORCED.load(Ordering::Relaxed) {
            1 => Isa::Avx512,
            2 => Isa::Avx2Fma,
            3 => Isa::Portable,
            _ => Isa::detect(),
        }
    }

    /// Make every later [`gemm`] in this process use `isa` (`None`: back to detection).
    ///
    /// For tests and benchmarks that show the bits do not depend on the kernel; fails if the
    /// CPU cannot run `isa`. Results never change, only speed.
    pub fn force(isa: Option<Isa>) -> RefResult<()> {
        let code = match isa {
            None => 0,
            Some(i) if !i.is_supported() => return Err(RefError::Unsupported(i.name())),
            Some(Isa::Avx512) => 1,
            Some(Isa::Avx2Fma) => 2,
            Some(Isa::Portable) => 3,
        };
        FORCED.store(code, Ordering::Relaxed);
        Ok(())
    }

    /// The fastest variant this CPU supports (detected once).
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            if Isa::Avx512.is_supported() {
                Isa::Avx512
            } else if Isa::Avx2Fma.is_supported() {
                Isa::Avx2Fma
            } else {
                Isa::Portable
            }
        })
    }

    /// Whether this CPU can run the variant.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Short name (`avx512`, `avx2-fma`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2Fma => "avx2-fma",
            Isa::Portable => "portable",
        }
    }
}

/// The naive triple loop that defines the result: `acc = a[i][p].mul_add(b[p][j], acc)` for
/// `p = 0, 1, ...`, starting from zero. Returns `C` row-major.
pub fn matmul_reference<T: Real>(a: MatRef<'_, T>, b: MatRef<'_, T>) -> RefResult<Vec<T>> {
    check_inner(&a, &b)?;
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let mut c = vec![T::ZERO; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = T::ZERO;
            for p in 0..k {
                acc = a.at(i, p).mul_add(b.at(p, j), acc);
            }
            c[i * n + j] = acc;
        }
    }
    Ok(c)
}

fn check_inner<T: Real>(a: &MatRef<'_, T>, b: &MatRef<'_, T>) -> RefResult<()> {
    if a.cols != b.rows {
        return Err(RefError::shape(
            "gemm",
            format!(
                "inner dimensions differ: {}x{} times {}x{}",
                a.rows, a.cols, b.rows, b.cols
            ),
        ));
    }
    Ok(())
}

/// `C = A·B` into `c` (row-major `A.rows x B.cols`, overwritten) with [`Isa::active`].
pub fn gemm<T: Real>(a: MatRef<'_, T>, b: MatRef<'_, T>, c: &mut [T]) -> RefResult<()> {
    gemm_with(Isa::active(), a, b, c)
}

/// [`gemm`] with an explicit kernel variant (for tests and benchmarks).
pub fn gemm_with<T: Real>(
    isa: Isa,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut [T],
) -> RefResult<()> {
    gemm_into(isa, a, b, as_slots(c))
}

/// [`gemm_with`] into slots that need not be initialized: on success every one of them
/// holds its output (on error none was written).
fn gemm_into<T: Real>(
    isa: Isa,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut [MaybeUninit<T>],
) -> RefResult<()> {
    check_inner(&a, &b)?;
    if c.len() != a.rows * b.cols {
        return Err(RefError::shape(
            "gemm",
            format!(
                "output has {} elements, expected {}x{}",
                c.len(),
                a.rows,
                b.cols
            ),
        ));
    }
    if !isa.is_supported() {
        return Err(RefError::Unsupported(isa.name()));
    }
    let wide = std::mem::size_of::<T>() == 8;
    match (isa, wide) {
        (Isa::Avx512, false) => gemm_tiled::<T, 8, 32>(isa, &a, &b, c),
        (Isa::Avx512, true) => gemm_tiled::<T, 8, 16>(isa, &a, &b, c),
        (Isa::Avx2Fma, false) => gemm_tiled::<T, 6, 16>(isa, &a, &b, c),
        (Isa::Avx2Fma, true) => gemm_tiled::<T, 6, 8>(isa, &a, &b, c),
        (Isa::Portable, _) => gemm_tiled::<T, 4, 8>(isa, &a, &b, c),
    }
    Ok(())
}

/// `[m,k] · [k,n] → [m,n]`.
pub fn matmul<T: Real>(a: &Tensor<T>, b: &Tensor<T>) -> RefResult<Tensor<T>> {
    let a = MatRef::from_tensor(a, "matmul")?;
    let b = MatRef::from_tensor(b, "matmul")?;
    product(a, b)
}

/// `[m,k] · [n,k]ᵀ → [m,n]` (e.g. `x · Wᵀ` for a `[out, in]` weight).
pub fn matmul_nt<T: Real>(a: &Tensor<T>, b: &Tensor<T>) -> RefResult<Tensor<T>> {
    let a = MatRef::from_tensor(a, "matmul_nt")?;
    let b = MatRef::from_tensor(b, "matmul_nt")?.t();
    product(a, b)
}

/// `[k,m]ᵀ · [k,n] → [m,n]` (e.g. a weight gradient `dyᵀ · x`).
pub fn matmul_tn<T: Real>(a: &Tensor<T>, b: &Tensor<T>) -> RefResult<Tensor<T>> {
    let a = MatRef::from_tensor(a, "matmul_tn")?.t();
    let b = MatRef::from_tensor(b, "matmul_tn")?;
    product(a, b)
}

/// `A·B` of two views into a new `[A.rows, B.cols]` tensor (its buffer is not zeroed
/// first: the product writes every element).
pub fn product<T: Real>(a: MatRef<'_, T>, b: MatRef<'_, T>) -> RefResult<Tensor<T>> {
    let len = a.rows * b.cols;
    let mut c = Vec::with_capacity(len);
    gemm_into(Isa::active(), a, b, &mut c.spare_capacity_mut()[..len])?;
    // SAFETY: `gemm_into` succeeded, so it wrote all `len` elements.
    unsafe { c.set_len(len) };
    Tensor::from_vec(&[a.rows, b.cols], c)
}

/// `c` as slots that may be uninitialized: the GEMM writes only initialized values into
/// them, so an initialized `c` stays so.
fn as_slots<T>(c: &mut [T]) -> &mut [MaybeUninit<T>] {
    // SAFETY: `MaybeUninit<T>` has `T`'s size and alignment; every write through the result
    // stores an initialized `T` (see the functions below), so `c` never loses its values.
    unsafe { &mut *(c as *mut [T] as *mut [MaybeUninit<T>]) }
}

/// Row `r` of a tile (`nr` values at `r * ldc`) into `acc`: the value an earlier reduction
/// block stored.
#[inline(always)]
fn load_row<T: Real>(c: &[MaybeUninit<T>], start: usize, acc: &mut [T]) {
    let len = acc.len();
    for (x, slot) in acc.iter_mut().zip(&c[start..start + len]) {
        // SAFETY: only read when the tile's first reduction block (`first`) stored it.
        *x = unsafe { slot.assume_init() };
    }
}

/// `values` into the slots from `start` on.
#[inline(always)]
fn store_row<T: Real>(c: &mut [MaybeUninit<T>], start: usize, values: &[T]) {
    for (slot, &x) in c[start..start + values.len()].iter_mut().zip(values) {
        slot.write(x);
    }
}

/// One `MR x NR` tile over `kc` reduction steps, of which the first `mr x nr` are stored;
/// `first` starts from zero, otherwise from `c`.
#[inline(always)]
fn micro_kernel<T: Real, const MR: usize, const NR: usize>(
    (a, b): (Strip<'_, T>, Strip<'_, T>),
    kc: usize,
    c: &mut [MaybeUninit<T>],
    ldc: usize,
    (mr, nr): (usize, usize),
    first: bool,
) {
    let mut acc = [[T::ZERO; NR]; MR];
    if !first {
        for (r, row) in acc.iter_mut().enumerate().take(mr) {
            load_row(c, r * ldc, &mut row[..nr]);
        }
    }
    for p in 0..kc {
        let (ap, bp) = (a.lanes::<MR>(p), b.lanes::<NR>(p));
        for r in 0..MR {
            let av = ap[r];
            for q in 0..NR {
                acc[r][q] = av.mul_add(bp[q], acc[r][q]);
            }
        }
    }
    for (r, row) in acc.iter().enumerate().take(mr) {
        store_row(c, r * ldc, &row[..nr]);
    }
}

/// A kernel for a full `MR x NR` tile of one type and instruction set: `a` and `b` over
/// `kc` steps, `c` with its row stride, and whether the chain starts from zero
/// ([`micro_kernel`]'s arguments, less the tile's size). Unsafe: it needs its instruction
/// set.
type FullTile<T> = unsafe fn(Strip<'_, T>, Strip<'_, T>, usize, &mut [MaybeUninit<T>], usize, bool);

/// [`crate::matmul_avx512::full_tile_f32`] for `T`, `MR`, `NR`, when they are its (f32,
/// 8 x 32).
#[cfg(target_arch = "x86_64")]
fn avx512_full_tile<T: Real, const MR: usize, const NR: usize>() -> Option<FullTile<T>> {
    use crate::matmul_avx512 as tile;
    (std::mem::size_of::<T>() == 4 && MR == tile::MR && NR == tile::NR)
        .then_some(full_tile_f32_as::<T> as FullTile<T>)
}

/// [`crate::matmul_avx512::full_tile_f32`] on slices of `T`, which is `f32`.
///
/// # Safety
///
/// The CPU must support AVX-512F. Panics unless `T` has 4 bytes: [`Real`] is sealed to
/// `f32` and `f64`, so `T` is then `f32` and the casts below reinterpret nothing.
#[cfg(target_arch = "x86_64")]
unsafe fn full_tile_f32_as<T: Real>(
    a: Strip<'_, T>,
    b: Strip<'_, T>,
    kc: usize,
    c: &mut [MaybeUninit<T>],
    ldc: usize,
    first: bool,
) {
    assert_eq!(std::mem::size_of::<T>(), 4, "the f32 tile on another type");
    let cast = |s: Strip<'_, T>| Strip {
        // SAFETY: `T` is f32 (see above): same size, alignment and bits; lengths are kept.
        data: unsafe { std::slice::from_raw_parts(s.data.as_ptr().cast::<f32>(), s.data.len()) },
        step: s.step,
        lane: s.lane,
    };
    // SAFETY: as above.
    let c = unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr().cast(), c.len()) };
    // SAFETY: the caller guarantees AVX-512F.
    unsafe { crate::matmul_avx512::full_tile_f32(cast(a), cast(b), kc, c, ldc, first) }
}

/// The first `mr x nr` of a tile by a full-tile kernel: directly in `c` when the tile is
/// full, else in a full-size copy whose extra rows and columns (zeros in the packed
/// operands) are never stored, so every stored element has the same fma chain.
#[inline(always)]
fn partial_tile<T: Real, const MR: usize, const NR: usize>(
    tile: FullTile<T>,
    (a, b): (Strip<'_, T>, Strip<'_, T>),
    kc: usize,
    c: &mut [MaybeUninit<T>],
    ldc: usize,
    (mr, nr): (usize, usize),
    first: bool,
) {
    if mr == MR && nr == NR {
        // SAFETY: `tile` is only given where its instruction set was found.
        unsafe { tile(a, b, kc, c, ldc, first) };
        return;
    }
    let mut tmp = [[T::ZERO; NR]; MR];
    if !first {
        for (r, row) in tmp.iter_mut().enumerate().take(mr) {
            load_row(c, r * ldc, &mut row[..nr]);
        }
    }
    // SAFETY: as above.
    unsafe { tile(a, b, kc, as_slots(tmp.as_flattened_mut()), NR, first) };
    for (r, row) in tmp.iter().enumerate().take(mr) {
        store_row(c, r * ldc, &row[..nr]);
    }
}

/// Panels packed together just before use ([`BSource::Lazy`]): a row-major `B` is then read
/// `LAZY_PANELS * NR` values a row ([`pack_b_group`]), and the group stays in the L2 cache.
const LAZY_PANELS: usize = 8;

/// Panel `jp` of `B` for reduction steps `[p0, p0 + kc)`: packed beforehand, read in place,
/// or packed now (with the rest of its group when it is the group's first) into `lazy`,
/// which holds `slots` pieces.
#[inline(always)]
fn b_strip<'s, T: Real, const NR: usize>(
    b: BSource<'s, T>,
    (jp, nr): (usize, usize),
    (p0, kc, k): (usize, usize, usize),
    (lazy, slots): (&'s mut [T], usize),
) -> Strip<'s, T> {
    let piece = kc * NR;
    match b {
        BSource::Packed(all) => Strip::rows(&all[(jp * k + p0) * NR..(jp * k + p0 + kc) * NR], NR),
        BSource::InPlace(b) if nr == NR => Strip::rows(&b.data[p0 * b.rs + jp * NR..], b.rs),
        BSource::InPlace(b) | BSource::Lazy(b) => {
            let slot = jp % slots;
            if slot == 0 {
                let count = slots.min(b.cols.div_ceil(NR) - jp);
                pack_b_group::<T, NR>(b, (p0, jp), kc, &mut lazy[..count * piece]);
            }
            Strip::rows(&lazy[slot * piece..(slot + 1) * piece], NR)
        }
    }
}

/// Whether the full tiles read `A` where it lies: stored by columns when [`reads_in_place`]
/// allows its stride (a tile serves every panel: reused), or stored by rows where a full-tile
/// kernel (`intrinsic`) broadcasts each lane by itself anyway (the tile's `MR` rows stay in
/// L1).
fn reads_a_in_place<T: Real>(a: &MatRef<'_, T>, kc: usize, intrinsic: bool) -> bool {
    if a.rs == 1 {
        reads_in_place(a.cs * std::mem::size_of::<T>(), kc, true)
    } else {
        a.cs == 1 && intrinsic
    }
}

/// The full tile of `A` whose first element is `(i, p)`, read in place.
fn a_in_place<'s, T: Real>(a: &MatRef<'s, T>, (i, p): (usize, usize)) -> Strip<'s, T> {
    Strip {
        data: &a.data[i * a.rs + p * a.cs..],
        step: a.cs,
        lane: a.rs,
    }
}

/// All output rows `[i0, i0 + rows)`: `c` is that row block of `C` (`rows x n`). Tiles go to
/// `full_tile` when there is one (its instruction set checked by the caller), partial ones
/// through [`partial_tile`].
#[inline(always)]
fn row_block<T: Real, const MR: usize, const NR: usize>(
    a: &MatRef<'_, T>,
    (i0, rows): (usize, usize),
    b: BSource<'_, T>,
    c: &mut [MaybeUninit<T>],
    (n, k): (usize, usize),
    full_tile: Option<FullTile<T>>,
) {
    let tiles = rows.div_ceil(MR);
    let panels = n.div_ceil(NR);
    // `A` stored by columns at a stride that keeps a tile's steps in L2: its full tiles are
    // read in place, only a last, partial one is packed.
    let full_tiles = if reads_a_in_place(a, KC.min(k), full_tile.is_some()) {
        rows / MR
    } else {
        0
    };
    let mut packed_a = PackBuffer::zeroed((tiles - full_tiles) * KC.min(k) * MR);
    let slots = match b {
        BSource::Packed(_) => 0,
        BSource::InPlace(_) => usize::from(n % NR != 0),
        BSource::Lazy(_) => LAZY_PANELS.min(panels),
    };
    let mut lazy_b = PackBuffer::zeroed(slots * KC.min(k) * NR);
    let mut p0 = 0;
    while p0 < k {
        let kc = KC.min(k - p0);
        let pa = &mut packed_a.as_mut_slice()[..(tiles - full_tiles) * kc * MR];
        let packed_rows = rows - full_tiles * MR;
        if packed_rows > 0 {
            pack_a_block::<T, MR>(a, i0 + full_tiles * MR, packed_rows, p0, kc, pa);
        }
        for jp in 0..panels {
            let j0 = jp * NR;
            let nr = NR.min(n - j0);
            let sb = b_strip::<T, NR>(b, (jp, nr), (p0, kc, k), (lazy_b.as_mut_slice(), slots));
            for tile in 0..tiles {
                let r0 = tile * MR;
                let mr = MR.min(rows - r0);
                let ct = &mut c[r0 * n + j0..];
                let sa = if tile < full_tiles {
                    a_in_place(a, (i0 + r0, p0))
                } else {
                    let at = (tile - full_tiles) * kc * MR;
                    Strip::rows(&pa[at..at + kc * MR], MR)
                };
                let (size, first) = ((mr, nr), p0 == 0);
                match full_tile {
                    Some(f) => partial_tile::<T, MR, NR>(f, (sa, sb), kc, ct, n, size, first),
                    None => micro_kernel::<T, MR, NR>((sa, sb), kc, ct, n, size, first),
                }
            }
        }
        p0 += kc;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn row_block_avx512<T: Real, const MR: usize, const NR: usize>(
    a: &MatRef<'_, T>,
    (i0, rows): (usize, usize),
    b: BSource<'_, T>,
    c: &mut [MaybeUninit<T>],
    (n, k): (usize, usize),
) {
    let tile = avx512_full_tile::<T, MR, NR>();
    row_block::<T, MR, NR>(a, (i0, rows), b, c, (n, k), tile)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn row_block_avx2<T: Real, const MR: usize, const NR: usize>(
    a: &MatRef<'_, T>,
    (i0, rows): (usize, usize),
    b: BSource<'_, T>,
    c: &mut [MaybeUninit<T>],
    (n, k): (usize, usize),
) {
    row_block::<T, MR, NR>(a, (i0, rows), b, c, (n, k), None)
}

fn dispatch_row_block<T: Real, const MR: usize, const NR: usize>(
    isa: Isa,
    a: &MatRef<'_, T>,
    block: (usize, usize),
    b: BSource<'_, T>,
    c: &mut [MaybeUninit<T>],
    nk: (usize, usize),
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `gemm_with` only passes variants whose CPU features `Isa::is_supported` found.
        Isa::Avx512 => unsafe { row_block_avx512::<T, MR, NR>(a, block, b, c, nk) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2Fma => unsafe { row_block_avx2::<T, MR, NR>(a, block, b, c, nk) },
        _ => row_block::<T, MR, NR>(a, block, b, c, nk, None),
    }
}

/// `C = A·B` into the slots `c` (`m x n`), every one written.
fn gemm_tiled<T: Real, const MR: usize, const NR: usize>(
    isa: Isa,
    a: &MatRef<'_, T>,
    b: &MatRef<'_, T>,
    c: &mut [MaybeUninit<T>],
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.fill(MaybeUninit::new(T::ZERO));
        return;
    }
    let work = m * n * k;
    let threads = rayon::current_num_threads();
    let parallel = threads > 1 && work >= PAR_THRESHOLD;

    // Row-block height: enough blocks to balance the threads, capped for cache reuse. It changes
    // only the grouping of whole output rows, never the order inside an output.
    let mc_cap = MC_MAX - MC_MAX % MR;
    let mc = if parallel {
        m.div_ceil(threads * 4)
            .next_multiple_of(MR)
            .clamp(MR, mc_cap)
    } else {
        mc_cap
    };
    let b_row_bytes = b.rs * std::mem::size_of::<T>();
    let in_place = |reused| b.cs == 1 && reads_in_place(b_row_bytes, KC.min(k), reused);
    if m <= mc {
        let source = if in_place(false) {
            BSource::InPlace(b)
        } else {
            BSource::Lazy(b)
        };
        dispatch_row_block::<T, MR, NR>(isa, a, (0, m), source, c, (n, k));
        return;
    }
    let in_place = in_place(true);
    let packed_b = if in_place {
        PackBuffer::zeroed(0)
    } else {
        pack_b_whole::<T, NR>(b, parallel)
    };
    let source = if in_place {
        BSource::InPlace(b)
    } else {
        BSource::Packed(packed_b.as_slice())
    };
    let block = |(ib, cb): (usize, &mut [MaybeUninit<T>])| {
        let rows = (ib * mc, cb.len() / n);
        dispatch_row_block::<T, MR, NR>(isa, a, rows, source, cb, (n, k))
    };
    if parallel {
        c.par_chunks_mut(mc * n).enumerate().for_each(block);
    } else {
        c.chunks_mut(mc * n).enumerate().for_each(block);
    }
}

/// Every panel of `B`, `[panel][k][NR]`, packed on the rayon threads when `parallel`.
fn pack_b_whole<T: Real, const NR: usize>(b: &MatRef<'_, T>, parallel: bool) -> PackBuffer<T> {
    let (k, panels) = (b.rows, b.cols.div_ceil(NR));
    let mut buffer = PackBuffer::zeroed(panels * k * NR);
    let packed = buffer.as_mut_slice();
    let group = LAZY_PANELS * k * NR;
    let pack = |(g, out): (usize, &mut [T])| {
        pack_b_group::<T, NR>(b, (0, g * LAZY_PANELS), k, out);
    };
    if parallel {
        packed.par_chunks_mut(group).enumerate().for_each(pack);
    } else {
        packed.chunks_mut(group).enumerate().for_each(pack);
    }
    buffer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::KeyedRng;

    fn random(seed: u64, len: usize) -> Vec<f32> {
        KeyedRng::new(seed, 0).normal_range(0, len as u64)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn tiled_kernels_equal_the_naive_loop_bit_for_bit() {
        let shapes = [
            (1, 1, 1),
            (3, 5, 7),
            (7, 300, 33),
            (13, 257, 65),
            (37, 513, 19),
            (101, 31, 130),
            (6, 0, 4),
        ];
        for (m, k, n) in shapes {
            let a = random(1, m * k);
            let b = random(2, k * n);
            let am = MatRef::row_major(&a, m, k).unwrap();
            let bm = MatRef::row_major(&b, k, n).unwrap();
            let want = bits(&matmul_reference(am, bm).unwrap());
            for isa in [Isa::Avx512, Isa::Avx2Fma, Isa::Portable] {
                if !isa.is_supported() {
                    continue;
                }
                let mut c = vec![f32::NAN; m * n];
                gemm_with(isa, am, bm, &mut c).unwrap();
                assert_eq!(bits(&c), want, "{isa:?} {m}x{k}x{n}");
            }
        }
    }

    #[test]
    fn transposed_variants_follow_the_same_order() {
        let (m, k, n) = (19, 270, 23);
        let a = Tensor::from_vec(&[m, k], random(3, m * k)).unwrap();
        let bt = Tensor::from_vec(&[n, k], random(4, n * k)).unwrap();
        let at = Tensor::from_vec(&[k, m], random(5, k * m)).unwrap();
        let b = Tensor::from_vec(&[k, n], random(6, k * n)).unwrap();
        let nt = matmul_nt(&a, &bt).unwrap();
        let want_nt = matmul_reference(
            MatRef::from_tensor(&a, "t").unwrap(),
            MatRef::from_tensor(&bt, "t").unwrap().t(),
        )
        .unwrap();
        assert_eq!(bits(nt.as_slice()), bits(&want_nt));
        let tn = matmul_tn(&at, &b).unwrap();
        let want_tn = matmul_reference(
            MatRef::from_tensor(&at, "t").unwrap().t(),
            MatRef::from_tensor(&b, "t").unwrap(),
        )
        .unwrap();
        assert_eq!(bits(tn.as_slice()), bits(&want_tn));
    }

    /// Every packing path (row-major, by columns, transposed per piece or whole), full and
    /// partial tiles, one and several row blocks and reduction blocks: the naive loop's bits.
    #[test]
    fn every_layout_and_packing_path_equals_the_naive_loop() {
        for (m, k, n) in [(64, 64, 64), (130, 300, 70), (97, 513, 96), (8, 40, 32)] {
            let x = random(11, m * k);
            let y = random(12, k * n);
            let layouts = [
                (MatRef::row_major(&x, m, k), MatRef::row_major(&y, k, n)),
                (
                    MatRef::row_major(&x, m, k),
                    MatRef::row_major(&y, n, k).map(|b| b.t()),
                ),
                (
                    MatRef::row_major(&x, k, m).map(|a| a.t()),
                    MatRef::row_major(&y, k, n),
                ),
            ];
            for (layout, (am, bm)) in layouts.into_iter().enumerate() {
                let (am, bm) = (am.unwrap(), bm.unwrap());
                let want = bits(&matmul_reference(am, bm).unwrap());
                for isa in [Isa::Avx512, Isa::Avx2Fma, Isa::Portable] {
                    if !isa.is_supported() {
                        continue;
                    }
                    let mut c = vec![f32::NAN; m * n];
                    gemm_with(isa, am, bm, &mut c).unwrap();
                    assert_eq!(bits(&c), want, "{isa:?} layout {layout} {m}x{k}x{n}");
                }
            }
        }
    }

    /// A view of `data` with explicit strides (the operand sources depend on them).
    fn view(
        data: &[f32],
        (rows, cols): (usize, usize),
        (rs, cs): (usize, usize),
    ) -> MatRef<'_, f32> {
        MatRef::new(data, rows, cols, rs, cs).unwrap()
    }

    /// Every operand source, on one thread and on several, every kernel variant: `B` by rows
    /// at a 4 KiB stride (packed in groups just before use, packed whole, read in place when
    /// read once), at a 2080-byte stride (in place) with a partial panel; `A` by rows (in
    /// place by the AVX-512 tile, a partial tile packed), by columns at 4 KiB (packed) and
    /// at 2080 bytes (in place): the naive loop's bits.
    #[test]
    fn every_operand_source_equals_the_naive_loop() {
        let data_a = random(21, 1024 * 310);
        let data_b = random(22, 1024 * 310);
        let mut cases = Vec::new();
        for (k, n, b_rs) in [
            (300, 40, 1024),
            (64, 40, 1024),
            (300, 45, 520),
            (70, 32, 520),
        ] {
            let b = view(&data_b, (k, n), (b_rs, 1));
            for m in [8, 13, 104] {
                cases.push((view(&data_a, (m, k), (k + 3, 1)), b));
                cases.push((view(&data_a, (m, k), (1, 1024)), b));
                cases.push((view(&data_a, (m, k), (1, 520)), b));
            }
        }
        for (a, b) in cases {
            let want = bits(&matmul_reference(a, b).unwrap());
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                for isa in [Isa::Avx512, Isa::Avx2Fma, Isa::Portable] {
                    if !isa.is_supported() {
                        continue;
                    }
                    let mut c = vec![f32::NAN; a.rows * b.cols];
                    pool.install(|| gemm_with(isa, a, b, &mut c)).unwrap();
                    assert_eq!(bits(&c), want, "{isa:?} {threads}T a {a:?} b {b:?}");
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Random shapes, layouts and row paddings: [`product`] (unzeroed output) and
        /// [`gemm`] give the naive loop's bits.
        #[test]
        fn random_views_equal_the_naive_loop(
            (m, k, n) in (1usize..40, 1usize..300, 1usize..80),
            (pad_a, pad_b) in (0usize..40, 0usize..40),
            (a_by_cols, b_by_cols) in (proptest::bool::ANY, proptest::bool::ANY),
            seed in 0u64..1000,
        ) {
            let data_a = random(seed, (m + pad_a) * (k + pad_a));
            let data_b = random(seed + 1, (k + pad_b) * (n + pad_b));
            let a = if a_by_cols {
                view(&data_a, (m, k), (1, m + pad_a))
            } else {
                view(&data_a, (m, k), (k + pad_a, 1))
            };
            let b = if b_by_cols {
                view(&data_b, (k, n), (1, k + pad_b))
            } else {
                view(&data_b, (k, n), (n + pad_b, 1))
            };
            let want = bits(&matmul_reference(a, b).unwrap());
            let c = product(a, b).unwrap();
            proptest::prop_assert_eq!(bits(c.as_slice()), want.clone());
            let mut c = vec![f32::NAN; m * n];
            gemm(a, b, &mut c).unwrap();
            proptest::prop_assert_eq!(bits(&c), want);
        }
    }

    #[test]
    fn one_thread_and_many_threads_agree() {
        let (m, k, n) = (203, 611, 97);
        let a = Tensor::from_vec(&[m, k], random(7, m * k)).unwrap();
        let b = Tensor::from_vec(&[k, n], random(8, k * n)).unwrap();
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| matmul(&a, &b).unwrap())
        };
        let one = run(1);
        for threads in [2, 3, 8] {
            assert!(run(threads).bit_eq(&one), "{threads} threads");
        }
        let naive = matmul_reference(
            MatRef::from_tensor(&a, "t").unwrap(),
            MatRef::from_tensor(&b, "t").unwrap(),
        )
        .unwrap();
        assert_eq!(bits(one.as_slice()), bits(&naive));
    }

    #[test]
    fn fma_is_really_used() {
        // a*b + c with one rounding differs from the two-rounding result here.
        let x = 1.0f32 + 2f32.powi(-12);
        let a = [x];
        let b = [x];
        let am = MatRef::row_major(&a, 1, 1).unwrap();
        let bm = MatRef::row_major(&b, 1, 1).unwrap();
        let c = matmul_reference(am, bm).unwrap();
        assert_eq!(c[0], x.mul_add(x, 0.0));
        let two_k = [x, -1.0];
        let b2 = [x, 1.0];
        let a2 = MatRef::row_major(&two_k, 1, 2).unwrap();
        let bm2 = MatRef::row_major(&b2, 2, 1).unwrap();
        let mut out = [0.0f32];
        gemm(a2, bm2, &mut out).unwrap();
        // fma(-1, 1, x*x rounded) = round(x*x) - 1, exact here.
        assert_eq!(out[0], x.mul_add(x, 0.0) - 1.0);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let a = Tensor::<f32>::zeros(&[2, 3]);
        let b = Tensor::<f32>::zeros(&[4, 2]);
        assert!(matmul(&a, &b).is_err());
        assert!(matmul_nt(&a, &b).is_err());
        assert!(MatRef::new(&[0.0f32; 5], 2, 3, 3, 1).is_err());
        let mut c = [0.0f32; 3];
        let am = MatRef::row_major(&[0.0f32; 6], 2, 3).unwrap();
        let bm = MatRef::row_major(&[0.0f32; 6], 3, 2).unwrap();
        assert!(gemm(am, bm, &mut c).is_err());
    }

    #[test]
    fn f64_kernel_matches_its_naive_loop() {
        let (m, k, n) = (17, 300, 21);
        let a: Vec<f64> = random(9, m * k).iter().map(|&x| f64::from(x)).collect();
        let b: Vec<f64> = random(10, k * n)
            .iter()
            .map(|&x| f64::from(x) * 1.1)
            .collect();
        let am = MatRef::row_major(&a, m, k).unwrap();
        let bm = MatRef::row_major(&b, k, n).unwrap();
        let want = matmul_reference(am, bm).unwrap();
        let mut c = vec![0.0f64; m * n];
        gemm(am, bm, &mut c).unwrap();
        assert!(c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
