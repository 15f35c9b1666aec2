//! End-to-end tests of `hpfsdp plan`, run from the workspace root: the text report's sections
//! and counts on exp-b, the `--json` document (sharding params, FSDP units, Muon batches,
//! digest), `--explain` on a fused expert weight, `--all`, and the exit statuses (0 clean,
//! 1 on lint errors, 2 on a bad scenario file with its file:line).

use std::path::Path;
use std::process::{Command, Output};

fn hpfsdp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run hpfsdp")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const EXP_B: &str = "scenarios/paper/exp-b.toml";

#[test]
fn text_report_has_every_section() {
    let o = hpfsdp(&["plan", EXP_B]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    for section in [
        "PARAMETERS",
        "BOUNDARY CONTRACTS",
        "COMMUNICATION GROUPS",
        "LINT: 0 error(s), 0 warning(s)",
    ] {
        assert!(out.contains(section), "missing {section}:\n{out}");
    }
    assert!(out.contains("scenario   exp-b"), "{out}");
    assert!(
        out.contains("50 units; per micro-batch 1059 all-gathers, 531 reduce-scatters"),
        "{out}"
    );
    // Layers fold into one row per parameter name.
    let row = out
        .lines()
        .find(|l| l.starts_with("model.layers.{L}.mlp.experts.gate_up_proj "))
        .unwrap_or_else(|| panic!("no folded experts row:\n{out}"));
    assert!(row.contains("0-47") && row.contains("MOE_EXPERT"), "{row}");
    assert!(row.contains("[8,1536,2048]"), "{row}");
    assert!(out.contains("fsdp dense.shard"), "{out}");
}

#[test]
fn all_flag_lists_every_layer() {
    let o = hpfsdp(&["plan", EXP_B, "--all"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(
        out.contains("model.layers.47.mlp.experts.gate_up_proj"),
        "{out}"
    );
    assert!(!out.contains("model.layers.{L}.self_attn.q_proj.weight"));
}

#[test]
fn json_report_parses_and_has_the_plans() {
    let o = hpfsdp(&["plan", EXP_B, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    let params = v["sharding"]["params"].as_array().expect("sharding.params");
    assert_eq!(params.len(), 531);
    let q = params
        .iter()
        .find(|p| p["name"] == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(q["role"], "COLWISE");
    assert_eq!(q["boundary"], "model.layers.0.self_attn");
    assert_eq!(q["shape"], serde_json::json!([4096, 2048]));
    assert_eq!(v["fsdp"]["units"].as_array().expect("fsdp.units").len(), 50);
    let fq = v["fsdp"]["params"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(fq["local_shape"], serde_json::json!([256, 2048]));
    assert_eq!(fq["all_gather"]["bytes_in_per_rank"], 1_048_576);
    assert_eq!(
        v["muon"]["batches"].as_array().expect("muon.batches").len(),
        5,
        "four expert batches under the local-shard HSDP cap, one shard-path batch"
    );
    let digest = v["digest"].as_str().expect("digest");
    assert_eq!(digest.len(), 64);
    assert!(digest.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(v["sharding_digest"].as_str().unwrap().len(), 64);
    assert_eq!(v["scenario"], "exp-b");
    // Deterministic: a second run gives the same digest.
    let again: serde_json::Value =
        serde_json::from_slice(&hpfsdp(&["plan", EXP_B, "--json"]).stdout).unwrap();
    assert_eq!(again["digest"], v["digest"]);
}

#[test]
fn explain_names_role_boundary_and_rule() {
    let name = "model.layers.0.mlp.experts.gate_up_proj";
    let o = hpfsdp(&["plan", EXP_B, "--explain", name]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with(name), "{out}");
    assert!(out.contains("MOE_EXPERT"), "{out}");
    assert!(
        out.contains("default rule #4") && out.contains("pattern 'experts'"),
        "{out}"
    );
    assert!(
        out.contains("boundary   model.layers.0.mlp (moe_mlp"),
        "{out}"
    );
    assert!(out.contains("merged into 'model.layers.0.mlp'"), "{out}");
    assert!(out.contains("local [8,1536,2048]"), "{out}");
    assert!(out.contains("128 matrices"), "{out}");
}

#[test]
fn explain_of_an_unknown_parameter_fails() {
    let o = hpfsdp(&["plan", EXP_B, "--explain", "model.layers.0.mlp.nope.weight"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no parameter named"), "{}", stderr(&o));
}

#[test]
fn lint_errors_exit_with_status_1() {
    let o = hpfsdp(&["plan", "plan/tests/fixtures/lint-uncovered.toml"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(out.contains("LINT: 4 error(s)"), "{out}");
    assert!(
        out.contains(
            "error[uncovered-param]: trainable param 'model.layers.0.self_attn.q_proj.weight'"
        ),
        "{out}"
    );
    assert!(out.contains("fix: add a [[plan.override]]"), "{out}");
    // --json still prints the plan, and still exits 1.
    let o = hpfsdp(&["plan", "plan/tests/fixtures/lint-uncovered.toml", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["sharding"]["lints"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["code"] == "uncovered-param" && l["severity"] == "error")
            .count(),
        4
    );
}

#[test]
fn bad_scenario_exits_with_status_2_and_file_line() {
    let file = "plan/tests/fixtures/err-unknown-mesh.toml";
    let o = hpfsdp(&["plan", file]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains(&format!("{file}:10:")), "{err}");
    assert!(err.contains("dp_shrad"), "{err}");
    assert!(stdout(&o).is_empty());
    let o = hpfsdp(&["plan", "scenarios/paper/no-such-scenario.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no-such-scenario.toml"));
}
