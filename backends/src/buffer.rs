//! Owned communication payloads.
//!
//! A backend takes a [`Buffer`] by value when a call is issued and hands a buffer back when its
//! handle is waited on, so an asynchronous call can never race with the caller's use of the
//! memory (the ownership model an MPI/NCCL host-staging implementation needs as well).

use half::bf16;

use crate::error::{CommError, CommResult};
use crate::types::DType;

/// A contiguous payload of one element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Buffer {
    /// f32 elements.
    F32(Vec<f32>),
    /// bf16 elements.
    Bf16(Vec<bf16>),
    /// f64 elements.
    F64(Vec<f64>),
    /// Bytes.
    U8(Vec<u8>),
}

/// Applies the same expression to the vector inside any variant.
macro_rules! each {
    ($buf:expr, $v:ident => $e:expr) => {
        match $buf {
            Buffer::F32($v) => $e,
            Buffer::Bf16($v) => $e,
            Buffer::F64($v) => $e,
            Buffer::U8($v) => $e,
        }
    };
}

/// Applies the same expression to the vector inside any variant and rewraps it in that variant.
macro_rules! map_each {
    ($buf:expr, $v:ident => $e:expr) => {
        match $buf {
            Buffer::F32($v) => Buffer::F32($e),
            Buffer::Bf16($v) => Buffer::Bf16($e),
            Buffer::F64($v) => Buffer::F64($e),
            Buffer::U8($v) => Buffer::U8($e),
        }
    };
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
            DType::F64 => Buffer::F64(vec![0.0; len]),
            DType::U8 => Buffer::U8(vec![0; len]),
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
            Buffer::F64(_) => DType::F64,
            Buffer::U8(_) => DType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each!(self, v => v.len())
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
        map_each!(self, v => v[start..end].to_vec())
    }

    /// Concatenate buffers of one type, in the order given (all must share `dtype`; parts of
    /// another type are skipped, callers validate dtypes beforehand).
    pub(crate) fn concat(dtype: DType, parts: &[&Buffer]) -> Buffer {
        let total = parts.iter().map(|p| p.len()).sum();
        let mut out = Buffer::empty(dtype);
        match &mut out {
            Buffer::F32(o) => o.reserve(total),
            Buffer::Bf16(o) => o.reserve(total),
            Buffer::F64(o) => o.reserve(total),
            Buffer::U8(o) => o.reserve(total),
        }
        for p in parts {
            match (&mut out, p) {
                (Buffer::F32(o), Buffer::F32(v)) => o.extend_from_slice(v),
                (Buffer::Bf16(o), Buffer::Bf16(v)) => o.extend_from_slice(v),
                (Buffer::F64(o), Buffer::F64(v)) => o.extend_from_slice(v),
                (Buffer::U8(o), Buffer::U8(v)) => o.extend_from_slice(v),
                _ => {}
            }
        }
        out
    }

    /// Bit patterns of the elements, widened to u64 (for bit-exact comparisons and digests).
    pub fn to_bits(&self) -> Vec<u64> {
        match self {
            Buffer::F32(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
            Buffer::Bf16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
            Buffer::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
            Buffer::U8(v) => v.iter().map(|&x| u64::from(x)).collect(),
        }
    }

    /// The elements' little-endian bytes, back to back (the wire form of process backends).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            Buffer::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Buffer::Bf16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Buffer::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Buffer::U8(v) => v.clone(),
        }
    }

    /// Rebuild a buffer of `dtype` from its little-endian bytes (the inverse of
    /// [`Buffer::to_le_bytes`]); fails if the byte count is not a whole number of elements.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> CommResult<Buffer> {
        let size = dtype.size_bytes();
        if !bytes.len().is_multiple_of(size) {
            return Err(CommError::InvalidWorld(format!(
                "{} bytes are not a whole number of {dtype} elements ({size} bytes each)",
                bytes.len()
            )));
        }
        Ok(match dtype {
            DType::F32 => Buffer::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            DType::Bf16 => Buffer::Bf16(
                bytes
                    .chunks_exact(2)
                    .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            DType::F64 => Buffer::F64(
                bytes
                    .chunks_exact(8)
                    .map(|c| {
                        let mut a = [0u8; 8];
                        a.copy_from_slice(c);
                        f64::from_le_bytes(a)
                    })
                    .collect(),
            ),
            DType::U8 => Buffer::U8(bytes.to_vec()),
        })
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

impl From<Vec<f64>> for Buffer {
    fn from(v: Vec<f64>) -> Self {
        Buffer::F64(v)
    }
}

impl From<Vec<u8>> for Buffer {
    fn from(v: Vec<u8>) -> Self {
        Buffer::U8(v)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for f64 {}
    impl Sealed for u8 {}
}

/// An element type a backend can move: `f32`, `half::bf16`, `f64` or `u8` (sealed).
pub trait Element: sealed::Sealed + Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Wrap a vector of this type into a [`crate::Buffer`].
    fn into_buffer(v: Vec<Self>) -> Buffer;
    /// Unwrap a [`crate::Buffer`] holding this type, or report the dtype it holds.
    fn from_buffer(b: Buffer) -> CommResult<Vec<Self>>;
}

/// Implements [`Element`] for a type and its [`crate::Buffer`] variant.
macro_rules! element {
    ($t:ty, $dtype:ident, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            fn into_buffer(v: Vec<Self>) -> Buffer {
                Buffer::$variant(v)
            }
            fn from_buffer(b: Buffer) -> CommResult<Vec<Self>> {
                match b {
                    Buffer::$variant(v) => Ok(v),
                    other => Err(CommError::DTypeMismatch {
                        expected: DType::$dtype,
                        actual: other.dtype(),
                    }),
                }
            }
        }
    };
}

element!(f32, F32, F32);
element!(bf16, Bf16, Bf16);
element!(f64, F64, F64);
element!(u8, U8, U8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn le_bytes_round_trip_every_dtype() {
        let bufs = [
            Buffer::F32(vec![1.5, -0.0, f32::NAN, f32::MIN_POSITIVE]),
            Buffer::Bf16(vec![bf16::from_f32(3.0), bf16::NEG_ZERO]),
            Buffer::F64(vec![std::f64::consts::PI, -1e300]),
            Buffer::U8(vec![0, 7, 255]),
        ];
        for b in bufs {
            let back = Buffer::from_le_bytes(b.dtype(), &b.to_le_bytes()).unwrap();
            assert_eq!(back.to_bits(), b.to_bits());
            assert_eq!(back.dtype(), b.dtype());
        }
        assert!(Buffer::from_le_bytes(DType::F64, &[0u8; 7]).is_err());
    }

    #[test]
    fn concat_and_slice_keep_order() {
        let a = Buffer::U8(vec![1, 2]);
        let b = Buffer::U8(vec![3]);
        let c = Buffer::concat(DType::U8, &[&a, &b]);
        assert_eq!(c, Buffer::U8(vec![1, 2, 3]));
        assert_eq!(c.slice(1, 3), Buffer::U8(vec![2, 3]));
    }
}
