//! One rank's step program as Chakra nodes, typed and sized the way ASTRA-sim and Chakra's
//! feeders read them.
//!
//! Checked against the public source (see the crate docs for the commits): ASTRA-sim's
//! `Workload::issue*` (astra-sim/workload/Workload.cc), its ring collective
//! (`Ring.cc`: an all-gather's `final_data_size = data_size * nodes_in_ring`), Chakra's
//! `ETFeederNode` (mlcommons/chakra `src/feeder/et_feeder_node.cpp`, which reads `num_ops`,
//! `comm_type` and `comm_size` as `int64_val`, `tensor_size` as `uint64_val` and
//! `comm_src` / `comm_dst` / `comm_tag` as `int32_val`; ASTRA-sim's FeederV3 converts any
//! integer kind) and Chakra's own generator (`src/generator/generator.py`).
//!
//! Every op becomes one node, with the op's index as id, except a point-to-point transfer,
//! which becomes a `COMM_SEND_NODE` and/or a `COMM_RECV_NODE` (the second one numbered after
//! the last op):
//! - compute and device copies are `COMP_NODE`s (`num_ops` = FLOPs, `tensor_size` = HBM
//!   bytes), host work is a `COMP_NODE` with `is_cpu_op = true` lasting what the host model
//!   charges it (its duration, the device -> host sync when it waits on the device, its CPU
//!   operator events);
//! - every device op (compute, copy, collective) is launched by a host node before it
//!   (`<op>.launch`, `is_cpu_op = true`, numbered after the op nodes, lasting the op's host
//!   cost in the hpfsdp host model: kernel or collective launches, CPU operator events), and
//!   the host nodes and host ops form one chain in program order, as the hpfsdp engine's host
//!   thread issues them, so a host-bound step stays host-bound in ASTRA-sim;
//! - collectives are `COMM_COLL_NODE`s with `comm_type`, `pg_name` (the group's id in the
//!   trace's group table) and `comm_size` as ASTRA-sim's collective models take it
//!   ([`comm_size_bytes`]);
//! - every node carries its predicted duration (`duration_micros`, and exactly in the
//!   `duration_ns` attribute): ASTRA-sim replays compute, host work and broadcasts from it
//!   (and everything in `replay-only` mode) and simulates the other collectives itself.
//!
//! The program's dependencies are the nodes' `data_deps`; the order of ops on one stream
//! (which the hpfsdp simulator enforces) is kept as `ctrl_deps` on the stream's previous op.
//! Durations are the hpfsdp cost model's for the op alone: compute roofline per kernel class,
//! copies at HBM bandwidth, host time as given, collectives by the alpha-beta model of the
//! group's tiers (no contention with other streams; the simulator adds that).

use crate::ExportError;
use crate::et_def::attribute_proto::Value;
use crate::et_def::{AttributeProto, CollectiveCommType, Node, NodeType};
use crate::groups::GroupTable;
use hpfsdp_plan::{CollectiveKind, Topology};
use hpfsdp_program::step::{CollectiveOp, Payload, StepProgram, Stream};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::cost::{collective_phases, compute_work_s, copy_s};
use hpfsdp_sim::host_cost::HostCosts;
use hpfsdp_sim::shape::GroupShape;
use std::collections::BTreeMap;

/// The Chakra collective type of a collective kind; `None` for a point-to-point transfer
/// (exported as send / receive nodes). An all-to-all-v is an all-to-all of this rank's send
/// total.
pub fn comm_type(kind: CollectiveKind) -> Option<CollectiveCommType> {
    match kind {
        CollectiveKind::AllGather => Some(CollectiveCommType::AllGather),
        CollectiveKind::ReduceScatter => Some(CollectiveCommType::ReduceScatter),
        CollectiveKind::AllReduce => Some(CollectiveCommType::AllReduce),
        CollectiveKind::Broadcast => Some(CollectiveCommType::Broadcast),
        CollectiveKind::AllToAll | CollectiveKind::AllToAllV => Some(CollectiveCommType::AllToAll),
        CollectiveKind::SendRecv => None,
    }
}

