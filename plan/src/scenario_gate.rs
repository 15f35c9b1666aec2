//! The `[gate]` section of a scenario file: what `hpfsdp gate` checks beside the plan itself.

use serde::{Deserialize, Serialize};

/// `[gate]`: options of the CI gate for this scenario.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateSection {
    /// The scenario's tiny verification twin (a scenario under `scenarios/verify/`, relative
    /// to this file): the gate runs `verify` on it, since a production-size scenario is too
    /// large for the reference executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<String>,
}
