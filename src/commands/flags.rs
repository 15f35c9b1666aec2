//! Value parsers of command-line flags that several commands share (clap's `value_parser`).

use hpfsdp_backends::replay::{ComputeMode, FaultInjection};
use hpfsdp_backends::select::BackendKind;

/// Parses `--backend`.
pub(crate) fn parse_backend(text: &str) -> Result<BackendKind, String> {
    text.parse()
}

/// Parses `--compute`.
pub(crate) fn parse_compute(text: &str) -> Result<ComputeMode, String> {
    text.parse()
}

/// Parses `--inject-fault`.
pub(crate) fn parse_fault(text: &str) -> Result<FaultInjection, String> {
    text.parse()
}
