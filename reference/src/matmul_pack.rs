//! Where the GEMM's tiles read their operands: `A`'s rows packed per cache block, `B`'s
//! columns packed (beforehand or just before use) or read where they lie when `B` is stored
//! by rows at a stride that keeps a panel piece in the L2 cache. Packing and reading in place
//! only move values: every output keeps its fma chain, so none of this changes a bit.

use crate::real::Real;

use crate::mat_ref::MatRef;

/// A tile operand over the reduction: lane `l` of step `p` is `data[p * step + l * lane]`
/// (a packed piece: `step` is the tile's width and `lane` 1; `B` or `A` stored by columns
/// read in place: `step` is the row stride and `lane` 1; row-major `A` read in place: `step`
/// 1 and `lane` its row stride).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Strip<'s, T> {
    /// The elements from the tile's first one on.
    pub(crate) data: &'s [T],
    /// Distance between successive reduction steps.
    pub(crate) step: usize,
    /// Distance between successive lanes (rows of an `A` tile, columns of a `B` panel).
    pub(crate) lane: usize,
}

impl<'s, T: Real> Strip<'s, T> {
    /// Contiguous lanes, `step` apart.
    pub(crate) fn rows(data: &'s [T], step: usize) -> Self {
        Strip {
            data,
            step,
            lane: 1,
        }
    }

    /// The `L` lanes of reduction step `p`.
    #[inline(always)]
    pub(crate) fn lanes<const L: usize>(&self, p: usize) -> [T; L] {
        if self.lane == 1 {
            let start = p * self.step;
            *<&[T; L]>::try_from(&self.data[start..start + L]).expect("L lanes per step")
        } else {
            std::array::from_fn(|l| self.data[p * self.step + l * self.lane])
        }
    }
}

/// Where a row block finds `B`'s panels (columns `[j0, j0 + NR)`, all reduction steps).
#[derive(Clone, Copy)]
pub(crate) enum BSource<'s, T> {
    /// Every panel packed beforehand, `[panel][k][NR]` (shared by the row blocks).
    Packed(&'s [T]),
    /// Packed a `KC` piece at a time just before its tiles use it, while it is in cache, a
    /// group of panels together (a single row block: each piece serves only it).
    Lazy(&'s MatRef<'s, T>),
    /// `B` stored by rows, read where it lies (see [`reads_in_place`]); only a last, partial
    /// panel is packed as [`BSource::Lazy`] does.
    InPlace(&'s MatRef<'s, T>),
}

/// Bytes of one way of the L2 cache on current x86 cores (1 MiB 8-way, 2 MiB 16-way): rows
/// whose addresses differ by a multiple of it compete for the same cache sets.
const L2_WAY_BYTES: usize = 128 << 10;
/// Most rows of one panel piece allowed on the same L2 sets (half the ways of an 8-way L2).
const ROWS_PER_SET_MAX: usize = 4;

/// Page size: an operand read in place at a stride of at least this touches a new page every
/// step.
const PAGE_BYTES: usize = 4096;

/// Whether the tiles read an operand whose reduction steps are `step_bytes` apart (a
/// row-major `B`, an `A` stored by columns) in place for reduction blocks of `kc` steps,
/// `reused` when each piece serves several row blocks or panels. Yes unless
/// - the stride maps more than [`ROWS_PER_SET_MAX`] of a piece's steps onto the same L2 sets
///   (a 4 KiB stride does at `kc` = 256: the piece would be evicted before the next tile
///   rereads it), or
/// - a reused piece has every step on its own page ([`PAGE_BYTES`]): read that way again
///   and again it was slower than packed (weight gradients 1024 x 64 x 1024, `dyᵀ·x`);
///   read once, packing it would cost more than it saves.
pub(crate) fn reads_in_place(step_bytes: usize, kc: usize, reused: bool) -> bool {
    let period_rows = L2_WAY_BYTES / gcd(L2_WAY_BYTES, step_bytes);
    kc.div_ceil(period_rows) <= ROWS_PER_SET_MAX && !(reused && step_bytes >= PAGE_BYTES)
}

fn gcd(mut x: usize, mut y: usize) -> usize {
    while y != 0 {
        (x, y) = (y, x % y);
    }
    x
}

