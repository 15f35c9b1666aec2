//! Scenario loading: every bad scenario fixture (`tests/fixtures/err-*.toml`) fails with an
//! error that names the file, the line of the offending key (or section/override header) and
//! the key itself: unknown keys at the top level and in a section, wrong types, missing
//! required keys, mesh/topology product mismatches, indivisible global batches, bad recompute
//! ranges, unknown strategies/baselines/presets, bad dtypes, missing model files, both model
//! sources, and bad `[[plan.override]]` entries (unknown and DP axes). Also: the valid tiny
//! fixture and all 8 paper scenarios load and plan with zero lint errors.

use hpfsdp_plan::PlanError;
use hpfsdp_plan::planner::lint::Severity;
use hpfsdp_plan::planner::plan;
use hpfsdp_plan::scenario::Scenario;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Loads a fixture that must fail; returns (line, full message) after checking that the
/// error is a scenario error naming the fixture file.
fn load_err(name: &str) -> (usize, String) {
    let path = fixture(name);
    let err = match Scenario::load(&path) {
        Ok(_) => panic!("{name} loaded but should fail"),
        Err(e) => e,
    };
    let text = err.to_string();
    match err {
        PlanError::Scenario { file, line, .. } => {
            assert_eq!(file, path.display().to_string(), "{text}");
            assert!(
                text.starts_with(&format!("{}:{line}: ", path.display())),
                "{text}"
            );
            assert!(text.contains(name), "{text}");
            (line, text)
        }
        other => panic!("{name}: expected a scenario error, got {other:?}"),
    }
}

/// Asserts the error of fixture `name` is on `line` and mentions every one of `needles`.
fn check(name: &str, line: usize, needles: &[&str]) {
    let (got, text) = load_err(name);
    assert_eq!(got, line, "{name}: wrong line in {text}");
    for n in needles {
        assert!(text.contains(n), "{name}: '{n}' missing from {text}");
    }
}

#[test]
fn valid_tiny_fixture_loads() {
    let s = Scenario::load(&fixture("ok-tiny.toml")).unwrap();
    assert_eq!(s.world_size(), 4);
    assert_eq!(s.grad_accum_steps, 2);
    assert_eq!(s.model.name, "tiny-moe");
    assert!(!plan(&s.model, &s.planner_input()).has_errors());
}

#[test]
fn unknown_key_at_top_level() {
    check(
        "err-unknown-top.toml",
        4,
        &["unknown field `descripton`", "description"],
    );
}

#[test]
fn unknown_key_in_a_section() {
    check(
        "err-unknown-mesh.toml",
        10,
        &["unknown field `dp_shrad`", "dp_shard"],
    );
}

#[test]
fn wrong_type() {
    check(
        "err-wrong-type.toml",
        9,
        &["invalid type", "usize", "mesh.dp_shard"],
    );
}

#[test]
fn missing_required_key() {
    // Reported at the [train] header, naming the missing key.
    check("err-missing-key.toml", 16, &["missing field `seq_len`"]);
}

#[test]
fn mesh_and_topology_products_differ() {
    check(
        "err-topology.toml",
        14,
        &["topology has 8 dies", "mesh has 4 ranks", "supernodes"],
    );
}

#[test]
fn global_batch_not_divisible() {
    check(
        "err-global-batch.toml",
        18,
        &["global_batch 6", "micro_batch 1", "data-parallel ranks 4"],
    );
}

#[test]
fn bad_recompute_range() {
    check(
        "err-recompute.toml",
        20,
        &["recompute.layers = \"0..5\"", "within 0..2"],
    );
}

#[test]
fn unknown_fsdp_strategy() {
    check(
        "err-strategy.toml",
        22,
        &[
            "[fsdp] strategy",
            "'zero3'",
            "hyperparallel, fsdp2, megatron-ddp",
        ],
    );
}

#[test]
fn unknown_muon_baseline() {
    check(
        "err-baseline.toml",
        23,
        &["[optimizer] baselines", "'shampoo'", "flexshard"],
    );
}

#[test]
fn unknown_preset() {
    check(
        "err-preset.toml",
        22,
        &["[optimizer] preset", "adam-ish", "keller-jordan"],
    );
}

#[test]
fn bad_dtype() {
    check(
        "err-dtype.toml",
        23,
        &["[fsdp] reduce_dtype", "\"int4\"", "bf16"],
    );
}

#[test]
fn missing_model_file() {
    check(
        "err-model-missing.toml",
        6,
        &["[model] compact", "no-such-model.toml", "cannot read"],
    );
}

#[test]
fn both_hf_config_and_compact() {
    check(
        "err-model-both.toml",
        7,
        &["hf_config", "compact", "keep one"],
    );
}

#[test]
fn override_with_unknown_axis_points_at_its_header() {
    check(
        "err-override-axis.toml",
        25,
        &[
            "[[plan.override]] #2",
            "unknown axis 'tq'",
            "gate.weight",
            "tp, cp, ep, etp",
        ],
    );
}

#[test]
fn override_with_dp_axis_points_at_its_header() {
    check(
        "err-override-dp.toml",
        21,
        &[
            "[[plan.override]] #1",
            "dp_shard",
            "DP placement",
            "q_proj.weight",
        ],
    );
}

