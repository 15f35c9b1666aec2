//! The MPI backend under `mpirun -np 4`: every collective kind and dtype on the world group and
//! on subgroups, bit for bit against the in-process backend (results and traces), native
//! reductions, point-to-point messages, and the fault paths (a mismatched call, a rank that
//! never arrives, a rank that dies).
//!
//! Each `#[test]` re-runs this test binary under `mpirun` with `HPFSDP_MPI_CASE` set; the
//! `#[ignore]`d `mpi_rank_entry` test is the per-rank program. Needs `mpirun` on `PATH`
//! (OpenMPI: `--oversubscribe --allow-run-as-root` are passed).
#![cfg(feature = "mpi")]

use std::process::Command;
use std::time::{Duration, Instant};

use hpfsdp_backends::mpi::{MpiComm, MpiOptions, ReductionMode};
use hpfsdp_backends::{
    Buffer, Collective, CollectiveExt, CommError, CommResult, DType, Group, InProcWorld, ReduceOp,
    TraceEvent, bf16, wait_all,
};

const RANKS: usize = 4;
const CASE_ENV: &str = "HPFSDP_MPI_CASE";

/// Run case `case` on `RANKS` processes; returns (exit success, stdout + stderr).
fn mpirun(case: &str) -> (bool, String) {
    let exe = std::env::current_exe().expect("test binary path");
    // Output goes to a file: a pipe nobody reads while waiting could fill up and block mpirun.
    let log = std::env::temp_dir().join(format!("hpfsdp-mpi-{case}-{}.log", std::process::id()));
    let file = std::fs::File::create(&log).expect("log file");
    let mut child = Command::new("mpirun")
        .args(["--oversubscribe", "--allow-run-as-root", "-np"])
        .arg(RANKS.to_string())
        .arg(exe)
        .args([
            "--exact",
            "mpi_rank_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CASE_ENV, case)
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        .spawn()
        .expect("mpirun must be installed (apt-get install openmpi-bin libopenmpi-dev)");
    let start = Instant::now();
    // A hang is a failure: nothing may block past the backend's timeouts.
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait on mpirun") {
            break s;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("case {case}: mpirun still running after 120 s (a hang)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    (status.success(), text)
}

fn assert_ok(case: &str) -> String {
    let (ok, text) = mpirun(case);
    assert!(ok, "case {case} failed under mpirun:\n{text}");
    for r in 0..RANKS {
        assert!(
            text.contains(&format!("rank {r}: {case} ok")),
            "rank {r} did not finish {case}:\n{text}"
        );
    }
    text
}

#[test]
fn deterministic_collectives_equal_inproc_bit_for_bit() {
    assert_ok("deterministic");
}

#[test]
fn native_reductions_equal_inproc_on_exact_data() {
    assert_ok("native");
}

#[test]
fn point_to_point_every_dtype_and_size_mismatch() {
    assert_ok("p2p");
}

#[test]
fn mismatched_collective_is_reported_on_every_rank() {
    assert_ok("mismatch");
}

#[test]
fn missing_rank_times_out_naming_it_and_aborts() {
    let (ok, text) = mpirun("timeout");
    assert!(!ok, "the job must fail:\n{text}");
    assert!(
        text.contains(
            "all-reduce on group world (call #1) timed out after 1500 ms; waiting for rank(s) [3]"
        ),
        "{text}"
    );
}

#[test]
fn dead_rank_ends_the_job_with_failure() {
    let (ok, text) = mpirun("dead");
    assert!(!ok, "the job must fail:\n{text}");
    assert!(text.contains("rank 2: exiting on purpose"), "{text}");
}

// ---------------------------------------------------------------- per-rank programs

/// Values whose f32 sums depend on the order of addition (large and small magnitudes mixed).
fn f32_data(rank: usize, n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let k = (rank * 131 + i * 17 + salt * 7) % 23;
            let big = if (rank + i).is_multiple_of(3) {
                1.0e7
            } else {
                1.0
            };
            (k as f32 - 11.0) * big * 0.37 + (i as f32) * 1e-3
        })
        .collect()
}

/// Small integers: exact in every dtype and every summation order.
fn int_data(rank: usize, n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((rank * 5 + i * 3 + salt) % 9) as f32 - 4.0)
        .collect()
}

