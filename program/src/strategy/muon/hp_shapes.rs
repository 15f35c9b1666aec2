//! Shape ids: what a HyperParallel slot part reads of its parameters, interned, so that
//! the part cache ([`super::hp_parts::PartCache`]) keys a part by the shapes of the
//! parameters it covers instead of by which parameters they are. Slots of different
//! expert-parallel classes hold different per-expert weights of the same shapes, and
//! build equal parts: keyed by plan batch and class, exp-d built 1,679 slot parts for 238
//! distinct ones.
//!
//! A parameter's shape id covers every field of its optimizer view (`OptParam`) and of
//! its Muon plan entry but its name, its FSDP unit and its EP owner; an owned set's id
//! ([`OwnedShape`]) covers what `hyperparallel::slot_part` reads of a rank's batch (its
//! execution slot and path, the replica coordinate, the first held parameter, the owned
//! parameters per NS memory batch and their shard owners' relay bytes), each parameter by
//! shape id. Equal ids therefore read equal values at every position, hence build equal
//! parts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Interned shape ids of parameters and owned sets, shared by every rank's build.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShapeIds {
    /// Per parameter (plan order), its shape id (built on first use).
    params: Arc<OnceLock<Vec<u32>>>,
    /// Owned sets by content.
    owned: Arc<Mutex<HashMap<OwnedShape, u32>>>,
}

/// What a slot part reads of a rank's batch, parameters by shape id.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct OwnedShape {
    /// Execution slot.
    pub(crate) slot: usize,
    /// Shard path (else local path).
    pub(crate) shard_path: bool,
    /// Replica coordinate.
    pub(crate) rc: Vec<usize>,
    /// The first held parameter (its replicate axes drive the replica broadcast).
    pub(crate) first_held: Option<u32>,
    /// The owned parameters.
    pub(crate) params: Vec<u32>,
    /// The owned members of every NS memory batch.
    pub(crate) units: Vec<Vec<u32>>,
    /// Per NS memory batch on the shard path: each shard owner's coordinate and relay bytes.
    pub(crate) sources: Vec<Vec<(Vec<usize>, u64)>>,
}

impl ShapeIds {
    /// The shape id of every parameter, in plan order (`ids` computes them on first use:
    /// `hyperparallel::param_shape_ids`).
    pub(crate) fn params(&self, ids: impl FnOnce() -> Vec<u32>) -> &[u32] {
        self.params.get_or_init(ids)
    }

    /// The id of an owned set (equal content, equal id).
    pub(crate) fn owned(&self, shape: OwnedShape) -> u32 {
        let mut m = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        let next = m.len() as u32;
        *m.entry(shape).or_insert(next)
    }
}
