//! End-to-end tests of `hpfsdp export --chakra`: one length-delimited Chakra trace per rank,
//! `GlobalMetadata` first, the program's ops as nodes with its dependencies, and ASTRA-sim's
//! configuration files beside them; bad input exits 2.
//!
//! The traces are decoded here with the official Chakra schema (tests/fixtures/chakra/
//! et_def.proto, compiled at test time by protox and read by prost-reflect), not with the
//! exporter's own prost structs, and checked the way ASTRA-sim and Chakra's feeder read them:
//! attribute kinds (`num_ops`, `comm_type`, `comm_size` as `int64_val`, `tensor_size` as
//! `uint64_val`, `comm_src` / `comm_dst` / `comm_tag` as `int32_val`), collective sizes (an
//! all-gather's `comm_size` is the per-rank shard ASTRA-sim multiplies by the group size), and
//! a predicted duration on every node that has work.

mod common;

use common::{hpfsdp, text};
use hpfsdp_plan::scenario::Scenario;
use hpfsdp_plan::{CollectiveKind, Topology};
use hpfsdp_program::step::{
    Category, CollectiveOp, ComputeWork, Group, Op, Payload, ProgramBuilder, StepProgram, Stream,
};
use hpfsdp_program::strategy::{ProgramGenerator, StrategyKind};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::scenario_run::{ScenarioPlans, hardware_dir_for};
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, ReflectMessage, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// One attribute as decoded: the name of the `oneof value` field that is set and the value.
#[derive(Debug, Clone, PartialEq)]
enum Attr {
    Int(&'static str, i128),
    Str(String),
    Bool(bool),
}

/// One node as decoded by the official schema.
#[derive(Debug, Clone)]
struct DecodedNode {
    id: u64,
    name: String,
    node_type: String,
    data_deps: Vec<u64>,
    ctrl_deps: Vec<u64>,
    duration_micros: u64,
    attrs: BTreeMap<String, Attr>,
}

impl DecodedNode {
    fn int(&self, name: &str, kind: &str) -> i128 {
        match self.attrs.get(name) {
            Some(Attr::Int(k, v)) if *k == kind => *v,
            other => panic!("node {} attr {name}: want {kind}, found {other:?}", self.id),
        }
    }

    fn string(&self, name: &str) -> String {
        match self.attrs.get(name) {
            Some(Attr::Str(s)) => s.clone(),
            other => panic!(
                "node {} attr {name}: want string_val, found {other:?}",
                self.id
            ),
        }
    }
}

fn pool() -> DescriptorPool {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chakra");
    let files = protox::compile(["et_def.proto"], [root]).expect("the official schema compiles");
    DescriptorPool::from_file_descriptor_set(files).expect("descriptor pool")
}

/// Reads one varint (protobuf base-128) from `bytes` at `at`.
fn varint(bytes: &[u8], at: &mut usize) -> usize {
    let mut v = 0usize;
    for shift in (0..64).step_by(7) {
        let b = bytes[*at];
        *at += 1;
        v |= usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return v;
        }
    }
    panic!("varint longer than 10 bytes")
}

fn attr_value(m: &DynamicMessage) -> (String, Attr) {
    let name = m
        .get_field_by_name("name")
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    let set: Vec<(String, Value)> = m
        .fields()
        .filter(|(f, _)| f.name() != "name" && f.name() != "doc_string")
        .map(|(f, v)| (f.name().to_string(), v.clone()))
        .collect();
    assert_eq!(set.len(), 1, "attribute {name} sets one value: {set:?}");
    let (field, v) = &set[0];
    let kind: &'static str = match field.as_str() {
        "int32_val" => "int32_val",
        "int64_val" => "int64_val",
        "uint32_val" => "uint32_val",
        "uint64_val" => "uint64_val",
        other => other.to_string().leak(),
    };
    let a = match v {
        Value::I32(x) => Attr::Int(kind, i128::from(*x)),
        Value::I64(x) => Attr::Int(kind, i128::from(*x)),
        Value::U32(x) => Attr::Int(kind, i128::from(*x)),
        Value::U64(x) => Attr::Int(kind, i128::from(*x)),
        Value::String(s) => Attr::Str(s.clone()),
        Value::Bool(b) => Attr::Bool(*b),
        other => panic!("attribute {name}: unexpected value {other:?}"),
    };
    (name, a)
}

fn u64_list(m: &DynamicMessage, field: &str) -> Vec<u64> {
    match m.get_field_by_name(field).as_deref() {
        Some(Value::List(l)) => l.iter().map(|v| v.as_u64().unwrap()).collect(),
        other => panic!("{field}: {other:?}"),
    }
}

