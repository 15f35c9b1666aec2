//! hpfsdp-plan: the one plan model (model IR, mesh, topology, placements, layouts, transitions,
//! planner, FSDP and Muon plans, scenario files) under the step program (`hpfsdp-program`), the
//! simulator, the reference executor and the backends. Pure data and pure functions; no I/O
//! beyond reading the files it is asked to parse.

pub mod collective;
pub mod digest;
pub mod error;
pub mod fsdp;
pub mod glob;
pub mod input_file;
pub mod kernel;
pub mod layout;
pub mod limits;
pub mod mesh;
pub mod mesh_groups;
pub mod model;
pub mod muon;
pub mod optimizer_numerics;
pub mod overrides;
pub mod placement;
pub mod planner;
pub mod replica_subgroup_rule;
pub mod scenario;
pub mod scenario_gate;
pub mod toml_lines;
pub mod topology;
pub mod transition;
pub mod whatif;

pub use collective::CollectiveKind;
pub use error::{PlanError, PlanResult};
pub use layout::{
    Layout, chunk_range, combine_partials, gather_tensor, shard_tensor, sum_partials,
};
pub use mesh::{DeviceMesh, MeshAxis};
pub use model::{DType, ExpertLayout, ModelConfig, ModelFamily, ModelIr, ModelOptions, ParamSpec};
pub use placement::{Placement, ReduceOp};
pub use topology::{DeviceLocation, Tier, Topology};
pub use transition::{
    TransitionAction, TransitionPlan, TransitionStep, classify_transition, lower_transition,
};
