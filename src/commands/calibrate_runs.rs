//! What `hpfsdp calibrate` calibrates and against what: the hardware profile (`--hardware`, a
//! shipped name or a profile file of one's own) and the runs files it is compared with
//! (`--runs FILE`..., or every shipped runs file of `scenarios/runs/` measured on that
//! profile), with a progress bar over the fit's simulations.

use anyhow::{Context, Result, bail};
use hpfsdp_plan::input_file::read_text;
use hpfsdp_plan::limits::{PROFILE_FILE, RUNS_FILE};
use hpfsdp_sim::HardwareProfile;
use hpfsdp_sim::calibration::{CalibrationSet, RUNS_DIR, RunsFile};
use hpfsdp_sim::profile::BUILTIN_PROFILES;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Directory of the shipped profiles.
pub const PROFILE_DIR: &str = "scenarios/hardware";

/// The profile being calibrated: parsed, its TOML text, and its file (none for a built-in
/// copy).
pub struct Profile {
    /// The profile.
    pub profile: HardwareProfile,
    /// Its TOML text (what `--write-profile` edits).
    pub text: String,
    /// Its file, when it was read from one.
    pub source: Option<PathBuf>,
}

/// True when a `--hardware` value names a profile file rather than a shipped profile.
pub fn is_profile_path(hardware: &str) -> bool {
    hardware.ends_with(".toml") || hardware.contains('/') || hardware.contains('\\')
}

/// Loads `--hardware`: a shipped profile name (`scenarios/hardware/<name>.toml` or the
/// built-in copy) or the path of a profile file (`my-cluster.toml`).
pub fn load_profile(hardware: &str) -> Result<Profile> {
    if is_profile_path(hardware) {
        let path = PathBuf::from(hardware);
        let profile = HardwareProfile::load(&path)
            .with_context(|| format!("--hardware {hardware}: loading the profile file"))?;
        let text =
            read_text(&path, &PROFILE_FILE).with_context(|| format!("--hardware {hardware}"))?;
        return Ok(Profile {
            profile,
            text,
            source: Some(path),
        });
    }
    crate::commands::preflight::check_hardware_flag(hardware)?;
    let profile = HardwareProfile::load_named(hardware, PROFILE_DIR)
        .with_context(|| format!("loading hardware profile '{hardware}'"))?;
    let path = Path::new(PROFILE_DIR).join(format!("{hardware}.toml"));
    if path.exists() {
        let text = read_text(&path, &PROFILE_FILE)?;
        return Ok(Profile {
            profile,
            text,
            source: Some(path),
        });
    }
    let text = BUILTIN_PROFILES
        .iter()
        .find(|(n, _)| *n == hardware)
        .map(|(_, t)| t.to_string())
        .with_context(|| format!("no hardware profile '{hardware}'"))?;
    Ok(Profile {
        profile,
        text,
        source: None,
    })
}

/// The runs files to compare with and where they came from.
pub struct Runs {
    /// The files, read and checked.
    pub files: Vec<RunsFile>,
    /// True when they were given with `--runs`; false when found in [`RUNS_DIR`].
    pub explicit: bool,
}

/// Reads the `--runs` files (each must be measured on `profile` unless `any_hardware`), or,
/// without any, every runs file of [`RUNS_DIR`] whose `hardware` is the profile's name.
pub fn runs_files(paths: &[PathBuf], profile: &str, any_hardware: bool) -> Result<Runs> {
    if paths.is_empty() {
        return Ok(Runs {
            files: shipped_runs(Path::new(RUNS_DIR), profile)?,
            explicit: false,
        });
    }
    let mut files = Vec::new();
    for path in paths {
        let file = load_runs_file(path).with_context(|| format!("--runs {}", path.display()))?;
        if file.hardware != profile && !any_hardware {
            bail!(
                "--runs {}: its runs were measured on profile '{}' (hardware = \"{}\"), but \
                 --hardware is '{profile}'; calibrate them with --hardware {}, or pass \
                 --any-hardware to compare them with '{profile}' anyway",
                path.display(),
                file.hardware,
                file.hardware,
                file.hardware
            );
        }
        files.push(file);
    }
    Ok(Runs {
        files,
        explicit: true,
    })
}

/// Reads a runs file with the input-file cap ([`RUNS_FILE`]: regular files of at most 4 MiB;
/// a device, FIFO or directory is refused by name) and checks it.
fn load_runs_file(path: &Path) -> Result<RunsFile> {
    let text = read_text(path, &RUNS_FILE)?;
    Ok(RunsFile::parse(&text, path)?)
}

/// Every runs file of `dir` (sorted by name) measured on `profile`; none when `dir` does
/// not exist.
fn shipped_runs(dir: &Path, profile: &str) -> Result<Vec<RunsFile>> {
    #[derive(Deserialize)]
    struct HardwareOnly {
        hardware: String,
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    paths.sort();
    let mut files = Vec::new();
    for path in paths {
        let text = read_text(&path, &RUNS_FILE)?;
        let head: HardwareOnly = toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "{}: not a runs file ({}); fix it or move it out of {}",
                path.display(),
                e.message().trim(),
                dir.display()
            )
        })?;
        if head.hardware == profile {
            files.push(RunsFile::parse(&text, &path)?);
        }
    }
    Ok(files)
}

/// One line saying what the comparison covers: the profile, the runs and their files.
pub fn scope_line(profile: &str, set: &CalibrationSet) -> String {
    let files: Vec<String> = set
        .files()
        .iter()
        .map(|f| f.path.display().to_string())
        .collect();
    format!(
        "calibrate: profile {profile} compared with {} measured run{} of {} experiment{} ({})",
        set.runs().count(),
        if set.runs().count() == 1 { "" } else { "s" },
        set.experiments().len(),
        if set.experiments().len() == 1 {
            ""
        } else {
            "s"
        },
        files.join(", ")
    )
}

/// The message when no runs file is measured on `profile`.
pub fn nothing_compared(profile: &str) -> String {
    format!(
        "no measured runs for profile {profile}: nothing compared (no runs file in {RUNS_DIR}/ \
         says hardware = \"{profile}\"; pass --runs FILE to compare with runs of your own)"
    )
}

/// A spinner on stderr (hidden when stderr is not a terminal) that counts the set's
/// simulations; its message says which fit is running.
pub fn progress(set: &mut CalibrationSet) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {pos} simulations ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let observer = bar.clone();
    set.observe(Box::new(move |n| observer.set_position(n as u64)));
    bar
}
