//! Optimizers applied to local parameter shards.

pub mod adamw;

pub use adamw::{AdamState, AdamW, lerp, lerp_fma};
pub use hpfsdp_plan::optimizer_numerics::ElementwiseNumerics;
