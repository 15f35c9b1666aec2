//! The verification scenarios end to end: production == validation bitwise, sharded ==
//! single device bitwise for data- and expert-parallel axes (TP within its bound), the golden
//! digests, mutations caught by validation mode with the module named, the trace against the
//! step program, and clear errors for bad inputs; for the `*-muon` scenarios also distributed
//! Muon on the real gradients over several steps (deduplicated == naive == single-device Muon
//! on the run's own gradients, bitwise; the dedup figures; a corrupted step is caught) and the
//! engine's collective trace against the `hyperparallel` Muon optimizer program (passing, or
//! advisory with its known plan-side difference).

use std::path::{Path, PathBuf};

use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::runtime::ExecMode;
use hpfsdp_reference::verify::compare::{Which, assemble};
use hpfsdp_reference::verify::muon_report::muon_part;
use hpfsdp_reference::verify::muon_spec::{MUON_VERIFY_STEPS, Route};
use hpfsdp_reference::verify::report::{
    MUON_TRACE_CHECK, MUON_TRACE_GATING, VerifyReport, muon_trace_check, verify_mutation,
};
use hpfsdp_reference::verify::{VerifyError, VerifySpec, run_distributed, run_single, verify};

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

fn check_scenario(name: &str, bitwise_single: bool) -> VerifyReport {
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
    r
}

/// Muon checks every `*-muon` scenario must show.
const MUON_CHECKS: [&str; 4] = [
    "Muon dedup == naive distributed Muon (bitwise)",
    "Muon sharded == single-device Muon on the run's gradients (bitwise)",
    "replicas and replica subgroups agree after every step",
    "Muon dedup figures match the plan",
];

/// The Muon trace check ("Muon collective trace == hyperparallel Muon optimizer program") per
/// Muon scenario: `Ok((calls, broadcasts))`, it passes, comparing that many calls of step 1
/// summed over ranks, every broadcast's root included; `Err(piece)`, the known difference on
/// the plan side, `piece` a piece of the first-difference message (the check is advisory
/// until none is left, see `MUON_TRACE_GATING`).
fn muon_trace_expectation(name: &str) -> Result<(usize, usize), &'static str> {
    match name {
        "dense-fsdp4-muon" => Ok((20, 16)),
        "dense-hsdp4x2-muon" => Ok((40, 32)),
        "moe-ep2-fsdp2-muon" => Ok((20, 16)),
        "mla-hsdp2x2-muon" => Ok((28, 24)),
        "uneven-fsdp3-muon" => Ok((12, 9)),
        "dense-tp2-fsdp2-muon" => Ok((64, 48)),
        _ => panic!("no Muon trace expectation for {name}"),
    }
}

/// A Muon scenario end to end; returns the report for scenario-specific figures.
fn check_muon(name: &str, bitwise_single: bool) -> VerifyReport {
    let r = check_scenario(name, bitwise_single);
    let t = r
        .checks
        .iter()
        .find(|c| c.name == MUON_TRACE_CHECK)
        .unwrap_or_else(|| panic!("{name}: no Muon trace check"));
    assert_eq!(t.gating, MUON_TRACE_GATING, "{name}");
    match muon_trace_expectation(name) {
        Ok((calls, broadcasts)) => {
            assert!(t.passed, "{name}: {}", t.detail);
            let want = format!("{calls} Muon calls of step 1 on {} ranks", r.world);
            assert!(t.detail.starts_with(&want), "{name}: {}", t.detail);
            let roots = format!("{broadcasts} of {broadcasts} broadcast roots compared");
            assert!(t.detail.ends_with(&roots), "{name}: {}", t.detail);
        }
        Err(known) => {
            assert!(
                !t.passed,
                "{name}: the known plan-side difference is gone: expect a pass here (and make \
                 the check gating once no scenario differs): {}",
                t.detail
            );
            assert!(
                t.detail.contains(known),
                "{name}: another difference than the known one: {}",
                t.detail
            );
        }
    }
    assert_eq!(r.steps, MUON_VERIFY_STEPS, "{name}");
    assert!(
        r.optimizer.starts_with("muon+adamw"),
        "{name}: {}",
        r.optimizer
    );
    for want in MUON_CHECKS {
        let c = r.checks.iter().find(|c| c.name == want);
        assert!(
            c.is_some_and(|c| c.passed && c.gating),
            "{name}: {want}: {c:?}"
        );
    }
    let m = r.muon.as_ref().expect("Muon summary");
    let (nd, nn) = m.ns_totals();
    assert!(nd < nn, "{name}: dedup {nd} vs naive {nn}");
    assert_eq!(m.ranks.len(), r.world, "{name}");
    assert_eq!(m.step_losses.len(), MUON_VERIFY_STEPS, "{name}");
    if bitwise_single {
        assert_eq!(m.step_losses, m.single_step_losses, "{name}");
        assert!(
            r.rows.iter().all(|row| row
                .first_step
                .is_some_and(|f| f.grad.bitwise && f.param.bitwise)),
            "{name}: step 1 bitwise"
        );
    }
    for row in &r.rows {
        let adamw =
            row.shape.len() < 2 || row.name.contains("embed") || row.name.contains("lm_head");
        assert_eq!(row.route == Route::Adamw, adamw, "{name}: {}", row.name);
    }
    r
}

