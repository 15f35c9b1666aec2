//! End-to-end tests of `hpfsdp calibrate`: the default comparison's JSON and exit status agree
//! with its verdict; `--from` a collective table refits the tiers and `--write-profile` writes
//! a loadable profile with the fitted values and the original comments; a GEMM table becomes
//! the profile's GEMM table; the shipped profiles are never overwritten; bad tables exit 2
//! naming the file and line.

use hpfsdp_plan::{CollectiveKind, Tier};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::calibration::coll_table::{
    COLLECTIVE_COLUMNS, CollectiveRow, algbw_busbw, collective_name, predicted_s,
};
use hpfsdp_sim::calibration::params::set;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hpfsdp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run hpfsdp")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hpfsdp-cli-calibrate-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An intra-machine collbench table of 16 ranks generated with latency 3 us, efficiency 0.55.
fn collbench_table() -> String {
    let mut truth = HardwareProfile::builtin("ascend-910c-a3").unwrap();
    set(&mut truth, "tiers.intra_machine.latency_us", 3.0);
    set(&mut truth, "tiers.intra_machine.efficiency", 0.55);
    set(&mut truth, "calibration.unaligned_bandwidth_factor", 0.4);
    let mut out = COLLECTIVE_COLUMNS.join(",");
    out.push('\n');
    // Powers of two (aligned from 2^16 up; 2^12 leaves 256 B per rank) and one size of 32 x an
    // odd count, never a multiple of 512 bytes per rank.
    let sizes = [
        1u64 << 12,
        1 << 16,
        1 << 20,
        1 << 24,
        1 << 28,
        1_048_573 * 32,
    ];
    for kind in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
        for size in sizes {
            let row = CollectiveRow {
                line: 0,
                kind,
                size_bytes: size,
                time_us: 1.0,
                tier: Tier::IntraMachine,
                ranks: 16,
            };
            let t = predicted_s(&row, &truth);
            let (algbw, busbw) = algbw_busbw(kind, size, t, 16);
            out.push_str(&format!(
                "{},{size},{},bfloat16,sum,-1,{:.3},{:.2},{:.2},0,intra-machine,16\n",
                collective_name(kind),
                size / 2,
                t * 1e6,
                algbw / 1e9,
                busbw / 1e9
            ));
        }
    }
    out
}

