//! Known inputs and the exact results they must give, for collbench's `#wrong` column.
//!
//! Rank `r` fills element `j` with `(r + 2j) mod 5`: small integers, so every sum over up to
//! 64 ranks (at most 256) is exact in f32 and bf16 whatever the reduction order, and a result
//! can be compared bit for bit with the expected value.

use half::bf16;

use crate::buffer::Buffer;
use crate::collbench::spec::BenchKind;
use crate::types::DType;

/// The known value of element `j` on global rank `rank`.
pub fn value(rank: usize, j: usize) -> f32 {
    ((rank + 2 * j) % 5) as f32
}

/// Rank `rank`'s input of `len` elements.
pub fn input(rank: usize, len: usize, dtype: DType) -> Buffer {
    // Inputs are small integers (0..=4), exact in every element type.
    to_buffer((0..len).map(|j| value(rank, j)).collect(), dtype)
}

/// Converts known values to a buffer of `dtype` (exact: they are small integers).
pub fn to_buffer(v: Vec<f32>, dtype: DType) -> Buffer {
    match dtype {
        DType::F32 => Buffer::F32(v),
        DType::Bf16 => Buffer::Bf16(v.into_iter().map(bf16::from_f32).collect()),
        DType::F64 => Buffer::F64(v.into_iter().map(f64::from).collect()),
        DType::U8 => Buffer::U8(v.into_iter().map(|x| x as u8).collect()),
    }
}

/// The in-place buffer of member `pos` (global rank `rank`) of a group of `n` for a
/// collective whose per-member input has `len` elements: all-gather's is the whole output
/// with the member's chunk holding its input (the rest zero), the others' is the input.
pub fn in_place_input(
    kind: BenchKind,
    rank: usize,
    pos: usize,
    n: usize,
    len: usize,
    dtype: DType,
) -> Buffer {
    if kind != BenchKind::AllGather {
        return input(rank, len, dtype);
    }
    let mut v = vec![0.0f32; len * n];
    for j in 0..len {
        v[pos * len + j] = value(rank, j);
    }
    to_buffer(v, dtype)
}

/// The exact output of member `pos` of a group with global ranks `ranks`, for a collective
/// of `kind` whose per-member input has `len` elements.
pub fn expected(kind: BenchKind, ranks: &[usize], pos: usize, len: usize) -> Vec<f32> {
    let n = ranks.len();
    match kind {
        BenchKind::AllGather => ranks
            .iter()
            .flat_map(|&r| (0..len).map(move |j| value(r, j)))
            .collect(),
        BenchKind::AllReduce => (0..len)
            .map(|j| ranks.iter().map(|&r| value(r, j)).sum())
            .collect(),
        BenchKind::ReduceScatter => {
            let c = len / n;
            (0..c)
                .map(|j| ranks.iter().map(|&r| value(r, pos * c + j)).sum())
                .collect()
        }
        BenchKind::Broadcast => (0..len).map(|j| value(ranks[0], j)).collect(),
        BenchKind::AllToAll => {
            let c = len / n;
            ranks
                .iter()
                .flat_map(|&r| (0..c).map(move |j| value(r, pos * c + j)))
                .collect()
        }
    }
}

/// Elements `start..start + len` of `b` as f32 (exact for the known values).
pub fn chunk(b: &Buffer, start: usize, len: usize) -> Buffer {
    let all: Vec<f32> = match b {
        Buffer::F32(v) => v.clone(),
        Buffer::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
        Buffer::F64(v) => v.iter().map(|&x| x as f32).collect(),
        Buffer::U8(v) => v.iter().map(|&x| f32::from(x)).collect(),
    };
    let end = (start + len).min(all.len());
    Buffer::F32(all.get(start..end).unwrap_or(&[]).to_vec())
}

/// Elements of `got` that differ from `want` (a length difference counts every missing or
/// extra element). Compares in place: no copy of the (possibly multi-GB) output.
pub fn count_wrong(got: &Buffer, want: &[f32]) -> u64 {
    fn differ(got: impl ExactSizeIterator<Item = f32>, want: &[f32]) -> u64 {
        let len = got.len();
        let wrong = got
            .zip(want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        (wrong + len.abs_diff(want.len())) as u64
    }
    match got {
        Buffer::F32(v) => differ(v.iter().copied(), want),
        Buffer::Bf16(v) => differ(v.iter().map(|x| x.to_f32()), want),
        Buffer::F64(v) => differ(v.iter().map(|&x| x as f32), want),
        Buffer::U8(v) => differ(v.iter().map(|&x| f32::from(x)), want),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_results_by_hand() {
        // ranks 0 and 1, 2 elements each: rank 0 = [0, 2], rank 1 = [1, 3].
        assert_eq!(
            expected(BenchKind::AllGather, &[0, 1], 0, 2),
            vec![0., 2., 1., 3.]
        );
        assert_eq!(expected(BenchKind::AllReduce, &[0, 1], 1, 2), vec![1., 5.]);
        assert_eq!(expected(BenchKind::ReduceScatter, &[0, 1], 1, 2), vec![5.]);
        assert_eq!(expected(BenchKind::Broadcast, &[0, 1], 1, 2), vec![0., 2.]);
        assert_eq!(expected(BenchKind::AllToAll, &[0, 1], 0, 2), vec![0., 1.]);
        assert_eq!(count_wrong(&Buffer::F32(vec![0., 1.]), &[0., 2., 3.]), 2);
    }
}
