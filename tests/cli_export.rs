//! End-to-end tests of `hpfsdp export --chakra`: one length-delimited Chakra trace per rank,
//! `GlobalMetadata` first, one node per program op with the program's dependencies, and
//! collectives as `COMM_COLL_NODE`s with `comm_type`, `comm_size` and `pg_name` that round-trip
//! to the step program they came from; bad input exits 2.

mod common;

use common::{hpfsdp, text};
use hpfsdp_export::et_def::attribute_proto::Value;
use hpfsdp_export::et_def::{CollectiveCommType, NodeType};
use hpfsdp_export::trace_file::read_trace;
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_program::step::Payload;
use hpfsdp_program::strategy::{ProgramGenerator, StrategyKind};
use hpfsdp_sim::scenario_run::ScenarioPlans;
use std::path::Path;

#[test]
fn traces_round_trip_to_the_step_programs() {
    let scenario = "scenarios/verify/dense-tp2-fsdp2.toml";
    let dir = std::env::temp_dir().join(format!("hpfsdp-chakra-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let o = hpfsdp(&[
        "export",
        scenario,
        "--chakra",
        dir.to_str().unwrap(),
        "--strategy",
        "fsdp2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("wrote 4 Chakra trace(s)"), "{}", text(&o));
    let groups: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("dense-tp2-fsdp2.comm_groups.json")).unwrap(),
    )
    .unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let plans = ScenarioPlans::new(Scenario::load(&root.join(scenario)).unwrap());
    let generator = ProgramGenerator::new(
        &plans.scenario,
        &plans.sharding,
        &plans.fsdp,
        StrategyKind::parse("fsdp2").unwrap(),
    )
    .unwrap();
    let mut collectives = 0;
    for rank in 0..4 {
        let (meta, nodes) = read_trace(&dir.join(format!("dense-tp2-fsdp2.{rank}.et"))).unwrap();
        assert_eq!(meta.version, hpfsdp_export::CHAKRA_SCHEMA_VERSION);
        assert!(
            meta.attr
                .iter()
                .any(|a| a.name == "rank" && a.value == Some(Value::Uint64Val(rank as u64)))
        );
        let program = generator.program(rank).unwrap();
        assert_eq!(nodes.len(), program.ops.len());
        for (node, op) in nodes.iter().zip(&program.ops) {
            assert_eq!(node.id, op.id.index() as u64);
            let deps: Vec<u64> = op.deps.iter().map(|d| d.index() as u64).collect();
            assert_eq!(node.data_deps, deps);
            assert!(
                node.ctrl_deps.iter().all(|d| *d < node.id),
                "dependencies point backwards"
            );
            match &op.payload {
                Payload::Collective(c) => {
                    collectives += 1;
                    assert_eq!(node.r#type, NodeType::CommCollNode as i32);
                    let Some(Value::Int64Val(t)) = node.attr("comm_type") else {
                        panic!("comm_type")
                    };
                    assert_eq!(*t, hpfsdp_export::chakra::comm_type(c.kind) as i64);
                    assert_ne!(*t, CollectiveCommType::Barrier as i64);
                    let Some(Value::Int64Val(size)) = node.attr("comm_size") else {
                        panic!("comm_size")
                    };
                    assert_eq!(*size as u64, c.input_bytes.max(c.output_bytes));
                    let Some(Value::StringVal(pg)) = node.attr("pg_name") else {
                        panic!("pg_name")
                    };
                    let mut ranks = program.group(c.group).unwrap().ranks.clone();
                    ranks.sort_unstable();
                    assert_eq!(groups[pg.as_str()], serde_json::json!(ranks), "pg {pg}");
                }
                _ => {
                    assert_eq!(node.r#type, NodeType::CompNode as i32);
                    assert!(node.attr("is_cpu_op").is_some());
                }
            }
        }
    }
    assert!(collectives > 0, "the programs have collectives");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_input_exits_2() {
    let dir = std::env::temp_dir().join(format!("hpfsdp-chakra-bad-{}", std::process::id()));
    let d = dir.to_str().unwrap();
    let o = hpfsdp(&[
        "export",
        "scenarios/verify/dense-fsdp4.toml",
        "--chakra",
        d,
        "--strategy",
        "zero3",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("--strategy zero3: unknown strategy"),
        "{}",
        text(&o)
    );
    let o = hpfsdp(&["export", "scenarios/none.toml", "--chakra", d]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("scenarios/none.toml"), "{}", text(&o));
    let o = hpfsdp(&["export", "scenarios/verify/dense-fsdp4.toml"]);
    assert_eq!(o.status.code(), Some(2), "--chakra is required");
    std::fs::remove_dir_all(&dir).ok();
}