/// Pack columns `[j0, j0+NR)` of `B`, rows from `p0` on (as many as `out` holds), as
/// `[rows][NR]`, zero-padded. Row-major
/// `B` copies row pieces; `B` stored by columns (`x·Wᵀ`) is transposed from `NR` column
/// slices. Packing only moves values, so the layout never changes a result. Out of line and
/// without the kernels' instruction sets: compiled into them, the transpose became scatter
/// stores, several times slower than scalar ones on AMD cores.
#[inline(never)]
pub(crate) fn pack_b_panel<T: Real, const NR: usize>(
    b: &MatRef<'_, T>,
    (p0, j0): (usize, usize),
    out: &mut [T],
) {
    let nr = NR.min(b.cols - j0);
    if b.cs == 1 && nr == NR {
        for (p, row) in out.chunks_exact_mut(NR).enumerate() {
            let start = (p0 + p) * b.rs + j0;
            let src: &[T; NR] = b.data[start..start + NR].try_into().expect("NR elements");
            let row: &mut [T; NR] = row.try_into().expect("chunks_exact yields NR elements");
            *row = *src;
        }
    } else if b.cs == 1 {
        for (p, row) in out.chunks_exact_mut(NR).enumerate() {
            let start = (p0 + p) * b.rs + j0;
            row[..nr].copy_from_slice(&b.data[start..start + nr]);
            row[nr..].fill(T::ZERO);
        }
    } else if b.rs == 1 {
        // A transpose, in steps of one cache line of each column: every line read is used
        // whole while the rows it fills are still in cache.
        const STEP: usize = 16;
        for (step, rows) in out.chunks_mut(STEP * NR).enumerate() {
            let first_row = p0 + step * STEP;
            for q in 0..NR {
                if q < nr {
                    let start = (j0 + q) * b.cs + first_row;
                    let column = &b.data[start..start + rows.len() / NR];
                    for (row, &x) in rows.chunks_exact_mut(NR).zip(column) {
                        row[q] = x;
                    }
                } else {
                    for row in rows.chunks_exact_mut(NR) {
                        row[q] = T::ZERO;
                    }
                }
            }
        }
    } else {
        for (p, row) in out.chunks_exact_mut(NR).enumerate() {
            for (q, x) in row.iter_mut().enumerate() {
                *x = if q < nr {
                    b.at(p0 + p, j0 + q)
                } else {
                    T::ZERO
                };
            }
        }
    }
}

/// Pack rows `[i0, i0+rows)`, reduction range `[p0, p0+kc)` of `A` as `[tile][kc][MR]`,
/// zero-padded. `A` stored by columns (`dyᵀ·x`) copies column pieces; row-major `A` copies
/// each row into its lane. Out of line, as [`pack_b_panel`].
#[inline(never)]
pub(crate) fn pack_a_block<T: Real, const MR: usize>(
    a: &MatRef<'_, T>,
    i0: usize,
    rows: usize,
    p0: usize,
    kc: usize,
    out: &mut [T],
) {
    if a.rs == 1 {
        pack_a_by_columns::<T, MR>(a, (i0, rows), (p0, kc), out);
        return;
    }
    for (tile, chunk) in out.chunks_exact_mut(kc * MR).enumerate() {
        let r0 = i0 + tile * MR;
        let mr = MR.min(i0 + rows - r0);
        if a.cs == 1 && mr == MR {
            // A transpose: eight loads from eight rows, one contiguous store per step.
            let rows: [&[T]; MR] = std::array::from_fn(|r| {
                let start = (r0 + r) * a.rs + p0;
                &a.data[start..start + kc]
            });
            for (p, col) in chunk.chunks_exact_mut(MR).enumerate() {
                let col: &mut [T; MR] = col.try_into().expect("chunks_exact yields MR elements");
                for r in 0..MR {
                    col[r] = rows[r][p];
                }
            }
        } else {
            for (p, col) in chunk.chunks_exact_mut(MR).enumerate() {
                for (r, x) in col.iter_mut().enumerate() {
                    *x = if r < mr {
                        a.at(r0 + r, p0 + p)
                    } else {
                        T::ZERO
                    };
                }
            }
        }
    }
}

