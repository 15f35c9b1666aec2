//! bf16 compute on every verification topology (issue 12 item 1): with `param_dtype = "bf16"`
//! (also the default when the key is absent) the TP/SP/EP activation collectives travel in
//! bf16, as the `hyperparallel` step program sizes them, so the gating trace check passes;
//! expert parallelism stays bitwise equal to the single device (which rounds the expert
//! traffic at the same points), TP stays within its bf16-widened bound, and a dropped TP
//! all-reduce still breaks that bound. The `*-bf16` scenarios' digests are pinned in
//! `scenarios/verify/golden.toml`.

use std::path::{Path, PathBuf};

use hpfsdp_backends::{CollectiveKind, DType};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::runtime::{ActDType, ExecMode};
use hpfsdp_reference::verify::compare::{Which, assemble, diff_sets};
use hpfsdp_reference::verify::report::{grad_rel_bound, tp_crossings};
use hpfsdp_reference::verify::{
    VerifyError, VerifyReport, VerifySpec, run_distributed, run_single, verify,
};

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
    t[name]
        .as_str()
        .unwrap_or_else(|| panic!("{name}: no golden digest"))
        .to_string()
}

/// Every gating check passes (the step-program trace check included), production equals
/// validation, sharded equals single device bitwise unless TP changes the order, and the
/// digest is the golden one.
fn check(name: &str) -> VerifyReport {
    let s = spec(name);
    assert_eq!(s.act_dtype(), ActDType::Bf16, "{name}: not a bf16 scenario");
    let r = verify(&s).unwrap_or_else(|e| panic!("{name}: {e}"));
    for c in r.checks.iter().filter(|c| c.gating) {
        assert!(c.passed, "{name}: {} failed: {}", c.name, c.detail);
    }
    assert!(r.passed, "{name}");
    assert_eq!(r.param_dtype, "bf16", "{name}");
    assert!(r.rows.iter().all(|row| row.prod_val_bitwise), "{name}");
    if s.order_changing() {
        assert_ne!(r.digest, r.single_device_digest, "{name}");
    } else {
        assert!(
            r.rows
                .iter()
                .all(|row| row.grad.bitwise && row.param.bitwise),
            "{name}: sharded != single device"
        );
        assert_eq!(r.digest, r.single_device_digest, "{name}");
    }
    assert_eq!(r.digest, golden(name), "{name}: golden digest changed");
    r
}

/// The model-parallel calls of rank 0's step-1 trace on `label` all carry bf16.
fn assert_bf16_on(name: &str, label: &str, kinds_f32_ok: bool) {
    let s = spec(name);
    let prod = run_distributed(&s, ExecMode::Production).unwrap();
    let calls: Vec<_> = prod.traces[0]
        .iter()
        .filter(|e| e.group_label == label)
        .collect();
    assert!(!calls.is_empty(), "{name}: no {label} calls");
    let bf16 = calls.iter().filter(|e| e.dtype == DType::Bf16).count();
    if kinds_f32_ok {
        // EP: the routed-row counts (all-to-all) and the routed copies' expert ids (one
        // all-to-all-v per count exchange, HyperParallel `ep_routed_forward`) travel as exact
        // f32, the routed rows in bf16.
        assert!(
            bf16 > 0 && bf16 < calls.len(),
            "{name}: {bf16} of {}",
            calls.len()
        );
        let f32_kind = |k: CollectiveKind| {
            calls
                .iter()
                .filter(|e| e.dtype == DType::F32 && e.kind == k)
                .count()
        };
        let counts = f32_kind(CollectiveKind::AllToAll);
        assert!(counts > 0, "{name}");
        assert_eq!(f32_kind(CollectiveKind::AllToAllV), counts, "{name}");
        assert_eq!(counts * 2, calls.len() - bf16, "{name}: other f32 calls");
    } else {
        assert_eq!(bf16, calls.len(), "{name}: {label} calls not all bf16");
    }
}

#[test]
fn dense_fsdp4_default_param_dtype_is_bf16() {
    let text = std::fs::read_to_string(dir().join("dense-fsdp4-bf16.toml")).unwrap();
    assert!(
        !text
            .lines()
            .any(|l| l.trim_start().starts_with("param_dtype")),
        "must leave the key out"
    );
    check("dense-fsdp4-bf16");
}

#[test]
fn dense_tp2_fsdp2_bf16_activations_within_the_widened_bound() {
    let r = check("dense-tp2-fsdp2-bf16");
    assert!(r.rows.iter().any(|row| !row.grad.bitwise));
    assert_bf16_on("dense-tp2-fsdp2-bf16", "tp", false);
}

#[test]
fn moe_ep2_fsdp2_bf16_stays_bitwise() {
    check("moe-ep2-fsdp2-bf16");
    assert_bf16_on("moe-ep2-fsdp2-bf16", "ep", true);
}

#[test]
fn mla_hsdp2x2_bf16() {
    check("mla-hsdp2x2-bf16");
}

#[test]
fn uneven_fsdp3_bf16() {
    check("uneven-fsdp3-bf16");
}

#[test]
fn muon_bf16_scenarios() {
    for name in [
        "dense-fsdp4-muon-bf16",
        "dense-tp2-fsdp2-muon-bf16",
        "moe-ep2-fsdp2-muon-bf16",
        "mla-hsdp2x2-muon-bf16",
        "uneven-fsdp3-muon-bf16",
    ] {
        let r = check(name);
        assert!(r.muon.is_some(), "{name}");
    }
}

#[test]
fn a_dropped_tp_all_reduce_breaks_the_bf16_bound() {
    let mut s = spec("dense-tp2-fsdp2-bf16");
    s.mutate("model.layers.0.mlp").unwrap();
    match verify(&s) {
        Err(VerifyError::Run { mode, source }) => {
            assert_eq!(mode, "validation");
            assert_eq!(source.module(), Some("model.layers.0.mlp"));
        }
        other => panic!("expected the validation run to fail, got {other:?}"),
    }
    let prod = run_distributed(&s, ExecMode::Production).unwrap();
    let single = run_single(&s).unwrap();
    let pg = assemble(&s, &prod, Which::Grads).unwrap();
    let worst = diff_sets(&pg.tensors, &single.grads)
        .into_iter()
        .map(|(_, d)| d.rel_to_max)
        .fold(0.0, f64::max);
    let bound = grad_rel_bound(&s, tp_crossings(&s, &prod));
    assert!(bound < 0.25, "the bound must stay discriminating: {bound}");
    println!("dropped all-reduce: worst gradient error {worst:e} of max|g|, bf16 bound {bound:e}");
    assert!(
        worst > bound,
        "a dropped all-reduce must exceed the bf16 TP bound {bound:e}, got {worst:e}"
    );
}

#[test]
fn the_f32_bound_is_unchanged_for_f32_activations() {
    let s = spec("dense-tp2-fsdp2");
    assert_eq!(s.act_dtype(), ActDType::F32);
    assert_eq!(
        grad_rel_bound(&s, 11),
        hpfsdp_reference::verify::report::GRAD_REL_BOUND
    );
}
