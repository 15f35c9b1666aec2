//! Reusable communication buffers: a replay issues thousands of collectives of a few sizes,
//! so buffers returned by finished collectives are kept per (dtype, length) and reused.

use std::collections::HashMap;

use crate::buffer::Buffer;
use crate::types::DType;

/// Free buffers by element type and length.
#[derive(Debug, Default)]
pub struct BufferPool {
    free: HashMap<(DType, usize), Vec<Buffer>>,
    allocated: usize,
    reused: usize,
}

impl BufferPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// A buffer of `len` elements of `dtype`: a reused one, or a new one filled with `fill`
    /// (contents are irrelevant to the timing; a rank-dependent fill keeps reductions honest).
    pub fn take(&mut self, dtype: DType, len: usize, fill: f32) -> Buffer {
        if let Some(b) = self.free.get_mut(&(dtype, len)).and_then(Vec::pop) {
            self.reused += 1;
            return b;
        }
        self.allocated += 1;
        match dtype {
            DType::F32 => Buffer::F32(vec![fill; len]),
            DType::Bf16 => Buffer::Bf16(vec![half::bf16::from_f32(fill); len]),
            DType::F64 => Buffer::F64(vec![f64::from(fill); len]),
            DType::U8 => Buffer::U8(vec![fill as u8; len]),
        }
    }

    /// Returns a buffer for reuse.
    pub fn put(&mut self, buffer: Buffer) {
        if !buffer.is_empty() {
            self.free
                .entry((buffer.dtype(), buffer.len()))
                .or_default()
                .push(buffer);
        }
    }

    /// Buffers allocated so far.
    pub fn allocated(&self) -> usize {
        self.allocated
    }

    /// Takes served from the pool so far.
    pub fn reused(&self) -> usize {
        self.reused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_by_type_and_length() {
        let mut p = BufferPool::new();
        let a = p.take(DType::F32, 8, 1.0);
        assert_eq!(a.len(), 8);
        p.put(a);
        let b = p.take(DType::F32, 8, 2.0);
        assert_eq!(p.reused(), 1);
        let c = p.take(DType::Bf16, 8, 2.0);
        assert_eq!(c.dtype(), DType::Bf16);
        assert_eq!(p.allocated(), 2);
        p.put(b);
    }
}
