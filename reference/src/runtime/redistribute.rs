//! Executing a layout change of a local activation `[tokens, features]` (or a 1-D tensor) one
//! mesh axis at a time: Partial→Replicate = all-reduce, Partial→Shard = reduce-scatter,
//! Shard→Replicate = all-gather, Replicate→Shard = local slice (ceil-chunk semantics, as
//! [`hpfsdp_plan::chunk_range`]). Anything else is refused. Collectives carry the activation
//! wire dtype ([`super::wire`]).

use hpfsdp_backends::Collective;
use hpfsdp_plan::{DeviceMesh, Layout, Placement, chunk_range};

use super::error::{RtResult, RuntimeError};
use super::topo::RankTopo;
use super::wire::{self, ActDType};
use crate::tensor::Tensor;

/// One executed step of a transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// All-reduce (sum) over the axis.
    AllReduce {
        /// Plan-mesh axis.
        axis: usize,
    },
    /// Reduce-scatter (sum) along a tensor dim.
    ReduceScatter {
        /// Plan-mesh axis.
        axis: usize,
        /// Tensor dim.
        dim: usize,
    },
    /// All-gather along a tensor dim.
    AllGather {
        /// Plan-mesh axis.
        axis: usize,
        /// Tensor dim.
        dim: usize,
    },
    /// Keep this rank's chunk along a tensor dim.
    Slice {
        /// Plan-mesh axis.
        axis: usize,
        /// Tensor dim.
        dim: usize,
    },
}

/// The steps that turn `src` into `dst`, axis by axis in mesh order (identities skipped).
pub fn lower(src: &Layout, dst: &Layout, mesh: &DeviceMesh) -> Result<Vec<Step>, String> {
    if src.placements.len() != dst.placements.len() {
        return Err(format!(
            "layouts {src} and {dst} have different axis counts"
        ));
    }
    let mut steps = Vec::new();
    for (axis, (p, q)) in src.placements.iter().zip(&dst.placements).enumerate() {
        if p == q {
            continue;
        }
        let step = match (p, q) {
            (Placement::Partial { .. }, Placement::Replicate) => Step::AllReduce { axis },
            (Placement::Partial { .. }, Placement::Shard { dim }) => {
                Step::ReduceScatter { axis, dim: *dim }
            }
            (Placement::Shard { dim }, Placement::Replicate) => Step::AllGather { axis, dim: *dim },
            (Placement::Replicate, Placement::Shard { dim }) => Step::Slice { axis, dim: *dim },
            _ => {
                return Err(format!(
                    "no lowering for {p} -> {q} on axis '{}' (from {src} to {dst})",
                    mesh.axes()[axis].name
                ));
            }
        };
        steps.push(step);
    }
    Ok(steps)
}

/// Apply one step to a layout (what the step does to the placements).
pub fn apply_to_layout(layout: &Layout, step: &Step) -> Layout {
    let (axis, p) = match step {
        Step::AllReduce { axis } | Step::AllGather { axis, .. } => (*axis, Placement::Replicate),
        Step::ReduceScatter { axis, dim } | Step::Slice { axis, dim } => {
            (*axis, Placement::shard(*dim))
        }
    };
    layout.with_placement(axis, p)
}

fn step_axis(step: &Step) -> usize {
    match step {
        Step::AllReduce { axis }
        | Step::ReduceScatter { axis, .. }
        | Step::AllGather { axis, .. }
        | Step::Slice { axis, .. } => *axis,
    }
}

/// `[outer, n, inner]` view sizes of `shape` around `dim`.
fn split_dims(shape: &[usize], dim: usize) -> RtResult<(usize, usize, usize)> {
    if dim >= shape.len() {
        return Err(RuntimeError::plan(format!(
            "cannot split dim {dim} of a tensor of shape {shape:?}"
        )));
    }
    Ok((
        shape[..dim].iter().product(),
        shape[dim],
        shape[dim + 1..].iter().product(),
    ))
}

