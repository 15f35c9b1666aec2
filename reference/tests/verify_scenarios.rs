//! The verification scenarios end to end: production == validation bitwise, sharded ==
//! single device bitwise for data- and expert-parallel axes (TP within its bound), the golden
//! digests, mutations caught by validation mode with the module named, the trace against the
//! step program, and clear errors for bad inputs.

use std::path::{Path, PathBuf};

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::runtime::ExecMode;
use hpfsdp_reference::verify::compare::{Which, assemble};
use hpfsdp_reference::verify::report::verify_mutation;
use hpfsdp_reference::verify::{VerifyError, VerifySpec, run_distributed, verify};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/verify")
}

fn spec(name: &str) -> VerifySpec {
    let sc = Scenario::load(&dir().join(format!("{name}.toml"))).unwrap();
    VerifySpec::from_scenario(&sc).unwrap()
}

fn golden(name: &str) -> String {
    let text = std::fs::read_to_string(dir().join("golden.toml")).unwrap();
    let t: toml::Table = toml::from_str(&text).unwrap();
    t[name].as_str().unwrap().to_string()
}

fn check_scenario(name: &str, bitwise_single: bool) {
    let s = spec(name);
    let r = verify(&s).unwrap();
    for c in r.checks.iter().filter(|c| c.gating) {
        assert!(c.passed, "{name}: {} failed: {}", c.name, c.detail);
    }
    assert!(r.passed, "{name}");
    assert!(r.rows.iter().all(|row| row.prod_val_bitwise), "{name}");
    assert_eq!(
        r.loss.production.to_bits(),
        r.loss.validation.to_bits(),
        "{name}"
    );
    if bitwise_single {
        assert!(
            r.rows
                .iter()
                .all(|row| row.grad.bitwise && row.param.bitwise),
            "{name}"
        );
        assert_eq!(
            r.digest, r.single_device_digest,
            "{name}: single-device digest"
        );
    } else {
        assert!(
            r.rows.iter().any(|row| !row.grad.bitwise),
            "{name}: TP should change some bits"
        );
        assert_ne!(r.digest, r.single_device_digest);
    }
    assert_eq!(r.digest, golden(name), "{name}: golden digest changed");
    assert!(
        r.dispatch_validation.total() > r.dispatch_production.total(),
        "{name}"
    );
    assert_eq!(
        r.dispatch_validation.ops, r.dispatch_production.ops,
        "{name}"
    );
}

#[test]
fn dense_fsdp4() {
    check_scenario("dense-fsdp4", true);
}

#[test]
fn dense_hsdp2x4_bf16_params() {
    check_scenario("dense-hsdp2x4", true);
}

#[test]
fn uneven_fsdp3() {
    check_scenario("uneven-fsdp3", true);
}

#[test]
fn mla_hsdp2x2() {
    check_scenario("mla-hsdp2x2", true);
}

#[test]
fn moe_ep2_fsdp2() {
    check_scenario("moe-ep2-fsdp2", true);
}

#[test]
fn dense_tp2_fsdp2_within_bound() {
    check_scenario("dense-tp2-fsdp2", false);
}

#[test]
fn fsdp_and_hsdp_traces_equal_the_hyperparallel_programs() {
    for name in [
        "dense-fsdp4",
        "dense-hsdp2x4",
        "uneven-fsdp3",
        "mla-hsdp2x2",
    ] {
        let s = spec(name);
        let prod = run_distributed(&s, ExecMode::Production).unwrap();
        let c = hpfsdp_reference::verify::report::trace_check(&s, &prod);
        assert!(c.passed, "{name}: {}", c.detail);
    }
}

#[test]
fn mutated_module_contract_is_caught_with_the_module_named() {
    for (scenario, target) in [
        ("dense-fsdp4", "model.layers.0.self_attn"),
        ("dense-fsdp4", "model.layers.1.post_attention_layernorm"),
        ("dense-tp2-fsdp2", "model.layers.1.mlp"),
        ("moe-ep2-fsdp2", "model.layers.0.mlp"),
    ] {
        let mut s = spec(scenario);
        s.mutate(target).unwrap();
        let o = verify_mutation(&s).unwrap();
        assert!(o.caught, "{scenario}/{target}: {}", o.message);
        assert_eq!(o.named_module.as_deref(), Some(target), "{}", o.message);
        assert!(o.message.contains(&format!("[{target}]")), "{}", o.message);
        assert!(o.message.contains("placement mismatch"), "{}", o.message);
    }
}

