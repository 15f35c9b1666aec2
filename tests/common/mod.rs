//! Helpers shared by the CLI tests: run the built `hpfsdp` binary from the repository root and
//! read its output, and make fresh per-process scratch directories.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs the built `hpfsdp` with `args` in the repository root (scenario paths are relative to it).
pub fn hpfsdp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("run hpfsdp")
}

/// stdout followed by stderr, lossily decoded: what a user sees in the terminal.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `$TMPDIR/hpfsdp-<suite>-<tag>-<pid>`, removed if it exists (not created: commands that take
/// `--out` create it themselves).
pub fn fresh_dir(suite: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hpfsdp-{suite}-{tag}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    dir
}
