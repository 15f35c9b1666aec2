//! Shared by the `nccl` and `hccl` integration tests: builds the CPU stand-in library
//! (`fake_collectives.c`, exporting NCCL + CUDA runtime + HCCL + ACL symbols) with the system C
//! compiler, runs ranks as threads with an injected environment, and a collective scenario
//! whose results are compared with the in-process backend.
//!
//! The stand-in proves our FFI plumbing (names, argument order, counts, displacements, roots,
//! peers, events, teardown); it says nothing about NCCL's or HCCL's own behaviour.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use hpfsdp_backends::{
    Buffer, Collective, CollectiveExt, CommResult, Group, ReduceOp, bf16, wait_all,
};

/// Compile the stand-in once per test binary; panics with the compiler's output if `cc` fails
/// (CI has a C compiler; a missing one must fail the test, not skip it).
pub fn fake_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        // From the backends crate's tests, or from the workspace root's (the CLI's).
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let src = [
            root.join("tests/fake/fake_collectives.c"),
            root.join("backends/tests/fake/fake_collectives.c"),
        ]
        .into_iter()
        .find(|p| p.is_file())
        .expect("tests/fake/fake_collectives.c");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let tmp = dir.join(format!("libfake_collectives.{}.so.tmp", std::process::id()));
        // Replaced atomically, so a copy another test process has mapped stays valid.
        let out = dir.join("libfake_collectives.so");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let result = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&tmp)
            .arg(&src)
            .arg("-lpthread")
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
        assert!(
            result.status.success(),
            "{cc} failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&result.stderr)
        );
        std::fs::rename(&tmp, &out).expect("rename the compiled stand-in");
        out
    })
    .clone()
}

/// The stand-in, kept loaded for the whole test binary so its counters and hooks survive
/// communicators coming and going (the backends open the same file: one mapping).
pub fn hooks() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    // SAFETY: the stand-in has no initialisers beyond libc's.
    LIB.get_or_init(|| unsafe { libloading::Library::new(fake_library()).expect("stand-in") })
}

/// Clears the calling thread's call log in the stand-in.
pub fn log_reset() {
    // SAFETY: the stand-in's hook `void fake_log_reset(void)`.
    unsafe {
        let f = hooks()
            .get::<unsafe extern "C" fn()>(b"fake_log_reset")
            .expect("fake_log_reset");
        f();
    }
}

/// The calling thread's call log since the last reset: one line per library call.
pub fn log_take() -> Vec<String> {
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: the stand-in's hook `long fake_log_take(char *out, size_t cap)`; the buffer
    // holds `cap` bytes.
    let n = unsafe {
        let f = hooks()
            .get::<unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> std::ffi::c_long>(
                b"fake_log_take",
            )
            .expect("fake_log_take");
        f(buf.as_mut_ptr().cast(), buf.len())
    };
    assert!(n >= 0, "the stand-in's call log overflowed");
    String::from_utf8_lossy(&buf[..n as usize])
        .lines()
        .map(String::from)
        .collect()
}

/// Spin-kernel launches so far in this process: `(launches, total ns, last grid, last block)`.
pub fn spin_launches() -> (i64, u64, u32, u32) {
    let (mut ns, mut grid, mut block) = (0u64, 0u32, 0u32);
    // SAFETY: the stand-in's hook `long fake_spin_launches(unsigned long long *, unsigned *,
    // unsigned *)` with valid out-pointers.
    let n = unsafe {
        let f = hooks()
            .get::<unsafe extern "C" fn(*mut u64, *mut u32, *mut u32) -> std::ffi::c_long>(
                b"fake_spin_launches",
            )
            .expect("fake_spin_launches");
        f(&mut ns, &mut grid, &mut block)
    };
    #[allow(clippy::useless_conversion)] // c_long is 32 bits on some targets
    (i64::from(n), ns, grid, block)
}

/// Checks a call log for timed regions (consecutive `cudaEventRecord` pairs): none may hold a
/// host copy, an allocation or a free. Returns the calls inside each region.
pub fn timed_regions(log: &[String]) -> Vec<Vec<String>> {
    let mut regions = Vec::new();
    let mut open: Option<Vec<String>> = None;
    for line in log {
        if line.starts_with("cudaEventRecord") {
            match open.take() {
                Some(region) => regions.push(region),
                None => open = Some(Vec::new()),
            }
        } else if let Some(region) = open.as_mut() {
            region.push(line.clone());
        }
    }
    assert!(open.is_none(), "an event pair was left open: {log:?}");
    for r in &regions {
        for call in r {
            assert!(
                !(call.starts_with("cudaMemcpy ")
                    || call.starts_with("cudaMalloc")
                    || call.starts_with("cudaFree")),
                "a timed region holds {call}: {r:?}"
            );
        }
    }
    regions
}

/// A fresh directory for one test's file rendezvous.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rdv-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create rendezvous dir");
    dir
}

/// An environment lookup over fixed pairs.
pub fn env_of(pairs: Vec<(String, String)>) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.into_iter().collect();
    move |k: &str| map.get(k).cloned()
}