fn buffer(dtype: DType, v: &[f32]) -> Buffer {
    match dtype {
        DType::F32 => Buffer::F32(v.to_vec()),
        DType::Bf16 => Buffer::Bf16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        // Exact for small integers (needs few mantissa bits), order-sensitive for `f32_data`.
        DType::F64 => Buffer::F64(
            v.iter()
                .map(|&x| f64::from(x) * (1.0 + 2f64.powi(-30)))
                .collect(),
        ),
        DType::U8 => Buffer::U8(
            v.iter()
                .map(|&x| (x as i32).rem_euclid(256) as u8)
                .collect(),
        ),
    }
}

fn groups() -> Vec<Group> {
    vec![
        Group::world(RANKS).unwrap(),
        Group::new("pair-even", vec![0, 2]).unwrap(),
        Group::new("pair-odd", vec![1, 3]).unwrap(),
        Group::new("tail", vec![1, 2, 3]).unwrap(),
    ]
}

/// Every collective kind, dtype and op on every group this rank is in; returns the outputs.
/// Two calls per group are issued before either is waited, and waited in reverse order.
fn program(
    c: &dyn Collective,
    data: fn(usize, usize, usize) -> Vec<f32>,
) -> CommResult<Vec<Buffer>> {
    let me = c.rank();
    let mut out = Vec::new();
    for g in groups().iter().filter(|g| g.contains(me)) {
        let p = g.size();
        let pos = g.position(me).unwrap();
        for (salt, dtype) in DType::ALL.into_iter().enumerate() {
            let d = |n: usize, s: usize| buffer(dtype, &data(me, n, salt * 10 + s));
            out.push(c.all_gather(g, d(3, 0))?.wait()?);
            for (k, op) in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min]
                .into_iter()
                .enumerate()
            {
                let a = c.all_reduce(g, d(5, 1 + k), op)?;
                let b = c.reduce_scatter(g, d(2 * p, 5 + k), op)?;
                out.push(b.wait()?);
                out.push(a.wait()?);
            }
            let root = g.ranks()[p - 1];
            out.push(c.broadcast(g, d(4, 9), root)?.wait()?);
            out.push(c.all_to_all(g, d(3 * p, 10))?.wait()?);
            let send: Vec<usize> = (0..p).map(|j| (pos + 2 * j) % 3).collect();
            let recv: Vec<usize> = (0..p).map(|j| (j + 2 * pos) % 3).collect();
            let total = send.iter().sum();
            out.push(c.all_to_all_v(g, d(total, 11), &send, &recv)?.wait()?);
            out.push(c.all_gather(g, Buffer::empty(dtype))?.wait()?);
        }
        c.barrier_wait(g)?;
    }
    Ok(out)
}

fn bits(bufs: &[Buffer]) -> Vec<(DType, Vec<u64>)> {
    bufs.iter().map(|b| (b.dtype(), b.to_bits())).collect()
}

fn inproc_reference(
    data: fn(usize, usize, usize) -> Vec<f32>,
) -> (Vec<Vec<Buffer>>, Vec<Vec<TraceEvent>>) {
    let run = InProcWorld::run(RANKS, |c| program(c, data)).expect("inproc world");
    let results = run
        .results
        .into_iter()
        .map(|r| r.expect("inproc program"))
        .collect();
    (results, run.traces)
}

fn compare_with_inproc(c: &MpiComm, data: fn(usize, usize, usize) -> Vec<f32>) {
    let mine = program(c, data).expect("mpi program");
    let (want, traces) = inproc_reference(data);
    let r = c.rank();
    assert_eq!(mine.len(), want[r].len());
    for (i, (a, b)) in bits(&mine).iter().zip(bits(&want[r])).enumerate() {
        assert_eq!(*a, b, "rank {r}: output {i} ({}) differs from inproc", a.0);
    }
    assert_eq!(
        c.trace(),
        traces[r],
        "rank {r}: MPI trace differs from inproc"
    );
}

fn opts(mode: ReductionMode, timeout_ms: u64) -> MpiOptions {
    MpiOptions {
        mode,
        timeout: Duration::from_millis(timeout_ms),
    }
}

