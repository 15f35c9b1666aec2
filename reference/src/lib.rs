//! hpfsdp-reference: the bit-exact CPU reference executor.
//!
//! "Bit-exact" means the same inputs give the same bits on every run, thread count and machine:
//!
//! - [`matmul`]: fixed reduction order with one fused multiply-add per step, parallel only over
//!   output rows; hardware FMA kernels (AVX-512 / AVX2) selected at run time, identical bits to
//!   the portable path and to the naive triple loop.
//! - [`reduce`]: sums over an index in ascending order, on one thread.
//! - [`real`]: `f32`/`f64` with transcendental functions from the pure-Rust `libm`.
//! - [`bf16`]: explicit round-to-nearest-even from f32 only.
//! - [`rng`]: random values keyed by `(seed, stream, global element index)`, identical under any
//!   sharding.
//! - [`ops`]: transformer operators with hand-written backward passes, checked against f64
//!   finite differences ([`gradcheck`]); [`model`] assembles them into a small decoder.
//! - [`bench`]: the matmul benchmark (`cargo run --release -p hpfsdp-reference --example
//!   matmul_bench`).
//!
//! ```
//! use hpfsdp_reference::{ModelConfig, TinyModel};
//!
//! let config = ModelConfig::tiny();
//! let model = TinyModel::new(config)?;
//! let params = config.init_params::<f32>(42)?;
//! let ids = [1, 5, 9, 2];
//! let targets = [5, 9, 2, 7];
//! let (loss, grads) = model.loss_and_grads(&params, &ids, &targets, 4)?;
//! assert!(loss.is_finite());
//! assert_eq!(grads.names(), params.names());
//! # Ok::<(), hpfsdp_reference::RefError>(())
//! ```

pub mod bench;
pub mod bf16;
pub mod error;
pub mod gradcheck;
pub mod mat_ref;
pub mod matmul;
mod matmul_avx512;
mod matmul_pack;
pub mod model;
pub mod muon;
pub mod ops;
pub mod optim;
pub mod real;
pub mod reduce;
pub mod rng;
pub mod runtime;
pub mod tensor;
pub mod verify;

pub use error::{RefError, RefResult};
pub use matmul::{Isa, MatRef, matmul, matmul_nt, matmul_tn};
pub use model::{MlaConfig, ModelConfig, MoeConfig, ParamSet, ParamSpec, TinyModel};
pub use real::Real;
pub use rng::KeyedRng;
pub use tensor::Tensor;

/// The crate version, recorded next to golden digests.
pub const REFERENCE_VERSION: &str = env!("CARGO_PKG_VERSION");
