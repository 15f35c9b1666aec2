//! A read-only strided matrix view ([`MatRef`]): how the GEMM ([`crate::matmul`]) and its
//! operand packing ([`crate::matmul_pack`]) see their inputs, in any layout, without copies.

use crate::error::{RefError, RefResult};
use crate::real::Real;
use crate::tensor::Tensor;

/// A read-only strided matrix view: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a, T> {
    pub(crate) data: &'a [T],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

impl<'a, T: Real> MatRef<'a, T> {
    /// A view with explicit strides; fails if any element would fall outside `data`.
    pub fn new(data: &'a [T], rows: usize, cols: usize, rs: usize, cs: usize) -> RefResult<Self> {
        if rows > 0 && cols > 0 {
            let last = (rows - 1)
                .checked_mul(rs)
                .and_then(|x| (cols - 1).checked_mul(cs).and_then(|y| x.checked_add(y)));
            match last {
                Some(l) if l < data.len() => {}
                _ => {
                    return Err(RefError::shape(
                        "MatRef::new",
                        format!(
                            "{rows}x{cols} view with strides ({rs}, {cs}) does not fit {} elements",
                            data.len()
                        ),
                    ));
                }
            }
        }
        Ok(MatRef {
            data,
            rows,
            cols,
            rs,
            cs,
        })
    }

    /// A row-major `rows x cols` view (`data` may be longer).
    pub fn row_major(data: &'a [T], rows: usize, cols: usize) -> RefResult<Self> {
        Self::new(data, rows, cols, cols, 1)
    }

    /// A 2-D tensor as a row-major view.
    pub fn from_tensor(t: &'a Tensor<T>, op: &'static str) -> RefResult<Self> {
        let (r, c) = t.dims2(op)?;
        Self::row_major(t.as_slice(), r, c)
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        MatRef {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Element `(i, j)`; the caller keeps `i < rows`, `j < cols`.
    #[inline(always)]
    pub fn at(&self, i: usize, j: usize) -> T {
        self.data[i * self.rs + j * self.cs]
    }
}
