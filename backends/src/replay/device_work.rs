//! What a compute or copy op enqueues on its device stream in replay's device walker
//! ([`crate::replay::device`]), and the device buffers it needs, allocated before the first
//! step so no allocation (which may synchronise the device) happens inside one.
//!
//! `--compute busy`: one spin kernel lasting the op's predicted duration.
//!
//! `--compute real`, from the op's kernel mix (`StepProgram::kernel_mixes`):
//! - a GEMM `[m, k] · [k, n]` x `batch` runs as a cuBLAS bf16 batched GEMM of that shape, once
//!   per launch of the entry;
//! - a grouped expert GEMM runs as `groups` products of `[tokens_per_group, k] · [k, n]`;
//! - attention runs as GEMMs of its FLOPs (cuBLAS has no fused attention): square products of
//!   side `clamp(round(cbrt(F / 2)), 1, 8192)` repeated to match the FLOPs;
//! - a memory-bound entry (and a compute op without a mix) is `count` device copies of
//!   `hbm_bytes / (2 count)` bytes each (every byte read once and written once);
//! - a copy op is `kernels` device copies of `bytes / kernels` bytes each.
//!
//! An operand whose bytes over the batch would exceed [`MAX_OPERAND_BYTES`] is shared by the
//! batch's products (stride 0): the FLOPs are kept, its memory traffic is understated.

use hpfsdp_plan::kernel::{KernelClass, KernelWork};
use hpfsdp_program::step::{ComputeWork, CopyWork, Payload, StepProgram};

use crate::device::gemm::GemmProblem;

/// Largest operand (over its batch) a real-mode GEMM allocates: 4 GiB.
pub const MAX_OPERAND_BYTES: u64 = 4 << 30;
/// Largest side of the square GEMMs that stand for attention.
pub const MAX_ATTENTION_SIDE: u64 = 8192;
/// Bytes of a bf16 element.
const BF16: u64 = 2;

/// One device launch of a compute or copy op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// A spin kernel of this many nanoseconds.
    Spin(u64),
    /// A bf16 batched GEMM.
    Gemm(GemmProblem),
    /// A device-to-device copy of this many bytes.
    Copy(u64),
}

/// The launches standing for op `i` of `program` in real mode (busy mode is one spin).
pub fn real_launches(program: &StepProgram, i: usize) -> Vec<Launch> {
    match &program.ops[i].payload {
        Payload::Compute(w) => compute_launches(program, w),
        // Driver memcpys are copies too: one device copy per kernel or memcpy call.
        Payload::Copy(CopyWork {
            bytes,
            kernels,
            memcpys,
            ..
        }) => copies(kernels + memcpys, *bytes),
        Payload::Collective(_) | Payload::Host { .. } => Vec::new(),
    }
}

fn compute_launches(program: &StepProgram, w: &ComputeWork) -> Vec<Launch> {
    let mix = w.mix.and_then(|id| program.kernel_mixes.get(&id));
    let Some(entries) = mix else {
        return copies(w.kernels, w.hbm_bytes / 2);
    };
    entries.iter().flat_map(entry_launches).collect()
}

/// `kernels` copies sharing `bytes` (at least one byte each when there is anything to copy).
fn copies(kernels: u32, bytes: u64) -> Vec<Launch> {
    let k = u64::from(kernels.max(1));
    if bytes == 0 {
        return Vec::new();
    }
    let each = bytes.div_ceil(k);
    (0..k).map(|_| Launch::Copy(each)).collect()
}

fn entry_launches(e: &KernelWork) -> Vec<Launch> {
    let count = e.count.max(1) as usize;
    let one = match e.class {
        KernelClass::Gemm { m, n, k, batch } => Launch::Gemm(problem(m, n, k, batch)),
        KernelClass::GroupedGemm {
            groups,
            tokens_per_group,
            n,
            k,
            ..
        } => Launch::Gemm(problem(tokens_per_group, n, k, groups)),
        KernelClass::Attention { .. } => {
            let per = e.flops / count as u64;
            let side = ((per as f64 / 2.0).cbrt().round() as u64).clamp(1, MAX_ATTENTION_SIDE);
            let repeats = (per as f64 / (2.0 * (side as f64).powi(3)))
                .round()
                .max(1.0) as u64;
            Launch::Gemm(problem(side, side, side, repeats))
        }
        KernelClass::MemoryBound
        | KernelClass::MultiTensorApply
        | KernelClass::IndexedElementwise
        | KernelClass::StridedElementwise => return copies(e.count, e.hbm_bytes / 2),
    };
    vec![one; count]
}

