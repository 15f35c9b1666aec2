//! A dense, row-major, contiguous tensor (`f32` by default, `f64` for gradient checks).
//!
//! Deliberately thin: a shape and a `Vec`. It converts to and from `ndarray` arrays for interop,
//! but every kernel in this crate works on the flat slice so the summation order is explicit.

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::error::{RefError, RefResult};
use crate::real::Real;

/// A dense row-major tensor. Invariant: `data.len() == shape.iter().product()`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor<T: Real = f32> {
    shape: Vec<usize>,
    data: Vec<T>,
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl<T: Real> Tensor<T> {
    /// A tensor over `data` with `shape`; fails if the sizes disagree.
    pub fn from_vec(shape: &[usize], data: Vec<T>) -> RefResult<Self> {
        if numel(shape) != data.len() {
            return Err(RefError::shape(
                "Tensor::from_vec",
                format!(
                    "shape {shape:?} needs {} elements, got {}",
                    numel(shape),
                    data.len()
                ),
            ));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Self {
        Self::full(shape, T::ZERO)
    }

    /// A tensor filled with `value`.
    pub fn full(shape: &[usize], value: T) -> Self {
        Tensor {
            shape: shape.to_vec(),
            data: vec![value; numel(shape)],
        }
    }

    /// A tensor whose element at flat (row-major) index `i` is `f(i)`.
    pub fn from_fn(shape: &[usize], f: impl FnMut(usize) -> T) -> Self {
        Tensor {
            shape: shape.to_vec(),
            data: (0..numel(shape)).map(f).collect(),
        }
    }

    /// Copy an `ndarray` array (any layout) into a row-major tensor.
    pub fn from_array(a: &ArrayD<T>) -> Self {
        Tensor {
            shape: a.shape().to_vec(),
            data: a.iter().copied().collect(),
        }
    }

    /// An `ndarray` view of the data.
    pub fn view(&self) -> ArrayViewD<'_, T> {
        ArrayViewD::from_shape(IxDyn(&self.shape), &self.data)
            .expect("tensor invariant: data length equals the shape's product")
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The elements in row-major order.
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// The elements in row-major order, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// Take the elements out.
    pub fn into_vec(self) -> Vec<T> {
        self.data
    }

    /// The same elements under another shape with the same element count.
    pub fn reshape(self, shape: &[usize]) -> RefResult<Self> {
        if numel(shape) != self.data.len() {
            return Err(RefError::shape(
                "Tensor::reshape",
                format!("cannot view {:?} as {shape:?}", self.shape),
            ));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            data: self.data,
        })
    }

    /// Fail unless the shape is exactly `want`.
    pub fn expect_shape(&self, op: &'static str, want: &[usize]) -> RefResult<()> {
        if self.shape == want {
            Ok(())
        } else {
            Err(RefError::shape(
                op,
                format!("expected {want:?}, got {:?}", self.shape),
            ))
        }
    }

    /// `(rows, cols)` of a 2-D tensor, or an error naming `op`.
    pub fn dims2(&self, op: &'static str) -> RefResult<(usize, usize)> {
        match self.shape[..] {
            [r, c] => Ok((r, c)),
            _ => Err(RefError::shape(
                op,
                format!("expected a 2-D tensor, got {:?}", self.shape),
            )),
        }
    }

    /// Row `i` of a tensor viewed as `[shape[0], rest]`.
    ///
    /// # Panics
    /// If `i >= shape[0]`, like slice indexing.
    pub fn row(&self, i: usize) -> &[T] {
        let w = self.row_len();
        &self.data[i * w..(i + 1) * w]
    }

    /// Mutable row `i`.
    ///
    /// # Panics
    /// If `i >= shape[0]`, like slice indexing.
    pub fn row_mut(&mut self, i: usize) -> &mut [T] {
        let w = self.row_len();
        &mut self.data[i * w..(i + 1) * w]
    }

    /// Elements per index of the first dimension.
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Element-wise conversion to another real type (f32 → f64 is exact).
    pub fn cast<U: Real>(&self) -> Tensor<U> {
        Tensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(|x| U::from_f64(x.to_f64())).collect(),
        }
    }

    /// Element-wise `self + other` (same shapes).
    pub fn add(&self, other: &Tensor<T>) -> RefResult<Tensor<T>> {
        self.zip_map("Tensor::add", other, |a, b| a + b)
    }

    /// In-place `self += other` (same shapes).
    pub fn add_assign(&mut self, other: &Tensor<T>) -> RefResult<()> {
        if self.shape != other.shape {
            return Err(RefError::shape(
                "Tensor::add_assign",
                format!("{:?} vs {:?}", self.shape, other.shape),
            ));
        }
        for (a, &b) in self.data.iter_mut().zip(&other.data) {
            *a += b;
        }
        Ok(())
    }

    /// Element-wise map.
    pub fn map(&self, f: impl Fn(T) -> T) -> Tensor<T> {
        Tensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(|&x| f(x)).collect(),
        }
    }

    /// Element-wise combination of two same-shape tensors.
    pub fn zip_map(
        &self,
        op: &'static str,
        other: &Tensor<T>,
        f: impl Fn(T, T) -> T,
    ) -> RefResult<Tensor<T>> {
        if self.shape != other.shape {
            return Err(RefError::shape(
                op,
                format!("{:?} vs {:?}", self.shape, other.shape),
            ));
        }
        Ok(Tensor {
            shape: self.shape.clone(),
            data: self
                .data
                .iter()
                .zip(&other.data)
                .map(|(&a, &b)| f(a, b))
                .collect(),
        })
    }

    /// Bit patterns of the elements (widened to u64).
    pub fn bits(&self) -> Vec<u64> {
        self.data.iter().map(|x| x.to_bits_u64()).collect()
    }

    /// A 64-bit FNV-1a digest of the shape and element bits (for golden comparisons).
    pub fn digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |x: u64| {
            for b in x.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        for &d in &self.shape {
            eat(d as u64);
        }
        for x in &self.data {
            eat(x.to_bits_u64());
        }
        h
    }

    /// Whether both tensors have the same shape and the same bits everywhere.
    pub fn bit_eq(&self, other: &Tensor<T>) -> bool {
        self.shape == other.shape
            && self
                .data
                .iter()
                .zip(&other.data)
                .all(|(a, b)| a.to_bits_u64() == b.to_bits_u64())
    }

    /// Largest absolute element-wise difference (in f64), or `None` for different shapes.
    pub fn max_abs_diff(&self, other: &Tensor<T>) -> Option<f64> {
        (self.shape == other.shape).then(|| {
            self.data
                .iter()
                .zip(&other.data)
                .map(|(a, b)| (a.to_f64() - b.to_f64()).abs())
                .fold(0.0, f64::max)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_helpers() {
        let t = Tensor::<f32>::from_fn(&[2, 3], |i| i as f32);
        assert_eq!(t.dims2("t").unwrap(), (2, 3));
        assert_eq!(t.row(1), &[3.0, 4.0, 5.0]);
        assert!(Tensor::<f32>::from_vec(&[2, 2], vec![0.0; 3]).is_err());
        let r = t.clone().reshape(&[3, 2]).unwrap();
        assert_eq!(r.shape(), &[3, 2]);
        assert!(t.clone().reshape(&[4]).is_err());
        assert!(t.expect_shape("t", &[3, 2]).is_err());
        assert_eq!(t.view()[[1, 2]], 5.0);
        let back = Tensor::from_array(&t.view().to_owned());
        assert!(back.bit_eq(&t));
        assert_eq!(t.cast::<f64>().cast::<f32>(), t);
        assert_ne!(t.digest(), r.digest(), "digest covers the shape");
    }
}
