//! End-to-end tests of `[whatif]` faults: `simulate` prints, and its JSON and HTML report
//! carry, the cost of each fault; `sweep` varies what-if keys; bad input exits 2 naming the
//! file, line and key.

mod common;

use common::{fresh_dir, hpfsdp, text};
use std::path::{Path, PathBuf};
use std::process::Output;

fn out_dir(tag: &str) -> PathBuf {
    fresh_dir("whatif", tag)
}

const SCENARIO: &str = "scenarios/fixtures/whatif-tiny.toml";

#[test]
fn simulate_prints_and_reports_the_cost_of_each_fault() {
    let o = hpfsdp(&["simulate", SCENARIO]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("What-if faults"), "{out}");
    for fault in [
        "baseline",
        "slow_ranks",
        "degraded_links",
        "straggler_jitter_pct",
        "all",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(fault)),
            "no row {fault}: {out}"
        );
    }

    let json = |o: &Output| -> serde_json::Value {
        assert_eq!(o.status.code(), Some(0), "{}", text(o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let a = json(&hpfsdp(&["simulate", SCENARIO, "--json"]));
    let b = json(&hpfsdp(&["simulate", SCENARIO, "--json"]));
    assert_eq!(a, b, "the what-if costs are deterministic");
    let rows = a["whatif"].as_array().expect("whatif rows");
    assert_eq!(rows.len(), 5);
    assert_eq!(rows[0]["fault"], "baseline");
    assert_eq!(rows[0]["delta_s"], 0.0);
    assert_eq!(rows[1]["fault"], "slow_ranks");
    assert!(rows[1]["delta_s"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[1]["critical_rank"], 13);
    // The `all` row is the scenario as written, i.e. the main result.
    assert_eq!(
        rows[4]["step_time_s"].as_f64().unwrap(),
        a["results"][0]["step_time_s"].as_f64().unwrap()
    );

    let dir = out_dir("report");
    let o = hpfsdp(&["simulate", SCENARIO, "--out", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("What-if faults") && html.contains("straggler_jitter_pct"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn scenarios_without_whatif_print_no_whatif_table() {
    let o = hpfsdp(&["simulate", "scenarios/verify/dense-fsdp4.toml", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v.get("whatif").is_none());
}

#[test]
fn sweep_varies_whatif_keys() {
    let dir = out_dir("sweep");
    let o = hpfsdp(&[
        "sweep",
        SCENARIO,
        "--vary",
        "whatif.straggler_jitter_pct=0,10,95",
        "--vary",
        "whatif.seed=1,2",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows[0][1], "whatif.straggler_jitter_pct");
    let step = |jitter: &str, seed: &str| {
        rows.iter()
            .find(|r| r[1] == jitter && r[2] == seed)
            .map(|r| (r[4].to_string(), r[5].to_string()))
            .unwrap()
    };
    // No jitter: the seed does not matter; with jitter it does.
    assert_eq!(step("0", "1"), step("0", "2"));
    assert_ne!(step("10", "1").1, step("10", "2").1);
    // 95% is out of range: an invalid point naming the key, not an abort.
    assert_eq!(step("95", "1").0, "invalid");
    assert!(csv.contains("straggler_jitter_pct"), "{csv}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_whatif_input_exits_2_naming_file_line_and_key() {
    let dir = out_dir("bad");
    std::fs::create_dir_all(&dir).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text_in = std::fs::read_to_string(root.join(SCENARIO))
        .unwrap()
        .replace(
            "../verify/models/tiny-dense.toml",
            root.join("scenarios/verify/models/tiny-dense.toml")
                .to_str()
                .unwrap(),
        )
        .replace("\"13\" = 1.5", "\"16\" = 1.5");
    let line = text_in
        .lines()
        .position(|l| l.starts_with("slow_ranks"))
        .unwrap()
        + 1;
    let path = dir.join("bad.toml");
    std::fs::write(&path, text_in).unwrap();
    let o = hpfsdp(&["simulate", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let msg = text(&o);
    assert!(msg.contains(&format!("bad.toml:{line}:")), "{msg}");
    assert!(msg.contains("rank 16 does not exist"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}
