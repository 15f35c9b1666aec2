//! End-to-end tests of `hpfsdp collbench` on the in-process backend: the CSV has exactly the
//! columns `calibrate --from` reads, every result is correct, algbw and busbw follow
//! nccl-tests' definitions, groups and dtypes work, and bad input exits with 2.

use std::path::Path;
use std::process::{Command, Output};

fn hpfsdp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run hpfsdp")
}

fn sweep(extra: &[&str], tag: &str) -> Vec<Vec<String>> {
    let file =
        std::env::temp_dir().join(format!("hpfsdp-collbench-{tag}-{}.csv", std::process::id()));
    let mut args = vec![
        "collbench",
        "--backend",
        "inproc",
        "--min-bytes",
        "8",
        "--max-bytes",
        "4K",
        "--factor",
        "8",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--out",
        file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = hpfsdp(&args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("out of bounds values: 0 OK"), "{stdout}");
    assert!(stdout.contains("# Avg bus bandwidth"), "{stdout}");
    let text = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        "collective,size,count,type,redop,root,time_us,algbw,busbw,#wrong,tier,ranks"
    );
    lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect()
}

fn factor(kind: &str, n: f64) -> f64 {
    match kind {
        "all-reduce" => 2.0 * (n - 1.0) / n,
        "broadcast" => 1.0,
        _ => (n - 1.0) / n,
    }
}

#[test]
fn sweep_on_inproc_is_correct_with_nccl_tests_bandwidths() {
    let rows = sweep(&["--ranks", "4"], "world");
    let kinds: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    for k in [
        "all-gather",
        "reduce-scatter",
        "all-reduce",
        "broadcast",
        "all-to-all",
    ] {
        assert!(kinds.contains(&k), "{k} missing");
    }
    for r in &rows {
        assert_eq!(r.len(), 12);
        let size: f64 = r[1].parse().unwrap();
        let count: f64 = r[2].parse().unwrap();
        let time_us: f64 = r[6].parse().unwrap();
        let algbw: f64 = r[7].parse().unwrap();
        let busbw: f64 = r[8].parse().unwrap();
        assert_eq!(r[3], "float");
        assert_eq!(r[9], "0", "#wrong in {r:?}");
        assert_eq!(r[10], "intra-machine");
        assert_eq!(r[11], "4");
        // nccl-tests' per-rank buffer convention: count is per rank chunk for the chunked kinds.
        let chunks = if ["all-gather", "reduce-scatter", "all-to-all"].contains(&r[0].as_str()) {
            4.0
        } else {
            1.0
        };
        assert_eq!(size, count * 4.0 * chunks, "{r:?}");
        assert!(time_us > 0.0);
        assert!(
            (algbw - size / time_us / 1e3).abs() <= 1e-9 * algbw.max(1.0),
            "{r:?}"
        );
        assert!(
            (busbw - algbw * factor(&r[0], 4.0)).abs() <= 1e-9 * busbw.max(1.0),
            "{r:?}"
        );
        let root = if r[0] == "broadcast" { "0" } else { "-1" };
        assert_eq!(r[5], root);
    }
}

#[test]
fn bf16_on_pairs_of_ranks() {
    let rows = sweep(
        &[
            "--ranks",
            "4",
            "--groups",
            "size:2",
            "--dtype",
            "bf16",
            "--kinds",
            "all-reduce,all-gather",
        ],
        "pairs",
    );
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(r[3], "bfloat16");
        assert_eq!(r[9], "0");
        assert_eq!(r[11], "2");
    }
}

/// nccl-tests' short flags, rows printed as they are measured, the in-place block (N/A for
/// host buffers), the closing average bus bandwidth, and `-c 0` leaving #wrong unknown.
#[test]
fn nccl_tests_flags_and_output() {
    let file =
        std::env::temp_dir().join(format!("hpfsdp-collbench-short-{}.csv", std::process::id()));
    let o = hpfsdp(&[
        "collbench",
        "--backend",
        "inproc",
        "--ranks",
        "2",
        "--kinds",
        "all-reduce",
        "-b",
        "64",
        "-e",
        "4K",
        "-f",
        "4",
        "-n",
        "3",
        "-w",
        "1",
        "-c",
        "0",
        "--out",
        file.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("all-reduce"))
        .collect();
    // 64, 256, 1024, 4096 bytes.
    assert_eq!(rows.len(), 4, "{out}");
    for r in &rows {
        let cells: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(cells.len(), 14, "{r}");
        assert_eq!(&cells[9..], ["N/A"; 5], "-c 0 and host buffers: {r}");
    }
    assert!(
        out.contains("out-of-place") && out.contains("in-place"),
        "{out}"
    );
    assert!(out.contains("out of bounds values: N/A"), "{out}");
    let avg = out
        .lines()
        .find_map(|l| l.strip_prefix("# Avg bus bandwidth    : "))
        .unwrap_or_else(|| panic!("no average line in {out}"));
    assert!(avg.trim().parse::<f64>().unwrap() > 0.0, "{avg}");
    let text = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        text.lines()
            .skip(1)
            .all(|l| l.split(',').nth(9) == Some("N/A")),
        "{text}"
    );
}

#[test]
fn bad_input_is_refused() {
    for (args, needle) in [
        (
            vec!["collbench", "--backend", "inproc", "--kinds", "gather"],
            "unknown collective 'gather'",
        ),
        (
            vec!["collbench", "--backend", "inproc", "--min-bytes", "1X"],
            "is not a byte size",
        ),
        (
            vec![
                "collbench",
                "--backend",
                "inproc",
                "--ranks",
                "4",
                "--groups",
                "size:3",
            ],
            "group size 3 does not divide the 4 ranks",
        ),
    ] {
        let o = hpfsdp(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: '{needle}' not in {err}");
    }
    // Counts beyond their limits (issue 27: `--iters 4000000000` aborted allocating 128 GB,
    // `--ranks 1000` gave nothing in 60 s, `--ranks 100000` aborted).
    for (args, needle) in [
        (vec!["--iters", "4000000000"], "1..=10000"),
        (vec!["-n", "0"], "1..=10000"),
        (vec!["-w", "4000000000"], "0..=10000"),
        (vec!["--ranks", "1000"], "1..=64"),
        (vec!["--ranks", "100000"], "1..=64"),
        (vec!["-c", "2"], "0..=1"),
        (vec!["-e", "32G"], "at most 17179869184 bytes"),
    ] {
        let mut all = vec!["collbench", "--backend", "inproc"];
        all.extend(args.iter().copied());
        let o = hpfsdp(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {err}");
        assert!(err.contains(needle), "{all:?}: '{needle}' not in {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // A backend not compiled in names the feature and the rebuild; one compiled in refuses
    // --ranks (its launcher sets the rank count).
    let o = hpfsdp(&["collbench", "--backend", "nccl", "--ranks", "2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "this hpfsdp was built without the `nccl` feature; rebuild with `cargo build --release --features nccl`"
        ) || err.contains("--ranks is for --backend inproc"),
        "{err}"
    );
}
