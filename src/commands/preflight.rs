//! Checks of command-line arguments made before any work starts: an output directory that
//! cannot be written, a `--hardware` name that is a path, a hardware profile whose machines
//! contradict the scenario's topology. Each error names the flag and the fix.

use anyhow::{Result, bail};
use hpfsdp_plan::scenario::{Scenario, check_profile_name};
use hpfsdp_sim::HardwareProfile;
use std::path::Path;

/// Creates `dir` (and its parents) and proves it writable by creating and removing a probe
/// file, so that `--out` into a read-only place fails before a long simulation, not after.
pub fn ensure_writable_dir(dir: &Path, flag: &str) -> Result<()> {
    if let Err(e) = std::fs::create_dir_all(dir) {
        bail!(
            "{flag} {}: cannot create the directory: {e}; choose a writable directory",
            dir.display()
        );
    }
    let probe = dir.join(format!(".hpfsdp-write-probe-{}", std::process::id()));
    if let Err(e) = std::fs::write(&probe, b"") {
        bail!(
            "{flag} {}: the directory is not writable: {e}; choose a writable directory",
            dir.display()
        );
    }
    // The probe is ours; failing to remove it leaves an empty file, not an error.
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Checks a `--hardware` flag value: a plain profile name, not empty and not a path.
pub fn check_hardware_flag(name: &str) -> Result<()> {
    check_profile_name(name).map_err(|e| anyhow::anyhow!("--hardware: {e}"))
}

/// Checks that a `--hardware` profile can hold the scenario's topology: its dies per machine
/// must equal the scenario's, unless the whole scenario fits inside one of its machines.
pub fn check_profile_topology(profile: &HardwareProfile, scenario: &Scenario) -> Result<()> {
    let t = &scenario.file.topology;
    let per_machine = profile.topology.dies_per_machine;
    let one_machine = t.machines_per_supernode == 1 && t.supernodes == 1;
    if t.dies_per_machine == per_machine || (one_machine && t.dies_per_machine <= per_machine) {
        return Ok(());
    }
    bail!(
        "--hardware {}: the profile has {per_machine} dies per machine but {} [topology] \
         dies_per_machine = {} ({} x {} x {} dies); choose a profile with {} dies per machine, \
         or write a scenario whose [topology] dies_per_machine = {per_machine}",
        profile.name,
        scenario.path.display(),
        t.dies_per_machine,
        t.dies_per_machine,
        t.machines_per_supernode,
        t.supernodes,
        t.dies_per_machine
    )
}