#[test]
fn mutated_parameter_placement_is_caught_in_its_module() {
    let mut s = spec("dense-fsdp4");
    s.mutate("model.layers.1.mlp.down_proj.weight").unwrap();
    let o = verify_mutation(&s).unwrap();
    assert!(o.caught);
    assert_eq!(o.named_module.as_deref(), Some("model.layers.1.mlp"));
    assert!(o.message.contains("swiglu"), "{}", o.message);
    // On a size-1 tp axis production cannot notice: only validation mode can.
    assert!(
        o.production.contains("without noticing"),
        "{}",
        o.production
    );
}

#[test]
fn a_dropped_tp_all_reduce_breaks_the_bound() {
    // Flip the MLP's out_src from Partial to Replicate: production silently skips the
    // all-reduce, and the comparison with the single device must fail.
    let mut s = spec("dense-tp2-fsdp2");
    s.mutate("model.layers.0.mlp").unwrap();
    let r = verify(&s);
    match r {
        Err(VerifyError::Run { mode, source }) => {
            assert_eq!(mode, "validation");
            assert_eq!(source.module(), Some("model.layers.0.mlp"));
        }
        other => panic!("expected the validation run to fail, got {other:?}"),
    }
    let prod = run_distributed(&s, ExecMode::Production).unwrap();
    let single = hpfsdp_reference::verify::run_single(&s).unwrap();
    let pg = assemble(&s, &prod, Which::Grads).unwrap();
    let worst = hpfsdp_reference::verify::compare::diff_sets(&pg.tensors, &single.grads)
        .into_iter()
        .map(|(_, d)| d.rel_to_max)
        .fold(0.0, f64::max);
    assert!(
        worst > hpfsdp_reference::verify::report::GRAD_REL_BOUND,
        "a dropped all-reduce must exceed the TP bound, got {worst:e}"
    );
}

#[test]
fn a_corrupted_shard_is_noticed() {
    let s = spec("dense-hsdp2x4");
    let prod = run_distributed(&s, ExecMode::Production).unwrap();
    let mut bad = prod.clone();
    // Rank 5 is a replica of rank 1; flip one bit of its first updated shard.
    let x = &mut bad.ranks[5].params[0][3];
    *x = f32::from_bits(x.to_bits() ^ 1);
    let a = assemble(&s, &bad, Which::Params).unwrap();
    assert_eq!(a.replica_mismatch, vec![s.fsdp.params[0].name.clone()]);
    let mut bad2 = prod.clone();
    let y = &mut bad2.ranks[0].grads[2][0];
    *y = f32::from_bits(y.to_bits() ^ 1);
    let d = hpfsdp_reference::verify::report::param_diff(&s, &prod, &prod).unwrap();
    assert!(d.iter().all(|(_, d)| d.bitwise));
    let g1 = assemble(&s, &prod, Which::Grads).unwrap();
    let g2 = assemble(&s, &bad2, Which::Grads).unwrap();
    assert!(!g1.tensors.bit_eq(&g2.tensors));
}

#[test]
fn bad_inputs_give_clear_errors() {
    let missing = dir().join("no-such-scenario.toml");
    let e = Scenario::load(&missing).unwrap_err().to_string();
    assert!(e.contains("no-such-scenario.toml"), "{e}");
    let text = std::fs::read_to_string(dir().join("dense-fsdp4.toml"))
        .unwrap()
        .replace("dp_shard = 4", "dp_shard = 4\nfoo_bar = 1");
    let e = Scenario::from_str_at(&text, &dir().join("bad.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("foo_bar") && e.contains("bad.toml"), "{e}");
    let text = std::fs::read_to_string(dir().join("dense-tp2-fsdp2.toml"))
        .unwrap()
        .replace("sequence_parallel = false", "sequence_parallel = true");
    let sc = Scenario::from_str_at(&text, &dir().join("sp.toml")).unwrap();
    let e = VerifySpec::from_scenario(&sc).unwrap_err().to_string();
    assert!(
        e.contains("sequence_parallel") && e.contains("set [train]"),
        "{e}"
    );
    let mut s = spec("dense-fsdp4");
    let e = s.mutate("model.layers.9.nothing").unwrap_err().to_string();
    assert!(
        e.contains("model.layers.9.nothing") && e.contains("no module boundary"),
        "{e}"
    );
}
