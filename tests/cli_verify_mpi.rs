//! `hpfsdp verify --backend mpi` under `mpirun`: one rank per process, rank 0 prints the
//! report, the digest equals the in-process golden for every verify scenario of 4 to 8 ranks;
//! a wrong process count and a wait past `--timeout-s` are clear errors and nothing hangs.
//! Built only with `--features mpi`; needs `mpirun` (OpenMPI) on `PATH`.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("scenarios/verify/{name}.toml"))
}

fn golden(name: &str) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/verify/golden.toml"),
    )
    .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} = \"")))
        .and_then(|r| r.strip_suffix('"'))
        .unwrap()
        .to_string()
}

/// `mpirun -np <np> hpfsdp verify <scenario> --backend mpi <extra>`: (success, exit code,
/// stdout, stderr). Output goes to files so a full pipe can never stall the job.
fn mpirun(np: usize, name: &str, extra: &[&str]) -> (bool, Option<i32>, String, String) {
    let tmp = std::env::temp_dir();
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    let tag = format!("{name}-{np}-{}-{n}", std::process::id());
    let (out_path, err_path) = (
        tmp.join(format!("hpfsdp-{tag}.out")),
        tmp.join(format!("hpfsdp-{tag}.err")),
    );
    let mut child = Command::new("mpirun")
        .args([
            "--oversubscribe",
            "--allow-run-as-root",
            "-np",
            &np.to_string(),
        ])
        .arg(env!("CARGO_BIN_EXE_hpfsdp"))
        .arg("verify")
        .arg(scenario(name))
        .args(["--backend", "mpi"])
        .args(extra)
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("mpirun must be installed (apt-get install openmpi-bin libopenmpi-dev)");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!("{name} on {np} processes still running after 300 s (a hang)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |p: &Path| {
        let t = std::fs::read_to_string(p).unwrap_or_default();
        let _ = std::fs::remove_file(p);
        t
    };
    (
        status.success(),
        status.code(),
        read(&out_path),
        read(&err_path),
    )
}

fn digest_equals_golden(name: &str, np: usize) {
    let (ok, _, stdout, stderr) = mpirun(np, name, &[]);
    assert!(ok, "{name}:\n{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("VERDICT: PASS").count(),
        1,
        "only rank 0 prints:\n{stdout}"
    );
    let want = format!("updated-parameter digest (blake3): {}", golden(name));
    assert!(
        stdout.contains(&want),
        "{name}: digest differs from the golden:\n{stdout}"
    );
}

#[test]
fn dense_fsdp4() {
    digest_equals_golden("dense-fsdp4", 4);
}

#[test]
fn moe_ep2_fsdp2() {
    digest_equals_golden("moe-ep2-fsdp2", 4);
}

#[test]
fn dense_tp2_fsdp2() {
    digest_equals_golden("dense-tp2-fsdp2", 4);
}

#[test]
fn mla_hsdp2x2() {
    digest_equals_golden("mla-hsdp2x2", 4);
}

#[test]
fn dense_fsdp4_muon() {
    digest_equals_golden("dense-fsdp4-muon", 4);
}

#[test]
fn moe_ep2_fsdp2_muon() {
    digest_equals_golden("moe-ep2-fsdp2-muon", 4);
}

#[test]
fn dense_tp2_fsdp2_muon() {
    digest_equals_golden("dense-tp2-fsdp2-muon", 4);
}

#[test]
fn mla_hsdp2x2_muon() {
    digest_equals_golden("mla-hsdp2x2-muon", 4);
}

#[test]
fn dense_tp2_fsdp2_bf16_activations() {
    // TP all-reduces in bf16 (rounded inputs, f32 sum in rank order, one rounding).
    digest_equals_golden("dense-tp2-fsdp2-bf16", 4);
}

#[test]
fn moe_ep2_fsdp2_bf16_activations() {
    // EP all-to-all-v of bf16 rows.
    digest_equals_golden("moe-ep2-fsdp2-bf16", 4);
}

#[test]
fn dense_hsdp2x4_on_eight_processes() {
    digest_equals_golden("dense-hsdp2x4", 8);
}

#[test]
fn dense_hsdp4x2_muon_on_eight_processes() {
    digest_equals_golden("dense-hsdp4x2-muon", 8);
}

#[test]
fn json_report_comes_from_rank_0_only() {
    let (ok, _, stdout, stderr) = mpirun(4, "dense-fsdp4", &["--json"]);
    assert!(ok, "{stdout}\n{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(v["report"]["digest"], golden("dense-fsdp4").as_str());
    assert_eq!(v["report"]["world"], 4);
}

#[test]
fn wrong_process_count_is_a_clear_error() {
    let (ok, code, stdout, stderr) = mpirun(3, "dense-fsdp4", &[]);
    assert!(!ok && code.is_some_and(|c| c != 0), "{stdout}\n{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(
        stderr.matches("scenario dense-fsdp4 has 4 ranks but the mpi world has 3 processes; launch exactly 4 processes (mpirun -np 4)").count(),
        1,
        "rank 0 alone reports it:\n{stderr}"
    );
}

#[test]
fn a_wait_past_the_timeout_names_the_call_and_ends_the_job() {
    // 1 µs is shorter than any header exchange: the first collective times out on some rank,
    // which reports it and aborts the job.
    let (ok, _, stdout, stderr) = mpirun(4, "dense-fsdp4", &["--timeout-s", "0.000001"]);
    assert!(!ok, "{stdout}\n{stderr}");
    assert!(!stdout.contains("VERDICT"), "{stdout}");
    assert!(stderr.contains("error (mpi rank "), "{stderr}");
    assert!(
        stderr.contains("timed out after 0 ms; waiting for rank(s) ["),
        "{stderr}"
    );
    assert!(stderr.contains("on group "), "{stderr}");
}

#[test]
fn mutate_is_refused_with_the_fix() {
    let (ok, _, stdout, stderr) = mpirun(4, "dense-fsdp4", &["--mutate", "lm_head"]);
    assert!(!ok, "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "--mutate and --bench-modes run on the in-process backend only; drop --backend mpi"
        ),
        "{stderr}"
    );
}
