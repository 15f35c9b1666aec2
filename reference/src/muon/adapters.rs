//! Matrix-splitting adapters: the matrices Muon sees inside one fused parameter matrix, and
//! how their updates are put back (HyperParallel's `ns_transform_fn`).
//!
//! Every split is a list of [`Part`]s, each an ordered selection of the matrix's rows,
//! optionally transposed; restoring writes the rows back. Each part is orthogonalized on its own
//! and scaled by its own dims. A split acts on each `[rows, cols]` matrix of a parameter, so a
//! fused expert stack `[E, 2I, H]` is split matrix by matrix and never flattened.
//!
//! | split | use | parts |
//! |---|---|---|
//! | [`MatrixSplit::RowBlocks`] | fused QKV, MLA down-projection (`q_lora, kv_lora, rope`) | contiguous row blocks |
//! | [`MatrixSplit::HeadRowBlocks`] | MLA `q_b_proj` (`nope, rope`), `kv_b_proj` (`nope, v`) | per-head row blocks, all heads together |
//! | [`MatrixSplit::GateUp`] | MoE FC1 `experts.gate_up_proj` `[E, 2I, H]` | gate and up halves, each transposed |
//! | [`MatrixSplit::Transpose`] | MoE FC2 `experts.down_proj` | the matrix, transposed |

use super::error::{MuonError, MuonResult};
use crate::model::ModelConfig;

/// One matrix Muon sees: rows of the parameter matrix, in order, optionally transposed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Source rows, in the part's row order.
    pub rows: Vec<usize>,
    /// Whether the part is the transpose of the selected rows.
    pub transpose: bool,
}

impl Part {
    /// The part's `(rows, cols)` as Newton-Schulz sees it.
    pub fn dims(&self, cols: usize) -> (usize, usize) {
        if self.transpose {
            (cols, self.rows.len())
        } else {
            (self.rows.len(), cols)
        }
    }
}

/// How one parameter matrix is cut into the matrices Muon orthogonalizes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MatrixSplit {
    /// The whole matrix.
    #[default]
    Whole,
    /// The whole matrix, transposed.
    Transpose,
    /// Contiguous row blocks of these heights (must add up to the rows).
    RowBlocks(Vec<usize>),
    /// Rows viewed as `[heads, sum(sizes)]`; part `j` takes rows `sizes[j]` of every head.
    HeadRowBlocks {
        /// Number of heads.
        heads: usize,
        /// Per-head row counts of each part.
        sizes: Vec<usize>,
    },
    /// Gate and up halves of a fused FC1, each transposed (`chunk(2, dim=-2)` then `.mT`).
    GateUp,
}

impl MatrixSplit {
    /// The parts of a `[rows, cols]` matrix; fails when the split does not fit the shape.
    pub fn parts(&self, rows: usize, _cols: usize) -> MuonResult<Vec<Part>> {
        let bad = |detail: String| MuonError::plan(format!("matrix split {self:?}: {detail}"));
        let block = |start: usize, len: usize| (start..start + len).collect::<Vec<_>>();
        Ok(match self {
            MatrixSplit::Whole => vec![Part {
                rows: block(0, rows),
                transpose: false,
            }],
            MatrixSplit::Transpose => vec![Part {
                rows: block(0, rows),
                transpose: true,
            }],
            MatrixSplit::RowBlocks(sizes) => {
                if sizes.iter().sum::<usize>() != rows || sizes.contains(&0) {
                    return Err(bad(format!(
                        "blocks {sizes:?} do not tile {rows} rows with non-empty blocks"
                    )));
                }
                let mut start = 0;
                sizes
                    .iter()
                    .map(|&s| {
                        start += s;
                        Part {
                            rows: block(start - s, s),
                            transpose: false,
                        }
                    })
                    .collect()
            }
            MatrixSplit::HeadRowBlocks { heads, sizes } => {
                let per_head: usize = sizes.iter().sum();
                if *heads == 0 || heads * per_head != rows || sizes.contains(&0) {
                    return Err(bad(format!(
                        "{heads} heads of {sizes:?} rows do not tile {rows} rows"
                    )));
                }
                let mut offset = 0;
                sizes
                    .iter()
                    .map(|&s| {
                        offset += s;
                        Part {
                            rows: (0..*heads)
                                .flat_map(|h| block(h * per_head + offset - s, s))
                                .collect(),
                            transpose: false,
                        }
                    })
                    .collect()
            }
            MatrixSplit::GateUp => {
                if !rows.is_multiple_of(2) || rows == 0 {
                    return Err(bad(format!("{rows} rows cannot be halved")));
                }
                let half = rows / 2;
                vec![
                    Part {
                        rows: block(0, half),
                        transpose: true,
                    },
                    Part {
                        rows: block(half, half),
                        transpose: true,
                    },
                ]
            }
        })
    }
}

