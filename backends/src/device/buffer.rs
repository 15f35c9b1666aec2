//! Device-resident payloads: allocated once, reused by many collectives without host copies
//! (what a replay of a step program needs to time the communication alone).

use std::sync::Arc;

use half::bf16;

use super::runtime::{DevPtr, DeviceRuntime};
use crate::buffer::Buffer;
use crate::error::{CommError, CommResult};
use crate::types::{CollectiveKind, DType};

/// Smallest allocation made, so zero-element buffers still have a valid address.
const MIN_ALLOC_BYTES: usize = 64;

/// `len` elements of `dtype` in device memory, freed on drop.
pub struct DeviceBuffer {
    ptr: DevPtr,
    dtype: DType,
    len: usize,
    device_index: usize,
    rt: Arc<dyn DeviceRuntime>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("dtype", &self.dtype)
            .field("len", &self.len)
            .field("device_index", &self.device_index)
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocate `len` elements of `dtype` on device `device_index` (contents undefined).
    pub fn alloc(
        rt: Arc<dyn DeviceRuntime>,
        device_index: usize,
        dtype: DType,
        len: usize,
    ) -> CommResult<DeviceBuffer> {
        rt.set_device(device_index)?;
        let bytes = (len * dtype.size_bytes()).max(MIN_ALLOC_BYTES);
        let ptr = rt.malloc(bytes)?;
        Ok(DeviceBuffer {
            ptr,
            dtype,
            len,
            device_index,
            rt,
        })
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Payload size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * self.dtype.size_bytes()
    }

    /// The device address.
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    /// Copy a host buffer of the same type and length into this one (synchronous). Wait on
    /// every collective that uses this buffer first.
    pub fn upload(&self, host: &Buffer) -> CommResult<()> {
        if host.dtype() != self.dtype || host.len() != self.len {
            return Err(CommError::InvalidArgument {
                kind: CollectiveKind::Send,
                reason: format!(
                    "uploading {} {} elements into a device buffer of {} {} elements",
                    host.len(),
                    host.dtype(),
                    self.len,
                    self.dtype
                ),
            });
        }
        self.rt.set_device(self.device_index)?;
        self.rt.copy_to_device(self.ptr, host_bytes(host))
    }

    /// Copy the contents back to a host buffer (synchronous). Wait on every collective that
    /// writes this buffer first.
    pub fn download(&self) -> CommResult<Buffer> {
        let mut out = Buffer::zeros(self.dtype, self.len);
        self.rt.set_device(self.device_index)?;
        self.rt.copy_to_host(host_bytes_mut(&mut out), self.ptr)?;
        Ok(out)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // A failure here leaks device memory; there is no caller to report it to.
        let _ = self.rt.set_device(self.device_index);
        let _ = self.rt.free(self.ptr);
    }
}

/// The bytes of a host buffer (f32, bf16, f64 and u8 have no padding and no invalid bit
/// patterns).
pub(crate) fn host_bytes(b: &Buffer) -> &[u8] {
    match b {
        // SAFETY: a live slice reinterpreted as bytes; u8 has alignment 1.
        Buffer::F64(v) => unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(&v[..]))
        },
        Buffer::U8(v) => v,
        // SAFETY: a live slice reinterpreted as bytes; u8 has alignment 1.
        Buffer::F32(v) => unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(&v[..]))
        },
        // SAFETY: as above (bf16 is a transparent u16).
        Buffer::Bf16(v) => unsafe {
            std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(&v[..]))
        },
    }
}

/// The bytes of a host buffer, writable (every bit pattern is a valid f32 / bf16).
pub(crate) fn host_bytes_mut(b: &mut Buffer) -> &mut [u8] {
    match b {
        // SAFETY: as in host_bytes, with unique access.
        Buffer::F64(v) => unsafe {
            let n = std::mem::size_of_val(&v[..]);
            std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), n)
        },
        Buffer::U8(v) => v,
        // SAFETY: as in host_bytes, with unique access.
        Buffer::F32(v) => unsafe {
            let n = std::mem::size_of_val(&v[..]);
            std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), n)
        },
        // SAFETY: as above.
        Buffer::Bf16(v) => unsafe {
            let n = std::mem::size_of_val(&v[..]);
            std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), n)
        },
    }
}

/// Divide every element by `n` on the host (HCCL has no native average: it sums, and the
/// host path divides once after the copy back; bf16 is thus rounded twice).
pub(crate) fn divide_in_place(b: &mut Buffer, n: usize) {
    let n = n as f32;
    match b {
        Buffer::F32(v) => v.iter_mut().for_each(|x| *x /= n),
        Buffer::Bf16(v) => v
            .iter_mut()
            .for_each(|x| *x = bf16::from_f32(x.to_f32() / n)),
        Buffer::F64(v) => v.iter_mut().for_each(|x| *x /= n as f64),
        // Integer payloads are counts: an average truncates toward zero.
        Buffer::U8(v) => v.iter_mut().for_each(|x| *x = (*x as f32 / n) as u8),
    }
}
