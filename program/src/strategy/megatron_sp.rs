//! Megatron-LM's sequence-parallel column-parallel linears: they keep the un-gathered input
//! for backward and all-gather it again there.
//!
//! `LinearWithGradAccumulationAndAsyncCommunication` (`megatron/core/tensor_parallel/layers.py`)
//! runs every `ColumnParallelLinear` with `sequence_parallel`: its forward all-gathers the
//! sequence-sharded input `[s/tp, b, h]` into the global memory buffer ("mpu"), multiplies,
//! and calls `ctx.save_for_backward(input, weight)` on the **local** input; its backward
//! all-gathers that input again (`dist_all_gather_func(..., async_op=True)`) for the weight
//! gradient, overlapped with the input-gradient GEMM, and reduce-scatters the input gradient.
//! So per column-parallel linear a Megatron rank keeps `1/tp` of the gathered input and
//! issues one more TP all-gather of the gathered size in backward.
//!
//! The column-parallel linears are the attention's `linear_qkv`, the MLP's `linear_fc1`
//! (gate and up fused) and the `output_layer` (whose `sequence_parallel` follows the
//! config); they sit at the plan's attention, MLP and head boundaries, whose input is the
//! `S(1) -> R` gather on `tp`. HyperParallel does the opposite: the boundary lowers that
//! gather to a differentiable all-gather (`tp_collective_lowering.TPExecutionOp`,
//! `differentiable_all_gather_concat`) and the local module's `nn.Linear` saves the gathered
//! tensor ([`super::saved_activations`]); PyTorch FSDP2 with HF modules saves it too.
//!
//! The re-gather sits in the stage right after the boundary's compute segment, so in backward
//! it is issued before that segment's backward (which holds the weight-gradient GEMM that
//! consumes it). A stage cannot split its segment, so the gather cannot overlap only the
//! input-gradient GEMM as on the device (`CUDA_DEVICE_MAX_CONNECTIONS=1` ordering).

use super::StrategyKind;
use super::parallel::CallPath;
use super::parallel::{ParAxis, ParColl};
use hpfsdp_plan::collective::CollectiveKind;
use hpfsdp_plan::planner::BoundarySpec;
use hpfsdp_plan::planner::boundary::BoundaryType;

/// Whether `kind`'s column-parallel linears save their sequence-parallel input un-gathered
/// (and re-gather it in backward): Megatron-LM with sequence parallelism over `tp > 1`.
/// `sequence_parallel` is the effective flag (SP requested and `tp > 1`).
pub fn saves_local_input(kind: StrategyKind, sequence_parallel: bool) -> bool {
    kind == StrategyKind::MegatronDdp && sequence_parallel
}

/// Whether boundary `b`'s input feeds a Megatron column-parallel linear (`linear_qkv`,
/// `linear_fc1`, `output_layer`).
fn feeds_column_parallel_linear(b: &BoundarySpec) -> bool {
    matches!(
        b.ty,
        BoundaryType::Attention | BoundaryType::Mlp | BoundaryType::LmHead
    )
}

/// The backward re-gather of boundary `b`'s sequence-parallel input: a backward-only TP
/// all-gather of the size of the forward gather among `input_colls` (the boundary's input
/// collectives), named `<module>.regather.hidden_states.tp`. `None` when `b` feeds no
/// column-parallel linear or its input is not gathered on `tp`.
pub fn backward_regather(b: &BoundarySpec, input_colls: &[ParColl]) -> Option<ParColl> {
    if !feeds_column_parallel_linear(b) {
        return None;
    }
    let gather = input_colls.iter().find(|c| {
        c.axis == ParAxis::Tp
            && c.name.ends_with(".in.hidden_states.tp")
            && c.fwd.is_some_and(|s| s.kind == CollectiveKind::AllGather)
    })?;
    Some(ParColl {
        name: gather
            .name
            .replace(".in.hidden_states.tp", ".regather.hidden_states.tp"),
        axis: ParAxis::Tp,
        fwd: None,
        bwd: gather.fwd,
        wire_dtype: gather.wire_dtype,
        host_sync: false,
        // `_gather_along_first_dim`: one `all_gather_into_tensor`, no list staging.
        call: CallPath::Direct,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::parallel::CollSpec;

    fn boundary(ty: BoundaryType) -> BoundarySpec {
        BoundarySpec {
            module: "model.layers.0.self_attn".into(),
            ty,
            reason: String::new(),
            source: hpfsdp_plan::planner::BoundarySource::Derived,
            params: Default::default(),
            in_src: None,
            in_dst: None,
            out_src: None,
            out_dst: None,
            flags: Default::default(),
            overrides: Vec::new(),
        }
    }

    fn gather(name: &str) -> ParColl {
        ParColl {
            name: name.into(),
            axis: ParAxis::Tp,
            fwd: Some(CollSpec {
                kind: CollectiveKind::AllGather,
                input_bytes: 100,
                output_bytes: 400,
            }),
            bwd: Some(CollSpec {
                kind: CollectiveKind::ReduceScatter,
                input_bytes: 400,
                output_bytes: 100,
            }),
            wire_dtype: None,
            host_sync: false,
            call: CallPath::Direct,
        }
    }

    #[test]
    fn column_parallel_inputs_are_gathered_again_in_backward_only() {
        let g = gather("layers.0.self_attn.in.hidden_states.tp");
        let re = backward_regather(&boundary(BoundaryType::Attention), std::slice::from_ref(&g))
            .unwrap();
        assert_eq!(re.name, "layers.0.self_attn.regather.hidden_states.tp");
        assert!(re.fwd.is_none());
        assert_eq!(re.bwd, g.fwd, "the forward gather's size, in backward");
        // A norm or router boundary holds no column-parallel linear.
        assert!(
            backward_regather(&boundary(BoundaryType::Norm), std::slice::from_ref(&g)).is_none()
        );
        assert!(backward_regather(&boundary(BoundaryType::MoeGate), &[g]).is_none());
        // No sequence-parallel gather, nothing to re-gather.
        assert!(backward_regather(&boundary(BoundaryType::Mlp), &[]).is_none());
        assert!(saves_local_input(StrategyKind::MegatronDdp, true));
        assert!(!saves_local_input(StrategyKind::MegatronDdp, false));
        assert!(!saves_local_input(StrategyKind::HyperParallel, true));
        assert!(!saves_local_input(StrategyKind::Fsdp2, true));
    }
}