/// Full panels `[jp0, jp0 + count)` of a row-major `B` (`count = out.len() / (kc * NR)`),
/// reduction rows `[p0, p0 + kc)`, as `[panel][kc][NR]`: a row at a time, so each read is
/// `count * NR` contiguous values instead of `NR` values a row stride apart (with a 4 KiB
/// stride every one of those is a new page, which the hardware prefetchers do not cross).
pub(crate) fn pack_b_rows<T: Real, const NR: usize>(
    b: &MatRef<'_, T>,
    (p0, jp0): (usize, usize),
    kc: usize,
    out: &mut [T],
) {
    let count = out.len() / (kc * NR);
    debug_assert!(b.cs == 1 && (jp0 + count) * NR <= b.cols && p0 + kc <= b.rows);
    for p in 0..kc {
        let start = (p0 + p) * b.rs + jp0 * NR;
        let row = &b.data[start..start + count * NR];
        for (g, piece) in row.chunks_exact(NR).enumerate() {
            let at = (g * kc + p) * NR;
            out[at..at + NR].copy_from_slice(piece);
        }
    }
}

/// Panels `[jp0, jp0 + count)` of `B` (`count = out.len() / (kc * NR)`), reduction rows
/// `[p0, p0 + kc)`, as `[panel][kc][NR]`, zero-padded: the full ones of a row-major `B` by
/// [`pack_b_rows`], the others by [`pack_b_panel`].
pub(crate) fn pack_b_group<T: Real, const NR: usize>(
    b: &MatRef<'_, T>,
    (p0, jp0): (usize, usize),
    kc: usize,
    out: &mut [T],
) {
    let count = out.len() / (kc * NR);
    let full = if b.cs == 1 {
        (b.cols / NR).saturating_sub(jp0).min(count)
    } else {
        0
    };
    let (rows, rest) = out.split_at_mut(full * kc * NR);
    if full > 0 {
        pack_b_rows::<T, NR>(b, (p0, jp0), kc, rows);
    }
    for (i, piece) in rest.chunks_exact_mut(kc * NR).enumerate() {
        pack_b_panel::<T, NR>(b, (p0, (jp0 + full + i) * NR), piece);
    }
}

/// Steps of `A` stored by columns packed together: their rows (a few cache lines each) stay
/// in L1 while every tile takes its pieces, and each tile's part of the output is written
/// whole lines at a time (a step at a time, the tiles' parts, `kc * MR` values apart, fell
/// on the same cache sets and were evicted half written).
const A_STEPS: usize = 16;

/// [`pack_a_block`] for `A` stored by columns (`dyᵀ·x`): rows `[i0, i0+rows)`, reduction
/// range `[p0, p0+kc)`, as `[tile][kc][MR]`, zero-padded.
fn pack_a_by_columns<T: Real, const MR: usize>(
    a: &MatRef<'_, T>,
    (i0, rows): (usize, usize),
    (p0, kc): (usize, usize),
    out: &mut [T],
) {
    let tiles = out.len() / (kc * MR);
    for s0 in (0..kc).step_by(A_STEPS) {
        let steps = A_STEPS.min(kc - s0);
        let src: [&[T]; A_STEPS] = std::array::from_fn(|s| {
            let start = (p0 + s0 + s.min(steps - 1)) * a.cs + i0;
            &a.data[start..start + rows]
        });
        for tile in 0..tiles {
            let r0 = tile * MR;
            let lanes = MR.min(rows - r0);
            let base = (tile * kc + s0) * MR;
            for (s, col) in out[base..base + steps * MR]
                .chunks_exact_mut(MR)
                .enumerate()
            {
                let piece = &src[s][r0..r0 + lanes];
                if let (Ok(col), Ok(piece)) = (
                    <&mut [T; MR]>::try_from(&mut *col),
                    <&[T; MR]>::try_from(piece),
                ) {
                    *col = *piece;
                } else {
                    col[..lanes].copy_from_slice(piece);
                    col[lanes..].fill(T::ZERO);
                }
            }
        }
    }
}

/// A zeroed packing buffer whose values start on a cache line (64 bytes), as the tiles'
/// 64-byte loads of packed `B` then never span two lines.
pub(crate) struct PackBuffer<T> {
    buf: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Real> PackBuffer<T> {
    /// `len` zeros.
    pub(crate) fn zeroed(len: usize) -> Self {
        let spare = 64 / std::mem::size_of::<T>();
        let buf = vec![T::ZERO; len + spare];
        // `align_offset` may answer `usize::MAX` (never for these types); then unaligned.
        let start = buf.as_ptr().align_offset(64).min(spare);
        PackBuffer { buf, start, len }
    }

    /// The values.
    pub(crate) fn as_slice(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }

    /// The values, to pack into.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize) -> Vec<f32> {
        (0..len).map(|x| x as f32 * 0.5 - 7.0).collect()
    }

