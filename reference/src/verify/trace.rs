//! Recorded communication versus the step program: per communicator, the ordered sequence
//! of (collective kind, element count, dtype) of a rank's in-process trace must be the same
//! as that of the program the `hyperparallel` strategy generates for that rank. Two parts of
//! a step are compared ([`Part`]):
//!
//! - [`Part::Step`]: the FSDP, TP and EP collectives of forward and backward, communicators
//!   matched by group label and ranks;
//! - [`Part::MuonOptimizer`]: the collectives of the deduplicated distributed Muon engine
//!   (fused shard all-gathers, relay broadcasts, replica broadcasts) against the program's
//!   `Optimizer` ops, communicators matched by membership (the engine and the program label
//!   their groups differently), and each broadcast's root position in its group compared
//!   where the program's op name gives the source coordinate ([`ProgramRoots`]).
//!
//! Element count = bytes handed to the collective / dtype size; the first difference is
//! reported precisely. An all-to-all-v's sizes depend on the routing of the data (the program
//! carries the planned sizes, the trace the routed ones), so for that kind only the kind and
//! dtype are compared.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use hpfsdp_backends::TraceEvent;
use hpfsdp_plan::CollectiveKind;
use hpfsdp_plan::model::DType as PlanDType;
use hpfsdp_plan::muon::MuonPlan;
use hpfsdp_program::{Category, StepProgram};
use serde::Serialize;

/// A communicator: group label plus member ranks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Communicator {
    /// Label (`dp_shard+cp`, `tp`, ...); for a communicator matched by membership, the
    /// program's label and the trace's (`dp_shard = muon/dp_shard`).
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
    /// A broadcast's root: its position in the group (`None`: not known, not compared).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<usize>,
    /// The program op's name or the trace index, for messages.
    pub origin: String,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} x {}",
            self.kind.name(),
            self.elements,
            self.dtype
        )?;
        if let Some(r) = self.root {
            write!(f, " from group position {r}")?;
        }
        write!(f, " ({})", self.origin)
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
    /// Calls on that communicator: (trace, program).
    pub lengths: (usize, usize),
    /// The two sequences on that communicator hold the same calls (kind, elements, dtype,
    /// root) in a different order.
    pub reordered: bool,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |c: &Option<Call>| c.as_ref().map_or("nothing".to_string(), Call::to_string);
        write!(
            f,
            "rank {}, communicator {}, call #{}: the trace has {}, the program has {} ({} calls in the trace, {} in the program)",
            self.rank,
            self.communicator,
            self.position,
            show(&self.trace),
            show(&self.program),
            self.lengths.0,
            self.lengths.1
        )?;
        if self.reordered {
            f.write_str("; both hold the same calls, in a different order")?;
        }
        Ok(())
    }
}

impl std::error::Error for Mismatch {}

/// What matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceMatch {
    /// Calls compared per communicator.
    pub per_communicator: Vec<(Communicator, usize)>,
    /// Broadcasts whose root position was compared.
    pub roots_compared: usize,
}

impl TraceMatch {
    /// Calls compared in all.
    pub fn calls(&self) -> usize {
        self.per_communicator.iter().map(|(_, n)| n).sum()
    }
}

/// Which collectives of a step program a trace is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// Forward and backward: FSDP, TP and EP categories; communicators by label and ranks.
    Step,
    /// The Muon optimizer: `Optimizer` category; communicators by membership.
    MuonOptimizer,
}

impl Part {
    /// Whether program ops of `category` belong to this part.
    pub fn includes(self, category: Category) -> bool {
        match self {
            Part::Step => is_compared(category),
            Part::MuonOptimizer => category == Category::Optimizer,
        }
    }

    fn by_label(self) -> bool {
        self == Part::Step
    }
}

/// Program collectives the reference executes in forward and backward: FSDP, TP and EP
/// categories.
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

/// Root positions of the Muon program's broadcasts, read from their op names: the
/// `hyperparallel` Muon strategy names a relay broadcast of NS memory batch `u`
/// `muon.b{slot}.m{u}.relay.{axis}.c{coord}` (`muon.b{slot}.relay...` without the memory
/// batch is read the same way) and a replica broadcast hop `muon.b{slot}.rb.{axis}.s{coord}.k{chunk}`, where `coord` is
/// the source's owner coordinate over the batch's shard (relay) or replicate (replica) axes,
/// `_`-separated, in the order of the Muon plan's axes. The root of the hop along axis `d`
/// is the rank at coordinate `coord[d]` of that axis's (sub)group, i.e. at position
/// `coord[d]` of its ascending rank list. A name that does not parse gives no root (the
/// call's root is then not compared).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProgramRoots {
    /// Shard and replicate axis names of the batches of each slot.
    slots: BTreeMap<usize, (Vec<String>, Vec<String>)>,
}

