//! Routing from the Muon plan: which parameters Muon updates and as which matrices.
//!
//! A Muon parameter is a stack of independent matrices of its core shape (the plan's
//! [`hpfsdp_plan::muon::core_shape`]): `[A, B]` is one matrix, `[A, 1, B]` one `A x B` matrix,
//! and `[N.., M, K]` is `N..` matrices of `M x K` — a fused expert `[E, M, K]` is E matrices,
//! never one `[E, M·K]` matrix. One-dimensional parameters, embeddings and heads go to AdamW.

use hpfsdp_plan::muon::{MuonPlan, OptimizerRoute, core_shape};

use super::adapters::{AdapterRules, MatrixSplit};
use super::error::{MuonError, MuonResult};

/// A tensor viewed as `count` matrices of `rows x cols` stored back to back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixStack {
    /// Number of matrices.
    pub count: usize,
    /// Rows of each matrix.
    pub rows: usize,
    /// Columns of each matrix.
    pub cols: usize,
}

impl MatrixStack {
    /// The stack of a tensor of `shape` under the core-shape rule of `core` (the matrix dims
    /// come from the global shape; `shape` may be a local piece sharded on leading dims).
    pub fn of_local(shape: &[usize], core: (usize, usize)) -> MuonResult<MatrixStack> {
        let numel: usize = shape.iter().product();
        let size = core.0 * core.1;
        if size == 0 || !numel.is_multiple_of(size) {
            return Err(MuonError::plan(format!(
                "a {shape:?} tensor is not a stack of {}x{} matrices",
                core.0, core.1
            )));
        }
        Ok(MatrixStack {
            count: numel / size,
            rows: core.0,
            cols: core.1,
        })
    }

    /// The stack of a global tensor (`None` below two dims).
    pub fn of_shape(shape: &[usize]) -> Option<MatrixStack> {
        let wide: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let (r, c) = core_shape(&wide)?;
        MatrixStack::of_local(shape, (r as usize, c as usize)).ok()
    }

    /// Elements per matrix.
    pub fn matrix_numel(&self) -> usize {
        self.rows * self.cols
    }
}

/// One plan parameter with its route and, for Muon, its matrices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedParam {
    /// Index into [`MuonPlan::params`].
    pub index: usize,
    /// FQN.
    pub name: String,
    /// Global shape.
    pub shape: Vec<usize>,
    /// Muon or AdamW.
    pub route: OptimizerRoute,
    /// Matrix dims (Muon only).
    pub core: Option<(usize, usize)>,
    /// How each matrix is split before Newton-Schulz (Muon only).
    pub split: MatrixSplit,
}

/// Routes every plan parameter and checks each Muon parameter's split against its matrices.
pub fn route_params(plan: &MuonPlan, rules: &AdapterRules) -> MuonResult<Vec<RoutedParam>> {
    plan.params
        .iter()
        .enumerate()
        .map(|(index, p)| {
            let shape: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
            let core = match p.route {
                OptimizerRoute::Muon => {
                    let (r, c) = p.core_shape.ok_or_else(|| {
                        MuonError::plan(format!("Muon parameter {} has no core shape", p.name))
                    })?;
                    Some((r as usize, c as usize))
                }
                OptimizerRoute::Adamw => None,
            };
            let split = match core {
                Some((r, c)) => {
                    let split = rules.split_for(&p.name).clone();
                    split.parts(r, c).map_err(|e| {
                        MuonError::plan(format!("parameter {} [{r}x{c}]: {e}", p.name))
                    })?;
                    split
                }
                None => MatrixSplit::Whole,
            };
            Ok(RoutedParam {
                index,
                name: p.name.clone(),
                shape,
                route: p.route,
                core,
                split,
            })
        })
        .collect()
}
