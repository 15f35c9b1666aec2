//! Device kernels by cost class: what one compute op of a step program really launches.
//!
//! A compute op of a [`crate::program::StepProgram`] stands for many kernels (a decoder layer's
//! forward is a dozen GEMMs, norms, RoPE, attention, activations...). Their achievable rates
//! differ by orders of magnitude: a large square GEMM runs near the device's peak, a GEMM with a
//! small `m` far below it, and a norm or cast is bound by HBM bandwidth. Summing FLOPs and bytes
//! of a whole segment before one roofline hides every memory-bound kernel, so each op carries its
//! **kernel mix**: a list of [`KernelWork`] entries, each one kernel class with the shape its rate
//! depends on, its launch count and its total FLOPs and bytes. The simulator costs every entry
//! on its own (per-class tables in the hardware profile) and adds them up.
//!
//! Mixes are stored once per program in [`crate::program::StepProgram::kernel_mixes`], keyed by
//! a content hash ([`MixId`]), so the many identical layers of a step share one entry and
//! [`crate::program::ComputeWork`] stays a small `Copy` value.

use serde::{Deserialize, Serialize};

/// How a grouped expert GEMM kernel tiles its per-expert products, where the rate of the
/// dense GEMM with the same rows does not describe it. PyTorch's `torch._grouped_mm` on
/// Hopper (`ATen/native/cuda/GroupMM.cu`: CUTLASS 3 grouped GEMM, a 128 x 256 x 64 tile with
/// the cooperative schedule, 64 x 128 x 128 when an expert's rows or the output columns are at
/// most 128) shows two effects the dense table cannot:
/// - each expert's rows are padded to whole row tiles. Routing gives experts uneven token
///   counts, so the padding is half a tile per expert on average (none when every expert
///   gets a multiple of the tile, as in a balanced micro-benchmark);
/// - the weight gradient (`dW = x^T dy`, tokens as the reduction dimension) runs a short
///   reduction per expert (one expert's tokens), so each output tile's epilogue (writing the
///   expert's gradient) is not hidden behind its main loop: memory time adds to math time
///   instead of overlapping it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub struct GroupedTiling {
    /// Rows each expert's product is padded to (the kernel's M tile); 0: no padding modelled.
    pub row_tile: u64,
    /// The launch computes weight gradients (tokens are the reduction dimension).
    pub weight_grad: bool,
}

impl GroupedTiling {
    /// `torch._grouped_mm`'s tiling on Hopper for experts of `tokens_per_group` rows and `n`
    /// output columns (`GroupMM.cu`'s `small` test picks the 64-row tile).
    pub fn torch_sm90(tokens_per_group: u64, n: u64, weight_grad: bool) -> Self {
        let small = tokens_per_group <= 128 || n <= 128;
        GroupedTiling {
            row_tile: if small { 64 } else { 128 },
            weight_grad,
        }
    }

    /// No tiling effect modelled (the dense rate of all the launch's rows).
    pub fn is_default(&self) -> bool {
        *self == GroupedTiling::default()
    }

    /// Rows each expert's product occupies on average: `tokens_per_group` plus half a tile of
    /// padding (routing leaves the count's remainder uniform over the tile), at least one
    /// tile; `tokens_per_group` itself without a tile or for weight gradients (whose tokens
    /// are the reduction dimension, not rows).
    pub fn padded_rows(&self, tokens_per_group: u64) -> f64 {
        if self.row_tile == 0 || self.weight_grad {
            return tokens_per_group as f64;
        }
        let tile = self.row_tile as f64;
        (tokens_per_group as f64 + (tile - 1.0) / 2.0).max(tile)
    }
}