impl ProgramRoots {
    /// The axes of every batch slot of `plan`.
    pub fn from_muon_plan(plan: &MuonPlan) -> ProgramRoots {
        let mut slots = BTreeMap::new();
        for b in &plan.batches {
            let Some(p) = b.params.first().and_then(|&i| plan.params.get(i)) else {
                continue;
            };
            slots.entry(b.slot).or_insert_with(|| {
                (
                    p.shard_axes.iter().map(|a| a.axis.clone()).collect(),
                    p.replicate_axes.iter().map(|(a, _)| a.clone()).collect(),
                )
            });
        }
        ProgramRoots { slots }
    }

    /// The root position in its group of the broadcast named `op_name`.
    pub fn root_position(&self, op_name: &str) -> Option<usize> {
        let mut parts: Vec<&str> = op_name.split('.').collect();
        // The memory-batch segment `m{u}` of a relay name carries no root.
        if parts
            .get(2)
            .and_then(|p| p.strip_prefix('m'))
            .is_some_and(|u| !u.is_empty() && u.bytes().all(|b| b.is_ascii_digit()))
        {
            parts.remove(2);
        }
        if parts.len() < 5 || parts[0] != "muon" {
            return None;
        }
        let slot: usize = parts[1].strip_prefix('b')?.parse().ok()?;
        let (shard, replicate) = self.slots.get(&slot)?;
        let (axes, prefix) = match parts[2] {
            "relay" => (shard, 'c'),
            "rb" => (replicate, 's'),
            _ => return None,
        };
        let d = axes.iter().position(|a| a == parts[3])?;
        let coord: Vec<usize> = parts[4]
            .strip_prefix(prefix)?
            .split('_')
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if coord.len() != axes.len() {
            return None;
        }
        coord.get(d).copied()
    }
}

/// Sequences keyed by (label, ranks) — or by ranks alone, with an empty label — each with
/// the labels it was built from.
type Seqs = BTreeMap<(String, Vec<usize>), (BTreeSet<String>, Vec<Call>)>;

fn push(out: &mut Seqs, part: Part, label: &str, ranks: &[usize], call: Call) {
    let key = (
        if part.by_label() {
            label.to_string()
        } else {
            String::new()
        },
        ranks.to_vec(),
    );
    let e = out.entry(key).or_default();
    e.0.insert(label.to_string());
    e.1.push(call);
}

fn program_seqs(program: &StepProgram, part: Part, roots: Option<&ProgramRoots>) -> Seqs {
    let mut out = Seqs::new();
    for op in &program.ops {
        let Some(c) = op.payload.as_collective() else {
            continue;
        };
        if !part.includes(op.category) {
            continue;
        }
        let Some(g) = program.groups.get(c.group.index()) else {
            continue;
        };
        let root = match (c.kind, roots, &op.name) {
            (CollectiveKind::Broadcast, Some(r), Some(n)) => r.root_position(n),
            _ => None,
        };
        let call = Call {
            kind: c.kind,
            elements: c.input_bytes / c.dtype.bytes().max(1),
            dtype: plan_dtype_name(c.dtype).to_string(),
            root,
            origin: op
                .name
                .clone()
                .unwrap_or_else(|| format!("op {}", op.id.index())),
        };
        push(&mut out, part, &g.label, &g.ranks, call);
    }
    out
}

fn trace_seqs(trace: &[TraceEvent], part: Part) -> Seqs {
    let mut out = Seqs::new();
    for e in trace {
        let Some(kind) = e.kind.plan_kind() else {
            continue;
        };
        let root = e.root.and_then(|r| e.ranks.iter().position(|&x| x == r));
        let call = Call {
            kind,
            elements: e.input_elements as u64,
            dtype: e.dtype.name().to_string(),
            root,
            origin: format!("trace #{}", e.index),
        };
        push(&mut out, part, &e.group_label, &e.ranks, call);
    }
    out
}