/// Cuts one row-major `[rows, cols]` matrix into its parts (each row-major in its own dims).
pub fn split_matrix(matrix: &[f32], cols: usize, parts: &[Part]) -> Vec<Vec<f32>> {
    parts
        .iter()
        .map(|p| {
            let n = p.rows.len();
            let mut out = vec![0.0f32; n * cols];
            for (i, &r) in p.rows.iter().enumerate() {
                let src = &matrix[r * cols..(r + 1) * cols];
                if p.transpose {
                    for (j, &v) in src.iter().enumerate() {
                        out[j * n + i] = v;
                    }
                } else {
                    out[i * cols..(i + 1) * cols].copy_from_slice(src);
                }
            }
            out
        })
        .collect()
}

/// Writes parts back into a row-major `[rows, cols]` matrix (the inverse of [`split_matrix`]).
pub fn restore_matrix(
    parts_data: &[Vec<f32>],
    rows: usize,
    cols: usize,
    parts: &[Part],
) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * cols];
    for (p, data) in parts.iter().zip(parts_data) {
        let n = p.rows.len();
        for (i, &r) in p.rows.iter().enumerate() {
            let dst = &mut out[r * cols..(r + 1) * cols];
            if p.transpose {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = data[j * n + i];
                }
            } else {
                dst.copy_from_slice(&data[i * cols..(i + 1) * cols]);
            }
        }
    }
    out
}

/// Which split each parameter gets, by name suffix (first match wins; default whole).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AdapterRules {
    rules: Vec<(String, MatrixSplit)>,
}

impl AdapterRules {
    /// No splits: every matrix is orthogonalized whole.
    pub fn none() -> AdapterRules {
        AdapterRules::default()
    }

    /// Adds a rule for parameter names ending in `suffix`.
    pub fn with(mut self, suffix: impl Into<String>, split: MatrixSplit) -> AdapterRules {
        self.rules.push((suffix.into(), split));
        self
    }

    /// The rules of the reference model: MLA `kv_a_proj_with_mqa` (`kv_lora, rope` rows),
    /// `q_b_proj` (`nope, rope` per head), `kv_b_proj` (`nope, v` per head); MoE
    /// `experts.gate_up_proj` (gate/up, transposed) and `experts.down_proj` (transposed).
    pub fn for_model(cfg: &ModelConfig) -> AdapterRules {
        let mut rules = AdapterRules::none();
        if let Some(m) = cfg.mla {
            rules = rules
                .with(
                    "kv_a_proj_with_mqa.weight",
                    MatrixSplit::RowBlocks(vec![m.kv_lora_rank, m.qk_rope_head_dim]),
                )
                .with(
                    "q_b_proj.weight",
                    MatrixSplit::HeadRowBlocks {
                        heads: cfg.heads,
                        sizes: vec![m.qk_nope_head_dim, m.qk_rope_head_dim],
                    },
                )
                .with(
                    "kv_b_proj.weight",
                    MatrixSplit::HeadRowBlocks {
                        heads: cfg.heads,
                        sizes: vec![m.qk_nope_head_dim, m.v_head_dim],
                    },
                );
        }
        if cfg.moe.is_some() {
            rules = rules
                .with("experts.gate_up_proj", MatrixSplit::GateUp)
                .with("experts.down_proj", MatrixSplit::Transpose);
        }
        rules
    }

    /// The split of parameter `name`.
    pub fn split_for(&self, name: &str) -> &MatrixSplit {
        static WHOLE: MatrixSplit = MatrixSplit::Whole;
        self.rules
            .iter()
            .find(|(s, _)| name.ends_with(s.as_str()))
            .map_or(&WHOLE, |(_, m)| m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_restore_exactly() {
        let (rows, cols) = (12, 5);
        let m: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        for split in [
            MatrixSplit::Whole,
            MatrixSplit::Transpose,
            MatrixSplit::RowBlocks(vec![4, 2, 6]),
            MatrixSplit::HeadRowBlocks {
                heads: 3,
                sizes: vec![3, 1],
            },
            MatrixSplit::GateUp,
        ] {
            let parts = split.parts(rows, cols).unwrap();
            let data = split_matrix(&m, cols, &parts);
            for (p, d) in parts.iter().zip(&data) {
                let (r, c) = p.dims(cols);
                assert_eq!(d.len(), r * c);
            }
            assert_eq!(restore_matrix(&data, rows, cols, &parts), m, "{split:?}");
        }
        let heads = MatrixSplit::HeadRowBlocks {
            heads: 2,
            sizes: vec![2, 1],
        }
        .parts(6, 1)
        .unwrap();
        assert_eq!(heads[0].rows, vec![0, 1, 3, 4]);
        assert_eq!(heads[1].rows, vec![2, 5]);
        assert!(MatrixSplit::RowBlocks(vec![3]).parts(4, 1).is_err());
        assert!(MatrixSplit::GateUp.parts(3, 1).is_err());
    }
}
