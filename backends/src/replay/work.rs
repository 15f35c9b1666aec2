//! Compute and copy ops as work on the CPU.
//!
//! - **Busy** ([`spin_for`]): spin on the wall clock for the op's predicted duration (the
//!   simulator's span for that op on the chosen profile), so the replay measures the
//!   communication schedule with compute that takes exactly what the model says.
//! - **Real** ([`gemm_flops`], [`copy_bytes`]): a plain f32 GEMM with the op's FLOPs and a
//!   real memory copy of the op's bytes. Shape rule: a compute op of `F` FLOPs is
//!   `r` multiplications of square `s x s` by `s x s` matrices with
//!   `s = clamp(round(cbrt(F / 2)), 1, 256)` and `r = max(1, round(F / (2 s^3)))`, so the
//!   FLOPs match to rounding while a matrix stays cache-sized (256^3 MACs = 33.5 MFLOP per
//!   product). Copies move `min(bytes, 16 MiB)` at a time until the op's bytes are copied.
//!
//! Every loop calls `tick` between short slices of work, so the caller can notice collectives
//! finishing (and faults) while the CPU is busy.

use std::time::{Duration, Instant};

/// How often a busy spin calls `tick`.
const TICK_EVERY: Duration = Duration::from_micros(20);
/// Largest matrix side of a real-mode GEMM.
const MAX_GEMM_SIDE: usize = 256;
/// Largest single memcpy of a real-mode copy.
const MAX_COPY_BYTES: usize = 16 << 20;

/// Spins until `duration` has passed on the wall clock, calling `tick` every ~20 µs; stops
/// early when `tick` returns false.
pub fn spin_for(duration: Duration, tick: &mut dyn FnMut() -> bool) {
    let start = Instant::now();
    let mut last_tick = start;
    loop {
        let now = Instant::now();
        if now.duration_since(start) >= duration {
            return;
        }
        if now.duration_since(last_tick) >= TICK_EVERY {
            last_tick = now;
            if !tick() {
                return;
            }
        }
        std::hint::spin_loop();
    }
}

/// The `(side, repeats)` of the GEMMs standing for `flops` FLOPs (see the module rule).
pub fn gemm_shape(flops: u64) -> (usize, usize) {
    let f = flops as f64;
    let side = (f / 2.0).cbrt().round().clamp(1.0, MAX_GEMM_SIDE as f64) as usize;
    let per = 2.0 * (side as f64).powi(3);
    let repeats = (f / per).round().max(1.0) as usize;
    (side, repeats)
}

/// Reusable matrices of the real compute mode.
#[derive(Debug, Default)]
pub struct GemmScratch {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl GemmScratch {
    /// Empty scratch space (grown on first use).
    pub fn new() -> Self {
        Self::default()
    }
}

/// Runs GEMMs worth `flops` FLOPs (shape rule in the module doc); `tick` is called between
/// row blocks and stops the work early when it returns false. Returns a checksum so the
/// work cannot be optimised away.
pub fn gemm_flops(flops: u64, scratch: &mut GemmScratch, tick: &mut dyn FnMut() -> bool) -> f32 {
    let (s, repeats) = gemm_shape(flops);
    let n = s * s;
    if scratch.a.len() < n {
        scratch.a = (0..n).map(|i| (i % 13) as f32 * 0.01).collect();
        scratch.b = (0..n).map(|i| (i % 7) as f32 * 0.02).collect();
        scratch.c = vec![0.0; n];
    }
    let (a, b, c) = (&scratch.a[..n], &scratch.b[..n], &mut scratch.c[..n]);
    for _ in 0..repeats {
        c.fill(0.0);
        for i in 0..s {
            for k in 0..s {
                let aik = a[i * s + k];
                let (row_c, row_b) = (&mut c[i * s..(i + 1) * s], &b[k * s..(k + 1) * s]);
                for (cj, bj) in row_c.iter_mut().zip(row_b) {
                    *cj += aik * bj;
                }
            }
            if i % 16 == 15 && !tick() {
                return c[0];
            }
        }
    }
    c[0]
}

/// Copies `bytes` bytes through a 16 MiB staging pair; `tick` between chunks.
pub fn copy_bytes(bytes: u64, scratch: &mut GemmScratch, tick: &mut dyn FnMut() -> bool) -> u8 {
    let chunk = (bytes as usize).min(MAX_COPY_BYTES);
    if chunk == 0 {
        return 0;
    }
    if scratch.src.len() < chunk {
        scratch.src = (0..chunk).map(|i| i as u8).collect();
        scratch.dst = vec![0; chunk];
    }
    let mut left = bytes as usize;
    while left > 0 {
        let n = left.min(chunk);
        scratch.dst[..n].copy_from_slice(&scratch.src[..n]);
        left -= n;
        if !tick() {
            break;
        }
    }
    scratch.dst[chunk - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_shape_matches_flops() {
        assert_eq!(gemm_shape(0), (1, 1));
        assert_eq!(gemm_shape(2 * 64 * 64 * 64), (64, 1));
        let (s, r) = gemm_shape(10 * 2 * 256 * 256 * 256);
        assert_eq!((s, r), (256, 10));
    }

    #[test]
    fn real_work_computes_and_can_stop() {
        let mut scratch = GemmScratch::new();
        let mut ticks = 0;
        let x = gemm_flops(2 * 32 * 32 * 32, &mut scratch, &mut || {
            ticks += 1;
            true
        });
        // a[0][k] = k % 13 * 0.01, b[k][0] = (k*32) % 7 * 0.02: the product is positive.
        assert!(x > 0.0);
        assert_eq!(ticks, 2);
        assert_eq!(copy_bytes(100, &mut scratch, &mut || true), 99);
        let mut calls = 0;
        spin_for(Duration::from_secs(30), &mut || {
            calls += 1;
            calls < 3
        });
        assert_eq!(calls, 3, "a false tick stops the spin");
    }

    /// Measures this machine's rate of the real-mode kernels (the `cpu-mpi` profile's device
    /// figures): `cargo test --release -p hpfsdp-backends --lib kernel_rates -- --ignored
    /// --nocapture`. Prints only; asserts nothing about time.
    #[test]
    #[ignore]
    fn kernel_rates() {
        let mut scratch = GemmScratch::new();
        let flops = 40 * 2 * 256u64.pow(3);
        gemm_flops(flops, &mut scratch, &mut || true);
        let t = std::time::Instant::now();
        std::hint::black_box(gemm_flops(flops, &mut scratch, &mut || true));
        let gemm = flops as f64 / t.elapsed().as_secs_f64();
        let bytes = 32u64 << 24;
        copy_bytes(bytes, &mut scratch, &mut || true);
        let t = std::time::Instant::now();
        std::hint::black_box(copy_bytes(bytes, &mut scratch, &mut || true));
        let copy = 2.0 * bytes as f64 / t.elapsed().as_secs_f64();
        println!(
            "f32 GEMM 256^3: {gemm:.3e} FLOP/s; memcpy 16 MiB chunks: {copy:.3e} B/s (read + write)"
        );
    }
}
