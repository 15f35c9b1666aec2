//! The distributed tensor of the runtime: a local tensor plus, in validation mode, its layout
//! on the plan mesh.

use hpfsdp_plan::{DeviceMesh, Layout, Placement};

use crate::tensor::Tensor;

/// A rank's local piece of a (logically global) tensor. `layout` is tracked only in
/// validation mode; production mode keeps plain local tensors.
#[derive(Debug, Clone)]
pub struct DTensor {
    /// The local values.
    pub local: Tensor<f32>,
    /// The global (logical) shape, known statically in both modes.
    pub global: Vec<usize>,
    /// Layout on the plan mesh (validation mode only).
    pub layout: Option<Layout>,
}

impl DTensor {
    /// A local tensor with its global shape and (validation mode) layout.
    pub fn new(local: Tensor<f32>, global: Vec<usize>, layout: Option<Layout>) -> DTensor {
        DTensor {
            local,
            global,
            layout,
        }
    }

    /// What backward needs to know about a forward input: its global shape and layout.
    pub fn meta(&self) -> Meta {
        Meta {
            global: self.global.clone(),
            layout: self.layout.clone(),
        }
    }
}

/// The global shape and (validation mode) layout of a tensor, without its values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Meta {
    /// Global shape.
    pub global: Vec<usize>,
    /// Layout on the plan mesh (validation mode only).
    pub layout: Option<Layout>,
}

/// The layout of an activation `[tokens, features]` with `placements` (already mapped to 2-D).
pub fn activation_layout(tokens: usize, features: usize, placements: &[Placement]) -> Layout {
    Layout {
        global_shape: vec![tokens as u64, features as u64],
        placements: placements.to_vec(),
    }
}

/// A layout that replicates `shape` on every axis of `mesh`.
pub fn replicated(shape: &[usize], mesh: &DeviceMesh) -> Layout {
    Layout::replicated(shape.iter().map(|&d| d as u64).collect(), mesh)
}

/// The local shape `rank` holds under `layout`, as `usize`.
pub fn local_shape(layout: &Layout, mesh: &DeviceMesh, rank: usize) -> Vec<usize> {
    layout
        .local_shape(mesh, rank)
        .into_iter()
        .map(|d| d as usize)
        .collect()
}

/// The layout a gradient of a tensor laid out as `layout` has once complete: `Partial` axes
/// become `Replicate` (the gradient of a partial-sum output is the whole gradient on every
/// contributor).
pub fn grad_layout(layout: &Layout) -> Layout {
    layout.without_partials()
}
