//! hpfsdp-plan: the one plan model shared by the simulator, the reference executor and the
//! backends. Pure data and pure functions; no I/O beyond reading the files it is asked to parse.

pub mod collective;
pub mod error;
pub mod layout;
pub mod mesh;
pub mod model;
pub mod placement;
pub mod program;
pub mod topology;
pub mod transition;

pub use error::{PlanError, PlanResult};
pub use mesh::{DeviceMesh, MeshAxis};
pub use model::{DType, ExpertLayout, ModelConfig, ModelFamily, ModelIr, ModelOptions, ParamSpec};
pub use placement::{Placement, ReduceOp};
pub use topology::{DeviceLocation, Tier, Topology};
