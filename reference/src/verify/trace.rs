//! Recorded communication versus the step program: per communicator (group label + ranks),
//! the ordered sequence of (collective kind, element count, dtype) of the FSDP, TP and EP
//! collectives must be the same in a rank's in-process trace and in the program the
//! `hyperparallel` strategy generates for that rank. Element count = bytes handed to the
//! collective / dtype size; the first difference is reported precisely. An all-to-all-v's
//! sizes depend on the routing of the data (the program carries the planned sizes, the trace
//! the routed ones), so for that kind only the kind and dtype are compared.

use std::collections::BTreeMap;
use std::fmt;

use hpfsdp_backends::TraceEvent;
use hpfsdp_plan::model::DType as PlanDType;
use hpfsdp_plan::{Category, CollectiveKind, StepProgram};
use serde::Serialize;

/// A communicator: group label plus member ranks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Communicator {
    /// Label (`dp_shard+cp`, `tp`, ...).
    pub label: String,
    /// Ranks, ascending.
    pub ranks: Vec<usize>,
}

impl fmt::Display for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.label, self.ranks)
    }
}

/// One call as compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Call {
    /// Kind.
    pub kind: CollectiveKind,
    /// Elements handed in by this rank.
    pub elements: u64,
    /// Element type name (`f32`, `bf16`).
    pub dtype: String,
    /// The program op's name or the trace index, for messages.
    pub origin: String,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} x {} ({})",
            self.kind.name(),
            self.elements,
            self.dtype,
            self.origin
        )
    }
}

/// The first difference between a trace and a program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// The rank.
    pub rank: usize,
    /// The communicator where the sequences first differ.
    pub communicator: Communicator,
    /// Position in that communicator's sequence.
    pub position: usize,
    /// What the trace recorded there (`None`: the trace ended).
    pub trace: Option<Call>,
    /// What the program has there (`None`: the program ended).
    pub program: Option<Call>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |c: &Option<Call>| c.as_ref().map_or("nothing".to_string(), Call::to_string);
        write!(
            f,
            "rank {}, communicator {}, call #{}: the trace has {}, the program has {}",
            self.rank,
            self.communicator,
            self.position,
            show(&self.trace),
            show(&self.program)
        )
    }
}

impl std::error::Error for Mismatch {}

/// What matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceMatch {
    /// Calls compared per communicator.
    pub per_communicator: Vec<(Communicator, usize)>,
}

/// Program collectives the reference executes: FSDP, TP and EP categories.
pub fn is_compared(category: Category) -> bool {
    matches!(
        category,
        Category::FsdpAg | Category::FsdpRs | Category::FsdpAr | Category::Tp | Category::Ep
    )
}

fn plan_dtype_name(d: PlanDType) -> &'static str {
    match d {
        PlanDType::F32 => "f32",
        PlanDType::Bf16 => "bf16",
        PlanDType::F16 => "f16",
        PlanDType::F8e4m3 => "f8e4m3",
    }
}

/// The per-communicator sequences of a program's compared collectives.
pub fn program_calls(program: &StepProgram) -> BTreeMap<Communicator, Vec<Call>> {
    let mut out: BTreeMap<Communicator, Vec<Call>> = BTreeMap::new();
    for op in &program.ops {
        let Some(c) = op.payload.as_collective() else {
            continue;
        };
        if !is_compared(op.category) {
            continue;
        }
        let Some(g) = program.groups.get(c.group.index()) else {
            continue;
        };
        out.entry(Communicator {
            label: g.label.clone(),
            ranks: g.ranks.clone(),
        })
        .or_default()
        .push(Call {
            kind: c.kind,
            elements: c.input_bytes / c.dtype.bytes().max(1),
            dtype: plan_dtype_name(c.dtype).to_string(),
            origin: op
                .name
                .clone()
                .unwrap_or_else(|| format!("op {}", op.id.index())),
        });
    }
    out
}

/// The per-communicator sequences of a trace (barriers carry no payload and are skipped).
pub fn trace_calls(trace: &[TraceEvent]) -> BTreeMap<Communicator, Vec<Call>> {
    let mut out: BTreeMap<Communicator, Vec<Call>> = BTreeMap::new();
    for e in trace {
        let Some(kind) = e.kind.plan_kind() else {
            continue;
        };
        out.entry(Communicator {
            label: e.group_label.clone(),
            ranks: e.ranks.clone(),
        })
        .or_default()
        .push(Call {
            kind,
            elements: e.input_elements as u64,
            dtype: e.dtype.name().to_string(),
            origin: format!("trace #{}", e.index),
        });
    }
    out
}

