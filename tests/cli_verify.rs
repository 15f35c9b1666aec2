//! End-to-end tests of `hpfsdp verify`, AdamW and distributed Muon scenarios.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
}

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

#[test]
fn verify_passes_prints_the_table_and_writes_reports() {
    let out = std::env::temp_dir().join(format!("hpfsdp-cli-verify-{}", std::process::id()));
    let o = bin()
        .arg("verify")
        .arg(scenario("uneven-fsdp3"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("VERDICT: PASS"), "{stdout}");
    assert!(stdout.contains("model.embed_tokens.weight"), "{stdout}");
    assert!(
        stdout.contains("production == validation (bitwise)"),
        "{stdout}"
    );
    assert!(stdout.contains(&golden("uneven-fsdp3")), "{stdout}");
    for f in ["verify.html", "params.csv", "checks.csv"] {
        let text = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(text.contains("lm_head.weight") || f == "checks.csv", "{f}");
    }
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn verify_json_has_the_report() {
    let o = bin()
        .args(["verify", "--json"])
        .arg(scenario("dense-fsdp4"))
        .output()
        .unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["report"]["passed"], true);
    assert_eq!(v["report"]["digest"], golden("dense-fsdp4"));
    assert_eq!(v["report"]["rows"].as_array().unwrap().len(), 21);
}

#[test]
fn mutation_is_caught_and_named() {
    let o = bin()
        .arg("verify")
        .arg(scenario("dense-fsdp4"))
        .args(["--mutate", "model.layers.1.self_attn"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}");
    assert!(
        stdout.contains("[model.layers.1.self_attn] forward output placement mismatch"),
        "{stdout}"
    );
    assert!(stdout.contains("VERDICT: PASS"), "{stdout}");
}

#[test]
fn bad_inputs_exit_2_with_the_file_named() {
    let o = bin()
        .args(["verify", "scenarios/verify/does-not-exist.toml"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("does-not-exist.toml"), "{e}");
    let o = bin()
        .arg("verify")
        .arg(scenario("dense-fsdp4"))
        .args(["--mutate", "model.layers.0.nope"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("model.layers.0.nope"), "{e}");
}

#[test]
fn verify_muon_scenario_prints_the_muon_checks_and_figures() {
    let out = std::env::temp_dir().join(format!("hpfsdp-cli-verify-muon-{}", std::process::id()));
    let o = bin()
        .arg("verify")
        .arg(scenario("moe-ep2-fsdp2-muon"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for want in [
        "optimizer muon+adamw (hyperparallel), 3 steps",
        "local-muon",
        "NS matrices per step:",
        "momentum bytes dedup",
        "Muon dedup == naive distributed Muon (bitwise)",
        "Muon sharded == single-device Muon on the run's gradients (bitwise)",
        "replicas and replica subgroups agree after every step",
        "Muon dedup figures match the plan",
        "Muon collective trace == hyperparallel Muon optimizer program",
        "20 Muon calls of step 1 on 4 ranks",
        "VERDICT: PASS",
    ] {
        assert!(stdout.contains(want), "missing {want:?}:\n{stdout}");
    }
    assert!(stdout.contains(&golden("moe-ep2-fsdp2-muon")), "{stdout}");
    let muon_csv = std::fs::read_to_string(out.join("muon.csv")).unwrap();
    assert!(muon_csv.contains("NS dedup"), "{muon_csv}");
    let params = std::fs::read_to_string(out.join("params.csv")).unwrap();
    assert!(params.contains("local-muon"), "{params}");
    let html = std::fs::read_to_string(out.join("verify.html")).unwrap();
    assert!(html.contains("Distributed Muon"));
    std::fs::remove_dir_all(&out).ok();

    let o = bin()
        .args(["verify", "--json"])
        .arg(scenario("dense-hsdp4x2-muon"))
        .output()
        .unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &v["report"];
    assert_eq!(r["passed"], true);
    assert_eq!(r["digest"], golden("dense-hsdp4x2-muon"));
    assert_eq!(r["steps"], 3);
    assert_eq!(r["muon"]["replica_count"], 2);
    assert_eq!(r["muon"]["ranks"].as_array().unwrap().len(), 8);
    assert_eq!(r["rows"][2]["route"], "muon");
    assert!(r["checks"].as_array().unwrap().iter().any(|c| c["name"]
        == "Muon dedup == naive distributed Muon (bitwise)"
        && c["passed"] == true));
    assert!(r["checks"].as_array().unwrap().iter().any(|c| c["name"]
        == "Muon collective trace == hyperparallel Muon optimizer program"
        && c["passed"] == true
        && c["gating"] == true));
}

#[test]
fn verify_muon_trace_matches_the_program_on_uneven_shards() {
    // Uneven shards: the program pads every fused-gather segment to the largest rank's piece,
    // as the engine does, so the gating Muon trace check passes.
    let o = bin()
        .arg("verify")
        .arg(scenario("uneven-fsdp3-muon"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for want in [
        "Muon collective trace == hyperparallel Muon optimizer program",
        "12 Muon calls of step 1 on 3 ranks",
        "VERDICT: PASS",
    ] {
        assert!(stdout.contains(want), "missing {want:?}:\n{stdout}");
    }
    assert!(!stdout.contains("advisory"), "{stdout}");
    assert!(stdout.contains(&golden("uneven-fsdp3-muon")), "{stdout}");
}

/// A copy of a verification scenario in a temporary file (model path made absolute), edited.
fn edited(name: &str, from: &str, to: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/verify");
    let text = std::fs::read_to_string(dir.join(format!("{name}.toml")))
        .unwrap()
        .replace(
            "compact = \"models/",
            &format!("compact = \"{}/models/", dir.display()),
        );
    assert!(text.contains(from));
    let path = std::env::temp_dir().join(format!(
        "hpfsdp-cli-{}-{}-{}.toml",
        name,
        std::process::id(),
        to.len()
    ));
    std::fs::write(&path, text.replace(from, to)).unwrap();
    path
}

#[test]
fn bad_muon_options_exit_2_naming_the_key() {
    let p = edited(
        "dense-fsdp4-muon",
        "preset = \"hyperparallel\"",
        "preset = \"hyperparalel\"",
    );
    let o = bin().arg("verify").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("preset")
            && e.contains("hyperparalel")
            && e.contains(&*p.file_name().unwrap().to_string_lossy()),
        "{e}"
    );
    std::fs::remove_file(&p).ok();
    let p = edited(
        "dense-hsdp4x2-muon",
        "preset = \"hyperparallel\"",
        "preset = \"hyperparallel\"\n\n[optimizer.muon]\nreplica_count = 3",
    );
    let o = bin().arg("verify").arg(&p).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    // The file, the line of the key (`path.toml:<line>:`) and the key.
    let with_line = e
        .split(".toml:")
        .skip(1)
        .any(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
    assert!(
        with_line && e.contains("[optimizer.muon] replica_count"),
        "{e}"
    );
    std::fs::remove_file(&p).ok();
}