/// Decodes a `.et` file: the `GlobalMetadata` record's version, then every `Node` record.
fn decode_et(pool: &DescriptorPool, path: &Path) -> (String, Vec<DecodedNode>) {
    let bytes = std::fs::read(path).unwrap();
    let meta_desc = pool
        .get_message_by_name("ChakraProtoMsg.GlobalMetadata")
        .unwrap();
    let node_desc: MessageDescriptor = pool.get_message_by_name("ChakraProtoMsg.Node").unwrap();
    let mut at = 0;
    let record = |desc: &MessageDescriptor, at: &mut usize| {
        let len = varint(&bytes, at);
        let m = DynamicMessage::decode(desc.clone(), &bytes[*at..*at + len]).unwrap();
        *at += len;
        m
    };
    let meta = record(&meta_desc, &mut at);
    let version = meta
        .get_field_by_name("version")
        .unwrap()
        .as_str()
        .unwrap()
        .to_string();
    let mut nodes = Vec::new();
    while at < bytes.len() {
        let m = record(&node_desc, &mut at);
        let type_number = m
            .get_field_by_name("type")
            .unwrap()
            .as_enum_number()
            .unwrap();
        let node_type = m
            .descriptor()
            .get_field_by_name("type")
            .and_then(|f| f.kind().as_enum().cloned())
            .and_then(|e| e.get_value(type_number))
            .map(|v| v.name().to_string())
            .unwrap();
        let attrs = match m.get_field_by_name("attr").as_deref() {
            Some(Value::List(l)) => l
                .iter()
                .map(|v| attr_value(v.as_message().unwrap()))
                .collect(),
            other => panic!("attr: {other:?}"),
        };
        nodes.push(DecodedNode {
            id: m.get_field_by_name("id").unwrap().as_u64().unwrap(),
            name: m
                .get_field_by_name("name")
                .unwrap()
                .as_str()
                .unwrap()
                .to_string(),
            node_type,
            data_deps: u64_list(&m, "data_deps"),
            ctrl_deps: u64_list(&m, "ctrl_deps"),
            duration_micros: m
                .get_field_by_name("duration_micros")
                .unwrap()
                .as_u64()
                .unwrap(),
            attrs,
        });
    }
    (version, nodes)
}

/// Chakra's `CollectiveCommType` value of `kind` (from the official enum, by name).
fn official_comm_type(pool: &DescriptorPool, kind: CollectiveKind) -> i32 {
    let name = match kind {
        CollectiveKind::AllGather => "ALL_GATHER",
        CollectiveKind::ReduceScatter => "REDUCE_SCATTER",
        CollectiveKind::AllReduce => "ALL_REDUCE",
        CollectiveKind::Broadcast => "BROADCAST",
        CollectiveKind::AllToAll | CollectiveKind::AllToAllV => "ALL_TO_ALL",
        CollectiveKind::SendRecv => unreachable!("exported as send/recv nodes"),
    };
    pool.get_enum_by_name("ChakraProtoMsg.CollectiveCommType")
        .unwrap()
        .get_value_by_name(name)
        .unwrap()
        .number()
}

/// What a decoded node is checked against: the official schema, the exported groups file,
/// and the topology and profile the durations come from.
struct NodeCheck<'a> {
    pool: &'a DescriptorPool,
    groups: &'a serde_json::Value,
    topology: &'a Topology,
    profile: &'a HardwareProfile,
}

impl NodeCheck<'_> {
    /// The node of `op` carries its payload: collectives their official type, size (as
    /// ASTRA-sim's ring reads it), group and duration; compute its FLOPs and bytes; copies
    /// their bytes; host ops their dependencies.
    fn check_payload(
        &self,
        node: &DecodedNode,
        op: &Op,
        program: &StepProgram,
        deps: &[u64],
        duration_ns: u64,
    ) {
        match &op.payload {
            Payload::Collective(c) => {
                assert_eq!(node.node_type, "COMM_COLL_NODE");
                assert_eq!(
                    node.int("comm_type", "int64_val"),
                    i128::from(official_comm_type(self.pool, c.kind))
                );
                let group = program.group(c.group).unwrap();
                let p = group.ranks.len() as i128;
                let size = node.int("comm_size", "int64_val");
                // What ASTRA-sim's ring moves into each rank's output buffer.
                let astra_output = match c.kind {
                    CollectiveKind::AllGather => size * p,
                    CollectiveKind::ReduceScatter => size / p,
                    _ => size,
                };
                assert_eq!(astra_output, i128::from(c.output_bytes), "{:?}", c.kind);
                let pg = node.string("pg_name");
                assert_eq!(self.groups[pg.as_str()], serde_json::json!(group.ranks));
                let s = hpfsdp_export::chakra::collective_s(
                    c,
                    &group.ranks,
                    self.topology,
                    self.profile,
                );
                assert!(s > 0.0);
                assert_eq!(duration_ns, (s * 1e9).round() as u64, "{:?}", c.kind);
                assert!(node.duration_micros > 0, "{:?} of {size} bytes", c.kind);
            }
            Payload::Compute(w) => {
                assert_eq!(node.node_type, "COMP_NODE");
                assert_eq!(node.attrs.get("is_cpu_op"), Some(&Attr::Bool(false)));
                assert_eq!(node.int("num_ops", "int64_val"), i128::from(w.flops));
                assert_eq!(
                    node.int("tensor_size", "uint64_val"),
                    i128::from(w.hbm_bytes)
                );
                assert!(duration_ns > 0, "compute has a predicted duration");
            }
            Payload::Copy(c) => {
                assert_eq!(node.int("tensor_size", "uint64_val"), i128::from(c.bytes));
                assert!(duration_ns > 0, "a copy has a predicted duration");
            }
            Payload::Host { .. } => {
                assert_eq!(node.attrs.get("is_cpu_op"), Some(&Attr::Bool(true)));
                assert_eq!(node.data_deps, deps);
            }
        }
    }
}

