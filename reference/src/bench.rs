//! A one-run matmul benchmark: this crate's fixed-order kernel beside ndarray's `dot`
//! (matrixmultiply), over the shapes and layouts the reference executor multiplies: square
//! products, products with one or two dimensions of 64 (a short sequence, a narrow head or
//! a small model's width), a shape that is no multiple of any tile, and the transposed
//! operands of `x·Wᵀ` ([`crate::matmul::matmul_nt`]) and of weight gradients `dyᵀ·x`
//! ([`crate::matmul::matmul_tn`]).
//!
//! Both run on the same inputs in the same process, alternately, best of several runs each,
//! so the ratio is meaningful even on a noisy machine; absolute numbers are not. Nothing here
//! is asserted on.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use ndarray::{Array2, ArrayView2};

use crate::matmul::{Isa, matmul, matmul_nt, matmul_tn};
use crate::rng::KeyedRng;
use crate::tensor::Tensor;

/// How the operands are stored, as the reference's three products take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `A[m,k] · B[k,n]` ([`matmul`]).
    Nn,
    /// `A[m,k] · B[n,k]ᵀ` ([`matmul_nt`]).
    Nt,
    /// `A[k,m]ᵀ · B[k,n]` ([`matmul_tn`]).
    Tn,
}

impl Layout {
    /// Short name (`nn`, `nt`, `tn`).
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nn => "nn",
            Layout::Nt => "nt",
            Layout::Tn => "tn",
        }
    }
}

/// The benchmark's products: `(m, k, n, layout)`.
pub const SHAPES: [(usize, usize, usize, Layout); 16] = [
    (64, 64, 64, Layout::Nn),
    (128, 128, 128, Layout::Nn),
    (256, 256, 256, Layout::Nn),
    (512, 512, 512, Layout::Nn),
    (1024, 1024, 1024, Layout::Nn),
    (64, 1024, 1024, Layout::Nn),
    (1024, 64, 1024, Layout::Nn),
    (1024, 1024, 64, Layout::Nn),
    (64, 64, 1024, Layout::Nn),
    (1024, 64, 64, Layout::Nn),
    (100, 300, 200, Layout::Nn),
    (512, 512, 512, Layout::Nt),
    (64, 1024, 1024, Layout::Nt),
    (1024, 256, 64, Layout::Nt),
    (512, 512, 512, Layout::Tn),
    (1024, 64, 1024, Layout::Tn),
];

/// One product's operands, stored as its layout wants them.
struct Operands {
    a: Tensor<f32>,
    b: Tensor<f32>,
    an: Array2<f32>,
    bn: Array2<f32>,
    layout: Layout,
}

impl Operands {
    fn new(m: usize, k: usize, n: usize, layout: Layout) -> Self {
        let (a_dims, b_dims) = match layout {
            Layout::Nn => ([m, k], [k, n]),
            Layout::Nt => ([m, k], [n, k]),
            Layout::Tn => ([k, m], [k, n]),
        };
        let tensor = |stream: u64, dims: [usize; 2]| {
            let len = dims[0] * dims[1];
            let values = KeyedRng::new(1, stream).normal_range(0, len as u64);
            Tensor::from_vec(&dims, values).expect("dims match the length")
        };
        let (a, b) = (tensor(0, a_dims), tensor(1, b_dims));
        let array = |t: &Tensor<f32>, d: [usize; 2]| {
            Array2::from_shape_vec((d[0], d[1]), t.as_slice().to_vec()).expect("same shape")
        };
        let (an, bn) = (array(&a, a_dims), array(&b, b_dims));
        Self {
            a,
            b,
            an,
            bn,
            layout,
        }
    }

    /// This crate's product.
    fn ours(&self) -> Option<Tensor<f32>> {
        match self.layout {
            Layout::Nn => matmul(&self.a, &self.b),
            Layout::Nt => matmul_nt(&self.a, &self.b),
            Layout::Tn => matmul_tn(&self.a, &self.b),
        }
        .ok()
    }

