//! Rank-independent pieces of HyperParallel Muon schedules ([`Pieces`]), held by the
//! optimizer context ([`super::OptCtx`]) and filled by [`super::hyperparallel`]'s builds.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// The held parameters of a plan batch that one replica coordinate owns: a function of the
/// batch, the EP class and the replica coordinate only, so built once and shared by every
/// rank with those ([`Pieces`]).
#[derive(Debug)]
pub(crate) struct Owned {
    /// Held parameters this replica coordinate owns.
    pub(crate) params: Vec<usize>,
    /// Owned members of every NS memory batch of the plan batch (empty when the rank owns
    /// none of it).
    pub(crate) units: Vec<Vec<usize>>,
    /// Per NS memory batch on the shard path (as `units`; empty on the local path): its
    /// members' shard owners.
    pub(crate) owners: Vec<UnitOwners>,
    /// The id of what a slot part reads of it ([`super::hp_shapes::OwnedShape`]).
    pub(crate) shape: u32,
}

/// The shard owners of one NS memory batch's owned members (shard path), found in the
/// plan's owner map once per [`Owned`] instead of by every rank's build, member by member.
#[derive(Debug, Default)]
pub(crate) struct UnitOwners {
    /// Every shard-owner coordinate of the members, in lexicographic order, with the bytes
    /// it relays: the packed bf16 updates of the matrices it owns, 512-byte padded each.
    pub(crate) sources: Vec<(Vec<usize>, u64)>,
    /// Per member (in the memory batch's order): its owner's position in `sources`.
    owner: Vec<Option<u32>>,
}

/// The owners of a memory batch with none (the local path).
pub(crate) static NO_OWNERS: UnitOwners = UnitOwners {
    sources: Vec::new(),
    owner: Vec::new(),
};

impl UnitOwners {
    /// The owners of a memory batch's members: per member, its shard owner's coordinate and
    /// the bytes it relays for the member, or `None` without an owner.
    pub(crate) fn new<'a>(members: &[Option<(&'a [usize], u64)>]) -> Self {
        let mut bytes: BTreeMap<&[usize], u64> = BTreeMap::new();
        for &(c, n) in members.iter().flatten() {
            *bytes.entry(c).or_default() += n;
        }
        let sources: Vec<(Vec<usize>, u64)> =
            bytes.into_iter().map(|(c, n)| (c.to_vec(), n)).collect();
        let owner = members
            .iter()
            .map(|m| {
                let (c, _) = (*m)?;
                let at = sources.binary_search_by(|(s, _)| s.as_slice().cmp(c));
                at.ok().map(|j| j as u32)
            })
            .collect();
        Self { sources, owner }
    }

    /// The shard-owner coordinate of the batch's `k`-th member, when it has one.
    pub(crate) fn owner_of(&self, k: usize) -> Option<&[usize]> {
        let j = (*self.owner.get(k)?)?;
        self.sources.get(j as usize).map(|(c, _)| c.as_slice())
    }
}

/// The parameters of a plan batch one EP class holds ([`OptCtx::held`](super::OptCtx::held)).
#[derive(Debug)]
pub(crate) struct Held {
    /// Held parameters, in batch order.
    pub(crate) params: Vec<usize>,
    /// Per domain (dense, expert): some held parameter of it has a replica owner.
    pub(crate) replicated: [bool; 2],
    /// The held parameters with a replica owner, grouped by owner and by what their local
    /// shard size reads (FSDP dim size, padded shard, domain, plan elements), in order of
    /// those: the replica-broadcast bytes of a rank sum one size per group, not per
    /// parameter (thousands of per-expert weights of a few shapes).
    pub(crate) sourced: Vec<SourceGroup>,
}

/// Held parameters with a replica owner whose local shards have equal sizes on every rank.
#[derive(Debug)]
pub(crate) struct SourceGroup {
    /// The replica owner's coordinate.
    pub(crate) owner: Vec<usize>,
    /// One of the parameters (any: they have equal local shard sizes).
    pub(crate) rep: usize,
    /// How many parameters.
    pub(crate) count: u64,
}

/// Bytes each replica owner sources in a batch's replica broadcast, by owner coordinate.
pub(crate) type SourceBytes = HashMap<Vec<usize>, u64>;

/// A shared map of computed pieces ([`cached`]).
pub(crate) type Cache<K, V> = Arc<Mutex<HashMap<K, Arc<V>>>>;

/// Rank-independent pieces of the HyperParallel schedule, each computed once per distinct
/// input and shared by every rank's build: a folded job builds one schedule per optimizer
/// coordinate (thousands on exp-d scaled out), and the walks over a batch's held parameters
/// (thousands of per-expert weights, each looked up in the plan's owner maps) were most of
/// each build. The pieces are pure functions of their keys, so which rank computes one first
/// (builds run in parallel) does not change any schedule.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pieces {
    /// Per (plan batch, EP class): the batch's parameters the class holds.
    pub(crate) held: Cache<(usize, usize), Held>,
    /// Per (plan batch, EP class, replica coordinate): what that coordinate owns.
    pub(crate) owned: Cache<(usize, usize, Vec<usize>), Owned>,
    /// Per (plan batch, EP class, dense and expert FSDP positions (`usize::MAX` for a
    /// domain none of whose held parameters is replicated), master bytes per element):
    /// bytes per replica owner.
    pub(crate) sources: Cache<(usize, usize, [usize; 2], u64), SourceBytes>,
    /// Anonymous schedule parts by key ([`super::hp_parts`]).
    pub(crate) parts: super::hp_parts::PartCache,
    /// Shape ids of parameters and owned sets ([`super::hp_shapes`]).
    pub(crate) shapes: super::hp_shapes::ShapeIds,
    /// Per plan batch: whether some of its parameters are per-expert weights (else every EP
    /// class holds the same parameters of it, and its pieces are keyed by class 0; see
    /// `hyperparallel::class_key`).
    pub(crate) per_class: Arc<std::sync::OnceLock<Vec<bool>>>,
}

/// The cached value of `key` in `map`, computed by `make` (outside the lock) when absent.
pub(crate) fn cached<K: std::hash::Hash + Eq, V>(
    map: &Mutex<HashMap<K, Arc<V>>>,
    key: K,
    make: impl FnOnce() -> V,
) -> Arc<V> {
    if let Ok(m) = map.lock()
        && let Some(v) = m.get(&key)
    {
        return v.clone();
    }
    let v = Arc::new(make());
    match map.lock() {
        Ok(mut m) => m.entry(key).or_insert(v).clone(),
        Err(_) => v,
    }
}
