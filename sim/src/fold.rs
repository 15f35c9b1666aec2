//! Symmetry folding: partitions ranks into classes that behave identically, so each class is
//! simulated once.
//!
//! Two ranks are in one class when (1) their programs are identical up to group relabeling:
//! same ops, streams, dependencies, payloads and memory effects, and for every group the same
//! label, size and shape on the topology (see [`GroupShape`]), and (2) recursively, their
//! groups have the same composition of classes. Step (2) is colour refinement: starting from
//! the classes of (1), a rank's class is refined by the multiset of classes in each of its
//! groups until the partition stops changing. A rank whose group holds a straggler is thereby
//! separated from a rank whose groups do not.
//!
//! Op names are labels for reports (the engine never reads them), so programs that differ
//! only in names fold: the per-expert weights of different expert-parallel ranks, the
//! matrices different Muon owners orthogonalize. A class's timeline carries its
//! representative's names.
//!
//! Program identity is decided by a 128-bit BLAKE3 digest of the program's canonical bytes.

use crate::error::SimError;
use crate::shape::GroupShape;
use hpfsdp_plan::Topology;
use hpfsdp_program::step::{Group, Op, SharedOps, StepProgram};
use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// The partition of ranks into equivalence classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classes {
    /// Class index of every rank; classes are numbered by their smallest rank.
    pub rank_class: Vec<u32>,
    /// Ranks of every class, ascending.
    pub members: Vec<Vec<usize>>,
}

impl Classes {
    /// Every rank in its own class (folding disabled).
    pub fn identity(world_size: usize) -> Self {
        Self {
            rank_class: (0..world_size as u32).collect(),
            members: (0..world_size).map(|r| vec![r]).collect(),
        }
    }
}

/// A `Hasher` that only collects bytes; the digest is taken over them afterwards.
struct ByteSink(Vec<u8>);

impl Hasher for ByteSink {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn finish(&self) -> u64 {
        0
    }
}

fn digest(bytes: &[u8]) -> u128 {
    let h = blake3::hash(bytes);
    let mut b = [0u8; 16];
    b.copy_from_slice(&h.as_bytes()[..16]);
    u128::from_le_bytes(b)
}

/// Interns values into dense ids in order of first appearance.
struct Interner<K> {
    ids: HashMap<K, u32>,
}

impl<K: Hash + Eq> Interner<K> {
    fn new() -> Self {
        Self {
            ids: HashMap::new(),
        }
    }
    fn id(&mut self, key: K) -> u32 {
        let next = self.ids.len() as u32;
        *self.ids.entry(key).or_insert(next)
    }
    fn len(&self) -> usize {
        self.ids.len()
    }
}

/// Per-chunk output of the digest pass.
struct ChunkDigests {
    /// Local (relabeled) program digest per rank.
    local: Vec<u128>,
    /// Digest of every group of every rank, in program group order.
    groups: Vec<u128>,
    /// Offsets of each rank's groups in `groups` (one more than ranks).
    offsets: Vec<usize>,
    /// Distinct groups first seen in this chunk, with their shapes.
    new_groups: HashMap<u128, (Group, GroupShape)>,
}

/// What the digest pass needs to know about one rank: a digest of its program with the
/// groups left out (ops and resident memory), and its group table.
pub(crate) struct RankView<'a> {
    /// Digest of the rank's ops and resident memory, groups excluded.
    pub ops_digest: u128,
    /// The rank's groups, in program order.
    pub groups: Cow<'a, [Group]>,
}

/// A `Hasher` that streams its bytes into BLAKE3 through a small buffer: the same digest as
/// collecting them all first ([`ByteSink`]), without holding megabytes per program.
#[derive(Clone)]
struct StreamSink {
    buf: Vec<u8>,
    hasher: blake3::Hasher,
}

/// Bytes buffered before they are fed to BLAKE3 (amortises its per-call cost).
const STREAM_BUF_BYTES: usize = 64 * 1024;

impl StreamSink {
    fn new() -> Self {
        Self {
            buf: Vec::with_capacity(STREAM_BUF_BYTES),
            hasher: blake3::Hasher::new(),
        }
    }

    /// The digest of every byte written, as [`digest`] computes it.
    fn digest(mut self) -> u128 {
        self.hasher.update(&self.buf);
        let h = self.hasher.finalize();
        let mut b = [0u8; 16];
        b.copy_from_slice(&h.as_bytes()[..16]);
        u128::from_le_bytes(b)
    }
}

impl Hasher for StreamSink {
    fn write(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= STREAM_BUF_BYTES {
            self.hasher.update(&self.buf);
            self.buf.clear();
        }
    }
    fn finish(&self) -> u64 {
        0
    }
}

/// Digest of a program's ops and resident memory (its groups and op names excluded).
pub(crate) fn ops_digest(prog: &StepProgram) -> u128 {
    ops_digest_with(prog, None)
}

