//! The read-only per-op tables the event loop consults on every op start and end: reverse
//! dependencies, memory effects, collectives and stream queues, in flat arrays (CSR) with
//! local op indices.
//!
//! Units whose programs have the same shape (every rank of an unfolded SPMD job, most classes
//! of a folded one) get the *same* table: [`StaticsInterner`] hands out one shared copy per
//! distinct content. The event loop interleaves hundreds of units in time order, so a private
//! copy per unit would be a cache miss on nearly every op; a shared one stays in cache.

use crate::memory::TagDelta;
use hpfsdp_program::step::{CollectiveOp, OpSlice, Payload};
use rustc_hash::FxHashSet as HashSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Where one op's entries start in [`UnitStatics`]'s flat tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Offsets {
    dependents: u32,
    allocs: u32,
    frees: u32,
}

/// Reverse dependencies and memory effects of the ops `base..` of one program, indexed by
/// local op (`local = index - base`); dependencies on ops before `base` are left out (they
/// are done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct UnitStatics {
    /// Per local op `i` (and one past the last): where its entries start in `dependents`,
    /// `allocs` and `frees`; op `i`'s end where op `i + 1`'s start. One array, so that an op's
    /// three ranges are one cache line.
    offsets: Vec<Offsets>,
    /// Local ops that depend on each op.
    dependents: Vec<u32>,
    /// Bytes each op allocates at start (effects with zero allocation left out, order kept).
    allocs: Vec<TagDelta>,
    /// Same for the bytes freed at the end.
    frees: Vec<TagDelta>,
    /// The collectives of the ops, in op order (the engine's per-op state holds an index).
    collectives: Vec<CollectiveOp>,
    /// Per device stream (in order of first use): its local ops in issue order.
    queues: Vec<Arc<[u32]>>,
}

impl UnitStatics {
    /// The tables of `ops` (program ops `base..base + ops.len()`) whose device streams run
    /// `queues` (local ops per stream, in issue order).
    pub(super) fn of(ops: OpSlice<'_>, base: usize, queues: Vec<Vec<u32>>) -> Self {
        let n = ops.len();
        let mut counts = vec![0u32; n + 1];
        for op in ops.iter() {
            for d in op.deps.iter().filter(|d| d.index() >= base) {
                counts[d.index() - base + 1] += 1;
            }
        }
        for i in 0..n {
            counts[i + 1] += counts[i];
        }
        let mut fill = counts.clone();
        let mut dependents = vec![0u32; counts[n] as usize];
        for (i, op) in ops.iter().enumerate() {
            for d in op.deps.iter().filter(|d| d.index() >= base) {
                let d = d.index() - base;
                dependents[fill[d] as usize] = i as u32;
                fill[d] += 1;
            }
        }
        let (alloc_offsets, allocs) = csr(ops, |e| e.alloc_bytes);
        let (free_offsets, frees) = csr(ops, |e| e.free_bytes);
        let offsets = (0..=n)
            .map(|i| Offsets {
                dependents: counts[i],
                allocs: alloc_offsets[i],
                frees: free_offsets[i],
            })
            .collect();
        let collectives = ops
            .iter()
            .filter_map(|op| match &op.payload {
                Payload::Collective(c) => Some(*c),
                _ => None,
            })
            .collect();
        Self {
            collectives,
            queues: queues.into_iter().map(Arc::from).collect(),
            offsets,
            dependents,
            allocs,
            frees,
        }
    }

    /// Local ops that depend on local op `op`.
    #[inline]
    pub(super) fn dependents(&self, op: usize) -> &[u32] {
        let (a, b) = (self.offsets[op].dependents, self.offsets[op + 1].dependents);
        &self.dependents[a as usize..b as usize]
    }

    /// Bytes local op `op` allocates when it starts.
    #[inline]
    pub(super) fn allocs(&self, op: usize) -> &[TagDelta] {
        let (a, b) = (self.offsets[op].allocs, self.offsets[op + 1].allocs);
        &self.allocs[a as usize..b as usize]
    }

    /// Per device stream: its local ops in issue order.
    pub(super) fn queues(&self) -> &[Arc<[u32]>] {
        &self.queues
    }

    /// The `k`-th collective of the ops (in op order).
    #[inline]
    pub(super) fn collective(&self, k: u32) -> &CollectiveOp {
        &self.collectives[k as usize]
    }

    /// Bytes local op `op` frees when it ends.
    #[inline]
    pub(super) fn frees(&self, op: usize) -> &[TagDelta] {
        let (a, b) = (self.offsets[op].frees, self.offsets[op + 1].frees);
        &self.frees[a as usize..b as usize]
    }
}

