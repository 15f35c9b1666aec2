//! End-to-end tests of `hpfsdp simulate`: every paper scenario simulates with the strategies it
//! lists, `--json` has the documented fields, `--out` writes the four report files (HTML with
//! no external resources), results are identical across runs, folding does not change them,
//! and bad input exits with status 2 and a message naming the problem.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn hpfsdp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run hpfsdp")
}

fn json(args: &[&str]) -> Value {
    let o = hpfsdp(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

const PAPER: [&str; 8] = [
    "exp-a-mbs1",
    "exp-a-mbs2",
    "exp-b",
    "exp-c",
    "exp-d",
    "muon-vs-dmuon",
    "muon-vs-matrixfsdp",
    "muon-vs-flexshard",
];

#[test]
fn every_paper_scenario_simulates() {
    for name in PAPER {
        let path = format!("scenarios/paper/{name}.toml");
        let doc = json(&["simulate", &path, "--json"]);
        assert_eq!(doc["scenario"], name);
        let results = doc["results"].as_array().unwrap();
        assert!(!results.is_empty(), "{name}");
        for r in results {
            let step = r["step_time_s"].as_f64().unwrap();
            assert!(step > 0.0 && step.is_finite(), "{name}: {r}");
            assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{name}");
            let mfu = r["mfu"].as_f64().unwrap();
            assert!(mfu > 0.0 && mfu < 1.0, "{name}: mfu {mfu}");
            let overlap = r["overlap_rate"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&overlap), "{name}");
            assert!(r["peak_memory_bytes"].as_u64().unwrap() > 0, "{name}");
            assert!(r["exposed_comm_s"].is_object(), "{name}");
            assert!(
                r["collectives"]["all-gather"]["count"].as_u64().unwrap() > 0,
                "{name}"
            );
            assert!(r["tier_bytes"].is_object(), "{name}");
        }
    }
}

#[test]
fn exp_b_compares_hyperparallel_with_fsdp2() {
    let doc = json(&["simulate", "scenarios/paper/exp-b.toml", "--json"]);
    let results = doc["results"].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["hyperparallel", "fsdp2"]);
    // Per-parameter collectives vs per-unit ones, derived from the model.
    assert_eq!(results[0]["collectives"]["reduce-scatter"]["count"], 531);
    assert_eq!(results[1]["collectives"]["reduce-scatter"]["count"], 49);
    // FSDP2 copies, HyperParallel does not.
    assert!(results[1]["copy_s"].as_f64().unwrap() > 0.0);
    assert_eq!(results[0]["copy_s"].as_f64().unwrap(), 0.0);
}

#[test]
fn output_is_identical_across_runs_and_with_folding_off() {
    let args = ["simulate", "scenarios/verify/dense-hsdp2x4.toml", "--json"];
    let a = hpfsdp(&args);
    let b = hpfsdp(&args);
    assert_eq!(a.stdout, b.stdout, "two runs differ");
    let folded = json(&args);
    let unfolded = json(&[
        "simulate",
        "scenarios/verify/dense-hsdp2x4.toml",
        "--json",
        "--no-fold",
    ]);
    for (f, u) in folded["results"]
        .as_array()
        .unwrap()
        .iter()
        .zip(unfolded["results"].as_array().unwrap())
    {
        for key in [
            "step_time_s",
            "exposed_comm_s",
            "overlap_rate",
            "peak_memory_bytes",
            "collectives",
            "tier_bytes",
        ] {
            assert_eq!(f[key], u[key], "{key} differs with folding off");
        }
        assert!(f["simulated_ranks"].as_u64() < u["simulated_ranks"].as_u64());
    }
}