/// Rows `[a, b)` of dim `dim` (as `[outer, n, inner]`), zero-padded to `pad` rows.
fn take(
    data: &[f32],
    (outer, n, inner): (usize, usize, usize),
    a: usize,
    b: usize,
    pad: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(outer * pad * inner);
    for o in 0..outer {
        let base = o * n * inner;
        out.extend_from_slice(&data[base + a * inner..base + b * inner]);
        out.resize(out.len() + (pad - (b - a)) * inner, 0.0);
    }
    out
}

/// Execute `steps` on `local`, whose global shape is `global` (the current local shape is
/// derived per step), with f32 on the wire. Axes of size 1 cost nothing; other axes need a
/// group in `topo`.
pub fn execute(
    comm: &dyn Collective,
    topo: &RankTopo,
    steps: &[Step],
    global: &[usize],
    local: Tensor<f32>,
) -> RtResult<Tensor<f32>> {
    execute_in(comm, topo, steps, global, local, ActDType::F32)
}

/// [`execute`] with the collectives in `dtype` (the step program's activation dtype).
pub fn execute_in(
    comm: &dyn Collective,
    topo: &RankTopo,
    steps: &[Step],
    global: &[usize],
    mut local: Tensor<f32>,
    dtype: ActDType,
) -> RtResult<Tensor<f32>> {
    let mesh = &topo.plan_mesh;
    for step in steps {
        let axis = step_axis(step);
        let name = mesh.axes()[axis].name.clone();
        let k = mesh.axes()[axis].size;
        if k == 1 {
            continue;
        }
        let g = topo.plan_axis_group(&name).ok_or_else(|| {
            RuntimeError::unsupported(format!(
                "layout transitions over axis '{name}' (size {k}) are not executed by the reference runtime"
            ))
        })?;
        let me = g.index;
        let shape = local.shape().to_vec();
        local = match *step {
            Step::AllReduce { .. } => {
                let v = wire::all_reduce(comm, &g.group, local.into_vec(), dtype)?;
                Tensor::from_vec(&shape, v)?
            }
            Step::Slice { dim, .. } => {
                let dims = split_dims(&shape, dim)?;
                let r = chunk_range(dims.1 as u64, k as u64, me as u64);
                let (a, b) = (r.start as usize, r.end as usize);
                let mut out_shape = shape.clone();
                out_shape[dim] = b - a;
                Tensor::from_vec(&out_shape, take(local.as_slice(), dims, a, b, b - a))?
            }
            Step::AllGather { dim, .. } => {
                let n = global[dim];
                let chunk = n.div_ceil(k);
                let dims = split_dims(&shape, dim)?;
                let padded = take(local.as_slice(), dims, 0, dims.1, chunk);
                let all = wire::all_gather(comm, &g.group, padded, dtype)?;
                let (outer, _, inner) = dims;
                let mut out = Vec::with_capacity(outer * n * inner);
                for o in 0..outer {
                    for j in 0..k {
                        let r = chunk_range(n as u64, k as u64, j as u64);
                        let len = (r.end - r.start) as usize;
                        let base = j * outer * chunk * inner + o * chunk * inner;
                        out.extend_from_slice(&all[base..base + len * inner]);
                    }
                }
                let mut out_shape = shape.clone();
                out_shape[dim] = n;
                Tensor::from_vec(&out_shape, out)?
            }
            Step::ReduceScatter { dim, .. } => {
                let dims = split_dims(&shape, dim)?;
                let n = dims.1;
                let chunk = n.div_ceil(k);
                let mut input = Vec::with_capacity(k * dims.0 * chunk * dims.2);
                for j in 0..k {
                    let r = chunk_range(n as u64, k as u64, j as u64);
                    input.extend(take(
                        local.as_slice(),
                        dims,
                        r.start as usize,
                        r.end as usize,
                        chunk,
                    ));
                }
                let mine = wire::reduce_scatter(comm, &g.group, input, dtype)?;
                let r = chunk_range(n as u64, k as u64, me as u64);
                let len = (r.end - r.start) as usize;
                let mut out_shape = shape.clone();
                out_shape[dim] = len;
                let v = take(&mine, (dims.0, chunk, dims.2), 0, len, len);
                Tensor::from_vec(&out_shape, v)?
            }
        };
    }
    Ok(local)
}