#[test]
fn dense_fsdp4_muon() {
    let r = check_muon("dense-fsdp4-muon", true);
    let m = r.muon.unwrap();
    let (nd, nn) = m.ns_totals();
    assert_eq!(nd, m.ns_single, "each matrix once per shard group");
    assert_eq!(nn, 4 * m.ns_single, "naive repeats NS on every rank");
    assert_eq!(m.routes.local_muon, 0);
}

#[test]
fn dense_hsdp4x2_muon_split_replica_subgroups() {
    let r = check_muon("dense-hsdp4x2-muon", true);
    let m = r.muon.unwrap();
    assert_eq!(m.replica_count, Some(2), "4 replicas on 2-die machines");
    assert_eq!(m.replica_subgroups, ["dp_replicate 4/2"]);
    let (nd, nn) = m.ns_totals();
    assert_eq!(
        nd,
        2 * m.ns_single,
        "once per shard group per replica subgroup"
    );
    assert_eq!(nn, 8 * m.ns_single);
    let (md, mn) = m.momentum_totals();
    assert_eq!(2 * md, mn, "momentum only on the subgroup's owner");
    assert!(m.ranks.iter().all(|x| x.replica_bytes > 0));
}

#[test]
fn dense_tp2_fsdp2_muon_within_bound() {
    let r = check_muon("dense-tp2-fsdp2-muon", false);
    let m = r.muon.unwrap();
    assert!(m.realigned_layouts > 0, "FSDP over TP uses strided layouts");
    assert_eq!(m.ns_totals().0, m.ns_single);
    for row in &r.rows {
        let f = row.first_step.unwrap();
        assert!(f.grad.rel_to_max < 1e-5, "{}: {:?}", row.name, f.grad);
        let bound = row.param_bound_per_step.unwrap();
        assert!(f.param.max_abs <= bound && row.param.max_abs <= 3.0 * bound);
    }
}

#[test]
fn moe_ep2_fsdp2_muon_local_experts() {
    let r = check_muon("moe-ep2-fsdp2-muon", true);
    let local: Vec<&str> = r
        .rows
        .iter()
        .filter(|row| row.route == Route::LocalMuon)
        .map(|row| row.name.as_str())
        .collect();
    assert_eq!(local.len(), 4, "{local:?}");
    assert!(
        local.iter().all(|n| n.contains("mlp.experts.")),
        "{local:?}"
    );
    let m = r.muon.unwrap();
    assert!(m.realigned_layouts > 0, "FSDP inside the EP pieces");
    assert_eq!(m.ns_totals().0, m.ns_single);
}

#[test]
fn uneven_fsdp3_muon_keller_jordan() {
    let r = check_muon("uneven-fsdp3-muon", true);
    let m = r.muon.unwrap();
    assert_eq!(m.preset, "keller-jordan");
    assert_eq!(m.ns_totals(), (m.ns_single, 3 * m.ns_single));
}

