//! `torch.optim.AdamW`'s default step on a GPU: the `foreach` implementation
//! (`torch/optim/adamw.py` -> `adam.py::_multi_tensor_adam`, `decoupled_weight_decay=True`),
//! what PyTorch FSDP2 users run unless they ask for `fused=True`.
//!
//! Over the whole parameter list of a group (one group per device and dtype) it runs eight
//! `torch._foreach_*` operators, each one pass over every tensor of its lists:
//!
//! | pass | operator | reads | writes |
//! | --- | --- | --- | --- |
//! | 1 | `_foreach_mul_(params, 1 - lr wd)` (only when `weight_decay != 0`) | param | param |
//! | 2 | `_foreach_lerp_(exp_avgs, grads, 1 - beta1)` | exp_avg, grad | exp_avg |
//! | 3 | `_foreach_mul_(exp_avg_sqs, beta2)` | exp_avg_sq | exp_avg_sq |
//! | 4 | `_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)` | exp_avg_sq, grad | exp_avg_sq |
//! | 5 | `exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)` (a new list: a temporary) | exp_avg_sq | temporary |
//! | 6 | `_foreach_div_(exp_avg_sq_sqrt, bias_correction2_sqrt)` | temporary | temporary |
//! | 7 | `_foreach_add_(exp_avg_sq_sqrt, eps)` | temporary | temporary |
//! | 8 | `_foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt, step_size)` | param, exp_avg, temporary | param |
//!
//! 80 bytes per fp32 element in all: against the 28 of one fused pass. The moments and the
//! temporary have the parameter's dtype (`torch.zeros_like(p)`). The temporary holds one
//! more copy of every parameter until the last pass, which is what sets the peak of a step
//! whose activations are gone by then (one H200, `shared/calibration/h200`: Qwen3-14B-shaped,
//! 8 layers, 4.198 B fp32 parameters: params + grads + two moments + temporary = 20 B per
//! parameter = 83.97 GB, measured peak allocated 84.04 GB).
//!
//! Each pass launches `multi_tensor_apply` kernels (`ATen/native/cuda/MultiTensorApply.cuh`):
//! tensors are cut into chunks of 65,536 elements, one thread block per chunk, and a launch
//! is issued when 320 blocks are queued or when the launch's tensor list is full at a
//! tensor's last chunk (110, 64, 48, 36, 30 tensors for lists of depth 1-5; 96 at depth 1
//! with a scalar list). [`launches`] replays that rule: 201, 98 and 149 launches per pass
//! for the three H200 runs' parameter lists, as their kernel tables count (1,608 = 8 x 201,
//! 784 = 8 x 98, 1,192 = 8 x 149).

use hpfsdp_plan::model::DType;

/// Elements per `multi_tensor_apply` chunk (one thread block each; `kChunkSize`).
pub const CHUNK_ELEMS: u64 = 65_536;
/// Thread blocks per `multi_tensor_apply` launch (`depth_to_max_blocks`).
pub const MAX_BLOCKS_PER_LAUNCH: u64 = 320;

/// Tensors per launch by list depth (`depth_to_max_tensors`).
const MAX_TENSORS: [u64; 5] = [110, 64, 48, 36, 30];
/// Tensors per launch of a depth-1 list with a scalar list (`depth_to_max_tensors_scalarlist`).
const MAX_TENSORS_SCALARLIST: [u64; 5] = [96, 64, 48, 36, 30];

/// One `_foreach_*` pass: its name, list depth and bytes per element read and written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForeachPass {
    /// The operator (`_foreach_lerp_`, ...).
    pub name: &'static str,
    /// Tensor lists the kernel walks (inputs and outputs).
    pub depth: usize,
    /// Whether the kernel takes a per-tensor scalar list (bias corrections).
    pub scalar_list: bool,
    /// Bytes read per element.
    pub read_bytes: u64,
    /// Bytes written per element.
    pub write_bytes: u64,
    /// This pass allocates the step's temporary (`_foreach_sqrt`).
    pub allocates_temporary: bool,
    /// This pass is the temporary's last use (`_foreach_addcdiv_`).
    pub frees_temporary: bool,
}

