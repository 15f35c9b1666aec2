//! Op storage of a [`super::StepProgram`]: an optional **shared prefix** plus the program's
//! own tail.
//!
//! Under a distributed Muon optimizer the programs of a large job differ only in their
//! optimizer tail: the forward, backward and gradient-reduction ops (~80% of every program)
//! are the same on every rank with the same model path. Storing that prefix once
//! ([`SharedOps`], behind an `Arc`) and each program's tail on its own turns hundreds of
//! copies of the prefix into one, and lets readers that see the same `Arc` (folding digests,
//! the prefix-sharing plan of the simulator) do the prefix's work once. The tail can be
//! shared too ([`OpSeq::share_tail`]): copies of a program that differ only in their rank
//! and group table (the simulator's relabelled representatives) then cost no op storage.
//!
//! Op ids stay global: op `i` is `prefix[i]` below the prefix length and `tail[i - len]`
//! above it, so dependencies, the engine, reports and replay index ops as before, through
//! [`OpSeq::get`], indexing and [`OpSeq::iter`]. Mutable access to a prefix op first copies
//! the prefix into the program's own storage (the shared copy is never changed).

use super::op::Op;
use hpfsdp_plan::kernel::MixId;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::sync::Arc;

/// Number of memory tags ([`super::MemTag::ALL`]).
const TAGS: usize = super::MemTag::ALL.len();

/// What validating a shared prefix once established, so that a program built on it
/// validates only its own tail ([`super::StepProgram::validate`]): the prefix's ops are
/// well formed on any program whose groups, kernel mixes and resident memory satisfy these
/// conditions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrefixCheck {
    /// Per memory tag: the smallest resident bytes the prefix never frees below zero with.
    pub need_bytes: [u64; TAGS],
    /// Per memory tag: bytes the prefix allocates in total.
    pub alloc_bytes: [u64; TAGS],
    /// Per memory tag: bytes the prefix frees in total.
    pub free_bytes: [u64; TAGS],
    /// (group slot, group size) of every group the prefix's collectives use.
    pub group_sizes: Vec<(u32, usize)>,
    /// Kernel mixes the prefix's compute ops refer to.
    pub mixes: Vec<MixId>,
}

/// Leading ops shared by several programs, with the result of validating them once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SharedOps {
    /// The ops, ids `0..len`.
    pub ops: Vec<Op>,
    /// `None` when the prefix failed validation where it was built (every program built on
    /// it is then validated op by op, which names the fault).
    pub check: Option<PrefixCheck>,
}

/// The ops of a step program in host issue order: a shared prefix (possibly none) followed
/// by the program's own ops. Serialises, compares and hashes as the `Vec<Op>` it replaces.
#[derive(Clone, Default)]
pub struct OpSeq {
    shared: Option<Arc<SharedOps>>,
    tail: Tail,
}

/// A program's own ops: owned while the program is built, or behind an `Arc` once
/// [`OpSeq::share_tail`] made clones share them (a change copies them back first).
#[derive(Clone)]
enum Tail {
    Own(Vec<Op>),
    Shared(Arc<Vec<Op>>),
}

impl Default for Tail {
    fn default() -> Self {
        Tail::Own(Vec::new())
    }
}

impl Tail {
    /// The ops, read only.
    #[inline]
    fn ops(&self) -> &[Op] {
        match self {
            Tail::Own(v) => v,
            Tail::Shared(v) => v,
        }
    }

    /// The ops for changing: a shared tail is copied first (unless this is its only owner).
    fn own(&mut self) -> &mut Vec<Op> {
        if let Tail::Shared(v) = self {
            let v = std::mem::take(v);
            *self = Tail::Own(Arc::try_unwrap(v).unwrap_or_else(|v| (*v).clone()));
        }
        match self {
            Tail::Own(v) => v,
            Tail::Shared(_) => unreachable!("the tail was just made owned"),
        }
    }

    /// The ops, owned (moved out, or copied when shared with another sequence).
    fn take(&mut self) -> Vec<Op> {
        std::mem::take(self.own())
    }
}

impl OpSeq {
    /// No ops.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sequence that starts with `prefix` (shared, not copied) and continues with `tail`
    /// (ids `prefix.ops.len()..`).
    pub fn with_prefix(prefix: Arc<SharedOps>, tail: Vec<Op>) -> Self {
        Self {
            shared: Some(prefix),
            tail: Tail::Own(tail),
        }
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.prefix_len() + self.tail.ops().len()
    }

    /// True when there are no ops.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of ops in the shared prefix (0 without one).
    pub fn prefix_len(&self) -> usize {
        self.shared.as_ref().map_or(0, |s| s.ops.len())
    }

    /// The shared prefix, when the sequence has one.
    pub fn shared(&self) -> Option<&Arc<SharedOps>> {
        self.shared.as_ref()
    }

    /// The shared prefix's ops (empty without one).
    pub fn prefix(&self) -> &[Op] {
        self.shared.as_ref().map_or(&[], |s| s.ops.as_slice())
    }

    /// The program's own ops after the prefix (all of them without a prefix).
    pub fn tail(&self) -> &[Op] {
        self.tail.ops()
    }