#[test]
fn mla_hsdp2x2_muon_adapters_moonlight() {
    let r = check_muon("mla-hsdp2x2-muon", true);
    let m = r.muon.unwrap();
    assert_eq!(m.preset, "moonlight");
    assert_eq!(m.routes.local_muon, 2, "fused experts sharded on E");
    let (md, mn) = m.momentum_totals();
    assert_eq!(2 * md, mn, "replica-domain dedup over 2 replicas");
}

#[test]
fn adamw_scenarios_stay_one_adamw_step() {
    let r = verify(&spec("dense-fsdp4")).unwrap();
    assert_eq!(r.steps, 1);
    assert_eq!(r.optimizer, "adamw");
    assert!(r.muon.is_none());
    assert!(
        r.rows
            .iter()
            .all(|row| row.route == Route::Adamw && row.first_step.is_none())
    );
}

#[test]
fn a_corrupted_muon_step_is_caught() {
    let s = spec("dense-fsdp4-muon");
    let mv = s.muon.as_ref().unwrap();
    let prod = run_distributed(&s, ExecMode::Production).unwrap();
    let single = run_single(&s).unwrap();
    let (_, checks) = muon_part(&s, mv, &prod, &single).unwrap();
    assert!(checks.iter().all(|c| c.passed), "{checks:?}");
    // The engine's step-1 calls on each rank: one fused all-gather, then the relay broadcasts
    // of the 4 shard owners; a wrong root or a missing call breaks the Muon trace check.
    assert!(muon_trace_check(&s, &prod).passed);
    assert!(prod.muon_traces.iter().all(|t| t.len() == 5));
    let mut bad = prod.clone();
    let e = &mut bad.muon_traces[1][2];
    e.root = Some(e.ranks[3]);
    let c = muon_trace_check(&s, &bad);
    assert!(!c.passed, "{c:?}");
    assert!(
        c.detail.contains("rank 1, communicator")
            && c.detail.contains("call #2: the trace has broadcast")
            && c.detail.contains("from group position 3 (trace #")
            && c.detail
                .contains("from group position 1 (muon.b0.m0.relay.")
            && c.detail.contains("of 4 ranks differ"),
        "{}",
        c.detail
    );
    let mut bad = prod.clone();
    bad.muon_traces[3].pop();
    let c = muon_trace_check(&s, &bad);
    assert!(
        c.detail.contains("call #4: the trace has nothing"),
        "{}",
        c.detail
    );
    // Flip one bit of rank 2's q_proj shard after step 2: the sharded optimizer no longer
    // reproduces single-device Muon on the run's own gradients.
    let q = s
        .fsdp
        .params
        .iter()
        .position(|p| p.name == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    let mut bad = prod.clone();
    let x = &mut bad.ranks[2].history[1].params[q][5];
    *x = f32::from_bits(x.to_bits() ^ 1);
    let (_, checks) = muon_part(&s, mv, &bad, &single).unwrap();
    let own = checks
        .iter()
        .find(|c| c.name.starts_with("Muon sharded == single-device"))
        .unwrap();
    assert!(!own.passed, "{own:?}");
    assert!(
        own.detail
            .contains("step 2 model.layers.0.self_attn.q_proj.weight"),
        "{}",
        own.detail
    );
    // A naive/dedup disagreement reported by a rank fails its check.
    let mut bad = prod.clone();
    bad.ranks[1].muon[0].naive_mismatch.push("x".into());
    let (_, checks) = muon_part(&s, mv, &bad, &single).unwrap();
    assert!(
        checks
            .iter()
            .any(|c| c.name.starts_with("Muon dedup == naive") && !c.passed)
    );
}

#[test]
fn bad_muon_options_name_the_file_line_and_key() {
    let path = dir().join("dense-hsdp4x2-muon.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let bad = dir().join("bad-muon.toml");
    let e = Scenario::from_str_at(
        &text.replace("preset = \"hyperparallel\"", "preset = \"hyperparalel\""),
        &bad,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("bad-muon.toml") && e.contains("preset") && e.contains("hyperparalel"),
        "{e}"
    );
    let sc = Scenario::from_str_at(
        &text.replace(
            "preset = \"hyperparallel\"",
            "preset = \"hyperparallel\"\n[optimizer.muon]\nreplica_count = 3",
        ),
        &path,
    )
    .unwrap();
    let e = VerifySpec::from_scenario(&sc).unwrap_err().to_string();
    assert!(
        e.contains("dense-hsdp4x2-muon.toml:")
            && e.contains("replica_count")
            && e.contains("divide"),
        "{e}"
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
        "dense-fsdp4-muon",
        "dense-hsdp4x2-muon",
    ] {
        let s = spec(name);
        let prod = run_distributed(&s, ExecMode::Production).unwrap();
        let c = hpfsdp_reference::verify::report::trace_check(&s, &prod);
        assert!(c.passed, "{name}: {}", c.detail);
    }
}

/// The reference executor's FSDP schedule keeps the root (embedding, final norm, `lm_head`)
/// gathered from the root's pre-forward to the end of backward: per micro-batch every sharded
/// parameter is gathered once for forward and only the block parameters again for backward,
/// the count `FsdpPlan::collective_counts` gives, and each micro-batch's first three
/// all-gathers are the root's, in unit order, before any block's; its reduce-scatters come
/// last.
#[test]
fn root_units_are_gathered_once_per_micro_batch() {
    use hpfsdp_backends::CollectiveKind;
    let s = spec("dense-fsdp4");
    assert!(s.fsdp.reshard_after_forward);
    let sharded: Vec<_> = s
        .fsdp
        .params
        .iter()
        .filter(|p| p.all_gather.bytes_out_per_rank > 0)
        .collect();
    let root: Vec<_> = sharded
        .iter()
        .filter(|p| s.fsdp.units[p.unit].is_root())
        .collect();
    assert_eq!(root.len(), 3);
    let per_micro_batch = 2 * sharded.len() - root.len();
    assert_eq!(s.fsdp.collective_counts().0, per_micro_batch);
    let prod = run_distributed(&s, ExecMode::Production).unwrap();
    let micro_batches = (s.grad_accum * s.steps) as u64;
    assert!(
        s.grad_accum > 1,
        "several micro-batches exercise the re-gather"
    );
    for r in &prod.ranks {
        assert_eq!(r.fsdp.all_gathers, per_micro_batch as u64 * micro_batches);
    }
    // Rank 0's first step: the forward of each micro-batch starts with the root's gathers.
    let ag: Vec<usize> = prod.traces[0]
        .iter()
        .filter(|e| e.kind == CollectiveKind::AllGather)
        .map(|e| e.input_elements)
        .collect();
    assert_eq!(ag.len(), per_micro_batch * s.grad_accum);
    let root_elems: Vec<usize> = root.iter().map(|p| p.padded_shard_numel as usize).collect();
    for mb in ag.chunks(per_micro_batch) {
        assert_eq!(mb[..3], root_elems[..]);
    }
    // The root's post-backward fires last: each micro-batch's last three reduce-scatters are
    // the root's, in unit order.
    let shard = s.fsdp.groups["dense.shard"].size;
    let rs: Vec<usize> = prod.traces[0]
        .iter()
        .filter(|e| e.kind == CollectiveKind::ReduceScatter)
        .map(|e| e.input_elements / shard)
        .collect();
    assert_eq!(rs.len(), sharded.len() * s.grad_accum);
    for mb in rs.chunks(sharded.len()) {
        assert_eq!(mb[mb.len() - 3..], root_elems[..]);
    }
}

#[test]
fn mutated_module_contract_is_caught_with_the_module_named() {
    for (scenario, target) in [
        ("dense-fsdp4", "model.layers.0.self_attn"),
        ("dense-fsdp4", "model.layers.1.post_attention_layernorm"),
        ("dense-tp2-fsdp2", "model.layers.1.mlp"),
        ("moe-ep2-fsdp2", "model.layers.0.mlp"),
        ("dense-tp2-fsdp2-muon", "model.layers.1.mlp"),
        ("moe-ep2-fsdp2-muon", "model.layers.0.mlp"),
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