/// The cost class of a device kernel, with the shape its achievable FLOP rate depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "kebab-case")]
pub enum KernelClass {
    /// Dense matmul `C[m, n] = A[m, k] · B[k, n]`, `batch` independent products of that shape
    /// (1 for a plain GEMM; the matrices of a batched Newton-Schulz step otherwise).
    Gemm {
        /// Rows of the output (tokens for a projection).
        m: u64,
        /// Columns of the output (output features).
        n: u64,
        /// Reduction length (input features).
        k: u64,
        /// Independent products in one launch.
        batch: u64,
    },
    /// Grouped expert GEMM: `groups` products of `[tokens_per_group, k] · [k, n]` in one launch
    /// (its rate follows the tokens each expert receives, not the total).
    GroupedGemm {
        /// Experts in the launch.
        groups: u64,
        /// Tokens per expert (rows of each product).
        tokens_per_group: u64,
        /// Output features.
        n: u64,
        /// Input features.
        k: u64,
        /// How the kernel tiles each expert's product ([`GroupedTiling`]); the default
        /// charges the dense rate of `groups x tokens_per_group` rows.
        #[serde(default, skip_serializing_if = "GroupedTiling::is_default")]
        tiling: GroupedTiling,
    },
    /// Fused (flash) attention core: `batch` sequences of `seq` query tokens against `seq`
    /// keys (causal), `heads` query heads of `head_dim`.
    Attention {
        /// Sequences in the launch.
        batch: u64,
        /// Tokens per sequence on this rank.
        seq: u64,
        /// Query heads on this rank.
        heads: u64,
        /// Head dimension.
        head_dim: u64,
    },
    /// A memory-bound kernel: norms, RoPE, activations, residual adds, casts, softmax, router
    /// top-k, permutes, loss, optimizer element-wise (foreach) kernels, embedding lookups.
    MemoryBound,
    /// A `multi_tensor_apply` kernel of a `torch._foreach_*` operator (the optimizer's
    /// element-wise passes): memory-bound, but at its own fraction of the HBM bandwidth (it
    /// walks tensor lists in 65,536-element chunks).
    MultiTensorApply,
    /// Memory-bound kernels that gather, mask, broadcast or scatter (`masked_fill_`,
    /// `index`, `index_put_`, a `[rows, hidden] x [rows, 1]` multiply): non-vectorized
    /// element-wise kernels at their own fraction of the HBM bandwidth.
    IndexedElementwise,
    /// Element-wise kernels whose operands are broadcast, non-contiguous views or widened
    /// from bf16 to f32 (a norm's `x.float()` and `x * rsqrt(...)`, rotary embedding on the
    /// transposed q and k): TensorIterator's non-vectorized `elementwise_kernel` path, at its
    /// own fraction of the HBM bandwidth.
    StridedElementwise,
}

impl KernelClass {
    /// Whether the class is memory-bound element-wise work (vector cores, not GEMM units).
    pub fn is_memory_bound(&self) -> bool {
        matches!(
            self,
            KernelClass::MemoryBound
                | KernelClass::MultiTensorApply
                | KernelClass::IndexedElementwise
                | KernelClass::StridedElementwise
        )
    }

    /// Short kebab-case name of the class (`gemm`, `grouped-gemm`, `attention`, `memory-bound`).
    pub fn name(&self) -> &'static str {
        match self {
            KernelClass::Gemm { .. } => "gemm",
            KernelClass::GroupedGemm { .. } => "grouped-gemm",
            KernelClass::Attention { .. } => "attention",
            KernelClass::MemoryBound => "memory-bound",
            KernelClass::MultiTensorApply => "multi-tensor-apply",
            KernelClass::IndexedElementwise => "indexed-elementwise",
            KernelClass::StridedElementwise => "strided-elementwise",
        }
    }
}

/// `count` launches of one kernel class; `flops` and `hbm_bytes` are totals over the launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KernelWork {
    /// What the kernels are and their shape.
    pub class: KernelClass,
    /// Launches (each costs host launch time and device launch latency).
    pub count: u32,
    /// Floating-point operations of all launches (2 per multiply-accumulate).
    pub flops: u64,
    /// HBM bytes read plus written by all launches.
    pub hbm_bytes: u64,
}

impl KernelWork {
    /// `count` memory-bound launches moving `hbm_bytes` in total (and doing `flops`).
    pub fn memory_bound(count: u32, flops: u64, hbm_bytes: u64) -> Self {
        Self {
            class: KernelClass::MemoryBound,
            count,
            flops,
            hbm_bytes,
        }
    }

    /// One GEMM launch of `batch` products `[m, k] · [k, n]` on `elem_bytes`-byte operands:
    /// `2 m n k batch` FLOPs, reading both inputs and writing the output once.
    pub fn gemm(m: u64, n: u64, k: u64, batch: u64, elem_bytes: u64) -> Self {
        let flops = 2u64
            .saturating_mul(m)
            .saturating_mul(n)
            .saturating_mul(k)
            .saturating_mul(batch);
        let elems = (m.saturating_mul(k))
            .saturating_add(k.saturating_mul(n))
            .saturating_add(m.saturating_mul(n))
            .saturating_mul(batch);
        Self {
            class: KernelClass::Gemm { m, n, k, batch },
            count: 1,
            flops,
            hbm_bytes: elems.saturating_mul(elem_bytes),
        }
    }

    /// The same work repeated `times` times (more launches, scaled FLOPs and bytes).
    pub fn repeated(self, times: u32) -> Self {
        Self {
            count: self.count.saturating_mul(times),
            flops: self.flops.saturating_mul(times as u64),
            hbm_bytes: self.hbm_bytes.saturating_mul(times as u64),
            ..self
        }
    }
}

/// Content hash of a kernel mix: equal lists get equal ids in every program and run.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
pub struct MixId(pub u64);

