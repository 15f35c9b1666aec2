//! The one deterministic reduction every backend must reproduce.
//!
//! Contributions are combined **in ascending rank order**: `((x0 ∘ x1) ∘ x2) ∘ ...`, starting from
//! the lowest rank's value (not from zero, so a lone `-0.0` stays `-0.0`). bf16 payloads are
//! widened to f32, combined in f32 in the same order, and rounded to bf16 **once** at the end
//! (round-to-nearest-even, as `half::bf16::from_f32` does) — what GPU collectives that accumulate
//! in f32 do. `Avg` is the `Sum` result divided once by the number of contributions (in f32).
//! `Max`/`Min` propagate NaN. f64 payloads reduce in f64 the same way. u8 payloads are summed
//! exactly in u64 and wrap modulo 256 at the end (what MPI's `MPI_SUM` on `MPI_UINT8_T` gives);
//! their `Avg` is the exact sum divided by the count, rounded down.

use half::bf16;

use crate::buffer::Buffer;
use crate::types::{DType, ReduceOp};

/// Combine two f32 values with `op` (`Avg` combines like `Sum`; the division happens at the end).
#[inline]
fn combine(op: ReduceOp, acc: f32, x: f32) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc + x,
        ReduceOp::Max => {
            if acc.is_nan() || x.is_nan() {
                f32::NAN
            } else if x > acc {
                x
            } else {
                acc
            }
        }
        ReduceOp::Min => {
            if acc.is_nan() || x.is_nan() {
                f32::NAN
            } else if x < acc {
                x
            } else {
                acc
            }
        }
    }
}

/// Reduce f32 slices (given in ascending rank order) element-wise into an f32 vector.
///
/// All slices must have the same length; an empty list gives an empty vector.
pub fn reduce_f32_in_rank_order(op: ReduceOp, parts: &[&[f32]]) -> Vec<f32> {
    let Some(first) = parts.first() else {
        return Vec::new();
    };
    let mut acc = first.to_vec();
    for part in &parts[1..] {
        for (a, &x) in acc.iter_mut().zip(part.iter()) {
            *a = combine(op, *a, x);
        }
    }
    if op == ReduceOp::Avg {
        let n = parts.len() as f32;
        for a in &mut acc {
            *a /= n;
        }
    }
    acc
}

/// Reduce bf16 slices (ascending rank order): widen to f32, reduce in f32, round once to bf16.
pub fn reduce_bf16_in_rank_order(op: ReduceOp, parts: &[&[bf16]]) -> Vec<bf16> {
    let Some(first) = parts.first() else {
        return Vec::new();
    };
    let mut acc: Vec<f32> = first.iter().map(|x| x.to_f32()).collect();
    for part in &parts[1..] {
        for (a, x) in acc.iter_mut().zip(part.iter()) {
            *a = combine(op, *a, x.to_f32());
        }
    }
    if op == ReduceOp::Avg {
        let n = parts.len() as f32;
        for a in &mut acc {
            *a /= n;
        }
    }
    acc.into_iter().map(bf16::from_f32).collect()
}

/// Combine two f64 values with `op` (the f64 twin of `combine`).
#[inline]
fn combine_f64(op: ReduceOp, acc: f64, x: f64) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc + x,
        ReduceOp::Max | ReduceOp::Min if acc.is_nan() || x.is_nan() => f64::NAN,
        ReduceOp::Max => acc.max(x),
        ReduceOp::Min => acc.min(x),
    }
}

/// Reduce f64 slices (ascending rank order) element-wise in f64.
pub fn reduce_f64_in_rank_order(op: ReduceOp, parts: &[&[f64]]) -> Vec<f64> {
    let Some(first) = parts.first() else {
        return Vec::new();
    };
    let mut acc = first.to_vec();
    for part in &parts[1..] {
        for (a, &x) in acc.iter_mut().zip(part.iter()) {
            *a = combine_f64(op, *a, x);
        }
    }
    if op == ReduceOp::Avg {
        let n = parts.len() as f64;
        for a in &mut acc {
            *a /= n;
        }
    }
    acc
}

/// Reduce u8 slices element-wise: exact u64 sums wrapped modulo 256 (`Sum`), floor of the exact
/// mean (`Avg`), or the extreme value (`Max`/`Min`). Integer arithmetic, so order is irrelevant.
pub fn reduce_u8_in_rank_order(op: ReduceOp, parts: &[&[u8]]) -> Vec<u8> {
    let Some(first) = parts.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|i| {
            let column = parts.iter().map(|p| p[i]);
            match op {
                ReduceOp::Sum => column.map(u64::from).sum::<u64>() as u8,
                ReduceOp::Avg => (column.map(u64::from).sum::<u64>() / parts.len() as u64) as u8,
                ReduceOp::Max => column.max().unwrap_or(0),
                ReduceOp::Min => column.min().unwrap_or(0),
            }
        })
        .collect()
}