fn flatten(seqs: Seqs) -> BTreeMap<Communicator, Vec<Call>> {
    seqs.into_iter()
        .map(|((_, ranks), (labels, calls))| {
            let label = labels.into_iter().collect::<Vec<_>>().join(" | ");
            (Communicator { label, ranks }, calls)
        })
        .collect()
}

/// The per-communicator sequences of a program's forward/backward collectives.
pub fn program_calls(program: &StepProgram) -> BTreeMap<Communicator, Vec<Call>> {
    flatten(program_seqs(program, Part::Step, None))
}

/// The per-communicator sequences of a trace (barriers carry no payload and are skipped).
pub fn trace_calls(trace: &[TraceEvent]) -> BTreeMap<Communicator, Vec<Call>> {
    flatten(trace_seqs(trace, Part::Step))
}

/// The per-communicator sequences of a program's collectives of `part` (communicators
/// keyed by membership for [`Part::MuonOptimizer`]).
pub fn program_part_calls(
    program: &StepProgram,
    part: Part,
    roots: Option<&ProgramRoots>,
) -> BTreeMap<Communicator, Vec<Call>> {
    flatten(program_seqs(program, part, roots))
}

/// The per-communicator sequences of a trace's calls, keyed as for `part`.
pub fn trace_part_calls(trace: &[TraceEvent], part: Part) -> BTreeMap<Communicator, Vec<Call>> {
    flatten(trace_seqs(trace, part))
}

/// Compare `trace` (one rank's recorded forward/backward calls) with `program` (that rank's
/// step program).
pub fn compare_trace_with_program(
    trace: &[TraceEvent],
    program: &StepProgram,
) -> Result<TraceMatch, Box<Mismatch>> {
    compare_part(trace, program, Part::Step, None)
}

