//! Layout-driven distributed Muon on local tensors (paper section 6).
//!
//! - [`presets`]: the named presets with their exact constants and the scenario mapping.
//! - [`newton_schulz`]: bf16-per-operation Newton-Schulz, per matrix and shape-fused batched.
//! - [`torch_cpu`]: torch's own CPU GEMM and norm orders (the `addmm_cpublas`/`addmm_onednn` Newton-Schulz).
//! - [`update`]: momentum, in-update scaling and the decoupled-weight-decay apply.
//! - [`routing`], [`adapters`]: which parameters are Muon matrices and how fused matrices split.
//! - [`orthogonalize`]: the split → Newton-Schulz → scale → restore stage every executor shares.
//! - [`domains`]: each parameter's mesh, layout, shard and replica axes, and process groups.
//! - [`single`]: single-device Muon on full tensors (the definition).
//! - [`naive`]: naive distributed Muon (every rank gathers and orthogonalizes everything).
//! - [`distributed`]: the deduplicated engine replaying the Muon plan's communication.
//! - [`chained`]: AdamW for the non-matrix parameters, then Muon.
//! - [`harness`]: plans a scenario and runs the three executors for bitwise comparison.
//! - [`dedup_stats`], [`accuracy`]: per-rank state/compute predictions and NS accuracy vs SVD.

pub mod accuracy;
pub mod adapters;
pub mod chained;
pub mod dedup_stats;
pub mod distributed;
pub mod domains;
pub mod error;
pub mod harness;
pub mod naive;
pub mod newton_schulz;
pub mod orthogonalize;
pub mod presets;
pub mod routing;
pub mod single;
pub mod torch_cpu;
pub mod update;

pub use accuracy::{NsAccuracy, accuracy_table, ns_accuracy};
pub use adapters::{AdapterRules, MatrixSplit, Part};
pub use chained::{AdamwPart, ChainedOptimizer, SingleDeviceChained, adamw_from_options};
pub use dedup_stats::{DedupStats, RankLoad, dedup_stats};
pub use distributed::{DistributedMuon, StepReport};
pub use domains::{MuonDomains, ParamDomain};
pub use error::{MuonError, MuonResult};
pub use harness::{DistributedRun, MuonSetup};
pub use naive::NaiveDistributedMuon;
pub use newton_schulz::{newton_schulz, newton_schulz_batched};
pub use orthogonalize::{NsKernel, OrthoJob, orthogonalize};
pub use presets::{
    MomentumForm, MuonConfig, MuonPreset, NormMode, NsConfig, NsOpOrder, UpdateScale,
};
pub use routing::{MatrixStack, RoutedParam, route_params};
pub use single::SingleDeviceMuon;