#[test]
fn out_dir_gets_a_self_contained_report() {
    let dir = std::env::temp_dir().join(format!("hpfsdp-sim-out-{}", std::process::id()));
    let o = hpfsdp(&[
        "simulate",
        "scenarios/paper/exp-b.toml",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("step time") && out.contains("overlap rate"),
        "{out}"
    );
    for f in ["report.html", "summary.csv", "timeline.csv", "trace.json"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.matches("<svg").count() >= 4, "charts missing");
    for bad in ["src=\"http", "href=\"http", "<script src", "<link"] {
        assert!(!html.contains(bad), "external resource: {bad}");
    }
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap();
    assert!(trace["traceEvents"].as_array().unwrap().len() > 100);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_exits_2_with_a_clear_message() {
    let o = hpfsdp(&[
        "simulate",
        "scenarios/paper/exp-b.toml",
        "--strategy",
        "zero3",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("zero3") && err.contains("hyperparallel"),
        "{err}"
    );

    let o = hpfsdp(&[
        "simulate",
        "scenarios/paper/exp-b.toml",
        "--hardware",
        "tpu-v9",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tpu-v9"), "{err}");

    let o = hpfsdp(&["simulate", "scenarios/paper/no-such.toml"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no-such.toml"), "{err}");
}

#[test]
fn muon_optimizer_strategies_simulate_on_a_comparison_scenario() {
    let mut steps = Vec::new();
    for o in [
        "hyperparallel",
        "naive",
        "moonlight",
        "dmuon",
        "matrixfsdp",
        "flexshard",
    ] {
        let doc = json(&[
            "simulate",
            "scenarios/paper/muon-vs-flexshard.toml",
            "--strategy",
            "hyperparallel",
            "--optimizer",
            o,
            "--json",
        ]);
        let r = &doc["results"][0];
        // hyperparallel Muon is the scenario's default optimizer: the run keeps the plain name.
        let name = if o == "hyperparallel" {
            "hyperparallel".to_string()
        } else {
            format!("hyperparallel+{o}")
        };
        assert_eq!(r["strategy"], name);
        assert_eq!(r["optimizer"], o);
        assert!(
            r["optimizer_figures"]["range_s"].as_f64().unwrap() > 0.0,
            "{o}"
        );
        let step = r["step_time_s"].as_f64().unwrap();
        assert!(step > 0.0 && step.is_finite(), "{o}");
        steps.push((o, step));
    }
    // Naive Muon gathers and orthogonalizes every matrix on every rank: the slowest.
    let naive = steps.iter().find(|(o, _)| *o == "naive").unwrap().1;
    assert!(steps.iter().all(|(_, s)| *s <= naive), "{steps:?}");
}

/// Without flags a Muon comparison scenario runs its strategy with the default (hyperparallel)
/// Muon and then with each `[optimizer] baselines` entry, and reports the optimizer range,
/// optimizer bytes per tier and the peak-memory spread for each; the HTML report has them too.
#[test]
fn muon_comparison_scenario_runs_its_baselines_and_reports_them() {
    let dir = std::env::temp_dir().join(format!("hpfsdp-muon-cmp-{}", std::process::id()));
    let out = dir.to_string_lossy().to_string();
    let doc = json(&[
        "simulate",
        "scenarios/paper/muon-vs-dmuon.toml",
        "--json",
        "--out",
        &out,
    ]);
    let results = doc["results"].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "hyperparallel",
            "hyperparallel+dmuon",
            "hyperparallel+naive"
        ]
    );
    for r in results {
        let o = &r["optimizer_figures"];
        let range = o["range_s"].as_f64().unwrap();
        let busy = o["busy_s"].as_f64().unwrap();
        assert!(range >= busy && busy > 0.0, "{r}");
        let m = &r["memory_spread"];
        assert!(m["min_bytes"].as_u64().unwrap() <= m["mean_bytes"].as_u64().unwrap());
        assert!(m["mean_bytes"].as_u64().unwrap() <= m["max_bytes"].as_u64().unwrap());
        assert_eq!(m["max_bytes"], r["peak_memory_bytes"]);
    }
    // Owner-resident full matrices (dmuon) make peak memory differ across ranks.
    let spread = |i: usize| {
        let m = &results[i]["memory_spread"];
        m["max_bytes"].as_u64().unwrap() - m["min_bytes"].as_u64().unwrap()
    };
    assert!(
        spread(1) > spread(0),
        "dmuon {} vs hyperparallel {}",
        spread(1),
        spread(0)
    );
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("<h2>Optimizer step</h2>"));
    assert!(html.contains("<h2>Peak memory across ranks</h2>"));
    assert!(html.contains("hyperparallel+dmuon"));
    let csv = std::fs::read_to_string(dir.join("summary.csv")).unwrap();
    assert!(csv.lines().next().unwrap().contains("optimizer_range_s"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `--kernel-classes` adds rank 0's device time by phase and kernel class: a table in text
/// mode, a `kernel_classes` array in JSON (absent without the flag), summing to the device
/// time of a one-GPU step's kernels.
#[test]
fn kernel_classes_break_rank0_device_time_down() {
    let path = "scenarios/gpu/moe30b-4l-mbs1-grouped.toml";
    let plain = json(&["simulate", path, "--json"]);
    assert!(plain.get("kernel_classes").is_none());
    let doc = json(&["simulate", path, "--json", "--kernel-classes"]);
    let classes = doc["kernel_classes"].as_array().unwrap();
    assert_eq!(classes.len(), 1);
    assert_eq!(classes[0]["strategy"], "fsdp2");
    let rows = classes[0]["rows"].as_array().unwrap();
    let find = |phase: &str, class: &str| {
        rows.iter()
            .find(|r| r["phase"] == phase && r["class"] == class)
            .unwrap_or_else(|| panic!("{phase} {class}: {rows:?}"))
    };
    assert_eq!(find("forward", "grouped-gemm")["launches"], 8);
    assert_eq!(find("backward", "grouped-gemm")["launches"], 16);
    assert_eq!(find("optimizer", "multi-tensor-apply")["launches"], 1192);
    let total_s: f64 = rows.iter().map(|r| r["device_s"].as_f64().unwrap()).sum();
    let step_s = doc["results"][0]["step_time_s"].as_f64().unwrap();
    assert!(
        total_s > 0.9 * step_s && total_s <= step_s,
        "{total_s} vs {step_s}"
    );
    // The same results as without the flag.
    assert_eq!(doc["results"], plain["results"]);
    let text = hpfsdp(&["simulate", path, "--kernel-classes"]);
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(
        out.contains("rank 0 device time by phase and kernel class, fsdp2 + adamw"),
        "{out}"
    );
    assert!(out.contains("backward   chunk-cat"), "{out}");
}
