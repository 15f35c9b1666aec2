//! End-to-end tests of `hpfsdp replay` on the in-process backend: the two verify scenarios
//! replay with every op of every rank measured and dependencies respected, the report files
//! are written with the documented columns, scaling is reported, every fault kind ends the
//! run with an error naming the rank, the op and the group, and bad input exits with 2.

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::{Payload, StepProgram};
use hpfsdp_sim::scenario_run::{ScenarioPlans, prepare};
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

fn out_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hpfsdp-replay-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Every rank's program, as `replay` (and `simulate --no-fold`) generates it.
fn programs(scenario: &str) -> Vec<StepProgram> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(scenario);
    let plans = ScenarioPlans::new(Scenario::load(&path).unwrap());
    let strategy = plans.scenario.file.fsdp.strategy.clone();
    prepare(&plans, &strategy, None, false)
        .unwrap()
        .workload
        .units
        .into_iter()
        .map(|u| u.program)
        .collect()
}

/// One parsed `replay.csv` row: (op, rank, kind, category, bytes, start, end, pstart, pend).
type Row = (String, usize, String, String, u64, f64, f64, f64, f64);

fn read_csv(path: &Path) -> (String, Vec<Row>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap().to_string();
    let rows = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 9, "{l}");
            (
                f[0].to_string(),
                f[1].parse().unwrap(),
                f[2].to_string(),
                f[3].to_string(),
                f[4].parse().unwrap(),
                f[5].parse().unwrap(),
                f[6].parse().unwrap(),
                f[7].parse().unwrap(),
                f[8].parse().unwrap(),
            )
        })
        .collect();
    (header, rows)
}

/// Without `--out` the report goes to `out/replay/<scenario>` (under the working directory,
/// like every command's default output), never into the repository's `reports/`.
#[test]
fn the_default_out_is_out_replay_scenario() {
    let cwd = out_dir("default-out");
    std::fs::create_dir_all(&cwd).unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/verify/dense-fsdp4.toml");
    let o = Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(["replay", scenario.to_str().unwrap()])
        .args(["--backend", "inproc", "--steps", "1", "--warmup", "0"])
        .current_dir(&cwd)
        .output()
        .expect("run hpfsdp");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("wrote out/replay/dense-fsdp4/replay.csv"),
        "{stdout}"
    );
    for f in ["replay.csv", "trace.json", "report.html"] {
        assert!(
            cwd.join("out/replay/dense-fsdp4").join(f).is_file(),
            "{f} missing"
        );
    }
    let _ = std::fs::remove_dir_all(&cwd);
}

