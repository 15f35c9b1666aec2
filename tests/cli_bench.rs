//! `hpfsdp bench` runs each case in a process of its own and reports that process's CPU
//! seconds, wall time and peak RSS in its table and its JSON (two small scenario files keep
//! it cheap; nothing here asserts on a time).

use std::path::Path;
use std::process::{Command, Output};

fn hpfsdp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run hpfsdp")
}

const SCENARIOS: [&str; 4] = [
    "--scenario",
    "scenarios/verify/dense-fsdp4.toml",
    "--scenario",
    "scenarios/verify/dense-fsdp4-muon.toml",
];

#[test]
fn each_case_gets_its_own_process_figures_in_the_table() {
    let mut args = vec!["bench", "--only-scenarios"];
    args.extend(SCENARIOS);
    let o = hpfsdp(&args);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let header = out.lines().next().unwrap();
    for column in [
        "case",
        "ranks",
        "events",
        "wall s",
        "CPU s",
        "max RSS MB",
        "step s",
    ] {
        assert!(header.contains(column), "{column} missing: {header}");
    }
    let rows: Vec<&str> = out.lines().skip(2).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows[0].starts_with("dense-fsdp4 "), "{out}");
    assert!(rows[1].starts_with("dense-fsdp4-muon "), "{out}");
}

#[test]
fn the_json_has_each_process_and_its_report() {
    let mut args = vec!["bench", "--only-scenarios", "--json"];
    args.extend(SCENARIOS);
    let o = hpfsdp(&args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["hardware"], "ascend-910c-a3");
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    for (case, name) in cases.iter().zip(["dense-fsdp4", "dense-fsdp4-muon"]) {
        assert_eq!(case["name"], name);
        let process = &case["process"];
        // A whole process: it loaded the program and allocated, so its peak is non-zero.
        assert!(
            process["max_rss_bytes"].as_u64().unwrap() > 1_000_000,
            "{case}"
        );
        assert!(process["cpu_s"].as_f64().unwrap() >= 0.0, "{case}");
        assert!(process["wall_s"].as_f64().unwrap() > 0.0, "{case}");
        let report = &case["report"];
        assert_eq!(report["name"], name);
        assert_eq!(report["world_size"], 4);
        assert!(report["events"].as_u64().unwrap() > 0, "{case}");
        assert!(report["step_time_s"].as_f64().unwrap() > 0.0, "{case}");
    }
    // Without the exp-d cases there is no Muon / AdamW ratio.
    assert!(v["muon_over_adamw"].is_null());
}

#[test]
fn bad_cases_and_flags_are_named() {
    let o = hpfsdp(&["bench", "--only-scenarios"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--only-scenarios without --scenario"));
    let o = hpfsdp(&["bench", "--only-scenarios", "--scenario", "no/such.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--scenario no/such.toml"));
    let o = hpfsdp(&["bench-case", "--hardware", "ascend-910c-a3", "--case", "{"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("reading --case"));
}