/// `comm_size` of a collective as ASTRA-sim's collective models read it: the bytes each rank
/// contributes. An all-gather's is this rank's input shard (ASTRA-sim gathers `data_size *
/// nodes`), a reduce-scatter's its whole input (it keeps `data_size / nodes`), an
/// all-reduce's, all-to-all's and broadcast's the buffer (the send total for all-to-all-v).
pub fn comm_size_bytes(kind: CollectiveKind, input_bytes: u64, output_bytes: u64) -> u64 {
    match kind {
        CollectiveKind::AllGather
        | CollectiveKind::ReduceScatter
        | CollectiveKind::AllReduce
        | CollectiveKind::AllToAll
        | CollectiveKind::AllToAllV => input_bytes,
        CollectiveKind::Broadcast => input_bytes.max(output_bytes),
        CollectiveKind::SendRecv => input_bytes.max(output_bytes),
    }
}

/// Nearest whole nanoseconds of `seconds` (negative and NaN give 0).
fn nanos(seconds: f64) -> u64 {
    let ns = (seconds * 1e9).round();
    if ns.is_finite() && ns > 0.0 {
        ns as u64
    } else {
        0
    }
}

/// Nearest whole microseconds of `ns` (Chakra's `duration_micros`).
pub fn micros_of_ns(ns: u64) -> u64 {
    ns.saturating_add(500) / 1000
}

fn attr(name: &str, value: Value) -> AttributeProto {
    AttributeProto::new(name, value)
}

/// Predicted time of collective `c` on the group of `ranks` alone, seconds.
pub fn collective_s(
    c: &CollectiveOp,
    ranks: &[usize],
    topology: &Topology,
    profile: &HardwareProfile,
) -> f64 {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    let shape = GroupShape::of(&sorted, topology);
    collective_phases(
        c.kind,
        &shape,
        c.input_bytes,
        c.output_bytes,
        c.aligned_512,
        profile,
    )
    .iter()
    .map(|p| p.cost.total_s())
    .sum()
}

/// What one program needs from the job: the group table, the topology and the profile.
pub struct JobContext<'a> {
    /// Every group of the job with its `pg_name`.
    pub groups: &'a GroupTable,
    /// The job's topology (tiers of each group).
    pub topology: &'a Topology,
    /// The hardware profile the durations are predicted with.
    pub profile: &'a HardwareProfile,
}

/// A node before its dependencies are known.
struct Draft {
    node_type: NodeType,
    duration_ns: u64,
    attrs: Vec<AttributeProto>,
    suffix: &'static str,
}

/// Node ids of one op: its own node(s) and, for a device op, the host node launching it.
struct OpIds {
    own: Vec<u64>,
    launch: Option<u64>,
}

impl OpIds {
    /// The node on the host chain: the launch of a device op, a host op itself.
    fn host(&self) -> u64 {
        self.launch.unwrap_or(self.own[0])
    }
}

/// Numbers the nodes: each op's first node is the op index, then the extra nodes of
/// point-to-point ops, then the launch nodes, in op order.
fn number(program: &StepProgram, drafts: &[Vec<Draft>]) -> Vec<OpIds> {
    let mut next = program.ops.len() as u64;
    let mut ids: Vec<OpIds> = drafts
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut own = vec![i as u64];
            for _ in 1..d.len() {
                own.push(next);
                next += 1;
            }
            OpIds { own, launch: None }
        })
        .collect();
    for (op, id) in program.ops.iter().zip(&mut ids) {
        if !matches!(op.payload, Payload::Host { .. }) {
            id.launch = Some(next);
            next += 1;
        }
    }
    ids
}

