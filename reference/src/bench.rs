//! A one-run matmul benchmark: this crate's fixed-order kernel beside ndarray's `dot`.
//!
//! Both run on the same inputs in the same process, so the ratio is meaningful even on a noisy
//! machine; absolute numbers are not. Nothing here is asserted on.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use ndarray::Array2;

use crate::matmul::{Isa, matmul};
use crate::rng::KeyedRng;
use crate::tensor::Tensor;

/// Best wall time of `reps` runs of `f` (after one warm-up).
fn best_of(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn gflops(n: usize, t: Duration) -> f64 {
    2.0 * (n as f64).powi(3) / t.as_secs_f64() / 1e9
}

/// Run the benchmark on 512² and 1024² f32 matrices and format a small table:
/// GFLOP/s of the fixed-order kernel on 1 thread and on all rayon threads, of ndarray `dot`
/// (matrixmultiply, single-threaded), the ratios, and whether 1-thread and all-thread bits agree.
pub fn matmul_bench_report() -> String {
    let threads = rayon::current_num_threads();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "matmul f32, kernel {}, {} rayon threads (best of several runs)",
        Isa::detect().name(),
        threads
    );
    let _ = writeln!(
        out,
        "{:>6} {:>14} {:>14} {:>14} {:>10} {:>10} {:>8}",
        "n", "ours 1T GF/s", "ours nT GF/s", "ndarray GF/s", "1T/nd", "nT/nd", "1T==nT"
    );
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().ok();
    for n in [512usize, 1024] {
        let reps = if n <= 512 { 10 } else { 4 };
        let a = Tensor::from_vec(&[n, n], KeyedRng::new(1, 0).normal_range(0, (n * n) as u64))
            .expect("n*n elements");
        let b = Tensor::from_vec(&[n, n], KeyedRng::new(1, 1).normal_range(0, (n * n) as u64))
            .expect("n*n elements");
        let an = Array2::from_shape_vec((n, n), a.as_slice().to_vec()).expect("n*n elements");
        let bn = Array2::from_shape_vec((n, n), b.as_slice().to_vec()).expect("n*n elements");

        let mut c_all = None;
        let t_all = best_of(reps, || c_all = matmul(&a, &b).ok());
        let mut c_one = None;
        let t_one = match &one {
            Some(pool) => pool.install(|| best_of(reps, || c_one = matmul(&a, &b).ok())),
            None => Duration::ZERO,
        };
        let mut sink = 0.0f32;
        let t_nd = best_of(reps, || sink += an.dot(&bn)[[0, 0]]);
        std::hint::black_box(sink);

        let same = match (&c_one, &c_all) {
            (Some(x), Some(y)) => x.bit_eq(y),
            _ => false,
        };
        let (g1, gn, gnd) = (gflops(n, t_one), gflops(n, t_all), gflops(n, t_nd));
        let _ = writeln!(
            out,
            "{:>6} {:>14.1} {:>14.1} {:>14.1} {:>10.2} {:>10.2} {:>8}",
            n,
            g1,
            gn,
            gnd,
            g1 / gnd,
            gn / gnd,
            same
        );
    }
    out
}
