//! What a replay does besides walking the program: steps, warm-up, compute mode, the fault
//! deadline and an optional injected fault (for testing fault detection).

use std::str::FromStr;
use std::time::Duration;

/// How compute and copy ops spend their time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ComputeMode {
    /// Spin for the duration the simulator predicts for the op (calibrated busy work), so a
    /// replay isolates the communication schedule from the CPU's compute speed.
    #[default]
    Busy,
    /// Run a plain f32 GEMM with the op's FLOPs (see [`crate::replay::work`] for the shape
    /// rule) and real memory copies of the op's bytes.
    Real,
}

impl ComputeMode {
    /// The CLI name (`busy`, `real`).
    pub fn name(self) -> &'static str {
        match self {
            ComputeMode::Busy => "busy",
            ComputeMode::Real => "real",
        }
    }
}

impl FromStr for ComputeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "busy" => Ok(ComputeMode::Busy),
            "real" => Ok(ComputeMode::Real),
            other => Err(format!(
                "unknown compute mode '{other}'; use busy (spin for the predicted time) or real (f32 GEMMs)"
            )),
        }
    }
}

/// What an injected fault does when its rank reaches its op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The rank panics.
    Panic,
    /// The rank fails with an error (as a backend or allocation failure would).
    Error,
    /// The rank stops making progress (until the run is aborted or twice the timeout passed).
    Hang,
    /// The rank issues a different collective from its peers (all-reduce instead of the
    /// planned kind, or all-gather instead of an all-reduce); the op must be a collective.
    Mismatch,
}

impl FaultKind {
    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Panic => "panic",
            FaultKind::Error => "error",
            FaultKind::Hang => "hang",
            FaultKind::Mismatch => "mismatch",
        }
    }
}

/// A fault to inject: `rank:op:kind` (op = index in the rank's step program), in the first
/// step walked (warm-up included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultInjection {
    /// The faulty rank.
    pub rank: usize,
    /// The op index at which it fails.
    pub op: usize,
    /// How it fails.
    pub kind: FaultKind,
}

impl FromStr for FaultInjection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let usage =
            "expected RANK:OP:KIND with KIND one of panic, error, hang, mismatch (e.g. 1:4:hang)";
        let parts: Vec<&str> = s.split(':').collect();
        let [rank, op, kind] = parts.as_slice() else {
            return Err(format!("--inject-fault '{s}': {usage}"));
        };
        let rank = rank
            .parse()
            .map_err(|_| format!("--inject-fault '{s}': rank '{rank}' is not a number; {usage}"))?;
        let op = op
            .parse()
            .map_err(|_| format!("--inject-fault '{s}': op '{op}' is not a number; {usage}"))?;
        let kind = match *kind {
            "panic" => FaultKind::Panic,
            "error" => FaultKind::Error,
            "hang" => FaultKind::Hang,
            "mismatch" => FaultKind::Mismatch,
            other => {
                return Err(format!(
                    "--inject-fault '{s}': unknown kind '{other}'; {usage}"
                ));
            }
        };
        Ok(FaultInjection { rank, op, kind })
    }
}

/// Options of one replay run.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// Measured steps (at least 1).
    pub steps: usize,
    /// Unmeasured warm-up steps before them.
    pub warmup: usize,
    /// How compute and copy ops spend their time.
    pub compute: ComputeMode,
    /// A collective not complete after this long is a fault (a hung or dead peer).
    pub timeout: Duration,
    /// A fault to inject, for testing fault detection.
    pub fault: Option<FaultInjection>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            steps: 1,
            warmup: 0,
            compute: ComputeMode::Busy,
            timeout: Duration::from_secs(60),
            fault: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fault_specs_and_modes() {
        let f: FaultInjection = "1:4:hang".parse().unwrap();
        assert_eq!((f.rank, f.op, f.kind), (1, 4, FaultKind::Hang));
        assert!(
            "1:4"
                .parse::<FaultInjection>()
                .unwrap_err()
                .contains("RANK:OP:KIND")
        );
        assert!(
            "x:4:panic"
                .parse::<FaultInjection>()
                .unwrap_err()
                .contains("rank 'x'")
        );
        assert!(
            "1:4:boom"
                .parse::<FaultInjection>()
                .unwrap_err()
                .contains("unknown kind 'boom'")
        );
        assert_eq!("real".parse::<ComputeMode>().unwrap(), ComputeMode::Real);
        assert!("gpu".parse::<ComputeMode>().unwrap_err().contains("busy"));
    }
}