/// A batched problem with real strides, or stride 0 for an operand too big over the batch.
fn problem(m: u64, n: u64, k: u64, batch: u64) -> GemmProblem {
    let (m, n, k, batch) = (m.max(1), n.max(1), k.max(1), batch.max(1));
    let stride = |elems: u64| {
        if batch > 1 && elems.saturating_mul(batch).saturating_mul(BF16) > MAX_OPERAND_BYTES {
            0
        } else {
            elems as usize
        }
    };
    GemmProblem {
        m: m as usize,
        n: n as usize,
        k: k as usize,
        batch: batch as usize,
        stride_a: stride(m * k),
        stride_b: stride(k * n),
        stride_c: stride(m * n),
    }
}

/// Elements each operand of `p` spans (`(a, b, c)`).
pub fn operand_elements(p: &GemmProblem) -> (usize, usize, usize) {
    let span = |stride: usize, one: usize| stride * (p.batch - 1) + one;
    (
        span(p.stride_a, p.m * p.k),
        span(p.stride_b, p.k * p.n),
        span(p.stride_c, p.m * p.n),
    )
}

/// The scratch a stream needs: the largest operands of its GEMMs and its largest copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScratchNeed {
    /// bf16 elements of A, B and C.
    pub gemm: (usize, usize, usize),
    /// Bytes of the copy source and destination.
    pub copy_bytes: u64,
}

impl ScratchNeed {
    /// Grow to hold `launch`.
    pub fn add(&mut self, launch: &Launch) {
        match launch {
            Launch::Gemm(p) => {
                let (a, b, c) = operand_elements(p);
                self.gemm = (self.gemm.0.max(a), self.gemm.1.max(b), self.gemm.2.max(c));
            }
            Launch::Copy(bytes) => self.copy_bytes = self.copy_bytes.max(*bytes),
            Launch::Spin(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_mix_entries_become_launches_of_their_shapes() {
        let g = KernelWork::gemm(4096, 1024, 512, 1, 2);
        assert_eq!(
            entry_launches(&g),
            vec![Launch::Gemm(GemmProblem {
                m: 4096,
                n: 1024,
                k: 512,
                batch: 1,
                stride_a: 4096 * 512,
                stride_b: 512 * 1024,
                stride_c: 4096 * 1024,
            })]
        );
        let mb = KernelWork::memory_bound(4, 0, 800);
        assert_eq!(entry_launches(&mb), vec![Launch::Copy(100); 4]);
        let grouped = KernelWork {
            class: KernelClass::GroupedGemm {
                groups: 8,
                tokens_per_group: 64,
                n: 32,
                k: 16,
                tiling: Default::default(),
            },
            count: 1,
            flops: 2 * 8 * 64 * 32 * 16,
            hbm_bytes: 0,
        };
        let [Launch::Gemm(p)] = entry_launches(&grouped)[..] else {
            panic!("one grouped GEMM");
        };
        assert_eq!((p.m, p.n, p.k, p.batch), (64, 32, 16, 8));
        assert_eq!(
            operand_elements(&p),
            (8 * 64 * 16, 8 * 16 * 32, 8 * 64 * 32)
        );
        // Attention of 2 x 1024^3 FLOPs: one square product of side 1024.
        let att = KernelWork {
            class: KernelClass::Attention {
                batch: 1,
                seq: 1024,
                heads: 8,
                head_dim: 128,
            },
            count: 1,
            flops: 2 * 1024u64.pow(3),
            hbm_bytes: 0,
        };
        let [Launch::Gemm(p)] = entry_launches(&att)[..] else {
            panic!("one GEMM");
        };
        assert_eq!((p.m, p.batch), (1024, 1));
    }

    #[test]
    fn huge_batched_operands_are_shared() {
        let p = problem(8192, 8192, 8192, 64);
        assert_eq!((p.stride_a, p.stride_b, p.stride_c), (0, 0, 0));
        assert_eq!(
            operand_elements(&p),
            (8192 * 8192, 8192 * 8192, 8192 * 8192)
        );
        assert_eq!(copies(3, 10), vec![Launch::Copy(4); 3]);
        assert!(copies(3, 0).is_empty());
    }
}
