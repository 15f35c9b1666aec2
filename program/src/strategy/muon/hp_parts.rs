//! A HyperParallel Muon schedule as **parts**: the AdamW head (a function of the rank's
//! expert-parallel class) and one part per execution slot (a function of a few of the rank's
//! coordinates, [`SlotKey`]). Ranks share most parts: on exp-d 785 optimizer coordinates are
//! made of a few hundred distinct parts, so building each part once ([`PartCache`]) and
//! digesting a schedule from its parts' digests ([`Parts::digest`]) replaces one whole
//! schedule build and hash per coordinate. [`Parts::assemble`] lays the parts out as the
//! [`Schedule`] the strategy lowers, with the replica-broadcast landings between slots.
//!
//! A part's ops refer to each other by index within the part; assembling shifts them.

use super::schedule::{Dep, LaidOp, Layout, SOp, Schedule, Work};
use crate::step::MemTag;
use hpfsdp_plan::kernel::MixId;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// A slot's replica broadcast still in flight when the slot ends: (last-hop ops, bytes
/// received, slot); the ops are part-relative in a [`Part`], schedule-absolute once
/// assembled.
pub(crate) type InFlight = (Vec<u32>, u64, usize);

/// One part: its ops (indices relative to the part), the optimizer state it keeps resident,
/// its in-flight broadcast, and the digest of all of it without op names: 128 bits of
/// BLAKE3 over its canonical bytes, the identity of a part (as a program's is in folding),
/// so parts of equal digest are kept once without comparing them op by op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    /// The part's ops and resident state (`anonymous` as built).
    pub(crate) s: Schedule,
    /// The slot's replica broadcast left in flight (slot parts only).
    pub(crate) in_flight: Option<InFlight>,
    /// Digest of `s` without names and of `in_flight`.
    pub(crate) digest: u128,
    /// The kernel-mix id of each op, worked out on first use ([`Part::mix_ids`]).
    mix_ids: MixIds,
}

/// Per op of a part, the id of its kernel mix (`None`: no mix), computed the first time the
/// part is lowered and reused by every program that lowers it after. A cache of `s`'s
/// content: parts compare equal whether or not it was filled.
#[derive(Debug, Clone, Default)]
struct MixIds(std::sync::OnceLock<Vec<Option<MixId>>>);

impl PartialEq for MixIds {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for MixIds {}

impl Part {
    /// A part of `s` with its in-flight broadcast, digested.
    pub(crate) fn new(s: Schedule, in_flight: Option<InFlight>) -> Self {
        let mut h = ByteSink(Vec::new());
        s.hash_without_names(&mut h);
        in_flight.hash(&mut h);
        let mut b = [0u8; 16];
        b.copy_from_slice(&blake3::hash(&h.0).as_bytes()[..16]);
        let digest = u128::from_le_bytes(b);
        Self {
            s,
            in_flight,
            digest,
            mix_ids: MixIds::default(),
        }
    }

    /// The id of each op's kernel mix ([`MixId::of`] of a non-empty `Work::Kernels`).
    fn mix_ids(&self) -> &[Option<MixId>] {
        self.mix_ids.0.get_or_init(|| {
            self.s
                .ops
                .iter()
                .map(|op| match &op.work {
                    Work::Kernels(k) if !k.is_empty() => Some(MixId::of(k)),
                    _ => None,
                })
                .collect()
        })
    }
}

/// What a slot part takes from the rank: the shape id of what its replica coordinate owns
/// of its plan batch ([`super::hp_shapes::OwnedShape`]: the slot, the replica coordinate
/// and the owned parameters by shape), and per NS memory batch and replica broadcast what
/// its coordinates decide. The part is built from these alone (`hyperparallel::slot_part`
/// never sees the rank's view, and reads its batch only where the shape id covers it), so
/// equal inputs give equal parts; ranks owning different matrices of the same shapes (on
/// other EP classes, too) get equal inputs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SlotInputs {
    /// Shape id of the owned set.
    pub(crate) owned: u32,
    /// Per NS memory batch of the slot (`None`: the rank owns none of it).
    pub(crate) units: Vec<Option<UnitInputs>>,
    /// Bytes each replica source sends, in grid order (`None`: no replica group).
    pub(crate) sources: Option<Vec<u64>>,
}

/// What one NS memory batch takes from the rank.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct UnitInputs {
    /// (count, bytes) of the unpack kernels after the last fused gather (shard path).
    pub(crate) kept: (u32, u64),
    /// The NS calls the rank runs.
    pub(crate) calls: Vec<super::ns_call::NsCall>,
    /// Per shard dim but the last (where every rank joins every broadcast), the bytes of
    /// each relay broadcast it joins.
    pub(crate) relay: Vec<Vec<u64>>,
    /// Their owners' coordinates (op names), per dim; empty in an anonymous schedule.
    pub(crate) relay_owners: Vec<Vec<Vec<usize>>>,
}

/// A `Hasher` that only collects the bytes written (digested with BLAKE3 afterwards).
struct ByteSink(Vec<u8>);

impl Hasher for ByteSink {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn finish(&self) -> u64 {
        0
    }
}

/// Which part: the AdamW head of an EP class, or a slot part.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum PartKey {
    /// The AdamW-routed units of an EP class.
    Head(usize),
    /// A slot part (shared: the key is kept only when the part is new).
    Slot(Arc<SlotInputs>),
}

/// Anonymous parts by key, each built once and shared by every rank's schedule; parts of
/// equal content (different keys: e.g. the same work on another EP class's parameters) are
/// kept once.
#[derive(Debug, Clone, Default)]
pub(crate) struct PartCache {
    by_key: Arc<Mutex<HashMap<PartKey, Arc<Part>>>>,
    by_digest: Arc<Mutex<HashMap<u128, Arc<Part>>>>,
}