impl MixId {
    /// The id of `kernels` (blake3 of their canonical serialization, first 8 bytes).
    pub fn of(kernels: &[KernelWork]) -> Self {
        let mut hasher = blake3::Hasher::new();
        for k in kernels {
            let (tag, a, b, c, d) = match k.class {
                KernelClass::Gemm { m, n, k, batch } => (1u8, m, n, k, batch),
                KernelClass::GroupedGemm {
                    groups,
                    tokens_per_group,
                    n,
                    k,
                    tiling,
                } => {
                    // The default tiling hashes as before, so mixes without one keep their ids.
                    if !tiling.is_default() {
                        hasher.update(&tiling.row_tile.to_le_bytes());
                        hasher.update(&[u8::from(tiling.weight_grad)]);
                    }
                    (2, groups, tokens_per_group, n, k)
                }
                KernelClass::Attention {
                    batch,
                    seq,
                    heads,
                    head_dim,
                } => (3, batch, seq, heads, head_dim),
                KernelClass::MemoryBound => (4, 0, 0, 0, 0),
                KernelClass::MultiTensorApply => (5, 0, 0, 0, 0),
                KernelClass::IndexedElementwise => (6, 0, 0, 0, 0),
                KernelClass::StridedElementwise => (7, 0, 0, 0, 0),
            };
            hasher.update(&[tag]);
            for v in [a, b, c, d, k.count as u64, k.flops, k.hbm_bytes] {
                hasher.update(&v.to_le_bytes());
            }
        }
        let bytes = hasher.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&bytes.as_bytes()[..8]);
        MixId(u64::from_le_bytes(first))
    }
}

/// Totals of a kernel list: (FLOPs, HBM bytes, launches).
pub fn totals(kernels: &[KernelWork]) -> (u64, u64, u32) {
    kernels.iter().fold((0u64, 0u64, 0u32), |(f, b, c), k| {
        (
            f.saturating_add(k.flops),
            b.saturating_add(k.hbm_bytes),
            c.saturating_add(k.count),
        )
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn grouped_rows_pad_half_a_tile_and_weight_gradients_do_not() {
        let t = GroupedTiling::torch_sm90(256, 1536, false);
        assert_eq!(t.row_tile, 128);
        assert_eq!(t.padded_rows(256), 256.0 + 63.5);
        // Few rows per expert: the 64-row tile, and at least one whole tile.
        let small = GroupedTiling::torch_sm90(16, 1536, false);
        assert_eq!(small.row_tile, 64);
        assert_eq!(small.padded_rows(16), 64.0);
        assert_eq!(GroupedTiling::torch_sm90(4096, 64, false).row_tile, 64);
        // Tokens are the reduction of a weight gradient: no row padding.
        assert_eq!(
            GroupedTiling::torch_sm90(256, 1536, true).padded_rows(256),
            256.0
        );
        assert_eq!(GroupedTiling::default().padded_rows(256), 256.0);
        assert!(GroupedTiling::default().is_default());
        assert!(!t.is_default());
    }

    #[test]
    fn a_default_tiling_keeps_the_mix_id() {
        let work = |tiling| KernelWork {
            class: KernelClass::GroupedGemm {
                groups: 128,
                tokens_per_group: 256,
                n: 1536,
                k: 2048,
                tiling,
            },
            count: 1,
            flops: 1,
            hbm_bytes: 1,
        };
        let plain = MixId::of(&[work(GroupedTiling::default())]);
        let tiled = MixId::of(&[work(GroupedTiling::torch_sm90(256, 1536, false))]);
        let grad = MixId::of(&[work(GroupedTiling::torch_sm90(256, 1536, true))]);
        assert_ne!(plain, tiled);
        assert_ne!(tiled, grad);
        // Serialized without the field when it is the default (outputs unchanged).
        let json = serde_json::to_string(&work(GroupedTiling::default()).class).unwrap();
        assert!(!json.contains("tiling"), "{json}");
    }

    use super::*;

    #[test]
    fn gemm_counts_two_flops_per_mac_and_reads_each_operand_once() {
        let g = KernelWork::gemm(4, 8, 16, 2, 2);
        assert_eq!(g.flops, 2 * 4 * 8 * 16 * 2);
        assert_eq!(g.hbm_bytes, (4 * 16 + 16 * 8 + 4 * 8) * 2 * 2);
        assert_eq!(g.count, 1);
        let r = g.repeated(3);
        assert_eq!(
            (r.count, r.flops, r.hbm_bytes),
            (3, 3 * g.flops, 3 * g.hbm_bytes)
        );
    }

    #[test]
    fn mix_ids_follow_content_only() {
        let a = [
            KernelWork::gemm(4, 8, 16, 1, 2),
            KernelWork::memory_bound(2, 0, 64),
        ];
        let b = a;
        assert_eq!(MixId::of(&a), MixId::of(&b));
        let c = [a[1], a[0]];
        assert_ne!(MixId::of(&a), MixId::of(&c), "order is part of the content");
        assert_ne!(MixId::of(&a), MixId::of(&a[..1]));
        assert_eq!(totals(&a), (a[0].flops, a[0].hbm_bytes + 64, 3));
    }
}