/// Compare `trace` (one rank's recorded calls) with `program` (that rank's step program).
pub fn compare_trace_with_program(
    trace: &[TraceEvent],
    program: &StepProgram,
) -> Result<TraceMatch, Box<Mismatch>> {
    let t = trace_calls(trace);
    let p = program_calls(program);
    let mut comms: Vec<&Communicator> = t.keys().chain(p.keys()).collect();
    comms.sort();
    comms.dedup();
    let empty = Vec::new();
    let mut per = Vec::new();
    for c in comms {
        let (a, b) = (t.get(c).unwrap_or(&empty), p.get(c).unwrap_or(&empty));
        for i in 0..a.len().max(b.len()) {
            let (x, y) = (a.get(i), b.get(i));
            let same = match (x, y) {
                (Some(x), Some(y)) => {
                    let data_dependent = x.kind == CollectiveKind::AllToAllV;
                    x.kind == y.kind
                        && x.dtype == y.dtype
                        && (data_dependent || x.elements == y.elements)
                }
                _ => false,
            };
            if !same {
                return Err(Box::new(Mismatch {
                    rank: program.rank,
                    communicator: c.clone(),
                    position: i,
                    trace: x.cloned(),
                    program: y.cloned(),
                }));
            }
        }
        per.push((c.clone(), a.len()));
    }
    Ok(TraceMatch {
        per_communicator: per,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_backends::{CollectiveExt, Group, InProcWorld, ReduceOp};
    use hpfsdp_plan::program::{Group as PGroup, ProgramBuilder};
    use hpfsdp_plan::topology::Tier;
    use hpfsdp_plan::{CollectiveOp, Stream};

    type Spec<'a> = (
        CollectiveKind,
        u64,
        PlanDType,
        &'a str,
        Vec<usize>,
        Category,
    );

    fn program(rank: usize, calls: &[Spec<'_>]) -> StepProgram {
        let mut b = ProgramBuilder::new(rank);
        let mut prev = Vec::new();
        for (kind, bytes, dtype, label, ranks, cat) in calls {
            let g = b.group(PGroup::new(*label, ranks.clone()).unwrap());
            let n = ranks.len() as u64;
            let output_bytes = match kind {
                CollectiveKind::AllGather => bytes * n,
                CollectiveKind::ReduceScatter => bytes / n,
                _ => *bytes,
            };
            let op = CollectiveOp {
                kind: *kind,
                group: g,
                tier: Tier::IntraMachine,
                input_bytes: *bytes,
                output_bytes,
                dtype: *dtype,
                aligned_512: false,
            };
            let id = b.collective(Stream::AllGather, *cat, op, &prev);
            prev = vec![id];
        }
        b.build().unwrap()
    }

    #[test]
    fn matching_and_mismatching_sequences() {
        let run = InProcWorld::run(2, |comm| {
            let dp = Group::new("dp_shard+cp", vec![0, 1]).unwrap();
            let tp = Group::new("tp", vec![0, 1]).unwrap();
            comm.all_gather_vec(&dp, vec![1.0f32; 4]).unwrap();
            comm.all_reduce_vec(&tp, vec![1.0f32; 8], ReduceOp::Sum)
                .unwrap();
            comm.reduce_scatter_vec(&dp, vec![1.0f32; 8], ReduceOp::Sum)
                .unwrap();
        })
        .unwrap();
        let dp = vec![0, 1];
        let good = program(
            0,
            &[
                (
                    CollectiveKind::AllGather,
                    16,
                    PlanDType::F32,
                    "dp_shard+cp",
                    dp.clone(),
                    Category::FsdpAg,
                ),
                (
                    CollectiveKind::AllReduce,
                    32,
                    PlanDType::F32,
                    "tp",
                    dp.clone(),
                    Category::Tp,
                ),
                (
                    CollectiveKind::ReduceScatter,
                    32,
                    PlanDType::F32,
                    "dp_shard+cp",
                    dp.clone(),
                    Category::FsdpRs,
                ),
                (
                    CollectiveKind::AllReduce,
                    64,
                    PlanDType::F32,
                    "optim",
                    dp.clone(),
                    Category::Optimizer,
                ),
            ],
        );
        let m = compare_trace_with_program(&run.traces[0], &good).unwrap();
        assert_eq!(m.per_communicator.len(), 2);
        // Wrong dtype on tp.
        let bad = program(
            0,
            &[
                (
                    CollectiveKind::AllGather,
                    16,
                    PlanDType::F32,
                    "dp_shard+cp",
                    dp.clone(),
                    Category::FsdpAg,
                ),
                (
                    CollectiveKind::AllReduce,
                    16,
                    PlanDType::Bf16,
                    "tp",
                    dp.clone(),
                    Category::Tp,
                ),
                (
                    CollectiveKind::ReduceScatter,
                    32,
                    PlanDType::F32,
                    "dp_shard+cp",
                    dp.clone(),
                    Category::FsdpRs,
                ),
            ],
        );
        let e = compare_trace_with_program(&run.traces[0], &bad).unwrap_err();
        assert_eq!(e.communicator.label, "tp");
        assert_eq!(e.position, 0);
        assert!(e.to_string().contains("bf16"), "{e}");
        // Missing reduce-scatter in the program.
        let short = program(
            0,
            &[
                (
                    CollectiveKind::AllGather,
                    16,
                    PlanDType::F32,
                    "dp_shard+cp",
                    dp.clone(),
                    Category::FsdpAg,
                ),
                (
                    CollectiveKind::AllReduce,
                    32,
                    PlanDType::F32,
                    "tp",
                    dp.clone(),
                    Category::Tp,
                ),
            ],
        );
        let e = compare_trace_with_program(&run.traces[0], &short).unwrap_err();
        assert_eq!((e.position, e.program.is_none()), (1, true));
        assert!(e.to_string().contains("reduce-scatter"), "{e}");
    }
}
