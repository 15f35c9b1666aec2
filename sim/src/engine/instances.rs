//! The collective instances of a run by id. Ids are handed out in creation order and never
//! reused: events, the pending-rendezvous table and the network's transfers name an
//! instance by its id, and work at equal times is ordered by it, so reusing ids could
//! reorder a run. A completed instance's storage is reused instead ([`Instances::release`]):
//! a run creates one instance per collective call of every communicator (hundreds of
//! thousands on exp-d with Muon), of which only the ones in flight are kept, and an id costs
//! four bytes.

use hpfsdp_plan::Tier;
use hpfsdp_program::step::CollectiveOp;
use smallvec::SmallVec;

/// (unit, local op) of the members arrived at a collective, inline up to four (most of exp-d's
/// Muon relay collectives have four members): an arrival touches the instance, not a list
/// stored elsewhere.
pub(super) type Arrivals = SmallVec<[(u32, u32); 4]>;

/// (tier, latency ns, transfer ns) per phase of a collective, inline for one phase.
pub(super) type Phases = SmallVec<[(Tier, u64, u64); 1]>;

/// One collective call on a communicator: who arrived, the largest buffers, and, once every
/// member arrived, its phases (latency and transfer per tier) and the one in progress.
pub(super) struct Instance {
    /// Communicator key.
    pub(super) key: u32,
    /// (unit, local op) of every member arrived so far.
    pub(super) arrivals: Arrivals,
    /// Largest send buffer over the arrivals.
    pub(super) max_in: u64,
    /// Largest receive buffer over the arrivals.
    pub(super) max_out: u64,
    /// Every buffer a multiple of 512 bytes.
    pub(super) aligned: bool,
    /// The first member's collective (its view of the group decides the shape; later
    /// members are checked against it), kept here so that no member reads another's state.
    pub(super) first: Option<CollectiveOp>,
    /// When every member had arrived (`None` before): written into the members' spans when
    /// the collective completes, with their end times.
    pub(super) transfer_start_ns: Option<u64>,
    /// (tier, latency ns, transfer ns) per phase.
    pub(super) phases: Phases,
    /// The phase in progress.
    pub(super) phase: usize,
}

impl Instance {
    /// A fresh instance of communicator `key`: no member arrived, no phase planned.
    pub(super) fn new(key: u32) -> Self {
        Self {
            key,
            arrivals: Arrivals::new(),
            max_in: 0,
            max_out: 0,
            aligned: true,
            first: None,
            transfer_start_ns: None,
            phases: Phases::new(),
            phase: 0,
        }
    }
}

/// Slot of an id whose instance is released.
const GONE: u32 = u32::MAX;

/// Live collective instances, addressed by id ([`Instances::push`]).
#[derive(Default)]
pub(super) struct Instances {
    /// Per id: its slot in `live` ([`GONE`] once released).
    slot: Vec<u32>,
    /// Instance storage; a released slot is on `free` until reused.
    live: Vec<Instance>,
    /// Released slots.
    free: Vec<u32>,
}

impl Instances {
    /// Number of ids handed out (live or released).
    pub(super) fn len(&self) -> usize {
        self.slot.len()
    }

    /// Stores `inst` under a new id (the next in creation order) and returns the id.
    pub(super) fn push(&mut self, inst: Instance) -> u32 {
        let id = self.slot.len() as u32;
        let s = match self.free.pop() {
            Some(s) => {
                self.live[s as usize] = inst;
                s
            }
            None => {
                self.live.push(inst);
                self.live.len() as u32 - 1
            }
        };
        self.slot.push(s);
        id
    }

    /// Releases instance `id` (completed: no event or table refers to it any more) and
    /// returns it; its storage is reused by a later instance. `None` when already released.
    pub(super) fn release(&mut self, id: u32) -> Option<Instance> {
        let s = *self.slot.get(id as usize).filter(|&&s| s != GONE)?;
        self.slot[id as usize] = GONE;
        self.free.push(s);
        Some(std::mem::replace(
            &mut self.live[s as usize],
            Instance::new(0),
        ))
    }

    /// Instance `id`, or `None` when released.
    pub(super) fn get(&self, id: usize) -> Option<&Instance> {
        let s = *self.slot.get(id).filter(|&&s| s != GONE)?;
        Some(&self.live[s as usize])
    }

    /// The live instances with their ids, in id (creation) order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (usize, &Instance)> {
        self.slot
            .iter()
            .enumerate()
            .filter(|&(_, &s)| s != GONE)
            .map(|(id, &s)| (id, &self.live[s as usize]))
    }
}

impl std::ops::Index<usize> for Instances {
    type Output = Instance;
    /// Instance `id`; panics when it was released (an engine bug: released instances are
    /// complete and referred to by nothing).
    fn index(&self, id: usize) -> &Instance {
        match self.get(id) {
            Some(i) => i,
            None => panic!("internal: collective instance {id} used after completion"),
        }
    }
}

impl std::ops::IndexMut<usize> for Instances {
    fn index_mut(&mut self, id: usize) -> &mut Instance {
        match self.slot.get(id).filter(|&&s| s != GONE) {
            Some(&s) => &mut self.live[s as usize],
            None => panic!("internal: collective instance {id} used after completion"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(key: u32) -> Instance {
        Instance {
            arrivals: smallvec::smallvec![(key, 0)],
            ..Instance::new(key)
        }
    }

    /// Ids keep counting; storage is reused; released ids are gone from lookups and walks.
    #[test]
    fn ids_stay_storage_is_reused() {
        let mut all = Instances::default();
        assert_eq!((all.push(instance(10)), all.push(instance(11))), (0, 1));
        assert_eq!(all.release(0).map(|i| i.key), Some(10));
        assert!(all.release(0).is_none() && all.get(0).is_none());
        assert_eq!(all.push(instance(12)), 2);
        assert_eq!(all.live.len(), 2, "the released slot is reused");
        assert_eq!((all[1].key, all[2].key, all.len()), (11, 12, 3));
        all[2].phase = 3;
        let walk: Vec<(usize, u32, usize)> =
            all.iter().map(|(id, i)| (id, i.key, i.phase)).collect();
        assert_eq!(walk, vec![(1, 11, 0), (2, 12, 3)]);
    }
}