#[test]
fn unreadable_scenario_file() {
    let path = fixture("does-not-exist.toml");
    let e = Scenario::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("does-not-exist.toml") && e.contains("cannot read"),
        "{e}"
    );
}

#[test]
fn in_memory_variants_of_the_valid_fixture() {
    // Same checks through from_str_at, for errors that need no file of their own.
    let path = fixture("ok-tiny.toml");
    let base = std::fs::read_to_string(&path).unwrap();
    let err = |text: &str| match Scenario::from_str_at(text, &path) {
        Ok(_) => panic!("should fail:\n{text}"),
        Err(e) => e.to_string(),
    };
    // A zero degree names its key.
    let e = err(&base.replace("dp_shard = 4", "dp_shard = 4\ntp = 0"));
    assert!(e.contains(":10: ") && e.contains("[mesh] tp = 0"), "{e}");
    // An unknown recompute mode.
    let e = err(&format!("{base}recompute = \"sometimes\"\n"));
    assert!(e.contains(":20: ") && e.contains("sometimes"), "{e}");
    // An unknown fsdp variant section names its header line.
    let e = err(&format!(
        "{base}\n[fsdp.variant.zero2]\nprefetch_depth = 0\n"
    ));
    assert!(
        e.contains(":21: ") && e.contains("[fsdp.variant.zero2]"),
        "{e}"
    );
    // A custom preset needs coefficients.
    let e = err(&format!("{base}\n[optimizer]\npreset = \"custom\"\n"));
    assert!(e.contains("coefficients") && e.contains("custom"), "{e}");
    // An invalid `when` gate is an override error on its header line.
    let e = err(&format!(
        "{base}\n[[plan.override]]\nmatch = \"model.layers.*.mlp\"\nwhen = \"pp\"\nout_dst = \"none\"\n"
    ));
    assert!(e.contains(":21: ") && e.contains("when = \"pp\""), "{e}");
}

#[test]
fn all_paper_scenarios_load_and_plan_without_lint_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/paper");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    names.sort();
    let stems: Vec<String> = names
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        stems,
        [
            "exp-a-mbs1",
            "exp-a-mbs2",
            "exp-b",
            "exp-c",
            "exp-d",
            "muon-vs-dmuon",
            "muon-vs-flexshard",
            "muon-vs-matrixfsdp"
        ]
    );
    for path in &names {
        let s = Scenario::load(path).unwrap_or_else(|e| panic!("{e}"));
        let p = plan(&s.model, &s.planner_input());
        let errors: Vec<String> = p
            .lints
            .iter()
            .filter(|l| l.severity == Severity::Error)
            .map(|l| l.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{}:\n{}",
            path.display(),
            errors.join("\n")
        );
        assert!(
            p.params
                .iter()
                .filter(|x| x.trainable)
                .all(|x| x.boundary.is_some()),
            "{}",
            path.display()
        );
        assert_eq!(
            s.world_size(),
            s.topology.dies_per_machine * s.topology.machines_per_supernode * s.topology.supernodes
        );
    }
}

#[test]
fn paper_scenario_shapes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/paper");
    let b = Scenario::load(&dir.join("exp-b.toml")).unwrap();
    assert_eq!(b.world_size(), 16);
    assert_eq!(b.grad_accum_steps, 1);
    assert_eq!(b.tokens_per_step(), 131_072);
    assert_eq!(b.recompute.layers, 0..27);
    assert!(b.recompute.covers(26) && !b.recompute.covers(27));
    let c = Scenario::load(&dir.join("exp-c.toml")).unwrap();
    assert_eq!(c.world_size(), 128);
    assert_eq!(c.grad_accum_steps, 3);
    let d = Scenario::load(&dir.join("exp-d.toml")).unwrap();
    assert_eq!(d.world_size(), 768);
    assert_eq!(d.expert_mesh.axis_size("edp_replicate"), 2);
    assert_eq!(d.expert_mesh.axis_size("edp_shard"), 6);
    assert_eq!(d.tokens_per_step(), 3_145_728);
}

#[test]
fn unknown_kernel_library_and_unmodelled_experts_path_are_refused() {
    check(
        "err-kernel-library.toml",
        18,
        &[
            "[train] kernel_library = \"rocm\"",
            "torch_cuda",
            "leave it out",
        ],
    );
    check(
        "err-experts-implementation.toml",
        7,
        &[
            "[model] experts_implementation = \"batched_mm\"",
            "grouped_mm, eager",
            "not modelled",
        ],
    );
    check(
        "err-eager-experts-ep.toml",
        7,
        &[
            "[model] experts_implementation = \"eager\"",
            "ep = 2",
            "set ep = 1",
        ],
    );
}

#[test]
fn eager_experts_load_on_one_expert_rank() {
    let text = std::fs::read_to_string(fixture("ok-tiny.toml"))
        .unwrap()
        .replace("[model]\n", "[model]\nexperts_implementation = \"eager\"\n");
    let dir = std::env::temp_dir().join(format!("hpfsdp-eager-ok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture("tiny-moe.toml"), dir.join("tiny-moe.toml")).unwrap();
    let path = dir.join("ok-eager.toml");
    std::fs::write(&path, text).unwrap();
    let s = Scenario::load(&path).unwrap();
    assert_eq!(
        s.file.model.experts_implementation.as_deref(),
        Some("eager")
    );
}