/// The base environment of rank `rank` in a world of `n`: rank variables, the stand-in for
/// every vendor library, and a file rendezvous in `dir`.
pub fn rank_env(rank: usize, n: usize, dir: &std::path::Path) -> Vec<(String, String)> {
    let lib = fake_library().display().to_string();
    vec![
        ("RANK".into(), rank.to_string()),
        ("WORLD_SIZE".into(), n.to_string()),
        ("LOCAL_RANK".into(), rank.to_string()),
        ("HPFSDP_NCCL_LIB".into(), lib.clone()),
        ("HPFSDP_CUDART_LIB".into(), lib.clone()),
        ("HPFSDP_CUDA_DRIVER_LIB".into(), lib.clone()),
        ("HPFSDP_CUBLAS_LIB".into(), lib.clone()),
        ("HPFSDP_HCCL_LIB".into(), lib.clone()),
        ("HPFSDP_ACL_LIB".into(), lib),
        (
            "HPFSDP_RENDEZVOUS".into(),
            format!("file:{}", dir.display()),
        ),
        ("HPFSDP_RENDEZVOUS_TIMEOUT_S".into(), "60".into()),
    ]
}

/// Run `f` on `n` threads, one per rank, and collect the results in rank order.
pub fn on_threads<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|r| s.spawn(move || f(r))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Bit patterns of every output of [`scenario`], in order.
pub type Outputs = Vec<Vec<u64>>;

/// Every collective kind on the world, a sub-group, f32 and bf16, with values whose sums are
/// exact so any correct backend gives the same bits. `avg` is skipped where a backend lacks it.
pub fn scenario(c: &dyn Collective, with_avg: bool) -> CommResult<Outputs> {
    let n = c.world_size();
    let r = c.rank();
    let rf = r as f32;
    let world = Group::world(n)?;
    let mut out: Outputs = Vec::new();
    let mut push = |b: Buffer| out.push(b.to_bits());

    push(Buffer::from(c.all_gather_vec(&world, vec![rf, rf + 0.5])?));
    let rs: Vec<f32> = (0..2 * n).map(|j| rf * 10.0 + j as f32).collect();
    push(Buffer::from(c.reduce_scatter_vec(
        &world,
        rs,
        ReduceOp::Sum,
    )?));
    let ar: Vec<bf16> = [rf, -rf, 0.25 * rf]
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    push(Buffer::from(c.all_reduce_vec(
        &world,
        ar.clone(),
        ReduceOp::Sum,
    )?));
    push(Buffer::from(c.all_reduce_vec(
        &world,
        ar.clone(),
        ReduceOp::Max,
    )?));
    push(Buffer::from(c.all_reduce_vec(&world, ar, ReduceOp::Min)?));
    if with_avg {
        push(Buffer::from(c.all_reduce_vec(
            &world,
            vec![rf * 4.0, 8.0],
            ReduceOp::Avg,
        )?));
        let rs: Vec<f32> = (0..n).map(|j| (j * 4) as f32 + rf * 4.0).collect();
        push(Buffer::from(c.reduce_scatter_vec(
            &world,
            rs,
            ReduceOp::Avg,
        )?));
    }
    let root = n - 1;
    let payload = if r == root {
        vec![7.0f32, 8.0, 9.0]
    } else {
        vec![0.0; 3]
    };
    push(Buffer::from(c.broadcast_vec(&world, payload, root)?));
    let a2a: Vec<f32> = (0..2 * n).map(|j| rf * 100.0 + j as f32).collect();
    push(Buffer::from(c.all_to_all_vec(&world, a2a)?));
    // Member j gets (me + j) % 3 elements from me: zero-size chunks included.
    let send_counts: Vec<usize> = (0..n).map(|j| (r + j) % 3).collect();
    let recv_counts: Vec<usize> = (0..n).map(|i| (i + r) % 3).collect();
    let a2av: Vec<f32> = (0..send_counts.iter().sum::<usize>())
        .map(|k| rf * 1000.0 + k as f32)
        .collect();
    push(Buffer::from(c.all_to_all_v_vec(
        &world,
        a2av,
        &send_counts,
        &recv_counts,
    )?));
    // A ring where every rank sends before it receives: must not deadlock.
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let s = c.send(Buffer::from(vec![rf; 5]), next, 3)?;
    let v = c.recv(prev, 3, hpfsdp_backends::DType::F32, 5)?;
    let got = wait_all(vec![v, s])?;
    push(got[0].clone());
    c.barrier_wait(&world)?;
    // A sub-group (even ranks) and a group of one (this rank alone).
    let evens = Group::new("evens", (0..n).step_by(2).collect())?;
    if evens.contains(r) {
        push(Buffer::from(c.all_reduce_vec(
            &evens,
            vec![rf + 1.0],
            ReduceOp::Sum,
        )?));
        push(Buffer::from(c.all_gather_vec(&evens, vec![rf])?));
    }
    let alone = Group::new(format!("alone{r}"), vec![r])?;
    push(Buffer::from(c.all_reduce_vec(
        &alone,
        vec![rf],
        ReduceOp::Sum,
    )?));
    Ok(out)
}

/// The scenario's outputs on the in-process backend, per rank.
pub fn inproc_outputs(n: usize, with_avg: bool) -> Vec<Outputs> {
    hpfsdp_backends::InProcWorld::run(n, |c| scenario(c, with_avg))
        .expect("inproc world")
        .results
        .into_iter()
        .map(|r| r.expect("inproc scenario"))
        .collect()
}
