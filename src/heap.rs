//! Heap settings for commands that allocate and free the same large buffers thousands of
//! times (the calibration fit re-simulates its runs on every evaluation).
//!
//! glibc's allocator serves a buffer above its mmap threshold (128 KiB at first) with a fresh
//! `mmap` and returns it with `munmap`, and gives the free top of each heap back to the kernel
//! once it exceeds the trim threshold; each round trip costs page faults when the buffer is
//! touched again. On `calibrate --fit --loo` that was 1.6 million page faults and a fifth of
//! the CPU time (4.6 of 24 CPU-s, all system time). [`keep_freed_memory`] raises both
//! thresholds, so freed buffers stay in the process and are reused.

/// Buffers below this many bytes come from the heap, not from their own `mmap` (glibc's
/// largest allowed threshold on 64-bit targets).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD_BYTES: libc::c_int = 32 << 20;

/// Free memory at the top of a heap is kept up to this many bytes.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD_BYTES: libc::c_int = 1 << 30;

/// Keeps freed heap memory in the process for reuse (see the module documentation). Only
/// memory allocated once is kept, so the peak resident memory barely moves (40 -> 44 MB on
/// the paper fit). A no-op outside glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's thresholds; it is called before the
    // command allocates its large buffers and is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
    }
}
