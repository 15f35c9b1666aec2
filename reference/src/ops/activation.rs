//! Element-wise activations and the row softmax (libm `exp`, max-subtracted, ascending sums).

use crate::real::Real;

/// Logistic sigmoid `1 / (1 + e^-z)`.
#[inline]
pub fn sigmoid<T: Real>(z: T) -> T {
    T::ONE / (T::ONE + (-z).exp())
}

/// SiLU (swish): `z · sigmoid(z)`.
#[inline]
pub fn silu<T: Real>(z: T) -> T {
    z * sigmoid(z)
}

/// Derivative of SiLU: `σ(z) · (1 + z · (1 − σ(z)))`.
#[inline]
pub fn silu_grad<T: Real>(z: T) -> T {
    let s = sigmoid(z);
    s * (T::ONE + z * (T::ONE - s))
}

/// Softmax of one row in place: `m = max`, `e_j = exp(x_j − m)`, `s = Σ e_j` (ascending),
/// `p_j = e_j / s`. Entries equal to `-inf` become exactly 0.
pub fn softmax_in_place<T: Real>(row: &mut [T]) {
    let mut m = T::NEG_INFINITY;
    for &x in row.iter() {
        if x > m {
            m = x;
        }
    }
    if m == T::NEG_INFINITY {
        // Fully masked row: define the result as all zeros rather than NaN.
        row.fill(T::ZERO);
        return;
    }
    let mut s = T::ZERO;
    for x in row.iter_mut() {
        *x = (*x - m).exp();
        s += *x;
    }
    for x in row.iter_mut() {
        *x /= s;
    }
}

/// Backward of a row softmax: `dz_j = p_j · (dp_j − Σ_i p_i dp_i)` (sum ascending, fma).
pub fn softmax_backward_row<T: Real>(p: &[T], dp: &[T], dz: &mut [T]) {
    let mut dot = T::ZERO;
    for (&pi, &di) in p.iter().zip(dp) {
        dot = pi.mul_add(di, dot);
    }
    for ((z, &pi), &di) in dz.iter_mut().zip(p).zip(dp) {
        *z = pi * (di - dot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_basics() {
        let mut r = [1.0f64, 2.0, f64::NEG_INFINITY];
        softmax_in_place(&mut r);
        assert!((r[0] + r[1] - 1.0).abs() < 1e-15);
        assert_eq!(r[2], 0.0);
        let mut big = [1000.0f32, 1000.0];
        softmax_in_place(&mut big);
        assert_eq!(big, [0.5, 0.5]);
        let mut masked = [f32::NEG_INFINITY; 2];
        softmax_in_place(&mut masked);
        assert_eq!(masked, [0.0, 0.0]);
    }

    #[test]
    fn silu_grad_matches_finite_difference() {
        for z in [-3.0f64, -0.5, 0.0, 0.7, 4.0] {
            let h = 1e-6;
            let num = (silu(z + h) - silu(z - h)) / (2.0 * h);
            assert!((num - silu_grad(z)).abs() < 1e-9, "{z}");
        }
        assert_eq!(silu(-1000.0f32), -0.0);
    }
}