fn p2p(c: &MpiComm) {
    let r = c.rank();
    let next = (r + 1) % RANKS;
    let prev = (r + RANKS - 1) % RANKS;
    for (salt, dtype) in DType::ALL.into_iter().enumerate() {
        let recv = c.recv(prev, 40 + salt as u64, dtype, 6).unwrap();
        let sent = buffer(dtype, &f32_data(r, 6, salt));
        let back = c
            .send(sent.clone(), next, 40 + salt as u64)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(back, sent);
        let got = recv.wait().unwrap();
        assert_eq!(
            got.to_bits(),
            buffer(dtype, &f32_data(prev, 6, salt)).to_bits()
        );
    }
    // Wrong length: rank `prev` sends 3 elements where 6 are expected, then a correct one.
    let short = c.recv(prev, 7, DType::F32, 6).unwrap();
    c.send_vec(vec![1.0f32; 3], next, 7).unwrap();
    let e = short.wait().unwrap_err().to_string();
    assert!(
        e.contains(&format!("rank {prev} sent 3 f32 elements with tag 7")),
        "{e}"
    );
    // Too long: MPI reports truncation, which the backend turns into a mismatch.
    let long = c.recv(prev, 8, DType::F32, 2).unwrap();
    c.send_vec(vec![1.0f32; 9], next, 8).unwrap();
    let e = long.wait().unwrap_err();
    assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
}

fn mismatch(c: &MpiComm) {
    let g = Group::world(RANKS).unwrap();
    c.all_reduce_vec(&g, vec![1.0f32; 4], ReduceOp::Sum)
        .unwrap();
    let r = if c.rank() == 2 {
        c.all_gather_vec(&g, vec![1.0f32; 4]).map(|_| ())
    } else {
        c.all_reduce_vec(&g, vec![1.0f32; 4], ReduceOp::Sum)
            .map(|_| ())
    };
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("mismatched collective on group world (call #1): rank 0 called all-reduce(f32, 4 elements, op=sum) but rank 2 called all-gather(f32, 4 elements)"),
        "{e}"
    );
    // The group stays usable: the next call matches again on every rank.
    let s = c
        .all_reduce_vec(&g, vec![c.rank() as f32], ReduceOp::Sum)
        .unwrap();
    assert_eq!(s, vec![6.0]);
}

fn timeout(c: &MpiComm) {
    let g = Group::world(RANKS).unwrap();
    c.barrier_wait(&g).unwrap();
    if c.rank() == 3 {
        // Never makes call #1; waits for the others' abort.
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let e = c
        .all_reduce_vec(&g, vec![1.0f32], ReduceOp::Sum)
        .unwrap_err();
    println!("rank {}: error: {e}", c.rank());
    c.abort(3);
}

#[test]
#[ignore = "the per-rank program; run by the other tests under mpirun"]
fn mpi_rank_entry() {
    let Ok(case) = std::env::var(CASE_ENV) else {
        return;
    };
    let (mode, timeout_ms) = match case.as_str() {
        "native" => (ReductionMode::Native, 30_000),
        "timeout" => (ReductionMode::Deterministic, 1_500),
        _ => (ReductionMode::Deterministic, 30_000),
    };
    let c = MpiComm::world_with(opts(mode, timeout_ms)).expect("MPI world");
    assert_eq!(c.world_size(), RANKS);
    match case.as_str() {
        "deterministic" => compare_with_inproc(&c, f32_data),
        "native" => compare_with_inproc(&c, int_data),
        "p2p" => p2p(&c),
        "mismatch" => mismatch(&c),
        "timeout" => timeout(&c),
        "dead" => {
            let g = Group::world(RANKS).unwrap();
            c.barrier_wait(&g).unwrap();
            if c.rank() == 2 {
                println!("rank 2: exiting on purpose");
                std::process::exit(7);
            }
            let _ = c.all_reduce_vec(&g, vec![1.0f32], ReduceOp::Sum);
            std::thread::sleep(Duration::from_secs(60));
        }
        other => panic!("unknown case {other}"),
    }
    let _ = wait_all(Vec::new());
    println!("rank {}: {case} ok", c.rank());
}
