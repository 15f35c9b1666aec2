//! hpfsdp-reference: the bit-exact CPU reference executor.
//!
//! Placeholder until the reference-executor issue lands.

/// The crate version, recorded next to golden digests.
pub const REFERENCE_VERSION: &str = env!("CARGO_PKG_VERSION");