/// The passes of one step for parameters of dtype `param` and gradients of dtype `grad`
/// (moments and temporary in `param`), the weight-decay pass first when `weight_decay`.
pub fn passes(param: DType, grad: DType, weight_decay: bool) -> Vec<ForeachPass> {
    let (p, g) = (param.bytes(), grad.bytes());
    let pass = |name, depth, scalar_list, read_bytes, write_bytes| ForeachPass {
        name,
        depth,
        scalar_list,
        read_bytes,
        write_bytes,
        allocates_temporary: false,
        frees_temporary: false,
    };
    let mut out = Vec::with_capacity(8);
    if weight_decay {
        out.push(pass("_foreach_mul_(params)", 1, false, p, p));
    }
    out.push(pass("_foreach_lerp_", 2, false, p + g, p));
    out.push(pass("_foreach_mul_(exp_avg_sqs)", 1, false, p, p));
    out.push(pass("_foreach_addcmul_", 3, false, p + g, p));
    out.push(ForeachPass {
        allocates_temporary: true,
        ..pass("_foreach_sqrt", 2, false, p, p)
    });
    out.push(pass("_foreach_div_", 1, true, p, p));
    out.push(pass("_foreach_add_", 1, false, p, p));
    out.push(ForeachPass {
        frees_temporary: true,
        ..pass("_foreach_addcdiv_", 3, true, 3 * p, p)
    });
    out
}

/// `multi_tensor_apply` launches of one pass of list depth `depth` over tensors of
/// `numels` elements (in list order; empty tensors are skipped, as torch does).
pub fn launches(numels: impl IntoIterator<Item = u64>, depth: usize, scalar_list: bool) -> u64 {
    let table = if scalar_list {
        &MAX_TENSORS_SCALARLIST
    } else {
        &MAX_TENSORS
    };
    let max_tensors = table[depth.clamp(1, 5) - 1];
    let (mut blocks, mut tensors, mut count) = (0u64, 0u64, 0u64);
    for n in numels.into_iter().filter(|&n| n > 0) {
        tensors += 1;
        let mut chunks = n.div_ceil(CHUNK_ELEMS);
        while chunks > 0 {
            let take = chunks.min(MAX_BLOCKS_PER_LAUNCH - blocks);
            blocks += take;
            chunks -= take;
            let last = chunks == 0;
            if blocks == MAX_BLOCKS_PER_LAUNCH || (last && tensors == max_tensors) {
                count += 1;
                blocks = 0;
                // A tensor cut by a launch continues as the first tensor of the next one.
                tensors = u64::from(!last);
            }
        }
    }
    count + u64::from(blocks > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parameter numels of a dense Qwen3 model in `model.parameters()` order (untied).
    fn dense(h: u64, i: u64, heads: u64, kv: u64, hd: u64, vocab: u64, layers: u64) -> Vec<u64> {
        let mut ps = vec![vocab * h];
        for _ in 0..layers {
            let q = heads * hd * h;
            let k = kv * hd * h;
            ps.extend([q, k, k, q, hd, hd, i * h, i * h, i * h, h, h]);
        }
        ps.extend([h, vocab * h]);
        ps
    }

    #[test]
    fn launches_match_the_h200_kernel_tables() {
        // shared/calibration/h200/profiles/kernels-*.csv: multi_tensor_apply kernels per
        // step over eight passes.
        let q14 = dense(5120, 17408, 40, 8, 128, 151_936, 8);
        assert_eq!(q14.iter().sum::<u64>(), 4_198_325_248);
        let q17 = dense(2048, 6144, 16, 8, 128, 151_936, 28);
        assert_eq!(q17.iter().sum::<u64>(), 2_031_739_904);
        for (ps, per_pass) in [(q14, 201), (q17, 98)] {
            let total: u64 = passes(DType::F32, DType::F32, true)
                .iter()
                .map(|p| launches(ps.iter().copied(), p.depth, p.scalar_list))
                .sum();
            assert_eq!(total, 8 * per_pass);
        }
    }

    #[test]
    fn a_full_tensor_list_launches_early() {
        // 40 one-chunk tensors at depth 4 (36 per launch): two launches, not one.
        assert_eq!(launches(vec![10; 40], 4, false), 2);
        assert_eq!(launches(vec![10; 40], 1, false), 1);
        // 321 chunks of one tensor: two launches.
        assert_eq!(launches([321 * CHUNK_ELEMS], 1, false), 2);
        assert_eq!(launches(Vec::<u64>::new(), 1, false), 0);
        assert_eq!(launches([0, 0], 1, false), 0);
    }

    #[test]
    fn eighty_bytes_per_fp32_element() {
        let b: u64 = passes(DType::F32, DType::F32, true)
            .iter()
            .map(|p| p.read_bytes + p.write_bytes)
            .sum();
        assert_eq!(b, 80);
        assert_eq!(passes(DType::F32, DType::F32, false).len(), 7);
    }
}
