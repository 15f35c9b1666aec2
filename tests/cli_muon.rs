//! End-to-end test of `hpfsdp muon`: the dedup figures match their formulas on a paper scenario
//! (pure FSDP: every matrix orthogonalized once in total, naive does it on every rank) and on an
//! HSDP scenario (momentum held once per replica group).

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn muon_json(scenario: &str) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(["muon", scenario, "--json"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run hpfsdp");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn sum(doc: &Value, key: &str) -> u64 {
    doc["per_rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[key].as_u64().unwrap())
        .sum()
}

#[test]
fn fsdp_orthogonalizes_each_matrix_once_and_naive_everywhere() {
    let doc = muon_json("scenarios/paper/muon-vs-dmuon.toml");
    let ranks = doc["per_rank"].as_array().unwrap().len() as u64;
    let single = doc["ns_matrices_single_device"].as_u64().unwrap();
    assert!(single > 0);
    assert_eq!(sum(&doc, "ns_matrices_dedup"), single);
    assert_eq!(sum(&doc, "ns_matrices_naive"), single * ranks);
    // No replicas: momentum is sharded, not duplicated, in both.
    let mom = doc["momentum_elems_single_device"].as_u64().unwrap();
    assert_eq!(sum(&doc, "momentum_elems_dedup"), mom);
}

#[test]
fn hsdp_keeps_momentum_once_per_replica_group() {
    // exp-d: 6 dense replicas, 2 expert replicas; the deduplicated engine holds every momentum
    // element exactly once over the job.
    let doc = muon_json("scenarios/paper/exp-d.toml");
    let mom = doc["momentum_elems_single_device"].as_u64().unwrap();
    assert_eq!(sum(&doc, "momentum_elems_dedup"), mom);
    assert!(sum(&doc, "momentum_elems_naive") > 2 * mom);
}