/// Hashes the lengths and a sample of at most [`HASH_SAMPLE`] evenly spaced entries of each
/// table: equal tables hash equally (the sample is a function of the content), and interning
/// thousands of programs of tens of thousands of ops does not hash every entry.
impl Hash for UnitStatics {
    fn hash<H: Hasher>(&self, state: &mut H) {
        sample(&self.offsets, state);
        sample(&self.dependents, state);
        sample(&self.allocs, state);
        sample(&self.frees, state);
        sample(&self.collectives, state);
        self.queues.len().hash(state);
        for q in &self.queues {
            sample(q, state);
        }
    }
}

/// Entries of a table [`UnitStatics`]'s hash looks at.
const HASH_SAMPLE: usize = 64;

fn sample<T: Hash, H: Hasher>(items: &[T], state: &mut H) {
    items.len().hash(state);
    let step = items.len().div_ceil(HASH_SAMPLE).max(1);
    for item in items.iter().step_by(step) {
        item.hash(state);
    }
}

/// Per-op memory effects with a non-zero `bytes(effect)`, flattened: (offsets, entries).
fn csr(
    ops: OpSlice<'_>,
    bytes: impl Fn(&hpfsdp_program::step::MemoryEffect) -> u64,
) -> (Vec<u32>, Vec<TagDelta>) {
    let mut offsets = Vec::with_capacity(ops.len() + 1);
    let mut entries = Vec::new();
    offsets.push(0);
    for op in ops.iter() {
        for e in &op.memory {
            let b = bytes(e);
            if b > 0 {
                entries.push(TagDelta::new(e.tag, b));
            }
        }
        offsets.push(entries.len() as u32);
    }
    (offsets, entries)
}

/// Hands out one shared [`UnitStatics`] per distinct content.
#[derive(Debug, Default)]
pub(super) struct StaticsInterner {
    seen: HashSet<Arc<UnitStatics>>,
    /// The copy handed out last: consecutive units usually share a shape, and comparing
    /// with it is cheaper than hashing the tables.
    last: Option<Arc<UnitStatics>>,
}

impl StaticsInterner {
    /// The shared copy of `statics` (the first one with its content).
    pub(super) fn intern(&mut self, statics: UnitStatics) -> Arc<UnitStatics> {
        if let Some(last) = &self.last
            && **last == statics
        {
            return Arc::clone(last);
        }
        let s = match self.seen.get(&statics) {
            Some(s) => Arc::clone(s),
            None => {
                let s = Arc::new(statics);
                self.seen.insert(Arc::clone(&s));
                s
            }
        };
        self.last = Some(Arc::clone(&s));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpfsdp_program::step::{Category, ComputeWork, MemTag, ProgramBuilder, Stream};

    fn program(rank: usize, act_bytes: u64) -> hpfsdp_program::step::StepProgram {
        let mut b = ProgramBuilder::new(rank);
        let w = ComputeWork {
            flops: 10,
            hbm_bytes: 10,
            kernels: 1,
            mix: None,
        };
        let a = b.compute(w, &[]);
        b.alloc(a, MemTag::Activations, act_bytes);
        let c = b.compute_on(Stream::Compute, Category::Optimizer, w, &[a]);
        b.free(c, MemTag::Activations, act_bytes);
        b.host(Category::Host, 5, &[a, c]);
        b.build().unwrap()
    }

    #[test]
    fn tables_and_sharing() {
        let p = program(0, 100);
        let s = UnitStatics::of(p.ops.slice(0..p.ops.len()), 0, vec![]);
        assert_eq!(s.dependents(0), &[1, 2]);
        assert_eq!(s.dependents(1), &[2]);
        assert!(s.dependents(2).is_empty());
        assert_eq!(s.allocs(0), &[TagDelta::new(MemTag::Activations, 100)]);
        assert!(s.allocs(1).is_empty() && s.frees(0).is_empty());
        assert_eq!(s.frees(1), &[TagDelta::new(MemTag::Activations, 100)]);
        // From base 1: op 0 is done and gone from the tables.
        let tail = UnitStatics::of(p.ops.slice(1..p.ops.len()), 1, vec![]);
        assert_eq!(tail.dependents(0), &[1]);
        assert_eq!(tail.frees(0), &[TagDelta::new(MemTag::Activations, 100)]);

        let mut interner = StaticsInterner::default();
        let a = interner.intern(s);
        let statics_of = |p: &hpfsdp_program::step::StepProgram| {
            UnitStatics::of(p.ops.slice(0..p.ops.len()), 0, vec![])
        };
        let b = interner.intern(statics_of(&program(1, 100)));
        let c = interner.intern(statics_of(&program(2, 7)));
        let d = interner.intern(statics_of(&program(3, 100)));
        assert!(Arc::ptr_eq(&a, &b), "same shape on another rank is shared");
        assert!(!Arc::ptr_eq(&a, &c), "different bytes are not");
        assert!(
            Arc::ptr_eq(&a, &d),
            "nor lost when another shape came in between"
        );
    }
}
