//! End-to-end tests of `hpfsdp verify`.

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