#[test]
fn the_default_comparison_reports_every_figure_and_its_exit_status_follows_the_verdict() {
    let out = scratch("default");
    let o = hpfsdp(&["calibrate", "--json", "--out", out.to_str().unwrap()]);
    let doc: Value = serde_json::from_slice(&o.stdout).expect("json");
    let passed = doc["passed"].as_bool().unwrap();
    assert_eq!(o.status.code(), Some(if passed { 0 } else { 1 }));
    let rows = doc["rows"].as_array().unwrap();
    assert!(rows.len() >= 30);
    assert!(rows.iter().all(|r| r["fitted"] == false), "no fit was run");
    let failing_gate = rows
        .iter()
        .any(|r| r["gating"] == true && r["passed"] == false);
    assert_eq!(
        passed,
        !failing_gate && doc["exp_b_diff_error_pp"].as_f64().unwrap().abs() <= 3.0
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<svg"));
    assert_eq!(html.contains("verdict pass"), passed);
    assert!(html.contains("Host model"));
    assert!(html.contains("Unfitted constants with public ranges"));
    let ranges = doc["sourced_ranges"].as_array().unwrap();
    assert!(!ranges.is_empty());
    assert!(
        ranges.iter().all(|r| r["verdict"] == "inside"),
        "{ranges:?}"
    );
    // The host model per run: validation events are counted in both modes of exp A and
    // charged only in validation mode; every expert-parallel MoE layer forward syncs once, and
    // the trainer reads six scalars back per micro-batch (program/src/strategy/step_tail.rs:
    // the SP token count, the step tokens, the weighted loss, the global loss, and the two
    // loss read-backs after backward).
    let host = doc["host"].as_array().unwrap();
    let run = |label: &str| host.iter().find(|h| h["run"] == label).unwrap();
    let (prod, val) = (run("production mode"), run("validation mode"));
    assert!(prod["validation_events"].as_u64().unwrap() > 0);
    assert_eq!(prod["validation_events"], val["validation_events"]);
    assert_eq!(prod["validation_s"].as_f64(), Some(0.0));
    assert!(val["validation_s"].as_f64().unwrap() > 0.0);
    assert_eq!(prod["d2h_syncs"].as_u64(), Some(48 * 4 + 6 * 4));
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn from_a_collective_table_writes_a_loadable_profile_with_the_fitted_tier() {
    let dir = scratch("coll");
    let table = dir.join("coll.csv");
    std::fs::write(&table, collbench_table()).unwrap();
    let profile = dir.join("my-a3.toml");
    let o = hpfsdp(&[
        "calibrate",
        "--from",
        table.to_str().unwrap(),
        "--write-profile",
        profile.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{err}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("Tier fits from"), "{stdout}");
    let loaded = HardwareProfile::load(&profile).unwrap();
    assert_eq!(loaded.name, "my-a3");
    let t = &loaded.tiers.intra_machine;
    assert!((t.efficiency - 0.55).abs() < 0.005, "{}", t.efficiency);
    assert!((t.latency_us - 3.0).abs() < 0.1, "{}", t.latency_us);
    let factor = loaded.calibration.unaligned_bandwidth_factor;
    assert!((factor - 0.4).abs() < 0.01, "unaligned factor {factor}");
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(text.contains("rows not 512-byte aligned"), "{text}");
    assert!(text.contains("# Atlas 900 A3 SuperPoD"), "comments kept");
    assert!(text.contains("FITTED by `hpfsdp calibrate --from"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn from_a_gemm_table_writes_the_profile_gemm_table() {
    let dir = scratch("gemm");
    let table = dir.join("gemm.csv");
    std::fs::write(&table, "m,n,k,dtype,time_us\n4096,4096,4096,bf16,731.0\n").unwrap();
    let profile = dir.join("gemm-a3.toml");
    let o = hpfsdp(&[
        "calibrate",
        "--from",
        table.to_str().unwrap(),
        "--write-profile",
        profile.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let gemm = std::fs::read_to_string(dir.join("gemm-a3.gemm.csv")).unwrap();
    assert!(gemm.starts_with("m,n,k,dtype,efficiency,source\n4096,4096,4096,bf16,0.5000,"));
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(text.contains("[compute]") && text.contains("gemm_table = \"gemm-a3.gemm.csv\""));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn shipped_profiles_are_never_overwritten_and_bad_tables_name_the_line() {
    let o = hpfsdp(&[
        "calibrate",
        "--write-profile",
        "scenarios/hardware/ascend-910c-a3.toml",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--write-profile"), "{err}");
    let dir = scratch("bad");
    let table = dir.join("bad.csv");
    let text = collbench_table().replacen(",intra-machine,16\n", ",intra-machine,1\n", 1);
    std::fs::write(&table, text).unwrap();
    let o = hpfsdp(&["calibrate", "--from", table.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.csv:2") && err.contains("'ranks'"),
        "{err}"
    );
}

/// The runs file `scenarios/runs/paper-a3.toml` gives `calibrate --json` byte for byte what
/// the hard-wired runs gave (the fixture is the output of the branch start, before the runs
/// became data).
#[test]
fn the_paper_runs_file_reproduces_the_comparison_of_the_hard_wired_runs() {
    let out = scratch("before-plain");
    let o = hpfsdp(&["calibrate", "--json", "--out", out.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let before = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/calibrate-paper-before/comparison.json"),
    )
    .unwrap();
    assert!(
        o.stdout == before,
        "calibrate --json differs from the hard-wired runs' output"
    );
    std::fs::remove_dir_all(&out).ok();
}

/// The same for the joint fit and every leave-one-out fold (`--fit --loo --json`).
#[test]
#[ignore = "joint fit and six leave-one-out folds of the paper runs (~70 s)"]
fn the_paper_runs_file_reproduces_the_fit_and_loo_of_the_hard_wired_runs() {
    let out = scratch("before-loo");
    let o = hpfsdp(&[
        "calibrate",
        "--fit",
        "--loo",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let before = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/calibrate-paper-before/fit-loo.json"),
    )
    .unwrap();
    assert!(
        o.stdout == before,
        "calibrate --fit --loo --json differs from before"
    );
    std::fs::remove_dir_all(&out).ok();
}