fn replay_end_to_end(scenario: &str, tag: &str) {
    let dir = out_dir(tag);
    let o = hpfsdp(&[
        "replay",
        scenario,
        "--backend",
        "inproc",
        "--steps",
        "1",
        "--json",
        "--timeout-s",
        "60",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["backend"], "inproc");
    assert_eq!(doc["hardware"], "cpu-mpi");
    assert!(doc["measured"]["step_ns"].as_u64().unwrap() > 0);
    assert!(doc["predicted"]["step_ns"].as_u64().unwrap() > 0);
    for f in ["replay.csv", "trace.json", "report.html"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let (header, rows) = read_csv(&dir.join("replay.csv"));
    assert_eq!(
        header,
        "op,rank,kind,category,bytes,start_us,end_us,predicted_start_us,predicted_end_us"
    );
    let programs = programs(scenario);
    assert_eq!(doc["ranks"].as_u64().unwrap() as usize, programs.len());
    let total: usize = programs.iter().map(|p| p.ops.len()).sum();
    assert_eq!(rows.len(), total, "one row per op of every rank");
    let mut at = 0;
    for p in &programs {
        let mine = &rows[at..at + p.ops.len()];
        at += p.ops.len();
        for (i, op) in p.ops.iter().enumerate() {
            let r = &mine[i];
            assert_eq!(r.1, p.rank);
            assert_eq!(r.3, op.category.name());
            assert!(r.6 >= r.5, "rank {} op {i}: end before start", p.rank);
            assert!(r.8 >= r.7);
            if let Payload::Collective(c) = &op.payload {
                assert_eq!(r.2, c.kind.name());
                assert_eq!(r.4, c.output_bytes);
                assert!(r.6 > 0.0, "rank {} collective {i} never ended", p.rank);
            }
            for d in &op.deps {
                let dep_end = mine[d.index()].6;
                assert!(
                    r.5 >= dep_end,
                    "rank {} op {i} started at {} us before its dependency {} ended at {dep_end} us",
                    p.rank,
                    r.5,
                    d.index()
                );
            }
        }
    }
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap();
    let names: Vec<String> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["measured (inproc)", "predicted (cpu-mpi)"]);
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    for needle in [
        "Per category",
        "Per collective kind",
        "Worst mispredicted",
        "<svg",
    ] {
        assert!(html.contains(needle), "{needle}");
    }
    for bad in ["src=\"http", "href=\"http", "<script src", "<link"] {
        assert!(!html.contains(bad), "external resource: {bad}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dense_fsdp4_replays_on_inproc() {
    replay_end_to_end("scenarios/verify/dense-fsdp4.toml", "dense");
}

#[test]
fn moe_ep2_fsdp2_replays_on_inproc() {
    replay_end_to_end("scenarios/verify/moe-ep2-fsdp2.toml", "moe");
}

#[test]
fn scaling_down_is_reported() {
    let dir = out_dir("scaled");
    let o = hpfsdp(&[
        "replay",
        "scenarios/verify/moe-ep2-fsdp2.toml",
        "--backend",
        "inproc",
        "--ranks",
        "2",
        "--layers",
        "1",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["ranks"], 2);
    let notes: Vec<&str> = doc["scaling"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes.iter().any(|n| n.contains("dp_shard 4 -> 2")),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|n| n.contains("num_hidden_layers 2 -> 1")),
        "{notes:?}"
    );
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("Scaled down for the replay"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rank 1's first collective at or after op 3: (index, name, group label).
fn a_collective_of_rank1() -> (usize, String, String) {
    let p = &programs("scenarios/verify/dense-fsdp4.toml")[1];
    let (i, op) = p
        .ops
        .iter()
        .enumerate()
        .skip(3)
        .find(|(_, o)| matches!(o.payload, Payload::Collective(_)))
        .unwrap();
    let Payload::Collective(c) = &op.payload else {
        unreachable!()
    };
    (
        i,
        op.name.clone().unwrap(),
        p.groups[c.group.index()].label.clone(),
    )
}

fn fault(kind: &str, expect: &[&str]) {
    let (i, name, group) = a_collective_of_rank1();
    let dir = out_dir(&format!("fault-{kind}"));
    let spec = format!("1:{i}:{kind}");
    let o = hpfsdp(&[
        "replay",
        "scenarios/verify/dense-fsdp4.toml",
        "--backend",
        "inproc",
        "--timeout-s",
        "1",
        "--inject-fault",
        &spec,
        "--out",
        dir.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{kind}: {err}");
    let first = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("{kind}: no error line in {err}"));
    for needle in [
        format!("op #{i}"),
        format!("'{name}'"),
        format!("group {group}["),
    ] {
        assert!(
            first.contains(&needle),
            "{kind}: '{needle}' not in: {first}"
        );
    }
    for needle in expect {
        assert!(first.contains(needle), "{kind}: '{needle}' not in: {first}");
    }
    assert!(
        !dir.join("replay.csv").exists(),
        "{kind}: no report after a fault"
    );
}

#[test]
fn a_panicking_rank_is_named() {
    fault("panic", &["rank 1,", "died: panicked"]);
}

#[test]
fn a_failing_rank_is_named() {
    fault("error", &["rank 1,", "died: injected error"]);
}

#[test]
fn a_hanging_rank_times_out_its_peers() {
    fault("hang", &["timeout", "waiting for rank(s) [1]"]);
}

#[test]
fn a_mismatched_collective_is_named() {
    fault(
        "mismatch",
        &["collective mismatch", "rank 1 called all-reduce"],
    );
}

fn fails_with(args: &[&str], needle: &str) {
    let o = hpfsdp(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: '{needle}' not in {err}");
}

#[test]
fn bad_input_is_refused() {
    let dense = "scenarios/verify/dense-fsdp4.toml";
    fails_with(
        &["replay", dense, "--backend", "gloo"],
        "unknown backend 'gloo'; choose one of inproc, mpi, hccl, nccl",
    );
    fails_with(
        &[
            "replay",
            "scenarios/verify/dense-tp2-fsdp2.toml",
            "--backend",
            "inproc",
            "--ranks",
            "3",
        ],
        "--ranks 3: tp x cp = 2 must divide it",
    );
    fails_with(
        &["replay", dense, "--backend", "inproc", "--ranks", "8"],
        "scales a scenario down only",
    );
    fails_with(
        &["replay", dense, "--backend", "inproc", "--layers", "9"],
        "--layers 9: the model has 2 layers",
    );
    fails_with(
        &[
            "replay",
            dense,
            "--backend",
            "inproc",
            "--strategy",
            "zero3",
        ],
        "--strategy zero3: unknown strategy",
    );
    fails_with(
        &[
            "replay",
            dense,
            "--backend",
            "inproc",
            "--inject-fault",
            "1:99999:panic",
        ],
        "op #99999 does not exist",
    );
}

/// Every count a user gives has a limit, checked before anything is allocated or looped
/// over: exit 2 with the flag and the limit (issue 27's reproducers: `--steps 1000000000`
/// aborted allocating 24 GB, `--steps` at u64::MAX panicked, `--warmup 4000000000` never
/// ended).
#[test]
fn counts_beyond_their_limits_are_refused_naming_the_flag() {
    let dense = "scenarios/verify/dense-fsdp4.toml";
    let base = ["replay", dense, "--backend", "inproc"];
    for (flag, value, limit) in [
        ("--steps", "1000000000", "1..=1000"),
        ("--steps", "18446744073709551615", "1..=1000"),
        ("--steps", "0", "1..=1000"),
        ("--warmup", "4000000000", "0..=1000"),
        ("--ranks", "100000", "1..=4096"),
        ("--layers", "0", "1..=10000"),
    ] {
        let mut args = base.to_vec();
        args.extend([flag, value]);
        let o = hpfsdp(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(flag) && err.contains(limit),
            "{args:?}: '{flag}' and '{limit}' not in {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    // More ranks than inproc runs as threads: refused before the prediction.
    let o = hpfsdp(&[
        "replay",
        "scenarios/paper/exp-c.toml",
        "--backend",
        "inproc",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("runs at most 64 as threads"), "{err}");
}

/// The default run measures warm steps: 2 warm-up steps, then 5 measured ones whose spread
/// is reported beside the median.
#[test]
fn defaults_measure_several_warm_steps_with_their_spread() {
    let dir = out_dir("defaults");
    let o = hpfsdp(&[
        "replay",
        "scenarios/verify/dense-fsdp4.toml",
        "--backend",
        "inproc",
        "--ranks",
        "2",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["warmup"], 2);
    let steps = doc["measured_steps_ns"].as_array().unwrap();
    assert_eq!(steps.len(), 5);
    let s = &doc["step_spread"];
    let (min, median, max) = (
        s["min_ms"].as_f64().unwrap(),
        s["median_ms"].as_f64().unwrap(),
        s["max_ms"].as_f64().unwrap(),
    );
    assert!(min > 0.0 && min <= median && median <= max, "{s}");
    assert!(s["spread_pct"].as_f64().unwrap() >= 0.0);
    assert!(
        doc["hardware_reason"]
            .as_str()
            .unwrap()
            .contains("CPU cores"),
        "{doc}"
    );
    assert!(
        doc["compute_on"].as_str().unwrap().contains("host spin"),
        "{doc}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
