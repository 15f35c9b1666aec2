//! Placements: how one mesh axis distributes a tensor (replicate, shard, strided shard,
//! partial, ragged), with the scenario-file placement DSL.

use crate::error::{PlanError, PlanResult};
use serde::{Deserialize, Serialize};

/// Reduction applied when a `Partial` tensor is made whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReduceOp {
    /// Element-wise sum over the axis.
    Sum,
    /// Element-wise mean over the axis.
    Avg,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

impl ReduceOp {
    /// Lower-case name as written in placement strings.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How one mesh axis distributes a tensor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Placement {
    /// Every rank of the axis holds the whole (remaining) tensor.
    Replicate,
    /// The tensor is split along `dim` with ceil-chunk semantics.
    Shard {
        /// Tensor dimension that is split.
        dim: usize,
    },
    /// Split along `dim` when axes to the right already split the same dim: the dim is cut
    /// into `split_factor * axis_size` chunks and rank `i` holds chunks `j*axis_size + i`.
    StridedShard {
        /// Tensor dimension that is split.
        dim: usize,
        /// Number of interleaved pieces each rank holds (>= 1).
        split_factor: usize,
    },
    /// Every rank holds a partial value that must be reduced with `op`.
    Partial {
        /// The pending reduction.
        op: ReduceOp,
    },
    /// Uneven split of the flattened leading `dims` dimensions with explicit unit counts per
    /// rank along this axis (HyperParallel's RaggedShard).
    RaggedShard {
        /// Number of leading tensor dims flattened into cells.
        dims: usize,
        /// Units held by each rank of the axis, in axis order.
        local_units: Vec<u64>,
    },
}

impl Placement {
    /// `Shard(dim)`.
    pub fn shard(dim: usize) -> Self {
        Placement::Shard { dim }
    }

    /// `Partial(sum)`.
    pub fn partial_sum() -> Self {
        Placement::Partial { op: ReduceOp::Sum }
    }

    /// The tensor dim this placement splits, if any (ragged shards report dim 0).
    pub fn shard_dim(&self) -> Option<usize> {
        match self {
            Placement::Shard { dim } | Placement::StridedShard { dim, .. } => Some(*dim),
            Placement::RaggedShard { .. } => Some(0),
            _ => None,
        }
    }

    /// True for every sharding variant.
    pub fn is_shard(&self) -> bool {
        self.shard_dim().is_some()
    }

    /// True for `Partial`.
    pub fn is_partial(&self) -> bool {
        matches!(self, Placement::Partial { .. })
    }

    /// True for `Replicate`.
    pub fn is_replicate(&self) -> bool {
        matches!(self, Placement::Replicate)
    }

    /// Parses the scenario DSL: `replicate`, `partial`, `partial(sum|avg|max|min)`,
    /// `shard(N)`, `strided_shard(N, F)`; case-insensitive, whitespace-tolerant.
    /// Short forms `R`, `P`, `S(N)` are accepted too.
    pub fn parse(text: &str) -> PlanResult<Self> {
        let compact: String = text
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_lowercase();
        let bad = || {
            PlanError::Placement(format!(
                "'{text}' is not a placement; write replicate, partial, partial(sum|avg|max|min), \
                 shard(N) or strided_shard(N,F)"
            ))
        };
        let args = |prefix: &str| -> Option<Vec<String>> {
            let inner = compact
                .strip_prefix(prefix)?
                .strip_prefix('(')?
                .strip_suffix(')')?;
            Some(inner.split(',').map(str::to_string).collect())
        };
        match compact.as_str() {
            "replicate" | "r" => return Ok(Placement::Replicate),
            "partial" | "p" => return Ok(Placement::partial_sum()),
            _ => {}
        }
        if let Some(a) = args("partial") {
            let op = match a.as_slice() {
                [o] if o == "sum" => ReduceOp::Sum,
                [o] if o == "avg" => ReduceOp::Avg,
                [o] if o == "max" => ReduceOp::Max,
                [o] if o == "min" => ReduceOp::Min,
                _ => return Err(bad()),
            };
            return Ok(Placement::Partial { op });
        }
        if let Some(a) = args("strided_shard").or_else(|| args("ss")) {
            return match a.as_slice() {
                [d, f] => {
                    let dim = d.parse().map_err(|_| bad())?;
                    let split_factor: usize = f.parse().map_err(|_| bad())?;
                    if split_factor == 0 {
                        return Err(PlanError::Placement(format!(
                            "'{text}': split factor must be >= 1"
                        )));
                    }
                    Ok(Placement::StridedShard { dim, split_factor })
                }
                _ => Err(bad()),
            };
        }
        if let Some(a) = args("shard").or_else(|| args("s")) {
            return match a.as_slice() {
                [d] => Ok(Placement::Shard {
                    dim: d.parse().map_err(|_| bad())?,
                }),
                _ => Err(bad()),
            };
        }
        Err(bad())
    }
}

impl std::fmt::Display for Placement {
    /// Short form used in tables: `R`, `S(0)`, `SS(0,2)`, `P(sum)`, `RS(1;[2,1,1])`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Replicate => write!(f, "R"),
            Placement::Shard { dim } => write!(f, "S({dim})"),
            Placement::StridedShard { dim, split_factor } => write!(f, "SS({dim},{split_factor})"),
            Placement::Partial { op } => write!(f, "P({})", op.name()),
            Placement::RaggedShard { dims, local_units } => {
                let units: Vec<String> = local_units.iter().map(u64::to_string).collect();
                write!(f, "RS({dims};[{}])", units.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsl_parses_and_prints() {
        assert_eq!(
            Placement::parse(" Replicate ").unwrap(),
            Placement::Replicate
        );
        assert_eq!(Placement::parse("shard( 1 )").unwrap(), Placement::shard(1));
        assert_eq!(
            Placement::parse("partial").unwrap(),
            Placement::partial_sum()
        );
        assert_eq!(
            Placement::parse("partial(max)").unwrap(),
            Placement::Partial { op: ReduceOp::Max }
        );
        assert_eq!(
            Placement::parse("strided_shard(0,2)").unwrap(),
            Placement::StridedShard {
                dim: 0,
                split_factor: 2
            }
        );
        assert_eq!(Placement::parse("S(2)").unwrap().to_string(), "S(2)");
        for bad in [
            "shard",
            "shard(x)",
            "split(0)",
            "partial(prod)",
            "strided_shard(0,0)",
            "",
        ] {
            let err = Placement::parse(bad).unwrap_err().to_string();
            assert!(err.contains("placement"), "{bad}: {err}");
        }
    }
}
