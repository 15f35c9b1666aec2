//! The vocab-parallel cross entropy: the logits stay sharded over `tp` on the vocabulary
//! axis and the loss all-reduces per-token scalars over the TP group instead of gathering
//! the logits; each rank keeps the f32 softmax (or log-softmax) of its own vocabulary slice.
//!
//! - **Megatron-LM always runs it.** `GPTModel` keeps `parallel_output=True` and its loss is
//!   `tensor_parallel.vocab_parallel_cross_entropy` (`_VocabParallelCrossEntropy.forward`,
//!   `megatron/core/tensor_parallel/cross_entropy.py`): the local logits are upcast
//!   (`vocab_parallel_logits.float()`), then three all-reduces of one f32 per token run in
//!   forward: MAX of the logit maximum, SUM of the predicted logit, SUM of the exp sums.
//!   It saves the normalized f32 `exp_logits` of the local slice, the bool `target_mask` and
//!   the int64 `masked_target_1d`; its backward is local. Each MTP depth's loss is the same
//!   call on that depth's logits (`compute_language_model_loss`).
//! - **HyperParallel runs it with `[train] loss_parallel`** (`causal_lm_loss_parallel` ->
//!   `vocab_parallel_cross_entropy_local`, `components/losses/_vocab_parallel_cross_entropy.py`):
//!   `distributed_log_softmax` all-reduces MAX and SUM of one f32 per token, then the summed
//!   loss (`reduction="sum"`) is all-reduced once (one f32). The all-reduces run inside the
//!   autograd Function's forward, so backward adds none. It saves the f32 local
//!   log-probabilities, the int64 targets and the bool target mask. Without `loss_parallel`
//!   (`AcceleratorConfig.loss_parallel = False`, the default, and the dense TP recipe
//!   `examples/recipes/llama_tp.yaml` leaves it unset) the `lm_head` output is gathered to
//!   replicated logits and the HF loss runs on the whole vocabulary (the chunked loss,
//!   `ChunkedCausalLMLoss.bind_model`, refuses `tp_size != 1`).
//! - PyTorch FSDP2 (no TP in the shipped scenarios) follows the scenario's `loss_parallel` and
//!   is charged HyperParallel's three reduces (torch's `loss_parallel`,
//!   `torch/distributed/tensor/parallel/loss.py::_log_softmax`, all-reduces the maximum and
//!   the exp sum per row; the picked log-probabilities leave as a partial sum).

use super::StrategyKind;
use super::parallel::CallPath;
use super::parallel::{CollSpec, ParAxis, ParColl, ParDims};
use hpfsdp_plan::collective::CollectiveKind;
use hpfsdp_plan::model::DType;

/// Bytes of the f32 scalars the loss all-reduces.
const F32_BYTES: u64 = 4;

/// Whether `kind` computes the loss on vocabulary-sharded logits when the scenario asks for
/// `loss_parallel` (Megatron-LM whatever the scenario says).
pub fn runs(kind: StrategyKind, loss_parallel: bool) -> bool {
    kind == StrategyKind::MegatronDdp || loss_parallel
}

/// Whether `c` is the forward gather of the logits to replicated (the plan's `lm_head`
/// output transition without `loss_parallel`), which a vocab-parallel loss does not run.
pub fn is_logits_gather(c: &ParColl) -> bool {
    c.axis == ParAxis::Tp && c.name.ends_with(".out.logits.tp")
}

/// The forward all-reduces over `tp` of `kind`'s vocab-parallel loss after the head
/// `module` (short name, `lm_head` or an MTP layer's `shared_head.head`), on the
/// `d.tokens / d.cp` logit rows of one micro-batch; none without TP.
pub fn all_reduces(module: &str, d: &ParDims, kind: StrategyKind) -> Vec<ParColl> {
    if d.tp <= 1 {
        return Vec::new();
    }
    let rows = d.tokens / d.cp.max(1);
    let per_row = rows * F32_BYTES;
    let steps: [(&str, u64); 3] = match kind {
        StrategyKind::MegatronDdp => [
            ("logits_max", per_row),
            ("predicted_logits", per_row),
            ("sum_exp_logits", per_row),
        ],
        _ => [
            ("max", per_row),
            ("sum_exp", per_row),
            ("loss_sum", F32_BYTES),
        ],
    };
    steps
        .into_iter()
        .map(|(what, bytes)| ParColl {
            name: format!("{module}.loss.{what}.tp"),
            axis: ParAxis::Tp,
            fwd: Some(CollSpec {
                kind: CollectiveKind::AllReduce,
                input_bytes: bytes,
                output_bytes: bytes,
            }),
            bwd: None,
            wire_dtype: Some(DType::F32),
            host_sync: false,
            // A single-tensor `all_reduce` in both implementations: no staging kernels.
            call: CallPath::Direct,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(tp: u64) -> ParDims {
        ParDims {
            tp,
            cp: 2,
            ep: 1,
            sequence_parallel: true,
            tokens: 8192,
            hidden: 64,
            vocab: 1000,
            experts: 0,
            top_k: 0,
            kv_width: 32,
            act_wire_bytes: 2,
            routed_imbalance: 1.0,
        }
    }

    #[test]
    fn vocab_parallel_loss_reduces_per_token_f32_scalars_forward_only() {
        let m = all_reduces("lm_head", &dims(4), StrategyKind::MegatronDdp);
        assert_eq!(m.len(), 3);
        for c in &m {
            let s = c.fwd.unwrap();
            assert_eq!(s.kind, CollectiveKind::AllReduce);
            // One f32 per CP-local token row: 8192 / cp 2.
            assert_eq!(s.input_bytes, 4096 * 4, "{}", c.name);
            assert!(c.bwd.is_none());
            assert_eq!(c.wire_dtype, Some(DType::F32));
        }
        // HyperParallel's third reduce is the summed loss, one f32.
        let hp = all_reduces("lm_head", &dims(4), StrategyKind::HyperParallel);
        assert_eq!(hp[2].fwd.unwrap().input_bytes, 4);
        assert_eq!(hp[0].fwd.unwrap().input_bytes, 4096 * 4);
        assert!(all_reduces("lm_head", &dims(1), StrategyKind::MegatronDdp).is_empty());
        assert!(runs(StrategyKind::MegatronDdp, false));
        assert!(!runs(StrategyKind::HyperParallel, false));
        assert!(runs(StrategyKind::HyperParallel, true));
    }
}
