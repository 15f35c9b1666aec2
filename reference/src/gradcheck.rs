//! Central finite differences in f64, for checking hand-written backward passes.

use crate::error::RefResult;
use crate::rng::KeyedRng;
use crate::tensor::Tensor;

/// `∂f/∂x_i ≈ (f(x + h e_i) − f(x − h e_i)) / 2h` for every element of `x`.
pub fn numeric_gradient(
    x: &Tensor<f64>,
    h: f64,
    mut f: impl FnMut(&Tensor<f64>) -> RefResult<f64>,
) -> RefResult<Tensor<f64>> {
    let mut g = Tensor::zeros(x.shape());
    let mut probe = x.clone();
    for i in 0..x.len() {
        let x0 = x.as_slice()[i];
        probe.as_mut_slice()[i] = x0 + h;
        let up = f(&probe)?;
        probe.as_mut_slice()[i] = x0 - h;
        let down = f(&probe)?;
        probe.as_mut_slice()[i] = x0;
        g.as_mut_slice()[i] = (up - down) / (2.0 * h);
    }
    Ok(g)
}

/// `max_i |a_i − n_i| / max(|n_i|, floor)`: relative error, absolute below `floor`.
/// Returns infinity for different shapes.
pub fn max_relative_error(analytic: &Tensor<f64>, numeric: &Tensor<f64>, floor: f64) -> f64 {
    if analytic.shape() != numeric.shape() {
        return f64::INFINITY;
    }
    analytic
        .as_slice()
        .iter()
        .zip(numeric.as_slice())
        .map(|(a, n)| (a - n).abs() / n.abs().max(floor))
        .fold(0.0, f64::max)
}

/// A fixed random tensor `r` used to turn an output `y` into the scalar `Σ y·r`.
pub fn probe(shape: &[usize], seed: u64) -> Tensor<f64> {
    let n: usize = shape.iter().product();
    let v = KeyedRng::new(seed, 0xC0FFEE).normal_range(0, n as u64);
    Tensor::from_vec(shape, v.into_iter().map(f64::from).collect())
        .expect("length matches the shape")
}

/// `Σ y_i r_i` in ascending order.
pub fn project(y: &Tensor<f64>, r: &Tensor<f64>) -> f64 {
    y.as_slice()
        .iter()
        .zip(r.as_slice())
        .fold(0.0, |acc, (a, b)| a.mul_add(*b, acc))
}
