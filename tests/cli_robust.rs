//! Bad input never crashes and lint errors stop every plan-deriving command (issue 12, items
//! 2, 4 and 6): each crash the issue reports is a regression case here (every one now a quick
//! exit-2 error naming the key and its limit), each plan-deriving command refuses a plan with
//! lint errors (exit 1, the lint printed) unless `--allow-lint-errors`, and the CLI blames the
//! right flag, checks `--out` before working, never prints line 0, and rejects empty names,
//! path-like hardware names and profiles contradicting the topology.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn hpfsdp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(args)
        .current_dir(root())
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run hpfsdp")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh directory for one test's files.
fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hpfsdp-cli-robust-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `scenarios/verify/dense-fsdp4.toml` with `edit` applied, written into `dir` (its model path
/// made absolute); returns the file's path.
fn dense_fsdp4_with(dir: &Path, file: &str, edit: impl Fn(String) -> String) -> String {
    let text = std::fs::read_to_string(root().join("scenarios/verify/dense-fsdp4.toml")).unwrap();
    let model = root().join("scenarios/verify/models/tiny-dense.toml");
    let text = text.replace(
        "compact = \"models/tiny-dense.toml\"",
        &format!("compact = \"{}\"", model.display()),
    );
    let path = dir.join(file);
    std::fs::write(&path, edit(text)).unwrap();
    path.to_str().unwrap().to_string()
}

/// Asserts a clean refusal: exit status 2, no panic, the message containing every `needle`.
fn assert_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "missing {n:?} in: {err}");
    }
}

