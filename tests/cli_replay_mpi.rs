//! `hpfsdp replay` and `hpfsdp collbench` with `--backend mpi` under `mpirun -np 4`: one rank
//! per process, rank 0 writes the report; faults (a rank that errors, hangs or issues a
//! different collective) end the job with an error naming the rank and the op, never a hang.
//! Built only with `--features mpi`; needs `mpirun` (OpenMPI) on `PATH`.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn out_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hpfsdp-replay-mpi-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `mpirun -np 4 hpfsdp <args>`: (success, stdout, stderr); killed after 240 s.
fn mpirun(args: &[&str]) -> (bool, String, String) {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    let tmp = std::env::temp_dir();
    let tag = format!("{}-{n}", std::process::id());
    let (out, err) = (
        tmp.join(format!("hpfsdp-rmpi-{tag}.out")),
        tmp.join(format!("hpfsdp-rmpi-{tag}.err")),
    );
    let mut child = Command::new("mpirun")
        .args(["--oversubscribe", "--allow-run-as-root", "-np", "4"])
        .arg(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(args)
        .current_dir(root())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("mpirun must be installed (apt-get install openmpi-bin libopenmpi-dev)");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(240) {
            let _ = child.kill();
            panic!("mpirun {args:?} did not finish within 240 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.success(),
        std::fs::read_to_string(out).unwrap_or_default(),
        std::fs::read_to_string(err).unwrap_or_default(),
    )
}

fn replays(scenario: &str) {
    let dir = out_dir(scenario);
    let (ok, stdout, stderr) = mpirun(&[
        "replay",
        &format!("scenarios/verify/{scenario}.toml"),
        "--backend",
        "mpi",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--timeout-s",
        "60",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{scenario}: {stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("replay of ").count(),
        1,
        "only rank 0 prints: {stdout}"
    );
    let csv = std::fs::read_to_string(dir.join("replay.csv")).unwrap();
    let ranks: std::collections::BTreeSet<&str> = csv
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').nth(1))
        .collect();
    assert_eq!(ranks.len(), 4, "every rank's spans reach rank 0");
    assert!(dir.join("trace.json").exists() && dir.join("report.html").exists());
}

#[test]
fn dense_fsdp4_replays_on_four_mpi_processes() {
    replays("dense-fsdp4");
}

#[test]
fn moe_ep2_fsdp2_replays_on_four_mpi_processes() {
    replays("moe-ep2-fsdp2");
}

#[test]
fn collbench_on_four_mpi_processes_is_correct() {
    let dir = out_dir("collbench");
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("coll.csv");
    let (ok, stdout, stderr) = mpirun(&[
        "collbench",
        "--backend",
        "mpi",
        "--max-bytes",
        "64K",
        "--factor",
        "8",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--out",
        csv.to_str().unwrap(),
    ]);
    assert!(ok, "{stdout}\n{stderr}");
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("collective,size,count,type,redop,root,time_us,algbw,busbw,#wrong,tier,ranks")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(rows.len() >= 5 * 2, "{text}");
    for r in &rows {
        assert_eq!(r[9], "0", "wrong elements: {r:?}");
        assert_eq!(r[11], "4", "four ranks: {r:?}");
    }
}

/// The first collective op of rank 1's program (its index), found from inproc's replay CSV.
fn a_collective_of_rank1() -> usize {
    let dir = out_dir("probe");
    let o = Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .current_dir(root())
        .args([
            "replay",
            "scenarios/verify/dense-fsdp4.toml",
            "--backend",
            "inproc",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--out",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = std::fs::read_to_string(dir.join("replay.csv")).unwrap();
    csv.lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|r| r[1] == "1" && r[2] == "all-gather")
        .map(|r| r[0].to_string())
        .next()
        .and_then(|op| {
            // `op` is the op's name; its index is its row position among rank 1's rows.
            csv.lines()
                .skip(1)
                .filter(|l| l.split(',').nth(1) == Some("1"))
                .position(|l| l.split(',').next() == Some(op.as_str()))
        })
        .expect("rank 1 issues an all-gather")
}

fn fault(kind: &str, needles: &[&str]) {
    let i = a_collective_of_rank1();
    let dir = out_dir(&format!("fault-{kind}"));
    let spec = format!("1:{i}:{kind}");
    let (ok, stdout, stderr) = mpirun(&[
        "replay",
        "scenarios/verify/dense-fsdp4.toml",
        "--backend",
        "mpi",
        "--timeout-s",
        "3",
        "--inject-fault",
        &spec,
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(!ok, "{kind}: the job must fail: {stdout}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{kind}: '{needle}' not in:\n{stderr}"
        );
    }
    assert!(
        !dir.join("replay.csv").exists(),
        "{kind}: no report after a fault"
    );
}

#[test]
fn an_erroring_rank_is_named_under_mpi() {
    fault("error", &["rank 1", "injected error"]);
}

#[test]
fn a_hanging_rank_times_out_under_mpi() {
    fault("hang", &["timeout", "did not complete within 3.0 s"]);
}

#[test]
fn a_mismatched_collective_is_named_under_mpi() {
    fault("mismatch", &["mismatch"]);
}