    /// Puts the program's own ops behind an `Arc`, so that clones of this sequence share
    /// them instead of copying them (changing an op of a clone copies them back first).
    pub fn share_tail(&mut self) {
        if let Tail::Own(v) = &mut self.tail {
            let mut v = std::mem::take(v);
            v.shrink_to_fit();
            self.tail = Tail::Shared(Arc::new(v));
        }
    }

    /// Whether both sequences hold the very same tail storage (shared by
    /// [`OpSeq::share_tail`]), so that their tails are equal without comparing them.
    pub fn same_tail(&self, other: &Self) -> bool {
        match (&self.tail, &other.tail) {
            (Tail::Shared(a), Tail::Shared(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Op `i`, or `None` past the end.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&Op> {
        let p = self.prefix();
        if i < p.len() {
            Some(&p[i])
        } else {
            self.tail.ops().get(i - p.len())
        }
    }

    /// Op `i` for changing, or `None` past the end; a prefix op first copies the prefix into
    /// this sequence's own storage ([`OpSeq::unshare`]).
    pub fn get_mut(&mut self, i: usize) -> Option<&mut Op> {
        if i < self.prefix_len() {
            self.unshare();
        }
        let p = self.prefix_len();
        self.tail.own().get_mut(i - p)
    }

    /// The first op.
    pub fn first(&self) -> Option<&Op> {
        self.get(0)
    }

    /// The last op.
    pub fn last(&self) -> Option<&Op> {
        self.tail.ops().last().or_else(|| self.prefix().last())
    }

    /// Every op in order.
    pub fn iter(&self) -> OpIter<'_> {
        OpIter {
            prefix: self.prefix().iter(),
            tail: self.tail.ops().iter(),
        }
    }

    /// Ops `start..` in order (an empty iterator past the end).
    pub fn iter_from(&self, start: usize) -> OpIter<'_> {
        let (p, tail) = (self.prefix(), self.tail.ops());
        if start <= p.len() {
            OpIter {
                prefix: p[start..].iter(),
                tail: tail.iter(),
            }
        } else {
            OpIter {
                prefix: [].iter(),
                tail: tail[(start - p.len()).min(tail.len())..].iter(),
            }
        }
    }

    /// Ops `range` (clamped to the sequence), as a cheap view that iterates like a slice.
    pub fn slice(&self, range: std::ops::Range<usize>) -> OpSlice<'_> {
        let p = self.prefix();
        let clamp = |i: usize, len: usize| i.min(len);
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        OpSlice {
            prefix: &p[clamp(start, p.len())..clamp(end, p.len())],
            tail: &self.tail.ops()[start.saturating_sub(p.len())..end.saturating_sub(p.len())],
        }
    }

    /// Every op for changing; copies a shared prefix into this sequence first.
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Op> {
        self.unshare();
        self.tail.own().iter_mut()
    }

    /// Appends an op (its id must be [`OpSeq::len`]).
    pub fn push(&mut self, op: Op) {
        self.tail.own().push(op);
    }

    /// Reserves room for `additional` more ops in the program's own storage.
    pub fn reserve(&mut self, additional: usize) {
        self.tail.own().reserve(additional);
    }

    /// Copies the shared prefix (if any) into this sequence's own storage, so that every op
    /// can be changed; other sequences sharing the prefix are not affected.
    pub fn unshare(&mut self) {
        if let Some(shared) = self.shared.take() {
            let tail = self.tail.take();
            let mut ops = Vec::with_capacity(shared.ops.len() + tail.len());
            ops.extend_from_slice(&shared.ops);
            ops.extend(tail);
            self.tail = Tail::Own(ops);
        }
    }

    /// Moves every op into a new shared prefix and returns it; the sequence then consists
    /// of that prefix and an empty tail. `check` is the result of validating the ops.
    pub fn freeze(&mut self, check: Option<PrefixCheck>) -> Arc<SharedOps> {
        self.unshare();
        let mut ops = self.tail.take();
        ops.shrink_to_fit();
        let shared = Arc::new(SharedOps { ops, check });
        self.shared = Some(shared.clone());
        shared
    }

    /// An owned copy of every op.
    pub fn to_vec(&self) -> Vec<Op> {
        self.iter().cloned().collect()
    }

    /// Every op, owned (the tail is moved, a shared prefix copied).
    pub fn into_vec(mut self) -> Vec<Op> {
        self.unshare();
        self.tail.take()
    }
}

/// A contiguous run of an [`OpSeq`]'s ops ([`OpSeq::slice`]): the part in the shared
/// prefix, then the part in the tail. `Copy`, so it can be iterated several times.
#[derive(Debug, Clone, Copy)]
pub struct OpSlice<'a> {
    prefix: &'a [Op],
    tail: &'a [Op],
}

impl<'a> OpSlice<'a> {
    /// Number of ops.
    pub fn len(&self) -> usize {
        self.prefix.len() + self.tail.len()
    }

