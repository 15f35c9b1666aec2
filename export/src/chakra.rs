//! One rank's step program as Chakra nodes.
//!
//! Every op becomes one node with the op's index as id: compute and device copies are
//! `COMP_NODE`s, host work is a `COMP_NODE` with `is_cpu_op = true`, collectives are
//! `COMM_COLL_NODE`s with `comm_type`, `comm_size` (bytes of the whole collective buffer, as
//! ASTRA-sim's collective models expect: the gathered output of an all-gather, the full input
//! of a reduce-scatter, the buffer of an all-reduce / all-to-all / broadcast) and `pg_name`
//! (the process group's id in the trace's group table). The program's dependencies are the
//! nodes' `data_deps`; the order of ops on one stream (which the hpfsdp simulator enforces)
//! is kept as `ctrl_deps` on the stream's previous op. Durations are the hpfsdp cost model's
//! (compute roofline per kernel class, copies at HBM bandwidth, host time as given).

use crate::et_def::attribute_proto::Value;
use crate::et_def::{AttributeProto, CollectiveCommType, Node, NodeType};
use crate::groups::GroupTable;
use hpfsdp_plan::CollectiveKind;
use hpfsdp_program::step::{Payload, StepProgram, Stream};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::cost::{compute_work_s, copy_s};
use std::collections::BTreeMap;

/// The Chakra collective type of a collective kind. A point-to-point transfer is a broadcast
/// from the sender within its two-rank group; an all-to-all-v is an all-to-all of its largest
/// per-rank total.
pub fn comm_type(kind: CollectiveKind) -> CollectiveCommType {
    match kind {
        CollectiveKind::AllGather => CollectiveCommType::AllGather,
        CollectiveKind::ReduceScatter => CollectiveCommType::ReduceScatter,
        CollectiveKind::AllReduce => CollectiveCommType::AllReduce,
        CollectiveKind::Broadcast | CollectiveKind::SendRecv => CollectiveCommType::Broadcast,
        CollectiveKind::AllToAll | CollectiveKind::AllToAllV => CollectiveCommType::AllToAll,
    }
}

fn micros(seconds: f64) -> u64 {
    (seconds * 1e6).round().max(0.0) as u64
}

fn attr(name: &str, value: Value) -> AttributeProto {
    AttributeProto::new(name, value)
}

/// The nodes of `program` (ids = op indices), costed with `profile`; process-group names
/// come from `groups`, which must hold every group of the program.
pub fn program_nodes(
    program: &StepProgram,
    groups: &GroupTable,
    profile: &HardwareProfile,
) -> Result<Vec<Node>, crate::ExportError> {
    let mut last_on_stream: BTreeMap<Stream, u64> = BTreeMap::new();
    let mut nodes = Vec::with_capacity(program.ops.len());
    for (i, op) in program.ops.iter().enumerate() {
        let id = i as u64;
        let mut attrs = vec![
            attr("category", Value::StringVal(op.category.name().to_string())),
            attr("stream", Value::StringVal(op.stream.name())),
        ];
        let (node_type, duration_s) = match &op.payload {
            Payload::Compute(w) => {
                attrs.push(attr("is_cpu_op", Value::BoolVal(false)));
                attrs.push(attr("num_ops", Value::Uint64Val(w.flops)));
                attrs.push(attr("tensor_size", Value::Uint64Val(w.hbm_bytes)));
                (
                    NodeType::CompNode,
                    compute_work_s(w, &program.kernel_mixes, profile),
                )
            }
            Payload::Copy(c) => {
                attrs.push(attr("is_cpu_op", Value::BoolVal(false)));
                attrs.push(attr("tensor_size", Value::Uint64Val(c.bytes)));
                (NodeType::CompNode, copy_s(c.bytes, c.kernels, profile))
            }
            Payload::Host { duration_ns } => {
                attrs.push(attr("is_cpu_op", Value::BoolVal(true)));
                (NodeType::CompNode, *duration_ns as f64 * 1e-9)
            }
            Payload::Collective(c) => {
                let group = program.group(c.group).ok_or_else(|| {
                    crate::ExportError::Program(format!(
                        "rank {} op {i} names group {} which the program does not have",
                        program.rank,
                        c.group.index()
                    ))
                })?;
                let pg = groups.name_of(&group.ranks).ok_or_else(|| {
                    crate::ExportError::Program(format!(
                        "rank {} op {i}: group {:?} is missing from the group table",
                        program.rank, group.ranks
                    ))
                })?;
                attrs.push(attr("is_cpu_op", Value::BoolVal(false)));
                attrs.push(attr("comm_type", Value::Int64Val(comm_type(c.kind) as i64)));
                attrs.push(attr(
                    "comm_size",
                    Value::Int64Val(c.input_bytes.max(c.output_bytes) as i64),
                ));
                attrs.push(attr("pg_name", Value::StringVal(pg.to_string())));
                attrs.push(attr("tier", Value::StringVal(c.tier.to_string())));
                (NodeType::CommCollNode, 0.0)
            }
        };
        let ctrl_deps = last_on_stream
            .insert(op.stream, id)
            .filter(|prev| !op.deps.iter().any(|d| d.index() as u64 == *prev))
            .into_iter()
            .collect();
        nodes.push(Node {
            id,
            name: op
                .name
                .clone()
                .unwrap_or_else(|| format!("{}-{}", op.category.name(), i)),
            r#type: node_type as i32,
            ctrl_deps,
            data_deps: op.deps.iter().map(|d| d.index() as u64).collect(),
            start_time_micros: 0,
            duration_micros: micros(duration_s),
            inputs: None,
            outputs: None,
            attr: attrs,
        });
    }
    Ok(nodes)
}
