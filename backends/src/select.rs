//! Choosing a backend at run time and launching its ranks.
//!
//! - `inproc`: N ranks as threads of this process ([`InProcWorld`]); always available.
//! - `mpi`: one rank per process under `mpirun` (`MpiComm::world_with`, deterministic
//!   reductions, the run's timeout on every wait; cargo feature `mpi`).
//! - `nccl`: one rank per process, NCCL loaded at run time (`NcclComm::from_env()`, feature
//!   `nccl`).
//! - `hccl`: one rank per process, HCCL loaded at run time (`HcclComm::from_env()`, feature
//!   `hccl`).
//!
//! A backend whose feature was not compiled in is a clear error telling how to rebuild.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::collective::Collective;
use crate::error::CommError;
use crate::inproc::InProcWorld;

/// A collective backend the CLI can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Threads of this process.
    InProc,
    /// MPI processes.
    Mpi,
    /// Huawei HCCL (Ascend).
    Hccl,
    /// NVIDIA NCCL.
    Nccl,
}

impl BackendKind {
    /// Every backend, in CLI order.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::InProc,
        BackendKind::Mpi,
        BackendKind::Hccl,
        BackendKind::Nccl,
    ];

    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::InProc => "inproc",
            BackendKind::Mpi => "mpi",
            BackendKind::Hccl => "hccl",
            BackendKind::Nccl => "nccl",
        }
    }

    /// The cargo feature that compiles the backend in (`None`: always built).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            BackendKind::InProc => None,
            BackendKind::Mpi => Some("mpi"),
            BackendKind::Hccl => Some("hccl"),
            BackendKind::Nccl => Some("nccl"),
        }
    }

    /// Whether this binary was built with the backend.
    pub fn compiled_in(self) -> bool {
        match self {
            BackendKind::InProc => true,
            BackendKind::Mpi => cfg!(feature = "mpi"),
            BackendKind::Hccl => cfg!(feature = "hccl"),
            BackendKind::Nccl => cfg!(feature = "nccl"),
        }
    }

    /// Whether ranks are threads of this process (else one rank per process).
    pub fn ranks_are_threads(self) -> bool {
        self == BackendKind::InProc
    }

    /// The hardware profile a prediction for this backend uses by default: `cpu-mpi` for the
    /// CPU backends, the scenario's own profile for the accelerator backends.
    pub fn default_hardware(self, scenario_hardware: &str) -> String {
        match self {
            BackendKind::InProc | BackendKind::Mpi => "cpu-mpi".to_string(),
            BackendKind::Hccl | BackendKind::Nccl => scenario_hardware.to_string(),
        }
    }

    /// What the backend needs on the machine, for error messages.
    fn needs(self) -> &'static str {
        match self {
            BackendKind::InProc => "nothing",
            BackendKind::Mpi => "libopenmpi-dev",
            BackendKind::Hccl => "CANN's libhccl and libascendcl at run time",
            BackendKind::Nccl => "libnccl and the CUDA runtime at run time",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        BackendKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown backend '{s}'; choose one of {}",
                    BackendKind::ALL.map(BackendKind::name).join(", ")
                )
            })
    }
}

/// Why a backend could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// The backend's cargo feature was not compiled in.
    #[error(
        "this hpfsdp was built without the `{feature}` feature; rebuild with `cargo build --release --features {feature}` (needs {needs})"
    )]
    NotBuilt {
        /// The feature.
        feature: &'static str,
        /// What the backend needs.
        needs: &'static str,
    },
    /// The backend failed to start.
    #[error("starting the {backend} backend: {source}")]
    Start {
        /// Backend name.
        backend: &'static str,
        /// The backend's error.
        source: CommError,
    },
}

/// Fails with [`SelectError::NotBuilt`] when `kind` was not compiled in.
pub fn ensure_built(kind: BackendKind) -> Result<(), SelectError> {
    match kind.feature() {
        Some(feature) if !kind.compiled_in() => Err(SelectError::NotBuilt {
            feature,
            needs: kind.needs(),
        }),
        _ => Ok(()),
    }
}

