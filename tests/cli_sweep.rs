//! End-to-end tests of `hpfsdp sweep`: the cartesian product of `--vary` keys, invalid points
//! reported with their error instead of aborting, sweep.csv / sweep.html written and identical
//! for any `--jobs`, every point simulated on its own hardware profile (an unknown one is an
//! invalid point), `--json`, and bad input exiting 2 with a message naming the key.

mod common;

use common::{fresh_dir, hpfsdp, text};
use std::path::{Path, PathBuf};

fn out_dir(tag: &str) -> PathBuf {
    fresh_dir("sweep", tag)
}

const SCENARIO: &str = "scenarios/verify/dense-fsdp4.toml";

fn sweep(dir: &Path, jobs: &str) -> (String, String) {
    let o = hpfsdp(&[
        "sweep",
        SCENARIO,
        "--vary",
        "mesh.tp=1,3",
        "--vary",
        "train.micro_batch=1,2",
        "--strategy",
        "hyperparallel",
        "--strategy",
        "fsdp2",
        "--out",
        dir.to_str().unwrap(),
        "--jobs",
        jobs,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("best feasible point: mesh.tp=1"),
        "{}",
        text(&o)
    );
    (
        std::fs::read_to_string(dir.join("sweep.csv")).unwrap(),
        std::fs::read_to_string(dir.join("sweep.html")).unwrap(),
    )
}

#[test]
fn invalid_points_are_reported_and_output_is_the_same_for_any_jobs() {
    let (a, b) = (out_dir("j1"), out_dir("j3"));
    let (csv1, html1) = sweep(&a, "1");
    let (csv3, html3) = sweep(&b, "3");
    assert_eq!(csv1, csv3, "sweep.csv differs between --jobs 1 and 3");
    assert_eq!(html1, html3, "sweep.html differs between --jobs 1 and 3");
    let rows: Vec<Vec<&str>> = csv1.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(
        &rows[0][..5],
        &[
            "point",
            "mesh.tp",
            "train.micro_batch",
            "strategy",
            "status"
        ]
    );
    // tp=1: two points x two strategies simulated; tp=3: two points, each one invalid row.
    let ok: Vec<_> = rows[1..].iter().filter(|r| r[4] == "ok").collect();
    let invalid: Vec<_> = rows[1..].iter().filter(|r| r[4] == "invalid").collect();
    assert_eq!(ok.len(), 4, "{csv1}");
    assert_eq!(invalid.len(), 2, "{csv1}");
    assert!(ok.iter().all(|r| r[1] == "1"), "{csv1}");
    assert!(invalid.iter().all(|r| r[1] == "3"), "{csv1}");
    assert!(
        csv1.lines()
            .filter(|l| l.contains(",invalid,"))
            .all(|l| l.len() > 40),
        "invalid rows carry their error: {csv1}"
    );
    let best = rows[0].iter().position(|h| *h == "best").unwrap();
    assert_eq!(
        ok.iter().filter(|r| r[best] == "true").count(),
        1,
        "one best row: {csv1}"
    );
    assert!(html1.contains("best feasible point: mesh.tp=1"));
    assert!(
        html1.contains("<svg") && html1.contains("<circle"),
        "{html1}"
    );
    std::fs::remove_dir_all(&a).ok();
    std::fs::remove_dir_all(&b).ok();
}

#[test]
fn each_point_is_simulated_on_its_own_hardware_and_unknown_profiles_are_invalid() {
    let dir = out_dir("hardware");
    let o = hpfsdp(&[
        "sweep",
        SCENARIO,
        "--vary",
        "hardware=ascend-910c-a3,nvidia-h200-hgx,no-such-gpu",
        "--strategy",
        "fsdp2",
        "--out",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json prints JSON");
    let rows = v["report"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{v}");
    // Each simulated point names and uses its own profile: the H200's 141 GB HBM and a
    // different step time, not the base profile's.
    assert_eq!(rows[0]["hardware"], "ascend-910c-a3");
    assert_eq!(rows[1]["hardware"], "nvidia-h200-hgx");
    assert_eq!(rows[0]["hbm_capacity_bytes"], 64_000_000_000u64);
    assert_ne!(rows[1]["hbm_capacity_bytes"], rows[0]["hbm_capacity_bytes"]);
    assert_ne!(rows[1]["step_time_s"], rows[0]["step_time_s"]);
    assert_eq!(rows[2]["status"], "invalid");
    assert!(
        rows[2]["message"]
            .as_str()
            .unwrap()
            .contains("hardware profile 'no-such-gpu'"),
        "{v}"
    );
    assert_eq!(
        v["report"]["hardware"], "ascend-910c-a3, nvidia-h200-hgx",
        "{v}"
    );
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    assert!(
        csv.lines().nth(2).unwrap().contains(",nvidia-h200-hgx,"),
        "{csv}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_default_out_is_the_ignored_out_folder() {
    let o = hpfsdp(&["sweep", "--help"]);
    assert!(text(&o).contains("[default: out/sweep]"), "{}", text(&o));
    let ignore =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".gitignore")).unwrap();
    assert!(ignore.lines().any(|l| l == "/out"), "{ignore}");
}

#[test]
fn bad_input_exits_2_naming_the_key() {
    let dir = out_dir("bad");
    let d = dir.to_str().unwrap();
    for (vary, expect) in [
        ("mesh.tp", "is not KEY=VALUE"),
        ("mesh..tp=1", "empty segment"),
        ("mesh.tp=", "has no values"),
        ("mesh.dp_shrd=2,4", "dp_shrd"),
        ("mesh=2", "key 'mesh' is a table"),
    ] {
        let o = hpfsdp(&["sweep", SCENARIO, "--vary", vary, "--out", d]);
        assert_eq!(o.status.code(), Some(2), "{vary}: {}", text(&o));
        assert!(text(&o).contains(expect), "{vary}: {}", text(&o));
    }
    let o = hpfsdp(&[
        "sweep",
        SCENARIO,
        "--vary",
        "mesh.tp=1",
        "--strategy",
        "zero3",
        "--out",
        d,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("--strategy zero3: unknown strategy"),
        "{}",
        text(&o)
    );
    let o = hpfsdp(&[
        "sweep",
        SCENARIO,
        "--vary",
        "mesh.tp=1",
        "--jobs",
        "0",
        "--out",
        d,
    ]);
    assert_eq!(o.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_point_with_a_lint_error_is_reported_with_its_lint() {
    let dir = out_dir("lint");
    let o = hpfsdp(&[
        "sweep",
        SCENARIO,
        "--vary",
        "mesh.dp_shard=4,1",
        "--vary",
        "mesh.tp=1,4",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    let lint = csv
        .lines()
        .find(|l| l.starts_with("3,1,4,"))
        .expect("point 3 row");
    assert!(lint.contains(",invalid,"), "{csv}");
    assert!(
        lint.contains("error[kv-heads-not-divisible]")
            && lint.contains("fix: choose tp dividing 2"),
        "{csv}"
    );
    assert!(
        csv.lines()
            .any(|l| l.starts_with("0,4,1,hyperparallel,ok,")),
        "{csv}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[cfg(not(feature = "mpi"))]
#[test]
fn under_mpi_without_mpi_support_names_the_rebuild() {
    let o = hpfsdp(&[
        "sweep",
        SCENARIO,
        "--vary",
        "fsdp.prefetch_depth=0,1",
        "--under-mpi",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--features mpi"), "{}", text(&o));
}