#[test]
fn the_issue_crashes_are_errors_naming_key_and_limit() {
    let dir = temp_dir("crashes");
    let cases: [(&str, &str, &str, &[&str]); 7] = [
        (
            "seq_len = 32",
            "seq_len = 9223372036854775807",
            "verify",
            &["seq_len", "1,048,576"],
        ),
        (
            "seq_len = 32",
            "seq_len = 9223372036854775807",
            "simulate",
            &["seq_len", "1,048,576"],
        ),
        (
            "seq_len = 32",
            "seq_len = 4294967296",
            "verify",
            &["seq_len"],
        ),
        (
            "seq_len = 32",
            "seq_len = 268435456",
            "simulate",
            &["seq_len"],
        ),
        (
            "global_batch = 8",
            "global_batch = 4294967296",
            "simulate",
            &["global_batch", "16,777,216"],
        ),
        (
            "global_batch = 8",
            "global_batch = 4294967296",
            "verify",
            &["global_batch"],
        ),
        (
            "prefetch_depth = 1",
            "prefetch_depth = 4294967296",
            "verify",
            &["prefetch_depth", "0..=64"],
        ),
    ];
    for (i, (from, to, command, needles)) in cases.into_iter().enumerate() {
        let path = dense_fsdp4_with(&dir, &format!("c{i}.toml"), |t| t.replace(from, to));
        let o = hpfsdp(&[command, &path]);
        assert_error(&o, needles);
        // The line of the key, not line 0.
        assert!(
            stderr(&o).contains(&format!("c{i}.toml:")),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn a_huge_layer_count_in_an_hf_config_is_refused_at_once() {
    let dir = temp_dir("layers");
    let config =
        std::fs::read_to_string(root().join("scenarios/models/qwen3-30b-a3b.json")).unwrap();
    let huge = config.replace(
        "\"num_hidden_layers\": 48",
        "\"num_hidden_layers\": 1000000000000",
    );
    assert_ne!(config, huge, "the fixture changed; update the replacement");
    std::fs::write(dir.join("model.json"), huge).unwrap();
    let scenario = std::fs::read_to_string(root().join("scenarios/paper/exp-b.toml"))
        .unwrap()
        .replace("../models/qwen3-30b-a3b.json", "model.json");
    std::fs::write(dir.join("s.toml"), scenario).unwrap();
    let path = dir.join("s.toml");
    let o = hpfsdp(&["plan", path.to_str().unwrap()]);
    assert_error(&o, &["num_hidden_layers", "1,024"]);
}

#[test]
fn limits_cover_meshes_topology_and_optimizer_numbers() {
    let dir = temp_dir("limits");
    let cases: [(&str, &str, &[&str]); 6] = [
        (
            "dp_shard = 4",
            "dp_shard = 4\ncp = 0",
            &["cp", "at least 1"],
        ),
        (
            "dies_per_machine = 4",
            "dies_per_machine = 100000",
            &["dies_per_machine", "1..=1,024"],
        ),
        (
            "dp_shard = 4",
            "dp_shard = 2097152\ncp = 2097152",
            &["dp_shard 2097152 x cp 2097152", "2,097,152"],
        ),
        (
            "micro_batch = 1",
            "micro_batch = 1\nrouting_skew = nan",
            &["routing_skew"],
        ),
        (
            "kind = \"adamw\"",
            "kind = \"adamw\"\n[optimizer.adamw]\neps = -1.0",
            &["eps"],
        ),
        (
            "global_batch = 8",
            "global_batch = 16384",
            &["global_batch", "1..=1,024"],
        ),
    ];
    for (i, (from, to, needles)) in cases.into_iter().enumerate() {
        let path = dense_fsdp4_with(&dir, &format!("l{i}.toml"), |t| t.replacen(from, to, 1));
        assert_error(&hpfsdp(&["plan", &path]), needles);
    }
}

/// A scenario whose only fault is an override that matches no module: a lint error.
fn lint_error_scenario(dir: &Path) -> String {
    dense_fsdp4_with(dir, "lint.toml", |t| {
        t + "\n[[plan.override]]\nmatch = \"model.no_such_module\"\nout_dst = { tp = \"replicate\" }\n"
    })
}

#[test]
fn every_plan_deriving_command_refuses_lint_errors() {
    let dir = temp_dir("lint");
    let path = lint_error_scenario(&dir);
    let out = dir.join("replay-out");
    let out = out.to_str().unwrap();
    for args in [
        vec!["plan", &path],
        vec!["simulate", &path],
        vec!["muon", &path],
        vec!["verify", &path],
        vec!["replay", &path, "--backend", "inproc", "--out", out],
    ] {
        let o = hpfsdp(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        let printed = format!("{}{err}", String::from_utf8_lossy(&o.stdout));
        assert!(
            printed.contains("override-matches-nothing"),
            "{args:?}: {printed}"
        );
        if args[0] != "plan" {
            assert!(
                err.contains("refuses a plan with lint errors"),
                "{args:?}: {err}"
            );
            assert!(o.stdout.is_empty(), "{args:?} printed results");
        }
    }
}

#[test]
fn allow_lint_errors_runs_a_what_if_study() {
    let dir = temp_dir("allow");
    let path = lint_error_scenario(&dir);
    for args in [
        vec!["simulate", &path, "--allow-lint-errors"],
        vec!["muon", &path, "--allow-lint-errors"],
    ] {
        let o = hpfsdp(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            err.contains("warning") && err.contains("override-matches-nothing"),
            "{err}"
        );
        assert!(!o.stdout.is_empty());
    }
    // verify cannot run a plan with lint errors and does not offer the flag.
    let o = hpfsdp(&["verify", &path, "--allow-lint-errors"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn an_unknown_optimizer_blames_the_flag() {
    let o = hpfsdp(&[
        "simulate",
        "scenarios/verify/dense-fsdp4.toml",
        "--optimizer",
        "nope",
    ]);
    assert_error(&o, &["--optimizer nope", "flexshard"]);
    assert!(
        !stderr(&o).contains("[optimizer] baselines"),
        "{}",
        stderr(&o)
    );
    assert!(o.stdout.is_empty(), "simulated before checking the flag");
}

#[test]
fn an_unwritable_out_dir_fails_before_any_work() {
    let dir = temp_dir("out");
    // A regular file where a directory is needed: unwritable for every user, root included.
    let blocker = dir.join("file");
    std::fs::write(&blocker, "").unwrap();
    let out = blocker.join("report");
    let out = out.to_str().unwrap();
    for args in [
        vec![
            "simulate",
            "scenarios/verify/dense-fsdp4.toml",
            "--out",
            out,
        ],
        vec!["verify", "scenarios/verify/dense-fsdp4.toml", "--out", out],
    ] {
        let o = hpfsdp(&args);
        assert_error(&o, &["--out", "choose a writable directory"]);
        assert!(
            o.stdout.is_empty(),
            "{args:?} worked before failing on --out"
        );
    }
}

#[test]
fn read_errors_name_no_line_zero() {
    let o = hpfsdp(&["plan", "scenarios/verify/no-such-file.toml"]);
    assert_error(&o, &["no-such-file.toml", "cannot read"]);
    assert!(!stderr(&o).contains(":0:"), "{}", stderr(&o));
    let o = hpfsdp(&[
        "simulate",
        "scenarios/verify/dense-fsdp4.toml",
        "--hardware",
        "tpu-v9",
    ]);
    assert_error(&o, &["tpu-v9"]);
    assert!(!stderr(&o).contains(":0:"), "{}", stderr(&o));
}

#[test]
fn a_hardware_profile_contradicting_the_topology_is_an_error_naming_both() {
    // 8 dies per machine x 2 machines on a profile with 16 dies per machine.
    let o = hpfsdp(&[
        "simulate",
        "scenarios/fixtures/muon-hsdp-2x8.toml",
        "--hardware",
        "ascend-910c-a3",
    ]);
    assert_error(
        &o,
        &[
            "--hardware ascend-910c-a3",
            "16 dies per machine",
            "dies_per_machine = 8",
        ],
    );
    // A scenario inside one machine of the profile is fine.
    let o = hpfsdp(&[
        "simulate",
        "scenarios/verify/dense-fsdp4.toml",
        "--hardware",
        "nvidia-h100-hgx",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn empty_names_and_path_like_hardware_names_are_rejected() {
    let dir = temp_dir("names");
    let empty = dense_fsdp4_with(&dir, "empty.toml", |t| {
        t.replace("name = \"dense-fsdp4\"", "name = \"  \"")
    });
    assert_error(&hpfsdp(&["plan", &empty]), &["empty.toml:2", "name"]);
    let pathlike = dense_fsdp4_with(&dir, "path.toml", |t| {
        t.replace(
            "hardware = \"ascend-910c-a3\"",
            "hardware = \"../../etc/passwd\"",
        )
    });
    assert_error(
        &hpfsdp(&["plan", &pathlike]),
        &["path.toml:4", "not a plain profile name"],
    );
    // `bench` takes profile names only; `simulate --hardware` (like `calibrate`) also takes
    // a profile file's path, and a missing one is refused naming the flag and the path.
    assert_error(
        &hpfsdp(&["bench", "--hardware", "../x"]),
        &["--hardware", "not a plain profile name"],
    );
    assert_error(
        &hpfsdp(&[
            "simulate",
            "scenarios/verify/dense-fsdp4.toml",
            "--hardware",
            "../x",
        ]),
        &["--hardware ../x", "cannot read"],
    );
    assert_error(&hpfsdp(&["calibrate", "--hardware", ""]), &["--hardware"]);
}

#[test]
fn top_level_help_advertises_only_commands_that_exist() {
    let o = hpfsdp(&["--help"]);
    let text = String::from_utf8_lossy(&o.stdout).to_lowercase();
    // The one-line description and the command list (command descriptions may use "sweep"
    // as a noun).
    let help: String = text
        .lines()
        .take(1)
        .chain(
            text.lines()
                .skip_while(|l| !l.starts_with("commands:"))
                .filter_map(|l| l.split_whitespace().next()),
        )
        .collect::<Vec<_>>()
        .join("\n");
    // Commands planned in the design; the help may name one only once it runs.
    for planned in ["gate", "sweep", "export"] {
        let named = help
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '-')
            .any(|w| w == planned);
        if named {
            let o = hpfsdp(&[planned, "--help"]);
            assert_eq!(
                o.status.code(),
                Some(0),
                "the help names `{planned}` but `hpfsdp {planned}` does not exist:\n{help}"
            );
        }
    }
}

#[test]
fn verify_refuses_scenarios_beyond_the_cpu_reference_budget() {
    let dir = temp_dir("verify-budget");
    let many_ranks = dense_fsdp4_with(&dir, "ranks.toml", |t| {
        t.replace("dp_shard = 4", "dp_shard = 128")
            .replace("dies_per_machine = 4", "dies_per_machine = 128")
            .replace("global_batch = 8", "global_batch = 128")
    });
    assert_error(
        &hpfsdp(&["verify", &many_ranks]),
        &["128 ranks", "at most 64"],
    );
    let many_tokens = dense_fsdp4_with(&dir, "tokens.toml", |t| {
        t.replace("global_batch = 8", "global_batch = 4096")
    });
    assert_error(
        &hpfsdp(&["verify", &many_tokens]),
        &["global_batch x seq_len = 131072", "65536"],
    );
    // The same scenarios are fine for the simulator.
    for path in [&many_ranks, &many_tokens] {
        let o = hpfsdp(&["plan", path]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
}