/// Runs `f` on every rank of `kind` that lives in this process and returns their results in
/// rank order: `threads` ranks (each waiting at most `timeout` on a peer) for `inproc`, this
/// process's single rank for the others.
pub fn run_on_backend<R, F>(
    kind: BackendKind,
    threads: usize,
    timeout: Duration,
    f: F,
) -> Result<Vec<R>, SelectError>
where
    R: Send,
    F: Fn(&dyn Collective) -> R + Sync,
{
    ensure_built(kind)?;
    let start = |source| SelectError::Start {
        backend: kind.name(),
        source,
    };
    match kind {
        BackendKind::InProc => {
            let world = InProcWorld::new(threads)
                .map_err(start)?
                .with_timeout(timeout);
            let run = world.launch(|c| f(c)).map_err(start)?;
            Ok(run.results)
        }
        #[cfg(feature = "mpi")]
        BackendKind::Mpi => {
            let comm = crate::mpi::MpiComm::world_with(crate::mpi::MpiOptions {
                mode: crate::mpi::ReductionMode::Deterministic,
                timeout,
            })
            .map_err(start)?;
            Ok(vec![f(&comm)])
        }
        #[cfg(feature = "nccl")]
        BackendKind::Nccl => {
            let comm = crate::nccl::NcclComm::from_env().map_err(start)?;
            Ok(vec![f(&comm)])
        }
        #[cfg(feature = "hccl")]
        BackendKind::Hccl => {
            let comm = crate::hccl::HcclComm::from_env().map_err(start)?;
            Ok(vec![f(&comm)])
        }
        #[allow(unreachable_patterns)]
        other => Err(SelectError::NotBuilt {
            feature: other.feature().unwrap_or("inproc"),
            needs: other.needs(),
        }),
    }
}

/// Whether the backend runs on an accelerator (its ranks hold device memory and streams).
pub fn is_device(kind: BackendKind) -> bool {
    matches!(kind, BackendKind::Hccl | BackendKind::Nccl)
}

/// Runs `f` on this process's rank of an accelerator backend (`nccl`, `hccl`) with the
/// device view of its communicator (device buffers, streams, device name, kernels).
#[cfg(any(feature = "hccl", feature = "nccl"))]
pub fn run_on_device_backend<R, F>(kind: BackendKind, f: F) -> Result<R, SelectError>
where
    F: FnOnce(&dyn crate::device::DeviceCollective) -> R,
{
    ensure_built(kind)?;
    let start = |source| SelectError::Start {
        backend: kind.name(),
        source,
    };
    match kind {
        #[cfg(feature = "nccl")]
        BackendKind::Nccl => {
            let comm = crate::nccl::NcclComm::from_env().map_err(start)?;
            Ok(f(&comm))
        }
        #[cfg(feature = "hccl")]
        BackendKind::Hccl => {
            let comm = crate::hccl::HcclComm::from_env().map_err(start)?;
            Ok(f(&comm))
        }
        other => Err(start(CommError::Unavailable {
            backend: other.name().into(),
            reason: "not an accelerator backend".into(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_explains_missing_features() {
        assert_eq!("mpi".parse::<BackendKind>().unwrap(), BackendKind::Mpi);
        let e = "gloo".parse::<BackendKind>().unwrap_err();
        assert!(e.contains("unknown backend 'gloo'") && e.contains("inproc, mpi, hccl, nccl"));
        assert_eq!(BackendKind::InProc.default_hardware("x"), "cpu-mpi");
        assert_eq!(
            BackendKind::Nccl.default_hardware("nvidia-h100-hgx"),
            "nvidia-h100-hgx"
        );
        if !cfg!(feature = "mpi") {
            let e = ensure_built(BackendKind::Mpi).unwrap_err().to_string();
            assert_eq!(
                e,
                "this hpfsdp was built without the `mpi` feature; rebuild with `cargo build --release --features mpi` (needs libopenmpi-dev)"
            );
        }
        let ranks =
            run_on_backend(BackendKind::InProc, 3, Duration::from_secs(5), |c| c.rank()).unwrap();
        assert_eq!(ranks, vec![0, 1, 2]);
    }
}
