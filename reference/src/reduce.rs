//! Fixed-order reductions: every sum runs over its index in ascending order on one thread.
//!
//! Never use `Iterator::sum` on a rayon iterator or ndarray's `sum()` in golden code: both
//! change the association with the data layout or the thread split.

use crate::error::{RefError, RefResult};
use crate::real::Real;
use crate::tensor::Tensor;

/// `((x0 + x1) + x2) + ...`, starting from zero.
pub fn sum<T: Real>(xs: &[T]) -> T {
    let mut acc = T::ZERO;
    for &x in xs {
        acc += x;
    }
    acc
}

/// `Σ a_i b_i` with one fused multiply-add per step, `i` ascending (the matmul order).
pub fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut acc = T::ZERO;
    for (&x, &y) in a.iter().zip(b) {
        acc = x.mul_add(y, acc);
    }
    acc
}

/// `Σ x_i²` with fused multiply-adds, `i` ascending.
pub fn sum_squares<T: Real>(xs: &[T]) -> T {
    dot(xs, xs)
}

/// Largest element (NaN-propagating); `-inf` for an empty slice.
pub fn max<T: Real>(xs: &[T]) -> T {
    let mut m = T::NEG_INFINITY;
    for &x in xs {
        if x.partial_cmp(&m).is_none() {
            return x;
        }
        if x > m {
            m = x;
        }
    }
    m
}

/// Sum over `axis`, each output adding its inputs in ascending index order.
pub fn sum_axis<T: Real>(t: &Tensor<T>, axis: usize) -> RefResult<Tensor<T>> {
    let shape = t.shape();
    if axis >= shape.len() {
        return Err(RefError::invalid(
            "sum_axis",
            format!("axis {axis} of a {}-D tensor", shape.len()),
        ));
    }
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out_shape = shape.to_vec();
    out_shape.remove(axis);
    let x = t.as_slice();
    let mut out = vec![T::ZERO; outer * inner];
    for o in 0..outer {
        let dst = &mut out[o * inner..(o + 1) * inner];
        for l in 0..len {
            let src = &x[(o * len + l) * inner..(o * len + l + 1) * inner];
            for (d, &s) in dst.iter_mut().zip(src) {
                *d += s;
            }
        }
    }
    Tensor::from_vec(&out_shape, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_axis_is_ascending_per_output() {
        let t = Tensor::<f32>::from_fn(&[2, 3, 2], |i| i as f32);
        let s0 = sum_axis(&t, 0).unwrap();
        assert_eq!(s0.shape(), &[3, 2]);
        assert_eq!(s0.as_slice(), &[6.0, 8.0, 10.0, 12.0, 14.0, 16.0]);
        let s1 = sum_axis(&t, 1).unwrap();
        assert_eq!(s1.as_slice(), &[6.0, 9.0, 24.0, 27.0]);
        let s2 = sum_axis(&t, 2).unwrap();
        assert_eq!(s2.as_slice(), &[1.0, 5.0, 9.0, 13.0, 17.0, 21.0]);
        assert!(sum_axis(&t, 3).is_err());
        // Order matters and is ascending: (1e8 + 1) - 1e8 = 0 in f32.
        let o = Tensor::<f32>::from_vec(&[3, 1], vec![1e8, 1.0, -1e8]).unwrap();
        assert_eq!(sum_axis(&o, 0).unwrap().as_slice(), &[0.0]);
        assert_eq!(sum(&[1e8f32, 1.0, -1e8]), 0.0);
    }

    #[test]
    fn dot_and_max() {
        assert_eq!(dot(&[1.0f64, 2.0], &[3.0, 4.0]), 11.0);
        assert_eq!(sum_squares(&[3.0f32, 4.0]), 25.0);
        assert_eq!(max(&[1.0f32, 5.0, -2.0]), 5.0);
        assert!(max(&[1.0f32, f32::NAN]).is_nan());
        assert_eq!(max::<f32>(&[]), f32::NEG_INFINITY);
    }
}
