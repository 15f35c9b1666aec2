//! Activation collectives in the compute dtype: the model-parallel (TP/SP all-reduce,
//! all-gather, reduce-scatter; EP all-to-all-v) traffic of activations and their gradients
//! travels in the dtype the step program gives it, the gathered-parameter (compute) dtype.
//!
//! The runtime computes in f32. With a bf16 compute dtype each collective rounds its f32
//! payload to bf16 (round-to-nearest-even, [`crate::bf16::round_to_bf16`]) on the way in,
//! runs the bf16 collective (a sum widens to f32, adds in ascending rank order and rounds once,
//! see `hpfsdp_backends::reduce`) and widens the result back to f32 exactly. These are the
//! only rounding points the wire adds, so a single-device run that rounds at the same points
//! reproduces the bits wherever the summation order is unchanged (expert parallelism: see
//! [`crate::ops::ExpertWire`]).

use hpfsdp_backends::{Collective, CollectiveExt, Group, ReduceOp};
use hpfsdp_plan::model::DType as PlanDType;

use super::error::{RtResult, RuntimeError};
use crate::bf16::{bf16, to_bf16_vec, to_f32_vec};
use crate::ops::ExpertWire;

/// Element type of activations on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActDType {
    /// f32 (the f32-compute verify scenarios): values travel unchanged.
    #[default]
    F32,
    /// bf16: values are rounded to bf16 when they enter a collective.
    Bf16,
}

impl ActDType {
    /// The wire dtype of a plan's compute (gathered-parameter) dtype; f16 and fp8 compute are
    /// not executed by the reference runtime.
    pub fn from_plan(d: PlanDType) -> RtResult<ActDType> {
        match d {
            PlanDType::F32 => Ok(ActDType::F32),
            PlanDType::Bf16 => Ok(ActDType::Bf16),
            other => Err(RuntimeError::unsupported(format!(
                "activations in {other:?} are not executed by the reference runtime (param_dtype \
                 must be \"f32\" or \"bf16\")"
            ))),
        }
    }

    /// The rounding the single-device MoE must apply to match expert-parallel traffic.
    pub fn expert_wire(self) -> ExpertWire {
        match self {
            ActDType::F32 => ExpertWire::Exact,
            ActDType::Bf16 => ExpertWire::Bf16,
        }
    }
}

/// All-reduce (sum) of an activation in `dtype`.
pub fn all_reduce(
    comm: &dyn Collective,
    group: &Group,
    v: Vec<f32>,
    dtype: ActDType,
) -> RtResult<Vec<f32>> {
    Ok(match dtype {
        ActDType::F32 => comm.all_reduce_vec(group, v, ReduceOp::Sum)?,
        ActDType::Bf16 => {
            let r: Vec<bf16> = comm.all_reduce_vec(group, to_bf16_vec(&v), ReduceOp::Sum)?;
            to_f32_vec(&r)
        }
    })
}

/// All-gather of an activation in `dtype`.
pub fn all_gather(
    comm: &dyn Collective,
    group: &Group,
    v: Vec<f32>,
    dtype: ActDType,
) -> RtResult<Vec<f32>> {
    Ok(match dtype {
        ActDType::F32 => comm.all_gather_vec(group, v)?,
        ActDType::Bf16 => to_f32_vec(&comm.all_gather_vec(group, to_bf16_vec(&v))?),
    })
}

/// Reduce-scatter (sum) of an activation in `dtype`.
pub fn reduce_scatter(
    comm: &dyn Collective,
    group: &Group,
    v: Vec<f32>,
    dtype: ActDType,
) -> RtResult<Vec<f32>> {
    Ok(match dtype {
        ActDType::F32 => comm.reduce_scatter_vec(group, v, ReduceOp::Sum)?,
        ActDType::Bf16 => {
            let r: Vec<bf16> = comm.reduce_scatter_vec(group, to_bf16_vec(&v), ReduceOp::Sum)?;
            to_f32_vec(&r)
        }
    })
}

/// All-to-all-v of activation rows in `dtype` (counts in elements).
pub fn all_to_all_v(
    comm: &dyn Collective,
    group: &Group,
    v: Vec<f32>,
    send_counts: &[usize],
    recv_counts: &[usize],
    dtype: ActDType,
) -> RtResult<Vec<f32>> {
    Ok(match dtype {
        ActDType::F32 => comm.all_to_all_v_vec(group, v, send_counts, recv_counts)?,
        ActDType::Bf16 => {
            to_f32_vec(&comm.all_to_all_v_vec(group, to_bf16_vec(&v), send_counts, recv_counts)?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16::quantize_bf16;
    use hpfsdp_backends::InProcWorld;

    #[test]
    fn bf16_all_reduce_rounds_each_input_then_the_sum_once() {
        // 1 + 2^-9 rounds to 1 in bf16 on the way in; the f32 sum 2 + 2^-7 of the rounded
        // inputs then rounds once (to 2, ties-to-even at bf16's spacing 2^-6 near 2).
        let a = 1.0 + 2f32.powi(-9);
        let b = 1.0 + 2f32.powi(-7);
        let run = InProcWorld::run(2, |comm| {
            let g = Group::world(2).unwrap();
            let mine = if comm.rank() == 0 { a } else { b };
            (
                all_reduce(comm, &g, vec![mine], ActDType::Bf16).unwrap()[0],
                all_reduce(comm, &g, vec![mine], ActDType::F32).unwrap()[0],
            )
        })
        .unwrap();
        let want = quantize_bf16(quantize_bf16(a) + quantize_bf16(b));
        for (bf, f) in run.results {
            assert_eq!(bf.to_bits(), want.to_bits());
            assert_eq!(f.to_bits(), (a + b).to_bits());
            assert_ne!(bf.to_bits(), f.to_bits(), "the wire dtype must matter here");
        }
    }

    #[test]
    fn plan_dtypes_map_and_others_are_refused() {
        assert_eq!(ActDType::from_plan(PlanDType::F32).unwrap(), ActDType::F32);
        assert_eq!(
            ActDType::from_plan(PlanDType::Bf16).unwrap(),
            ActDType::Bf16
        );
        let e = ActDType::from_plan(PlanDType::F16).unwrap_err().to_string();
        assert!(e.contains("param_dtype"), "{e}");
    }
}