/// Hashes one op's fields that folding compares (everything but its name).
fn hash_op(op: &Op, sink: &mut StreamSink) {
    op.id.hash(sink);
    op.stream.hash(sink);
    op.category.hash(sink);
    op.deps.hash(sink);
    op.payload.hash(sink);
    op.memory.hash(sink);
    // Validation-mode host events change the op's host cost.
    op.validation_cpu_events.hash(sink);
    // So do its production host events.
    op.host_cpu_events.hash(sink);
}

/// [`ops_digest`], hashing a shared op prefix ([`hpfsdp_program::step::OpSeq`]) once per
/// job: `prefixes` keeps the BLAKE3 state after each prefix it has seen, and a program on
/// that prefix hashes only its own ops from there. The bytes hashed are the same as for a
/// program holding all its ops itself (ops in order, then their count and the resident
/// memory), so equal programs get equal digests however their ops are stored.
pub(crate) fn ops_digest_with(prog: &StepProgram, prefixes: Option<&PrefixDigests>) -> u128 {
    let (mut sink, start) = match (prefixes, prog.ops.shared()) {
        (Some(cache), Some(shared)) => (cache.after(shared), prog.ops.prefix_len()),
        _ => (StreamSink::new(), 0),
    };
    for op in prog.ops.iter_from(start) {
        hash_op(op, &mut sink);
    }
    prog.ops.len().hash(&mut sink);
    prog.resident.hash(&mut sink);
    sink.digest()
}

/// BLAKE3 states after hashing shared op prefixes, one per prefix (by address; the prefix
/// is kept alive with its state, so an address is never reused while cached).
#[derive(Default)]
pub(crate) struct PrefixDigests {
    states: Mutex<HashMap<usize, (Arc<SharedOps>, StreamSink)>>,
}

impl PrefixDigests {
    /// The state after hashing `shared`'s ops (computed on first use).
    fn after(&self, shared: &Arc<SharedOps>) -> StreamSink {
        let key = Arc::as_ptr(shared) as usize;
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        let (_, sink) = states.entry(key).or_insert_with(|| {
            let mut sink = StreamSink::new();
            for op in &shared.ops {
                hash_op(op, &mut sink);
            }
            (shared.clone(), sink)
        });
        sink.clone()
    }
}

/// Digests ranks `range`: hashes each rank's program digest with its groups relabeled to
/// (label, shape), and hashes each group's identity (label and ranks). A small cache makes
/// the common case (neighbouring ranks share groups) a memory comparison.
fn digest_chunk<'a, F>(
    range: std::ops::Range<usize>,
    world_size: usize,
    topology: &Topology,
    view: &F,
) -> Result<ChunkDigests, SimError>
where
    F: Fn(usize) -> Result<RankView<'a>, SimError>,
{
    let mut out = ChunkDigests {
        local: Vec::with_capacity(range.len()),
        groups: Vec::new(),
        offsets: vec![0],
        new_groups: HashMap::new(),
    };
    let mut cache: Vec<(Group, u128, GroupShape)> = Vec::new();
    let mut sink = ByteSink(Vec::new());
    let mut gsink = ByteSink(Vec::new());
    for rank in range {
        let rv = view(rank)?;
        check_groups(&rv.groups, rank, world_size)?;
        sink.0.clear();
        rv.ops_digest.hash(&mut sink);
        for g in rv.groups.iter() {
            let (id, shape) = match cache.iter().position(|(c, _, _)| c == g) {
                Some(i) => (cache[i].1, cache[i].2),
                None => {
                    gsink.0.clear();
                    g.hash(&mut gsink);
                    let id = digest(&gsink.0);
                    let shape = GroupShape::of(&g.ranks, topology);
                    out.new_groups
                        .entry(id)
                        .or_insert_with(|| (g.clone(), shape));
                    if cache.len() == 8 {
                        cache.remove(0);
                    }
                    cache.push((g.clone(), id, shape));
                    (id, shape)
                }
            };
            out.groups.push(id);
            g.label.hash(&mut sink);
            shape.hash(&mut sink);
        }
        out.offsets.push(out.groups.len());
        out.local.push(digest(&sink.0));
    }
    Ok(out)
}

/// Computes the classes of `world_size` ranks whose programs `program(rank)` returns. Each
/// program is validated and generated once (in parallel chunks on large jobs); only digests
/// and distinct groups are kept, so a 100k-rank job never holds all its programs at once.
pub fn classes<'a, F>(
    world_size: usize,
    topology: &Topology,
    program: F,
) -> Result<Classes, SimError>
where
    F: Fn(usize) -> Result<Cow<'a, StepProgram>, SimError> + Sync,
{
    classes_of_views(world_size, topology, |rank| {
        let prog = program(rank)?;
        check_program(&prog, rank, world_size)?;
        let ops_digest = ops_digest(&prog);
        let groups = match prog {
            Cow::Borrowed(p) => Cow::Borrowed(p.groups.as_slice()),
            Cow::Owned(p) => Cow::Owned(p.groups),
        };
        Ok(RankView { ops_digest, groups })
    })
}