    #[test]
    fn in_place_reads_follow_the_cache_and_page_rules() {
        // 2 KiB rows: 64 rows before the L2 sets repeat, 4 rows a set at kc = 256.
        assert!(reads_in_place(2048, 256, true));
        // 4 KiB rows: 8 rows a set at kc = 256, 2 at kc = 64; every step a new page.
        assert!(!reads_in_place(4096, 256, false));
        assert!(reads_in_place(4096, 64, false));
        assert!(!reads_in_place(4096, 64, true));
        // 1025 values a row: the sets spread (no conflict); still a page a step.
        assert!(reads_in_place(1025 * 4, 256, false));
        assert!(!reads_in_place(1025 * 4, 256, true));
        assert!(reads_in_place(1000 * 4, 256, true));
        assert!(reads_in_place(256, 256, true));
    }

    #[test]
    fn lanes_of_contiguous_and_strided_strips() {
        let data = values(64);
        let rows = Strip::rows(&data[3..], 10);
        assert_eq!(rows.lanes::<4>(2), [data[23], data[24], data[25], data[26]]);
        let strided = Strip {
            data: &data[1..],
            step: 1,
            lane: 9,
        };
        assert_eq!(strided.lanes::<3>(4), [data[5], data[14], data[23]]);
    }

    /// Row-major `B` packed a row at a time, in groups with a partial last panel, is what
    /// [`pack_b_panel`] makes panel by panel; so for `B` stored by columns.
    #[test]
    fn group_packing_equals_panel_packing() {
        const NR: usize = 8;
        let (k, cols, rs) = (37, 29, 33);
        let data = values(k * rs);
        let by_rows = MatRef::new(&data, k, cols, rs, 1).unwrap();
        let by_cols = MatRef::new(&data, k, cols, 1, rs).unwrap();
        for b in [by_rows, by_cols] {
            for (p0, kc, jp0, count) in [(0, k, 0, 4), (5, 20, 1, 3), (3, 9, 2, 2), (0, 1, 3, 1)] {
                let mut group = vec![f32::NAN; count * kc * NR];
                pack_b_group::<f32, NR>(&b, (p0, jp0), kc, &mut group);
                for (i, piece) in group.chunks_exact(kc * NR).enumerate() {
                    let mut want = vec![f32::NAN; kc * NR];
                    pack_b_panel::<f32, NR>(&b, (p0, (jp0 + i) * NR), &mut want);
                    assert_eq!(piece, &want[..], "p0 {p0} kc {kc} panel {}", jp0 + i);
                }
            }
        }
    }

    /// `A` stored by columns packs, in steps of [`A_STEPS`] and with partial tiles, to
    /// `[tile][kc][MR]` holding `A(i, p)`, zeros past the last row.
    #[test]
    fn column_packing_of_a_holds_every_element() {
        const MR: usize = 8;
        let (rows_total, k, cs) = (45, 40, 47);
        let data = values(k * cs);
        let a = MatRef::new(&data, rows_total, k, 1, cs).unwrap();
        for (i0, rows, p0, kc) in [
            (0usize, 45usize, 0usize, 40usize),
            (3, 21, 7, 33),
            (8, 8, 0, 17),
            (40, 5, 39, 1),
        ] {
            let tiles = rows.div_ceil(MR);
            let mut out = vec![f32::NAN; tiles * kc * MR];
            pack_a_block::<f32, MR>(&a, i0, rows, p0, kc, &mut out);
            for tile in 0..tiles {
                for p in 0..kc {
                    for r in 0..MR {
                        let i = tile * MR + r;
                        let want = if i < rows { a.at(i0 + i, p0 + p) } else { 0.0 };
                        assert_eq!(out[(tile * kc + p) * MR + r], want, "{i0} {rows} {p0} {kc}");
                    }
                }
            }
        }
    }

    #[test]
    fn pack_buffers_start_on_a_cache_line() {
        for len in [0, 1, 31, 4096] {
            let mut buffer = PackBuffer::<f32>::zeroed(len);
            assert_eq!(buffer.as_slice().len(), len);
            assert!(buffer.as_mut_slice().iter().all(|&x| x == 0.0));
            assert_eq!(buffer.as_slice().as_ptr() as usize % 64, 0);
        }
    }
}