impl PartCache {
    /// The part of `key`, built by `make` (outside the locks) when absent.
    pub(crate) fn get(&self, key: PartKey, make: impl FnOnce() -> Part) -> Arc<Part> {
        if let Ok(m) = self.by_key.lock()
            && let Some(p) = m.get(&key)
        {
            return p.clone();
        }
        let part = self.canonical(make());
        match self.by_key.lock() {
            Ok(mut m) => m.entry(key).or_insert(part).clone(),
            Err(_) => part,
        }
    }

    /// The kept part of `part`'s digest, or `part`, now kept.
    fn canonical(&self, mut part: Part) -> Arc<Part> {
        let Ok(mut m) = self.by_digest.lock() else {
            return Arc::new(part);
        };
        m.entry(part.digest)
            .or_insert_with(|| {
                part.s.ops.shrink_to_fit();
                Arc::new(part)
            })
            .clone()
    }
}

/// A rank's schedule as parts, in schedule order.
#[derive(Debug, Clone)]
pub(crate) struct Parts {
    /// The AdamW head.
    pub(crate) head: Arc<Part>,
    /// One part per slot (`None`: the rank holds none of the slot's batches).
    pub(crate) slots: Vec<Option<Arc<Part>>>,
}

impl Parts {
    /// Digest of the schedule the parts assemble into, names left out: equal digests mean
    /// equal part sequences, hence equal schedules (up to names).
    pub(crate) fn digest(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.head.digest.hash(&mut h);
        for p in &self.slots {
            p.as_ref().map(|p| p.digest).hash(&mut h);
        }
        h.finish()
    }

    /// The schedule as a [`Layout`]: the head's ops, then every slot's ops (borrowed from
    /// the parts, each part's ops with the index it starts at); after a slot that leaves a
    /// replica broadcast in flight, the previous one in flight is landed (at most one in
    /// flight), and the last one after every slot. Lowering it emits what lowering
    /// [`Parts::assemble`] does, without copying the parts' ops.
    pub(crate) fn layout<'a>(&'a self) -> Layout<'a> {
        let n: usize = self.head.s.ops.len()
            + self
                .slots
                .iter()
                .flatten()
                .map(|p| p.s.ops.len() + 1)
                .sum::<usize>();
        let mut out = Layout {
            ops: Vec::with_capacity(n),
            own: Vec::new(),
            momentum_bytes: 0,
            adamw_state_bytes: 0,
        };
        let append = |out: &mut Layout<'_>, p: &'_ Part| -> u32 {
            let base = out.ops.len() as u32;
            out.momentum_bytes += p.s.momentum_bytes;
            out.adamw_state_bytes += p.s.adamw_state_bytes;
            base
        };
        let laid = |p: &'a Part, base: u32| {
            p.s.ops
                .iter()
                .zip(p.mix_ids())
                .map(move |(op, &mix)| (LaidOp::Borrowed(op), base, mix))
        };
        let base = append(&mut out, &self.head);
        out.ops.extend(laid(&self.head, base));
        let mut in_flight: Option<InFlight> = None;
        for p in self.slots.iter().flatten() {
            let base = append(&mut out, p);
            out.ops.extend(laid(p, base));
            if let Some((ops, bytes, slot)) = &p.in_flight {
                if let Some(prev) = in_flight.take() {
                    self.land_into(&mut out, prev);
                }
                let ops = ops.iter().map(|&o| o + base).collect();
                in_flight = Some((ops, *bytes, *slot));
            }
        }
        if let Some(prev) = in_flight.take() {
            self.land_into(&mut out, prev);
        }
        out
    }

    /// Appends the landing of `in_flight` ([`Parts::landing`]) to `out` as its own op.
    fn land_into(&self, out: &mut Layout<'_>, in_flight: InFlight) {
        if let Some(op) = self.landing(in_flight) {
            out.ops.push((LaidOp::Own(out.own.len() as u32), 0, None));
            out.own.push(op);
        }
    }

    /// The schedule: `s` (empty) followed by the ops of [`Parts::layout`], their op
    /// dependencies shifted by their base.
    pub(crate) fn assemble(&self, mut s: Schedule) -> Schedule {
        let layout = self.layout();
        s.ops.reserve(layout.ops.len());
        s.ops.extend(layout.iter().map(|(op, base, _)| {
            let mut op = op.clone();
            for d in &mut op.deps {
                if let Dep::Op(i) = d {
                    *i += base;
                }
            }
            op
        }));
        s.momentum_bytes += layout.momentum_bytes;
        s.adamw_state_bytes += layout.adamw_state_bytes;
        s
    }

    /// The op that lands an in-flight batch ([`land`], named when the parts are): its op
    /// dependencies are schedule-absolute.
    fn landing(&self, in_flight: InFlight) -> Option<SOp> {
        let mut s = Schedule {
            anonymous: self.head.s.anonymous,
            ..Schedule::default()
        };
        land(&mut s, in_flight);
        s.ops.pop()
    }
}

/// Lands an in-flight batch: waits its broadcasts and unpacks what was received.
pub(crate) fn land(s: &mut Schedule, (ops, bytes, slot): InFlight) {
    let mut deps: Vec<Dep> = ops.iter().map(|&o| Dep::Op(o)).collect();
    deps.push(Dep::Issue);
    let op = s.copy(s.name(|| format!("muon.b{slot}.land")), bytes, 1, deps);
    s.free(op, MemTag::Buffers, bytes);
}
