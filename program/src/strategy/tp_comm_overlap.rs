//! How TP collectives run next to their GEMMs (`[train] tp_comm_overlap`): the mode the
//! options carry, apart from [`super::tp_overlap`], which plans the fused pairs (and reads the
//! options through the compute stages).

use serde::{Deserialize, Serialize};

/// How TP collectives run next to the GEMMs that produce or consume them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum TpCommOverlap {
    /// Every TP collective is serialized with the compute around it.
    #[default]
    None,
    /// Collective and neighbouring GEMM are fused and pipelined in `chunks` chunks.
    Fused {
        /// Chunks of the pipeline (at least 1).
        chunks: u64,
    },
}

impl TpCommOverlap {
    /// The mode named `mode` (one of [`hpfsdp_plan::scenario::TP_COMM_OVERLAP_MODES`]) with `chunks` chunks when fused (default:
    /// `tp_degree`, at least 1). `None` for an unknown name or zero chunks.
    pub fn resolve(mode: &str, chunks: Option<u64>, tp_degree: u64) -> Option<Self> {
        match mode {
            "none" => Some(Self::None),
            "fused" => {
                let chunks = chunks.unwrap_or(tp_degree.max(1));
                (chunks > 0).then_some(Self::Fused { chunks })
            }
            _ => None,
        }
    }

    /// Chunks of a fused pair (`None` without overlap).
    pub fn chunks(self) -> Option<u64> {
        match self {
            Self::None => None,
            Self::Fused { chunks } => Some(chunks),
        }
    }
}