/// ASTRA-sim's configuration files beside the traces: the network's NPU counts per tier
/// level (the levels of more than one), the system file, the memory file.
fn check_astra_configs(dir: &Path, name: &str, topology: &Topology) {
    let network = std::fs::read_to_string(dir.join(format!("{name}.network.yml"))).unwrap();
    let expect = format!(
        "npus_count: [ {} ]",
        [
            topology.dies_per_machine,
            topology.machines_per_supernode,
            topology.supernodes
        ]
        .iter()
        .filter(|n| **n > 1)
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(", ")
    );
    assert!(network.contains(&expect), "{network}");
    let system: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{name}.system.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(system["roofline-enabled"], 0);
    assert!(dir.join(format!("{name}.memory.json")).is_file());
}

#[test]
fn traces_decode_with_the_official_schema_as_astra_sim_reads_them() {
    let scenario = "scenarios/verify/dense-hsdp4x2-muon.toml";
    let dir = common::fresh_dir("chakra", "official");
    let o = hpfsdp(&["export", scenario, "--chakra", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("wrote 8 Chakra trace(s)"), "{}", text(&o));
    let name = "dense-hsdp4x2-muon";
    let groups: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{name}.comm_groups.json"))).unwrap(),
    )
    .unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sc = Scenario::load(&root.join(scenario)).unwrap();
    let profile =
        HardwareProfile::load_named(&sc.file.hardware, hardware_dir_for(&root.join(scenario)))
            .unwrap();
    let topology = sc.topology;
    let strategy = sc.file.fsdp.strategy.clone();
    let plans = ScenarioPlans::new(sc);
    let generator = ProgramGenerator::new(
        &plans.scenario,
        &plans.sharding,
        &plans.fsdp,
        StrategyKind::parse(&strategy).unwrap(),
    )
    .unwrap();
    let pool = pool();
    let host = hpfsdp_sim::host_cost::HostCosts::of(&profile, false);
    let ctx = NodeCheck {
        pool: &pool,
        groups: &groups,
        topology: &topology,
        profile: &profile,
    };
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for rank in 0..8 {
        let (version, nodes) = decode_et(&pool, &dir.join(format!("{name}.{rank}.et")));
        assert_eq!(version, "0.0.4");
        let program = generator.program(rank).unwrap();
        let by_id: BTreeMap<u64, &DecodedNode> = nodes.iter().map(|n| (n.id, n)).collect();
        assert_eq!(by_id.len(), nodes.len(), "unique ids");
        let device_ops = program
            .ops
            .iter()
            .filter(|o| !matches!(o.payload, Payload::Host { .. }))
            .count();
        assert_eq!(
            nodes.len(),
            program.ops.len() + device_ops,
            "op nodes + launches"
        );
        let mut previous_host: Option<u64> = None;
        for (i, op) in program.ops.iter().enumerate() {
            let node = by_id[&(i as u64)];
            let deps: Vec<u64> = op.deps.iter().map(|d| d.index() as u64).collect();
            let duration_ns = node.int("duration_ns", "uint64_val") as u64;
            assert_eq!(node.duration_micros, (duration_ns + 500) / 1000);
            // The host chain: every launch and host op after the previous one, in program
            // order, lasting the op's host cost.
            let host_node = match &op.payload {
                Payload::Host { .. } => node,
                _ => {
                    let launch = by_id[&node.data_deps[0]];
                    assert_eq!(launch.name, format!("{}.launch", node.name));
                    assert_eq!(launch.attrs.get("is_cpu_op"), Some(&Attr::Bool(true)));
                    assert_eq!(&node.data_deps[1..], &deps[..]);
                    launch
                }
            };
            assert_eq!(
                host_node.int("duration_ns", "uint64_val") as u64,
                host.op_ns(op)
            );
            assert_eq!(
                host_node.ctrl_deps,
                previous_host.into_iter().collect::<Vec<_>>()
            );
            previous_host = Some(host_node.id);
            if let Payload::Collective(c) = &op.payload {
                *seen.entry(c.kind.name()).or_default() += 1;
            }
            ctx.check_payload(node, op, &program, &deps, duration_ns);
        }
    }
    for kind in ["all-gather", "reduce-scatter", "broadcast"] {
        assert!(seen.get(kind).is_some_and(|n| *n > 0), "{kind}: {seen:?}");
    }
    check_astra_configs(&dir, name, &topology);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn point_to_point_transfers_are_send_and_recv_nodes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let profile =
        HardwareProfile::load_named("ascend-910c-a3", root.join("scenarios/hardware")).unwrap();
    let topology = hpfsdp_plan::Topology::new(2, 1, 1).unwrap();
    let table = hpfsdp_export::groups::GroupTable::new([vec![0, 1]]);
    let job = hpfsdp_export::chakra::JobContext {
        groups: &table,
        topology: &topology,
        profile: &profile,
    };
    let pool = pool();
    let dir = common::fresh_dir("chakra", "p2p");
    std::fs::create_dir_all(&dir).unwrap();
    for rank in 0..2 {
        let mut b = ProgramBuilder::new(rank);
        let g = b.group(Group::new("pair", vec![0, 1]).unwrap());
        let work = b.compute(ComputeWork::memory_bound(1 << 20, 1 << 20, 1), &[]);
        let op = |bytes_in, bytes_out| CollectiveOp {
            kind: CollectiveKind::SendRecv,
            group: g,
            tier: hpfsdp_plan::Tier::IntraMachine,
            input_bytes: bytes_in,
            output_bytes: bytes_out,
            dtype: hpfsdp_plan::DType::Bf16,
            aligned_512: true,
        };
        // Rank 0 sends 4 MiB to rank 1, then both exchange 1 MiB.
        let (i, o) = if rank == 0 {
            (4 << 20, 0)
        } else {
            (0, 4 << 20)
        };
        let first = b.collective(Stream::Parallel, Category::Pp, op(i, o), &[work]);
        b.collective(
            Stream::Parallel,
            Category::Pp,
            op(1 << 20, 1 << 20),
            &[first],
        );
        let program = b.build().unwrap();
        let nodes = hpfsdp_export::chakra::program_nodes(&program, &job).unwrap();
        let meta = hpfsdp_export::et_def::GlobalMetadata {
            version: "0.0.4".into(),
            attr: Vec::new(),
        };
        let path = dir.join(format!("p2p.{rank}.et"));
        std::fs::write(
            &path,
            hpfsdp_export::trace_file::encode_trace(&meta, &nodes),
        )
        .unwrap();
        let (_, decoded) = decode_et(&pool, &path);
        let kinds: Vec<&str> = decoded.iter().map(|n| n.node_type.as_str()).collect();
        let peer = 1 - rank as i128;
        let me = rank as i128;
        // Op 1 is one node (send on rank 0, recv on rank 1); op 2 a send (id 2) and a recv
        // (id 3, numbered after the last op), both after op 1; then the three ops' launches.
        let first_kind = if rank == 0 {
            "COMM_SEND_NODE"
        } else {
            "COMM_RECV_NODE"
        };
        assert_eq!(
            kinds,
            [
                "COMP_NODE",
                first_kind,
                "COMM_SEND_NODE",
                "COMM_RECV_NODE",
                "COMP_NODE",
                "COMP_NODE",
                "COMP_NODE"
            ]
        );
        let (send, recv) = (&decoded[2], &decoded[3]);
        assert_eq!((send.id, recv.id), (2, 3));
        // Both launched by node 6 (op 2's launch), after op 1.
        assert_eq!(send.data_deps, [6, 1]);
        assert_eq!(recv.data_deps, [6, 1]);
        assert_eq!(send.int("comm_src", "int32_val"), me);
        assert_eq!(send.int("comm_dst", "int32_val"), peer);
        assert_eq!(recv.int("comm_src", "int32_val"), peer);
        assert_eq!(recv.int("comm_dst", "int32_val"), me);
        assert_eq!(send.int("comm_size", "int64_val"), 1 << 20);
        // Tags count the pair's transfers, so both ranks agree: the first is 0, the second 1.
        assert_eq!(decoded[1].int("comm_tag", "int32_val"), 0);
        assert_eq!(send.int("comm_tag", "int32_val"), 1);
        assert_eq!(recv.int("comm_tag", "int32_val"), 1);
        assert_eq!(decoded[1].int("comm_size", "int64_val"), 4 << 20);
        assert!(decoded[1].duration_micros > 0);
    }
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
