//! How the Muon replica domain is cut into subgroups: the [`ReplicaSubgroupRule`] named by
//! `[optimizer.muon] replica_subgroups`.
//!
//! Its own module because both the scenario loader (which validates the key) and the Muon plan
//! (which applies the rule, [`crate::muon::subgroups`]) need it: keeping it in either would
//! make `scenario` and `muon` import each other.

use serde::{Deserialize, Serialize};

/// How replica subgroups are sized (`[optimizer.muon] replica_subgroups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaSubgroupRule {
    /// The paper's devices-per-machine rule (or `replica_count`), one size for every axis.
    #[default]
    Launcher,
    /// Per axis, the replica-group members that share a machine.
    Topology,
}

impl ReplicaSubgroupRule {
    /// Every rule, in a stable order.
    pub const ALL: [ReplicaSubgroupRule; 2] =
        [ReplicaSubgroupRule::Launcher, ReplicaSubgroupRule::Topology];

    /// The name in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            ReplicaSubgroupRule::Launcher => "launcher",
            ReplicaSubgroupRule::Topology => "topology",
        }
    }

    /// Parses a scenario-file name (`None` for an unknown one).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }
}