    /// ndarray's product on the same (transposed where the layout says) views.
    fn ndarray(&self) -> Array2<f32> {
        let (a, b): (ArrayView2<f32>, ArrayView2<f32>) = match self.layout {
            Layout::Nn => (self.an.view(), self.bn.view()),
            Layout::Nt => (self.an.view(), self.bn.t()),
            Layout::Tn => (self.an.t(), self.bn.view()),
        };
        a.dot(&b)
    }
}

/// CPU time of the calling thread (its wall time where the platform has no such clock): a
/// run the scheduler interrupts on a loaded machine is not charged for the interruption.
fn thread_time() -> Duration {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec we own; the clock id is valid.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
        }
    }
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// Best times of `reps` alternate runs of `f` and `g` (after one warm-up of each), by
/// `clock`.
fn best_of_both(
    reps: usize,
    clock: fn() -> Duration,
    mut f: impl FnMut(),
    mut g: impl FnMut(),
) -> (Duration, Duration) {
    f();
    g();
    let time = |h: &mut dyn FnMut()| {
        let t = clock();
        h();
        clock().saturating_sub(t)
    };
    let (mut bf, mut bg) = (Duration::MAX, Duration::MAX);
    for _ in 0..reps {
        bf = bf.min(time(&mut f));
        bg = bg.min(time(&mut g));
    }
    (bf, bg)
}

/// Wall time since the first call (the all-thread runs span several threads' CPU time).
fn wall_time() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// Runs of each side: enough for about 0.1 GFLOP per side, at least 5.
fn reps(flops: f64) -> usize {
    ((1e8 / flops).ceil() as usize).clamp(5, 200)
}

fn gflops(flops: f64, t: Duration) -> f64 {
    flops / t.as_secs_f64() / 1e9
}

/// Runs the benchmark over [`SHAPES`] and formats a table: GFLOP/s of the fixed-order kernel
/// on one thread beside ndarray `dot` (matrixmultiply, single-threaded) and their ratio (both
/// in the thread's CPU time), then the kernel on all rayon threads (wall time), its ratio,
/// and whether 1-thread and all-thread bits agree.
pub fn matmul_bench_report() -> String {
    let threads = rayon::current_num_threads();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "matmul f32, kernel {}, {} rayon threads (best of several alternate runs; 1T in thread \
         CPU time)",
        Isa::active().name(),
        threads
    );
    let _ = writeln!(
        out,
        "{:>18} {:>4} {:>12} {:>12} {:>7} {:>12} {:>7} {:>7}",
        "m x k x n",
        "ops",
        "ours 1T GF/s",
        "ndarray GF/s",
        "1T/nd",
        "ours nT GF/s",
        "nT/nd",
        "1T==nT"
    );
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().ok();
    for (m, k, n, layout) in SHAPES {
        let ops = Operands::new(m, k, n, layout);
        let flops = 2.0 * (m * k * n) as f64;
        let reps = reps(flops);
        let (mut c_one, mut c_all, mut sink) = (None, None, 0.0f32);
        let (t_one, t_nd) = match &one {
            Some(pool) => pool.install(|| {
                let nd = || sink += ops.ndarray()[[0, 0]];
                best_of_both(reps, thread_time, || c_one = ops.ours(), nd)
            }),
            None => (Duration::ZERO, Duration::ZERO),
        };
        let (t_all, _) = best_of_both(reps, wall_time, || c_all = ops.ours(), || {});
        std::hint::black_box(sink);
        let same = match (&c_one, &c_all) {
            (Some(x), Some(y)) => x.bit_eq(y),
            _ => false,
        };
        let (g1, gn, gnd) = (
            gflops(flops, t_one),
            gflops(flops, t_all),
            gflops(flops, t_nd),
        );
        let _ = writeln!(
            out,
            "{:>18} {:>4} {:>12.1} {:>12.1} {:>7.2} {:>12.1} {:>7.2} {:>7}",
            format!("{m} x {k} x {n}"),
            layout.name(),
            g1,
            gnd,
            g1 / gnd,
            gn,
            gn / gnd,
            same
        );
    }
    out
}
