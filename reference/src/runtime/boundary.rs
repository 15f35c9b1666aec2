//! Module boundaries compiled from the sharding plan: each boundary's input and output
//! contracts as placements on the plan mesh (mapped from the plan's `[batch, seq, hidden]`
//! activations to the runtime's `[tokens, features]`), and the transitions they imply,
//! lowered once ("precompiled") for both directions.

use std::collections::HashMap;

use hpfsdp_plan::planner::ShardingPlan;
use hpfsdp_plan::planner::templates::Contract;
use hpfsdp_plan::{DeviceMesh, Layout, Placement};

use super::dtensor::grad_layout;
use super::error::{RtResult, RuntimeError};
use super::redistribute::{Step, lower};

/// One contract tensor: its name, source and destination placements, and the lowered
/// forward and backward (adjoint) transitions.
#[derive(Debug, Clone, PartialEq)]
pub struct ContractPair {
    /// Tensor name (`hidden_states`, `input_ids`, `logits`, ...).
    pub tensor: String,
    /// Source placements per plan-mesh axis (`in_src` / `out_src`).
    pub src: Vec<Placement>,
    /// Destination placements per plan-mesh axis (`in_dst` / `out_dst`).
    pub dst: Vec<Placement>,
    /// Forward transition `src → dst`.
    pub forward: Vec<Step>,
    /// Backward transition of the gradient, `grad(dst) → grad(src)`.
    pub backward: Vec<Step>,
}

/// A compiled module boundary.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledBoundary {
    /// Module FQN.
    pub module: String,
    /// Input contract (`in_src → in_dst`), if declared.
    pub input: Option<ContractPair>,
    /// Output contract (`out_src → out_dst`), if declared.
    pub output: Option<ContractPair>,
}

/// Every boundary of a plan, by module name.
#[derive(Debug, Clone, Default)]
pub struct BoundaryTable {
    map: HashMap<String, CompiledBoundary>,
}

/// Map a plan placement of a `[batch, seq, hidden]` activation (or `[batch, seq]` ids) to the
/// runtime's token-major `[tokens, features]` (or `[tokens]`).
pub fn map_activation_placement(p: &Placement, tensor: &str) -> Placement {
    let ids = tensor == "input_ids";
    let map_dim = |d: usize| if ids || d < 2 { 0 } else { 1 };
    match p {
        Placement::Shard { dim } => Placement::shard(map_dim(*dim)),
        Placement::StridedShard { dim, split_factor } => Placement::StridedShard {
            dim: map_dim(*dim),
            split_factor: *split_factor,
        },
        other => other.clone(),
    }
}

fn placements(c: &Contract, tensor: &str, mesh: &DeviceMesh) -> Vec<Placement> {
    let per_axis = c.get(tensor);
    mesh.axes()
        .iter()
        .map(|a| {
            per_axis
                .and_then(|m| m.get(&a.name))
                .map_or(Placement::Replicate, |p| {
                    map_activation_placement(p, tensor)
                })
        })
        .collect()
}

fn layout_of(ps: &[Placement], tensor: &str) -> Layout {
    let ndim = if tensor == "input_ids" { 1 } else { 2 };
    Layout {
        global_shape: vec![1; ndim],
        placements: ps.to_vec(),
    }
}

fn pair(
    module: &str,
    src: Option<&Contract>,
    dst: Option<&Contract>,
    mesh: &DeviceMesh,
) -> RtResult<Option<ContractPair>> {
    let (Some(src), Some(dst)) = (src, dst) else {
        return Ok(None);
    };
    let Some(tensor) = src.keys().next().or_else(|| dst.keys().next()).cloned() else {
        return Ok(None);
    };
    let s = placements(src, &tensor, mesh);
    let d = placements(dst, &tensor, mesh);
    let (sl, dl) = (layout_of(&s, &tensor), layout_of(&d, &tensor));
    let lowered = |a: &Layout, b: &Layout| {
        lower(a, b, mesh).map_err(|e| {
            RuntimeError::unsupported(format!("boundary '{module}', tensor '{tensor}': {e}"))
        })
    };
    let forward = lowered(&sl, &dl)?;
    let backward = lowered(&grad_layout(&dl), &grad_layout(&sl))?;
    Ok(Some(ContractPair {
        tensor,
        src: s,
        dst: d,
        forward,
        backward,
    }))
}

/// The layout of the gradient a module body returns for its input: the input's placements
/// (`in_dst`, partials made whole) with `Partial(sum)` on every axis where the input is
/// replicated but the body's output (`out_src`) is not (partial sums or feature shards): each
/// rank's local backward then yields only its contribution to the input gradient (the
/// adjoint of "replicate, then compute a piece").
pub fn body_input_grad(in_dst: &[Placement], out_src: &[Placement]) -> Vec<Placement> {
    in_dst
        .iter()
        .zip(out_src)
        .map(|(i, o)| {
            if !o.is_replicate() && (i.is_replicate() || i.is_partial()) {
                Placement::partial_sum()
            } else if i.is_partial() {
                Placement::Replicate
            } else {
                i.clone()
            }
        })
        .collect()
}

impl BoundaryTable {
    /// Compile every boundary of `plan` on the plan mesh.
    pub fn compile(plan: &ShardingPlan, mesh: &DeviceMesh) -> RtResult<BoundaryTable> {
        let mut map = HashMap::new();
        for b in &plan.boundaries {
            let mut input = pair(&b.module, b.in_src.as_ref(), b.in_dst.as_ref(), mesh)?;
            let output = pair(&b.module, b.out_src.as_ref(), b.out_dst.as_ref(), mesh)?;
            // The body's input gradient is Partial wherever a replicated input feeds an output
            // that differs across ranks: the backward input transition starts there.
            if let (Some(i), Some(o)) = (input.as_mut(), output.as_ref()) {
                let body_grad = body_input_grad(&i.dst, &o.src);
                i.backward = lower(
                    &layout_of(&body_grad, &i.tensor),
                    &grad_layout(&layout_of(&i.src, &i.tensor)),
                    mesh,
                )
                .map_err(|e| {
                    RuntimeError::unsupported(format!(
                        "boundary '{}', tensor '{}' (backward): {e}",
                        b.module, i.tensor
                    ))
                })?;
            }
            map.insert(
                b.module.clone(),
                CompiledBoundary {
                    module: b.module.clone(),
                    input,
                    output,
                },
            );
        }
        Ok(BoundaryTable { map })
    }

    /// The boundary of `module`, if the plan has one.
    pub fn get(&self, module: &str) -> Option<&CompiledBoundary> {
        self.map.get(module)
    }

    /// Number of boundaries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
