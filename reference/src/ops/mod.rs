//! Transformer operators with hand-written backward passes.
//!
//! Every operator follows one pattern: a small `Copy` config struct (hyper-parameters only), a
//! borrowed `...Params` struct naming the weights it reads, and
//!
//! - `forward(&self, params, inputs...) -> RefResult<(output, Cache)>`
//! - `backward(&self, params, &cache, grad_output) -> RefResult<Grads>`
//!
//! where `Grads` holds the input gradient(s) and one gradient per weight. Parameters are not
//! owned by operators, so an FSDP runtime can hand in freshly gathered tensors each step.
//! Everything is generic over [`crate::Real`] (`f32` for execution, `f64` for finite-difference
//! checks) and sums in a fixed order: matmuls through [`crate::matmul`], other reductions
//! ascending over their index.
//!
//! Activations are token-major 2-D tensors `[tokens, features]`; a batch of sequences is stored
//! back to back (`tokens = batch * seq_len`).

pub mod activation;
pub mod attention;
pub mod embedding;
pub mod linear;
pub mod loss;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod rmsnorm;
pub mod rope;
pub mod self_attention;

pub use attention::{AttentionCache, AttentionGrads, CausalAttention};
pub use embedding::{Embedding, EmbeddingCache};
pub use linear::{Linear, LinearCache, LinearGrads};
pub use loss::{CrossEntropy, CrossEntropyCache};
pub use mla::{Mla, MlaCache, MlaGrads, MlaParams};
pub use mlp::{SwiGlu, SwiGluCache, SwiGluGrads, SwiGluParams};
pub use moe::{ExpertWire, Moe, MoeCache, MoeGrads, MoeParams};
pub use rmsnorm::{RmsNorm, RmsNormCache, RmsNormGrads};
pub use rope::Rope;
pub use self_attention::{
    SelfAttention, SelfAttentionCache, SelfAttentionGrads, SelfAttentionParams,
};