/// Computes the classes from per-rank views (program digest without groups, plus the group
/// table); [`classes`] builds the views from whole programs, templated workloads from one
/// program per template and a cheap group table per rank.
pub(crate) fn classes_of_views<'a, F>(
    world_size: usize,
    topology: &Topology,
    program: F,
) -> Result<Classes, SimError>
where
    F: Fn(usize) -> Result<RankView<'a>, SimError> + Sync,
{
    let threads = if world_size >= 4096 {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(16))
    } else {
        1
    };
    let chunk = world_size.div_ceil(threads);
    let ranges: Vec<std::ops::Range<usize>> = (0..threads)
        .map(|t| t * chunk..((t + 1) * chunk).min(world_size))
        .filter(|r| !r.is_empty())
        .collect();
    let chunks: Vec<Result<ChunkDigests, SimError>> = if ranges.len() == 1 {
        vec![digest_chunk(0..world_size, world_size, topology, &program)]
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = ranges
                .iter()
                .map(|r| {
                    let r = r.clone();
                    let program = &program;
                    scope.spawn(move || digest_chunk(r, world_size, topology, program))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(SimError::Workload("a program generator panicked".into()))
                    })
                })
                .collect()
        })
    };
    let chunks = chunks.into_iter().collect::<Result<Vec<_>, _>>()?;

    // Intern in rank order, so ids do not depend on the number of threads.
    let mut new_groups: HashMap<u128, (Group, GroupShape)> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut group_ids: HashMap<u128, u32> = HashMap::new();
    let mut rank_groups: Vec<u32> = Vec::new();
    let mut rank_group_offsets: Vec<usize> = vec![0];
    let mut local = Interner::<u128>::new();
    let mut class: Vec<u32> = Vec::with_capacity(world_size);
    for c in chunks {
        new_groups.extend(c.new_groups);
        for (i, &l) in c.local.iter().enumerate() {
            for &g in &c.groups[c.offsets[i]..c.offsets[i + 1]] {
                let next = groups.len() as u32;
                let id = *group_ids.entry(g).or_insert(next);
                if id == next {
                    let (group, _) = new_groups.remove(&g).ok_or_else(|| {
                        SimError::Workload("internal: group digest without group".into())
                    })?;
                    groups.push(group);
                }
                rank_groups.push(id);
            }
            rank_group_offsets.push(rank_groups.len());
            class.push(local.id(l));
        }
    }

    let mut count = local.len();
    loop {
        // Composition of every group: sorted (class, multiplicity) pairs.
        let mut compositions = Interner::<Vec<(u32, u32)>>::new();
        let group_comp: Vec<u32> = groups
            .iter()
            .map(|g| {
                let mut cs: Vec<u32> = g.ranks.iter().map(|&r| class[r]).collect();
                cs.sort_unstable();
                let mut comp: Vec<(u32, u32)> = Vec::new();
                for c in cs {
                    match comp.last_mut() {
                        Some((k, n)) if *k == c => *n += 1,
                        _ => comp.push((c, 1)),
                    }
                }
                compositions.id(comp)
            })
            .collect();
        let mut refined = Interner::<Vec<u32>>::new();
        let next: Vec<u32> = (0..world_size)
            .map(|r| {
                let mut key =
                    Vec::with_capacity(1 + rank_group_offsets[r + 1] - rank_group_offsets[r]);
                key.push(class[r]);
                key.extend(
                    rank_groups[rank_group_offsets[r]..rank_group_offsets[r + 1]]
                        .iter()
                        .map(|&g| group_comp[g as usize]),
                );
                refined.id(key)
            })
            .collect();
        let n = refined.len();
        class = next;
        if n == count {
            break;
        }
        count = n;
    }

    let mut members = vec![Vec::new(); count];
    for (r, &c) in class.iter().enumerate() {
        members[c as usize].push(r);
    }
    Ok(Classes {
        rank_class: class,
        members,
    })
}

/// Validates one program of a job: its rank, its structure and its groups' ranks.
pub(crate) fn check_program(
    prog: &StepProgram,
    rank: usize,
    world_size: usize,
) -> Result<(), SimError> {
    if prog.rank != rank {
        return Err(SimError::Workload(format!(
            "program number {rank} is for rank {}; supply one program per rank in rank order",
            prog.rank
        )));
    }
    prog.validate()?;
    check_groups(&prog.groups, rank, world_size)
}

/// Checks that every group of `rank` contains only ranks of the job.
pub(crate) fn check_groups(
    groups: &[Group],
    rank: usize,
    world_size: usize,
) -> Result<(), SimError> {
    for g in groups {
        if let Some(&last) = g.ranks.last()
            && last >= world_size
        {
            return Err(SimError::Workload(format!(
                "rank {rank}: group '{}' contains rank {last}, but the job has {world_size} ranks",
                g.label
            )));
        }
    }
    Ok(())
}
