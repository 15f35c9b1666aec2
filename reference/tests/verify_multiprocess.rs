//! The multi-process verification path (each rank runs its part over its own communicator,
//! records travel to rank 0 in the wire format, rank 0 builds the report) driven over
//! in-process ranks: the report equals the in-process harness's, digests equal the goldens.
//! The same path under `mpirun` is tested by the root crate's `cli_verify_mpi` tests.

use std::path::{Path, PathBuf};

use hpfsdp_backends::{Collective, InProcWorld};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_reference::verify::{VerifyError, VerifyReport, VerifySpec, verify, verify_on};

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

/// Everything of a report except wall times.
fn essence(r: &VerifyReport) -> String {
    let rows: Vec<String> = r
        .rows
        .iter()
        .map(|p| {
            format!(
                "{} {:?} {:?} {} {}",
                p.name, p.grad, p.param, p.prod_val_bitwise, p.verdict
            )
        })
        .collect();
    let checks: Vec<String> = r
        .checks
        .iter()
        .map(|c| format!("{} {} {}", c.name, c.passed, c.detail))
        .collect();
    format!(
        "{} {} {} {:?} {:?} {:?} {:?}\n{}\n{}\n{:?}",
        r.digest,
        r.single_device_digest,
        r.passed,
        r.dispatch_production,
        r.fsdp_rank0,
        r.loss.production.to_bits(),
        r.muon
            .as_ref()
            .map(|m| (m.ns_totals(), m.momentum_totals())),
        rows.join("\n"),
        checks.join("\n"),
        r.notes
    )
}

fn multiprocess_equals_inproc(name: &str) {
    let s = spec(name);
    let world = s.world();
    let run = InProcWorld::run(world, |comm| verify_on(&s, comm)).unwrap();
    let mut results = run.results.into_iter();
    let root = results
        .next()
        .unwrap()
        .unwrap()
        .expect("rank 0 builds the report");
    for (r, other) in results.enumerate() {
        assert!(
            other.unwrap().is_none(),
            "rank {} must not build a report",
            r + 1
        );
    }
    assert_eq!(root.digest, golden(name), "{name}: golden digest");
    let direct = verify(&s).unwrap();
    assert_eq!(essence(&root), essence(&direct), "{name}");
    assert!(root.passed, "{name}");
}

#[test]
fn dense_fsdp4_over_per_rank_communicators() {
    multiprocess_equals_inproc("dense-fsdp4");
}

#[test]
fn moe_muon_over_per_rank_communicators() {
    multiprocess_equals_inproc("moe-ep2-fsdp2-muon");
}

#[test]
fn wrong_world_size_is_a_clear_error() {
    let s = spec("dense-fsdp4");
    let run = InProcWorld::run(3, |comm| {
        assert_eq!(comm.world_size(), 3);
        verify_on(&s, comm)
    })
    .unwrap();
    for r in run.results {
        let e = r.unwrap_err();
        assert!(matches!(e, VerifyError::Unsupported { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("has 4 ranks but the inproc world has 3 processes"),
            "{msg}"
        );
        assert!(msg.contains("mpirun -np 4"), "{msg}");
    }
}