/// Reduce whole buffers of one dtype and equal length, given in ascending rank order.
///
/// Buffers of another dtype than the first are skipped (callers validate dtypes beforehand).
pub fn reduce_buffers_in_rank_order(op: ReduceOp, parts: &[&Buffer]) -> Buffer {
    let dtype = parts.first().map_or(DType::F32, |b| b.dtype());
    macro_rules! slices {
        ($variant:ident) => {
            parts
                .iter()
                .filter_map(|b| match b {
                    Buffer::$variant(v) => Some(v.as_slice()),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
    }
    match dtype {
        DType::F32 => Buffer::F32(reduce_f32_in_rank_order(op, &slices!(F32))),
        DType::Bf16 => Buffer::Bf16(reduce_bf16_in_rank_order(op, &slices!(Bf16))),
        DType::F64 => Buffer::F64(reduce_f64_in_rank_order(op, &slices!(F64))),
        DType::U8 => Buffer::U8(reduce_u8_in_rank_order(op, &slices!(U8))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_is_left_fold_in_rank_order() {
        // (1e8 + 1) + -1e8 = 0 in f32, whereas 1e8 + (1 + -1e8) = 0 too, but
        // (1 + 1e8) + -1e8 differs from 1 + (1e8 + -1e8) = 1: order matters.
        let a = [1.0f32];
        let b = [1e8f32];
        let c = [-1e8f32];
        assert_eq!(
            reduce_f32_in_rank_order(ReduceOp::Sum, &[&a, &b, &c]),
            vec![0.0]
        );
        assert_eq!(
            reduce_f32_in_rank_order(ReduceOp::Sum, &[&b, &c, &a]),
            vec![1.0]
        );
    }

    #[test]
    fn negative_zero_survives_a_single_contribution() {
        let a = [-0.0f32];
        let r = reduce_f32_in_rank_order(ReduceOp::Sum, &[&a]);
        assert_eq!(r[0].to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn bf16_is_reduced_in_f32_and_rounded_once() {
        // bf16 has 8 significant bits, so its spacing at 1 is 2^-7. Rounding after each add
        // keeps 1 + 2^-9 at 1 every time; in f32 the sum is 1 + 3 * 2^-9 = 1 + 0.75 * 2^-7,
        // which rounds once to 1 + 2^-7.
        let one = [bf16::from_f32(1.0)];
        let tiny = [bf16::from_f32(2f32.powi(-9))];
        let r = reduce_bf16_in_rank_order(ReduceOp::Sum, &[&one, &tiny, &tiny, &tiny]);
        assert_eq!(r[0].to_f32(), 1.0 + 2f32.powi(-7));
    }

    #[test]
    fn max_min_avg_and_nan() {
        let a = [1.0f32, f32::NAN, 4.0];
        let b = [3.0f32, 0.0, 2.0];
        let mx = reduce_f32_in_rank_order(ReduceOp::Max, &[&a, &b]);
        assert_eq!(mx[0], 3.0);
        assert!(mx[1].is_nan());
        assert_eq!(mx[2], 4.0);
        let mn = reduce_f32_in_rank_order(ReduceOp::Min, &[&a, &b]);
        assert_eq!((mn[0], mn[2]), (1.0, 2.0));
        let avg = reduce_f32_in_rank_order(ReduceOp::Avg, &[&a, &b]);
        assert_eq!((avg[0], avg[2]), (2.0, 3.0));
    }

    #[test]
    fn f64_and_u8_reductions() {
        let a = [1.0f64, f64::NAN];
        let b = [2.0f64, 0.0];
        let s = reduce_f64_in_rank_order(ReduceOp::Avg, &[&a, &b]);
        assert_eq!(s[0], 1.5);
        assert!(reduce_f64_in_rank_order(ReduceOp::Max, &[&a, &b])[1].is_nan());
        let x = [200u8, 3];
        let y = [100u8, 4];
        assert_eq!(
            reduce_u8_in_rank_order(ReduceOp::Sum, &[&x, &y]),
            vec![44, 7]
        );
        assert_eq!(
            reduce_u8_in_rank_order(ReduceOp::Avg, &[&x, &y]),
            vec![150, 3]
        );
        assert_eq!(
            reduce_u8_in_rank_order(ReduceOp::Max, &[&x, &y]),
            vec![200, 4]
        );
        assert_eq!(
            reduce_u8_in_rank_order(ReduceOp::Min, &[&x, &y]),
            vec![100, 3]
        );
    }
}