/// Compare `trace` (one rank's recorded calls of `part`) with the calls of `part` in
/// `program` (that rank's step program); `roots` reads the program's broadcast roots.
pub fn compare_part(
    trace: &[TraceEvent],
    program: &StepProgram,
    part: Part,
    roots: Option<&ProgramRoots>,
) -> Result<TraceMatch, Box<Mismatch>> {
    let t = trace_seqs(trace, part);
    let p = program_seqs(program, part, roots);
    let mut keys: Vec<&(String, Vec<usize>)> = t.keys().chain(p.keys()).collect();
    keys.sort();
    keys.dedup();
    let empty = (BTreeSet::new(), Vec::new());
    let mut per = Vec::new();
    let mut roots_compared = 0;
    for key in keys {
        let (tl, a) = t.get(key).unwrap_or(&empty);
        let (pl, b) = p.get(key).unwrap_or(&empty);
        let communicator = || {
            let join = |l: &BTreeSet<String>| l.iter().cloned().collect::<Vec<_>>().join(" | ");
            // Matched by label, both sides carry the same one.
            let label = if pl.is_empty() {
                join(tl)
            } else if tl.is_empty() || tl == pl {
                join(pl)
            } else {
                format!("{} = {}", join(pl), join(tl))
            };
            Communicator {
                label,
                ranks: key.1.clone(),
            }
        };
        for i in 0..a.len().max(b.len()) {
            let (x, y) = (a.get(i), b.get(i));
            let same = match (x, y) {
                (Some(x), Some(y)) => {
                    let data_dependent = x.kind == CollectiveKind::AllToAllV;
                    let root_ok = match (x.root, y.root) {
                        (Some(r), Some(s)) => {
                            roots_compared += 1;
                            r == s
                        }
                        _ => true,
                    };
                    x.kind == y.kind
                        && x.dtype == y.dtype
                        && (data_dependent || x.elements == y.elements)
                        && root_ok
                }
                _ => false,
            };
            if !same {
                let sorted = |v: &[Call]| {
                    let mut k: Vec<_> = v
                        .iter()
                        .map(|c| (c.kind.name(), c.elements, c.dtype.clone(), c.root))
                        .collect();
                    k.sort();
                    k
                };
                return Err(Box::new(Mismatch {
                    rank: program.rank,
                    communicator: communicator(),
                    position: i,
                    trace: x.cloned(),
                    program: y.cloned(),
                    lengths: (a.len(), b.len()),
                    reordered: sorted(a) == sorted(b),
                }));
            }
        }
        per.push((communicator(), a.len()));
    }
    Ok(TraceMatch {
        per_communicator: per,
        roots_compared,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_backends::{CollectiveExt, Group, InProcWorld, ReduceOp};
    use hpfsdp_plan::topology::Tier;
    use hpfsdp_program::step::{Group as PGroup, ProgramBuilder};
    use hpfsdp_program::{CollectiveOp, Stream};

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

    #[test]
    fn muon_part_matches_by_membership_and_compares_roots() {
        let run = InProcWorld::run(2, |comm| {
            let g = Group::new("muon/dp_shard", vec![0, 1]).unwrap();
            comm.all_gather_vec(&g, vec![hpfsdp_backends::bf16::ZERO; 256])
                .unwrap();
            comm.broadcast_vec(&g, vec![hpfsdp_backends::bf16::ZERO; 512], 1)
                .unwrap();
        })
        .unwrap();
        let roots = ProgramRoots {
            slots: [(0, (vec!["dp_shard".to_string()], Vec::new()))].into(),
        };
        assert_eq!(roots.root_position("muon.b0.relay.dp_shard.c1"), Some(1));
        assert_eq!(roots.root_position("muon.b0.m3.relay.dp_shard.c1"), Some(1));
        assert_eq!(roots.root_position("muon.b0.relay.tp.c1"), None);
        assert_eq!(roots.root_position("muon.b3.relay.dp_shard.c1"), None);
        assert_eq!(roots.root_position("layers.0.ag"), None);
        // (kind, bytes, name, category) on the program's `dp_shard` group of ranks [0, 1].
        let program = |ops: &[(CollectiveKind, u64, &str, Category)]| {
            let mut b = ProgramBuilder::new(0);
            let g = b.group(PGroup::new("dp_shard", vec![0, 1]).unwrap());
            let mut prev = Vec::new();
            for &(kind, bytes, name, cat) in ops {
                let op = CollectiveOp {
                    kind,
                    group: g,
                    tier: Tier::IntraMachine,
                    input_bytes: bytes,
                    output_bytes: if kind == CollectiveKind::AllGather {
                        2 * bytes
                    } else {
                        bytes
                    },
                    dtype: PlanDType::Bf16,
                    aligned_512: true,
                };
                let id = b.collective(Stream::Optimizer, cat, op, &prev);
                b.name(id, name);
                prev = vec![id];
            }
            b.build().unwrap()
        };
        let (ag, bc) = (CollectiveKind::AllGather, CollectiveKind::Broadcast);
        let opt = Category::Optimizer;
        let good = program(&[
            (ag, 4096, "layers.0.ag", Category::FsdpAg),
            (ag, 512, "muon.b0.m0.ag.dp_shard", opt),
            (bc, 1024, "muon.b0.relay.dp_shard.c1", opt),
        ]);
        let m = compare_part(&run.traces[0], &good, Part::MuonOptimizer, Some(&roots)).unwrap();
        assert_eq!(m.calls(), 2);
        assert_eq!(m.roots_compared, 1);
        assert_eq!(m.per_communicator[0].0.label, "dp_shard = muon/dp_shard");
        // The root at the other position.
        let wrong_root = program(&[
            (ag, 512, "muon.b0.m0.ag.dp_shard", opt),
            (bc, 1024, "muon.b0.relay.dp_shard.c0", opt),
        ]);
        let e = compare_part(
            &run.traces[0],
            &wrong_root,
            Part::MuonOptimizer,
            Some(&roots),
        )
        .unwrap_err();
        assert_eq!((e.position, e.reordered), (1, false));
        assert!(e.to_string().contains("from group position 0"), "{e}");
        // Without roots only kind, elements and dtype are compared.
        let m = compare_part(&run.traces[0], &wrong_root, Part::MuonOptimizer, None).unwrap();
        assert_eq!(m.roots_compared, 0);
        // The same calls in another order.
        let swapped = program(&[
            (bc, 1024, "muon.b0.relay.dp_shard.c1", opt),
            (ag, 512, "muon.b0.m0.ag.dp_shard", opt),
        ]);
        let e =
            compare_part(&run.traces[0], &swapped, Part::MuonOptimizer, Some(&roots)).unwrap_err();
        assert_eq!((e.position, e.reordered), (0, true));
        assert!(e.to_string().contains("different order"), "{e}");
        // The step part ignores optimizer calls and matches by label.
        let e = compare_trace_with_program(&run.traces[0], &good).unwrap_err();
        assert_eq!(e.communicator.label, "dp_shard");
    }
}
