//! Optimizers applied to local parameter shards.

pub mod adamw;

pub use adamw::{AdamState, AdamW, lerp};