/// The nodes of `program`, costed with `job.profile`; process-group names come from
/// `job.groups`, which must hold every group of the program.
pub fn program_nodes(
    program: &StepProgram,
    job: &JobContext<'_>,
) -> Result<Vec<Node>, ExportError> {
    let mut tags: BTreeMap<String, i32> = BTreeMap::new();
    let drafts = program
        .ops
        .iter()
        .enumerate()
        .map(|(i, op)| op_drafts(program, i, &op.payload, job, &mut tags))
        .collect::<Result<Vec<_>, _>>()?;
    let ids = number(program, &drafts);
    let host = HostCosts::of(job.profile, false);
    let mut last_on_stream: BTreeMap<Stream, usize> = BTreeMap::new();
    let mut last_host: Option<u64> = None;
    let mut nodes = Vec::new();
    for (i, (op, op_drafts)) in program.ops.iter().zip(drafts).enumerate() {
        let deps: Vec<u64> = op
            .deps
            .iter()
            .flat_map(|d| ids.get(d.index()).into_iter().flat_map(|x| x.own.iter()))
            .copied()
            .collect();
        let base = op
            .name
            .clone()
            .unwrap_or_else(|| format!("{}-{}", op.category.name(), i));
        let common = |duration_ns| {
            vec![
                attr("category", Value::StringVal(op.category.name().to_string())),
                attr("stream", Value::StringVal(op.stream.name())),
                attr("duration_ns", Value::Uint64Val(duration_ns)),
            ]
        };
        let node = |id, name: String, kind: NodeType, duration_ns, ctrl, data, extra| {
            let mut attrs = common(duration_ns);
            attrs.extend(extra);
            Node {
                id,
                name,
                r#type: kind as i32,
                ctrl_deps: ctrl,
                data_deps: data,
                start_time_micros: 0,
                duration_micros: micros_of_ns(duration_ns),
                inputs: None,
                outputs: None,
                attr: attrs,
            }
        };
        let host_ns = host.op_ns(op);
        let chain: Vec<u64> = last_host.into_iter().collect();
        last_host = Some(ids[i].host());
        if let Payload::Host { .. } = op.payload {
            // The host op itself: after the previous host work, once its device deps finished.
            let d = op_drafts.into_iter().next().ok_or_else(|| {
                ExportError::Program(format!("rank {} op {i} has no node", program.rank))
            })?;
            nodes.push(node(
                i as u64,
                base,
                d.node_type,
                host_ns,
                chain,
                deps,
                d.attrs,
            ));
            continue;
        }
        let launch = ids[i].host();
        nodes.push(node(
            launch,
            format!("{base}.launch"),
            NodeType::CompNode,
            host_ns,
            chain,
            Vec::new(),
            vec![attr("is_cpu_op", Value::BoolVal(true))],
        ));
        // The device op: launched, after its stream's previous op and its dependencies.
        let ctrl: Vec<u64> = last_on_stream
            .insert(op.stream, i)
            .filter(|prev| !op.deps.iter().any(|d| d.index() == *prev))
            .map(|prev| ids[prev].own.clone())
            .unwrap_or_default();
        let mut data = vec![launch];
        data.extend(&deps);
        for (d, &id) in op_drafts.into_iter().zip(&ids[i].own) {
            nodes.push(node(
                id,
                format!("{base}{}", d.suffix),
                d.node_type,
                d.duration_ns,
                ctrl.clone(),
                data.clone(),
                d.attrs,
            ));
        }
    }
    nodes.sort_by_key(|n| n.id);
    Ok(nodes)
}

/// The node(s) of op `i`: one, or a send and / or a receive for a point-to-point transfer.
fn op_drafts(
    program: &StepProgram,
    i: usize,
    payload: &Payload,
    job: &JobContext<'_>,
    tags: &mut BTreeMap<String, i32>,
) -> Result<Vec<Draft>, ExportError> {
    let comp = |duration_s: f64, cpu: bool, attrs: Vec<AttributeProto>| {
        let mut all = vec![attr("is_cpu_op", Value::BoolVal(cpu))];
        all.extend(attrs);
        vec![Draft {
            node_type: NodeType::CompNode,
            duration_ns: nanos(duration_s),
            attrs: all,
            suffix: "",
        }]
    };
    let profile = job.profile;
    match payload {
        Payload::Compute(w) => Ok(comp(
            compute_work_s(w, &program.kernel_mixes, profile),
            false,
            vec![
                attr("num_ops", Value::Int64Val(int64(w.flops))),
                attr("tensor_size", Value::Uint64Val(w.hbm_bytes)),
            ],
        )),
        Payload::Copy(c) => Ok(comp(
            copy_s(c.bytes, c.kernels, profile),
            false,
            vec![
                attr("num_ops", Value::Int64Val(0)),
                attr("tensor_size", Value::Uint64Val(c.bytes)),
            ],
        )),
        Payload::Host { duration_ns } => Ok(comp(*duration_ns as f64 * 1e-9, true, Vec::new())),
        Payload::Collective(c) => collective_drafts(program, i, c, job, tags),
    }
}

