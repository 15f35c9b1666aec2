//! Owned communication payloads.
//!
//! A backend takes a [`Buffer`] by value when a call is issued and hands a buffer back when its
//! handle is waited on, so an asynchronous call can never race with the caller's use of the
//! memory (the ownership model an MPI/NCCL host-staging implementation needs as well).

use half::bf16;

use crate::error::CommResult;
use crate::types::{DType, Element};

/// A contiguous payload of one element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Buffer {
    /// f32 elements.
    F32(Vec<f32>),
    /// bf16 elements.
    Bf16(Vec<bf16>),
}

impl Buffer {
    /// An empty buffer of the given type.
    pub fn empty(dtype: DType) -> Buffer {
        Buffer::zeros(dtype, 0)
    }

    /// `len` zeros of the given type.
    pub fn zeros(dtype: DType, len: usize) -> Buffer {
        match dtype {
            DType::F32 => Buffer::F32(vec![0.0; len]),
            DType::Bf16 => Buffer::Bf16(vec![bf16::ZERO; len]),
        }
    }

    /// Wrap a typed vector.
    pub fn from_vec<T: Element>(v: Vec<T>) -> Buffer {
        T::into_buffer(v)
    }

    /// Unwrap into a typed vector, failing if the element type differs.
    pub fn into_vec<T: Element>(self) -> CommResult<Vec<T>> {
        T::from_buffer(self)
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::F32(_) => DType::F32,
            Buffer::Bf16(_) => DType::Bf16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Buffer::F32(v) => v.len(),
            Buffer::Bf16(v) => v.len(),
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    /// A copy of elements `[start, end)`; internal callers guarantee the range is in bounds.
    pub(crate) fn slice(&self, start: usize, end: usize) -> Buffer {
        match self {
            Buffer::F32(v) => Buffer::F32(v[start..end].to_vec()),
            Buffer::Bf16(v) => Buffer::Bf16(v[start..end].to_vec()),
        }
    }

    /// Concatenate buffers of one type, in the order given (all must share `dtype`).
    pub(crate) fn concat(dtype: DType, parts: &[&Buffer]) -> Buffer {
        match dtype {
            DType::F32 => {
                let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
                for p in parts {
                    if let Buffer::F32(v) = p {
                        out.extend_from_slice(v);
                    }
                }
                Buffer::F32(out)
            }
            DType::Bf16 => {
                let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
                for p in parts {
                    if let Buffer::Bf16(v) = p {
                        out.extend_from_slice(v);
                    }
                }
                Buffer::Bf16(out)
            }
        }
    }

    /// Bit patterns of the elements, widened to u32 (for bit-exact comparisons and digests).
    pub fn to_bits(&self) -> Vec<u32> {
        match self {
            Buffer::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            Buffer::Bf16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
        }
    }
}

impl From<Vec<f32>> for Buffer {
    fn from(v: Vec<f32>) -> Self {
        Buffer::F32(v)
    }
}

impl From<Vec<bf16>> for Buffer {
    fn from(v: Vec<bf16>) -> Self {
        Buffer::Bf16(v)
    }
}