    /// True when there are no ops.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Op `i` of the run, or `None` past its end.
    pub fn get(&self, i: usize) -> Option<&'a Op> {
        if i < self.prefix.len() {
            Some(&self.prefix[i])
        } else {
            self.tail.get(i - self.prefix.len())
        }
    }

    /// The run's ops in order.
    pub fn iter(&self) -> OpIter<'a> {
        OpIter {
            prefix: self.prefix.iter(),
            tail: self.tail.iter(),
        }
    }
}

impl<'a> IntoIterator for OpSlice<'a> {
    type Item = &'a Op;
    type IntoIter = OpIter<'a>;
    fn into_iter(self) -> OpIter<'a> {
        self.iter()
    }
}

/// Iterator over an [`OpSeq`]: the prefix's ops, then the tail's.
#[derive(Debug, Clone)]
pub struct OpIter<'a> {
    prefix: std::slice::Iter<'a, Op>,
    tail: std::slice::Iter<'a, Op>,
}

impl<'a> Iterator for OpIter<'a> {
    type Item = &'a Op;

    #[inline]
    fn next(&mut self) -> Option<&'a Op> {
        self.prefix.next().or_else(|| self.tail.next())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.prefix.len() + self.tail.len();
        (n, Some(n))
    }

    fn nth(&mut self, n: usize) -> Option<&'a Op> {
        let p = self.prefix.len();
        if n < p {
            self.prefix.nth(n)
        } else {
            self.prefix = [].iter();
            self.tail.nth(n - p)
        }
    }
}

impl DoubleEndedIterator for OpIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.tail.next_back().or_else(|| self.prefix.next_back())
    }
}

impl ExactSizeIterator for OpIter<'_> {}

impl std::iter::FusedIterator for OpIter<'_> {}

impl<'a> IntoIterator for &'a OpSeq {
    type Item = &'a Op;
    type IntoIter = OpIter<'a>;
    fn into_iter(self) -> OpIter<'a> {
        self.iter()
    }
}

impl<'a> IntoIterator for &'a mut OpSeq {
    type Item = &'a mut Op;
    type IntoIter = std::slice::IterMut<'a, Op>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl std::ops::Index<usize> for OpSeq {
    type Output = Op;
    #[inline]
    fn index(&self, i: usize) -> &Op {
        match self.get(i) {
            Some(op) => op,
            None => panic!("op index {i} out of range for {} ops", self.len()),
        }
    }
}

impl std::ops::IndexMut<usize> for OpSeq {
    fn index_mut(&mut self, i: usize) -> &mut Op {
        let len = self.len();
        match self.get_mut(i) {
            Some(op) => op,
            None => panic!("op index {i} out of range for {len} ops"),
        }
    }
}

impl From<Vec<Op>> for OpSeq {
    fn from(tail: Vec<Op>) -> Self {
        Self {
            shared: None,
            tail: Tail::Own(tail),
        }
    }
}

impl FromIterator<Op> for OpSeq {
    fn from_iter<I: IntoIterator<Item = Op>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl PartialEq for OpSeq {
    fn eq(&self, other: &Self) -> bool {
        if self.len() != other.len() {
            return false;
        }
        let same_prefix = match (&self.shared, &other.shared) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if same_prefix {
            return self.same_tail(other) || self.tail.ops() == other.tail.ops();
        }
        self.iter().eq(other.iter())
    }
}

impl Eq for OpSeq {}

impl std::hash::Hash for OpSeq {
    /// Hashes as a slice of the ops (length, then every op).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.len().hash(state);
        for op in self.iter() {
            op.hash(state);
        }
    }
}

impl std::fmt::Debug for OpSeq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for OpSeq {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for OpSeq {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<Op>::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::{Category, ComputeWork, ProgramBuilder};

    fn ops(n: u64) -> OpSeq {
        let mut b = ProgramBuilder::new(0);
        for i in 0..n {
            b.compute(ComputeWork::memory_bound(i, i, 1), &[]);
        }
        b.build().unwrap().ops
    }

    /// Clones of a shared tail share its storage; changing one copies it and leaves the
    /// others as they were; the sequence reads, compares and hashes as before.
    #[test]
    fn shared_tail_is_copied_on_change_only() {
        let mut a = ops(3);
        let plain = a.clone();
        a.share_tail();
        let mut b = a.clone();
        assert!(a.same_tail(&b) && !a.same_tail(&plain));
        assert_eq!(a, plain);
        assert_eq!(a.tail().as_ptr(), b.tail().as_ptr(), "no copy");
        b[1].category = Category::Host;
        assert!(!a.same_tail(&b));
        assert_eq!(
            a[1].category,
            Category::Compute,
            "the original is untouched"
        );
        assert_eq!(b[1].category, Category::Host);
        assert_eq!(a.len(), 3);
        let mut c = a.clone();
        c.push(plain[2].clone());
        assert_eq!((a.len(), c.len()), (3, 4));
        assert_eq!(a.clone().into_vec(), plain.to_vec());
        use std::hash::{DefaultHasher, Hash, Hasher};
        let hash = |s: &OpSeq| {
            let mut h = DefaultHasher::new();
            s.hash(&mut h);
            h.finish()
        };
        assert_eq!(hash(&a), hash(&plain));
    }
}