/// `v` as Chakra's `int64_val` (saturating: no real count reaches 2^63).
fn int64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn collective_drafts(
    program: &StepProgram,
    i: usize,
    c: &CollectiveOp,
    job: &JobContext<'_>,
    tags: &mut BTreeMap<String, i32>,
) -> Result<Vec<Draft>, ExportError> {
    let group = program.group(c.group).ok_or_else(|| {
        ExportError::Program(format!(
            "rank {} op {i} names group {} which the program does not have",
            program.rank,
            c.group.index()
        ))
    })?;
    let pg = job.groups.name_of(&group.ranks).ok_or_else(|| {
        ExportError::Program(format!(
            "rank {} op {i}: group {:?} is missing from the group table",
            program.rank, group.ranks
        ))
    })?;
    let duration_ns = nanos(collective_s(c, &group.ranks, job.topology, job.profile));
    let common = vec![
        attr("is_cpu_op", Value::BoolVal(false)),
        attr("pg_name", Value::StringVal(pg.to_string())),
        attr("tier", Value::StringVal(c.tier.to_string())),
    ];
    let Some(kind) = comm_type(c.kind) else {
        let peer = group.ranks.iter().copied().find(|&r| r != program.rank);
        let peer = peer.ok_or_else(|| {
            ExportError::Program(format!(
                "rank {} op {i}: send/recv group {:?} has no peer",
                program.rank, group.ranks
            ))
        })?;
        let tag = tags.entry(pg.to_string()).or_insert(0);
        let this_tag = *tag;
        *tag += 1;
        return p2p_drafts(program.rank, peer, this_tag, c, duration_ns, &common);
    };
    let mut attrs = common;
    attrs.extend([
        attr("comm_type", Value::Int64Val(kind as i64)),
        attr(
            "comm_size",
            Value::Int64Val(int64(comm_size_bytes(
                c.kind,
                c.input_bytes,
                c.output_bytes,
            ))),
        ),
    ]);
    Ok(vec![Draft {
        node_type: NodeType::CommCollNode,
        duration_ns,
        attrs,
        suffix: "",
    }])
}

/// A point-to-point transfer as ASTRA-sim's send / receive nodes: this rank sends its input
/// bytes to `peer` and receives its output bytes from it, both under `tag` (the transfer's
/// number on this pair's group, the same on both ranks since they issue in the same order).
fn p2p_drafts(
    me: usize,
    peer: usize,
    tag: i32,
    c: &CollectiveOp,
    duration_ns: u64,
    common: &[AttributeProto],
) -> Result<Vec<Draft>, ExportError> {
    let rank = |r: usize| {
        i32::try_from(r)
            .map_err(|_| ExportError::Program(format!("rank {r} does not fit Chakra's int32")))
    };
    let mut out = Vec::new();
    for (node_type, bytes, src, dst, suffix) in [
        (NodeType::CommSendNode, c.input_bytes, me, peer, ".send"),
        (NodeType::CommRecvNode, c.output_bytes, peer, me, ".recv"),
    ] {
        if bytes == 0 {
            continue;
        }
        let mut attrs = common.to_vec();
        attrs.extend([
            attr("comm_src", Value::Int32Val(rank(src)?)),
            attr("comm_dst", Value::Int32Val(rank(dst)?)),
            attr("comm_tag", Value::Int32Val(tag)),
            attr("comm_size", Value::Int64Val(int64(bytes))),
        ]);
        out.push(Draft {
            node_type,
            duration_ns,
            attrs,
            suffix,
        });
    }
    if out.is_empty() {
        // Nothing moves: a zero-time node keeps the op's place in the dependency graph.
        out.push(Draft {
            node_type: NodeType::CompNode,
            duration_ns: 0,
            attrs: vec![attr("is_cpu_op", Value::BoolVal(false))],
            suffix: ".empty",
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_astra_sim() {
        // A 4-rank all-gather of 1 MiB shards: ASTRA-sim takes the shard and gathers 4 MiB.
        assert_eq!(
            comm_size_bytes(CollectiveKind::AllGather, 1 << 20, 4 << 20),
            1 << 20
        );
        assert_eq!(
            comm_size_bytes(CollectiveKind::ReduceScatter, 4 << 20, 1 << 20),
            4 << 20
        );
        assert_eq!(comm_size_bytes(CollectiveKind::AllReduce, 8, 8), 8);
        assert_eq!(comm_size_bytes(CollectiveKind::AllToAllV, 12, 20), 12);
        assert_eq!(comm_type(CollectiveKind::SendRecv), None);
        assert_eq!(micros_of_ns(1499), 1);
        assert_eq!(micros_of_ns(1500), 2);
        assert_eq!(nanos(f64::NAN), 0);
        assert_eq!(nanos(-1.0), 0);
    }
}
