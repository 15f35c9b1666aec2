//! End-to-end tests of `hpfsdp gate`: a copied scenario is locked, then an intended regression
//! in the copy fails the gate (exit 1) with a readable message, a JUnit failure and a Markdown
//! summary; a changed workload is judged by throughput; a verification twin that disappears
//! fails; a changed plan names its changed entries; a lock with NaN or negative figures and
//! other bad input exit 2 naming the fix; the shipped `hpfsdp.lock` passes.

mod common;

use common::{fresh_dir, hpfsdp, text};
use std::path::{Path, PathBuf};

fn temp_dir(tag: &str) -> PathBuf {
    let dir = fresh_dir("gate", tag);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `scenarios/verify/dense-fsdp4.toml` copied into `dir` (its model path made absolute), with
/// `edit` applied to its text.
fn copy_scenario(dir: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(root.join("scenarios/verify/dense-fsdp4.toml")).unwrap();
    let model = root.join("scenarios/verify/models/tiny-dense.toml");
    let text = src.replace(
        "compact = \"models/tiny-dense.toml\"",
        &format!("compact = {:?}", model.display().to_string()),
    );
    let path = dir.join("dense-fsdp4.toml");
    std::fs::write(&path, edit(text)).unwrap();
    path
}

#[test]
fn an_intended_regression_fails_with_a_readable_message_and_junit_failure() {
    let dir = temp_dir("regression");
    let scenario = copy_scenario(&dir, |t| t);
    let (s, lock) = (scenario.to_str().unwrap(), dir.join("hpfsdp.lock"));
    let lock = lock.to_str().unwrap();
    let o = hpfsdp(&["gate", s, "--lock", lock, "--update"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let locked = std::fs::read_to_string(lock).unwrap();
    assert!(
        locked.contains("[scenario.dense-fsdp4]") && locked.contains("plan_digest = "),
        "{locked}"
    );
    assert!(
        locked.contains("[scenario.dense-fsdp4.strategy.hyperparallel]"),
        "{locked}"
    );
    // Unchanged: passes against the lock, and the tiny scenario verifies itself.
    let o = hpfsdp(&["gate", s, "--lock", lock]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("every gating check passed"),
        "{}",
        text(&o)
    );
    // The regression: recompute every layer (the same plan, a slower step).
    copy_scenario(&dir, |t| {
        t.replace("recompute = \"off\"", "recompute = \"full\"")
    });
    let junit = dir.join("gate.xml");
    let markdown = dir.join("gate.md");
    let o = hpfsdp(&[
        "gate",
        s,
        "--lock",
        lock,
        "--junit",
        junit.to_str().unwrap(),
        "--markdown",
        markdown.to_str().unwrap(),
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("dense-fsdp4 throughput/hyperparallel: ") && out.contains(" tokens/s, -"),
        "{out}"
    );
    assert!(out.contains("over the 2% allowed"), "{out}");
    assert!(
        out.contains("- tokens_per_s = ") && out.contains("+ step_time_s = "),
        "{out}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let case = |name: &str| {
        doc.descendants()
            .find(|n| n.has_tag_name("testcase") && n.attribute("name") == Some(name))
            .unwrap_or_else(|| panic!("testcase {name}: {xml}"))
    };
    let failed = case("throughput/hyperparallel");
    assert_eq!(
        failed.attribute("classname"),
        Some("hpfsdp.gate.dense-fsdp4")
    );
    assert!(
        failed.children().any(|c| c.has_tag_name("failure")),
        "{xml}"
    );
    assert!(failed.attribute("time").is_some(), "{xml}");
    assert!(!case("lint").children().any(|c| c.is_element()), "{xml}");
    let md = std::fs::read_to_string(&markdown).unwrap();
    assert!(
        md.contains("**FAIL**") && md.contains("## Failed checks"),
        "{md}"
    );
    assert!(
        md.contains("| dense-fsdp4 | throughput/hyperparallel |"),
        "{md}"
    );
    // A larger allowance accepts it.
    let o = hpfsdp(&["gate", s, "--lock", lock, "--max-regression-pct", "1000"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_changed_plan_fails_the_digest_check_until_updated() {
    let dir = temp_dir("digest");
    let scenario = copy_scenario(&dir, |t| t);
    let (s, lock) = (scenario.to_str().unwrap(), dir.join("hpfsdp.lock"));
    let lock = lock.to_str().unwrap();
    assert_eq!(
        hpfsdp(&["gate", s, "--lock", lock, "--update"])
            .status
            .code(),
        Some(0)
    );
    copy_scenario(&dir, |t| {
        t.replace("dp_shard = 4", "dp_shard = 2\ndp_replicate = 2")
            .replace("dp_replicate = 1\n", "")
    });
    let o = hpfsdp(&["gate", s, "--lock", lock]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    // The message names the first plan entries whose digests changed, the diff lists them.
    assert!(
        out.contains("plan-digest: plan digest changed in fsdp."),
        "{out}"
    );
    assert!(out.contains("      - plan_digest = "), "{out}");
    assert!(out.contains("      + fsdp.groups = "), "{out}");
    assert_eq!(
        hpfsdp(&["gate", s, "--lock", lock, "--update"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(hpfsdp(&["gate", s, "--lock", lock]).status.code(), Some(0));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_input_exits_2_naming_the_fix() {
    let dir = temp_dir("bad");
    let scenario = copy_scenario(&dir, |t| t);
    let s = scenario.to_str().unwrap();
    let missing = dir.join("none.lock");
    let o = hpfsdp(&["gate", s, "--lock", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("does not exist") && text(&o).contains("--update"),
        "{}",
        text(&o)
    );
    let o = hpfsdp(&[
        "gate",
        "scenarios/nope.toml",
        "--lock",
        missing.to_str().unwrap(),
        "--update",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("scenarios/nope.toml: no such scenario file"),
        "{}",
        text(&o)
    );
    let bad_lock = dir.join("bad.lock");
    std::fs::write(
        &bad_lock,
        "tool_version = \"0.1.0\"\n[scenario.x]\nfile = 3\n",
    )
    .unwrap();
    let o = hpfsdp(&["gate", s, "--lock", bad_lock.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("bad.lock:3"), "{}", text(&o));
    copy_scenario(&dir, |t| {
        format!("{t}\n[gate]\nverify = \"no-such-twin.toml\"\n")
    });
    let o = hpfsdp(&["gate", s, "--lock", missing.to_str().unwrap(), "--update"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("[gate] verify = \"no-such-twin.toml\": no such file"),
        "{}",
        text(&o)
    );
    let o = hpfsdp(&[
        "gate",
        s,
        "--lock",
        missing.to_str().unwrap(),
        "--max-regression-pct",
        "-1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_changed_workload_is_judged_by_throughput() {
    let dir = temp_dir("workload");
    let scenario = copy_scenario(&dir, |t| t);
    let (s, lock) = (scenario.to_str().unwrap(), dir.join("hpfsdp.lock"));
    let lock = lock.to_str().unwrap();
    assert_eq!(
        hpfsdp(&["gate", s, "--lock", lock, "--update"])
            .status
            .code(),
        Some(0)
    );
    // Twice the tokens per step (two micro-batches per rank): a step 98% longer, which the
    // gate used to fail as a step-time regression, but more tokens per second.
    copy_scenario(&dir, |t| t.replace("global_batch = 8", "global_batch = 16"));
    let o = hpfsdp(&["gate", s, "--lock", lock]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("workload changed (256 -> 512 tokens per step): "),
        "{out}"
    );
    assert!(!out.contains("FAIL"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_locked_verification_twin_that_disappears_fails() {
    let dir = temp_dir("twin");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let twin = root.join("scenarios/verify/dense-fsdp4-muon.toml");
    let with_twin = |t: String| format!("{t}\n[gate]\nverify = {:?}\n", twin.display().to_string());
    let scenario = copy_scenario(&dir, with_twin);
    let (s, lock) = (scenario.to_str().unwrap(), dir.join("hpfsdp.lock"));
    let lock = lock.to_str().unwrap();
    assert_eq!(
        hpfsdp(&["gate", s, "--lock", lock, "--update"])
            .status
            .code(),
        Some(0)
    );
    assert!(std::fs::read_to_string(lock).unwrap().contains("verify = "));
    // Without its [gate] section the tiny copy would verify itself: the twin is gone.
    copy_scenario(&dir, |t| t);
    let o = hpfsdp(&["gate", s, "--lock", lock]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("dense-fsdp4 verify: the lock verifies this scenario with ")
            && out.contains(
                "dense-fsdp4-muon.toml, but the scenario no longer names it (it verifies itself)"
            ),
        "{out}"
    );
    // Accepting the change records the scenario's own verification.
    copy_scenario(&dir, |t| t);
    assert_eq!(
        hpfsdp(&["gate", s, "--lock", lock, "--update"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(hpfsdp(&["gate", s, "--lock", lock]).status.code(), Some(0));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_lock_with_nan_or_negative_figures_is_bad_input_naming_the_entry() {
    let dir = temp_dir("nanlock");
    let scenario = copy_scenario(&dir, |t| t);
    let (s, lock) = (scenario.to_str().unwrap(), dir.join("hpfsdp.lock"));
    let lock = lock.to_str().unwrap();
    assert_eq!(
        hpfsdp(&["gate", s, "--lock", lock, "--update"])
            .status
            .code(),
        Some(0)
    );
    let good = std::fs::read_to_string(lock).unwrap();
    for (key, bad) in [("step_time_s", "nan"), ("tokens_per_s", "-12.5")] {
        let edited: String = good
            .lines()
            .map(|l| {
                if l.starts_with(&format!("{key} = ")) {
                    format!("{key} = {bad}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(lock, edited).unwrap();
        let o = hpfsdp(&["gate", s, "--lock", lock]);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{key} = {bad}: {out}");
        assert!(
            out.contains(&format!(
                "scenario.dense-fsdp4.strategy.hyperparallel.{key} = "
            )),
            "{out}"
        );
        assert!(out.contains("hpfsdp.lock:"), "names the line: {out}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn json_lists_every_check_with_its_time() {
    let dir = temp_dir("json");
    let scenario = copy_scenario(&dir, |t| t);
    let (s, lock) = (scenario.to_str().unwrap(), dir.join("hpfsdp.lock"));
    let lock = lock.to_str().unwrap();
    let o = hpfsdp(&["gate", s, "--lock", lock, "--update", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("stdout is JSON");
    assert_eq!(v["passed"], true);
    let checks = v["checks"].as_array().unwrap();
    assert_eq!(checks.len(), v["checks_total"].as_u64().unwrap() as usize);
    let t = checks
        .iter()
        .find(|c| c["check"] == "throughput/hyperparallel")
        .unwrap();
    assert_eq!(t["status"], "pass");
    assert!(t["time_s"].as_f64().unwrap() > 0.0);
    assert_eq!(
        v["scenarios"][0]["runs"][0]["figures"]["tokens_per_step"],
        256
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The cheap twin of the CI gate: one paper scenario against the shipped lock.
#[test]
fn the_shipped_lock_passes_for_a_paper_scenario() {
    let o = hpfsdp(&[
        "gate",
        "scenarios/paper/exp-b.toml",
        "--lock",
        "hpfsdp.lock",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("scenarios/verify/moe-ep2-fsdp2-muon.toml: every gating check passed"),
        "{}",
        text(&o)
    );
}

/// The CI gate itself: every paper scenario against the shipped lock (slow on a shared
/// machine; `.ci/run` runs the same command).
#[test]
#[ignore]
fn the_shipped_lock_passes_for_every_paper_scenario() {
    let o = hpfsdp(&["gate", "scenarios/paper", "--lock", "hpfsdp.lock"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}
