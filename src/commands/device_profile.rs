//! Which hardware profile a `replay` or `collbench` prediction uses, and why: the profile of
//! the device the run is on.
//!
//! - `--hardware NAME` always wins (the reason says so, and names the device when it is
//!   known and would have picked another profile);
//! - the CPU backends (`inproc`, `mpi`) run on this machine's cores: `cpu-mpi`;
//! - the accelerator backends (`nccl`, `hccl`) ask the runtime for the device's name
//!   (`cuDeviceGetName`, `aclrtGetSocName`) and pick the profile of [`DEVICE_PROFILES`] whose
//!   pattern the name contains (first match, case-insensitive); a device no pattern matches
//!   is refused, naming `--hardware`, so a GPU run is never compared with another device's
//!   prediction without a word.

use anyhow::{Result, bail};
use hpfsdp_backends::select::{BackendKind, is_device};

/// Device-name patterns and the profile each picks (`None`: a known device without a
/// profile of its own). Checked in order; the first pattern the name contains wins.
pub const DEVICE_PROFILES: &[(&str, Option<&str>)] = &[
    // Grace Hopper (an H100-class GPU with its own memory system): no profile yet.
    ("GH200", None),
    ("GB200", Some("nvidia-gb200-nvl72")),
    ("H200", Some("nvidia-h200-hgx")),
    ("H100", Some("nvidia-h100-hgx")),
    // Ascend 910C (A3) SoCs report as Ascend910_93xx.
    ("910_93", Some("ascend-910c-a3")),
    ("910C", Some("ascend-910c-a3")),
    ("910B", Some("ascend-910b")),
];

/// The profile a prediction uses and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileChoice {
    /// Profile name (`scenarios/hardware/<name>.toml`).
    pub name: String,
    /// One sentence saying why this profile.
    pub reason: String,
}

/// The profile whose pattern `device` contains, if any (see [`DEVICE_PROFILES`]).
pub fn profile_for_device(device: &str) -> Option<&'static str> {
    let upper = device.to_ascii_uppercase();
    DEVICE_PROFILES
        .iter()
        .find(|(pattern, _)| upper.contains(&pattern.to_ascii_uppercase()))
        .and_then(|(_, profile)| *profile)
}

/// Chooses the profile for a run on `backend`: `explicit` (`--hardware`), else `cpu-mpi`
/// for the CPU backends, else the device's own (`device` is the runtime's name for it, or
/// why it could not be read).
pub fn choose(
    explicit: Option<&str>,
    backend: BackendKind,
    device: Option<Result<String, String>>,
) -> Result<ProfileChoice> {
    let device_name = device.as_ref().and_then(|d| d.as_ref().ok());
    if let Some(name) = explicit {
        let mut reason = format!("--hardware {name}");
        if let Some(d) = device_name {
            reason.push_str(&format!(" (the device is '{d}'"));
            match profile_for_device(d) {
                Some(own) if own != name => reason.push_str(&format!(", whose profile is {own})")),
                _ => reason.push(')'),
            }
        }
        return Ok(ProfileChoice {
            name: name.to_string(),
            reason,
        });
    }
    if !is_device(backend) {
        return Ok(ProfileChoice {
            name: "cpu-mpi".into(),
            reason: format!(
                "the {backend} backend runs on this machine's CPU cores (profile cpu-mpi; --hardware NAME picks another)"
            ),
        });
    }
    match device {
        Some(Ok(d)) => match profile_for_device(&d) {
            Some(p) => Ok(ProfileChoice {
                name: p.to_string(),
                reason: format!("the device is '{d}', which profile {p} describes"),
            }),
            None => bail!(
                "the device is '{d}' and no hardware profile matches it; pass --hardware NAME with a profile of scenarios/hardware/ (or write one for this device with `hpfsdp calibrate`)"
            ),
        },
        Some(Err(e)) => bail!("cannot read the device's name ({e}); pass --hardware NAME"),
        None => bail!("the {backend} backend gave no device; pass --hardware NAME"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_pick_their_profiles() {
        assert_eq!(profile_for_device("NVIDIA H200"), Some("nvidia-h200-hgx"));
        assert_eq!(
            profile_for_device("NVIDIA H100 80GB HBM3"),
            Some("nvidia-h100-hgx")
        );
        assert_eq!(
            profile_for_device("NVIDIA GB200"),
            Some("nvidia-gb200-nvl72")
        );
        assert_eq!(profile_for_device("NVIDIA GH200 480GB"), None);
        assert_eq!(profile_for_device("Ascend910B2"), Some("ascend-910b"));
        assert_eq!(profile_for_device("Ascend910_9391"), Some("ascend-910c-a3"));
        assert_eq!(profile_for_device("NVIDIA A100-SXM4-80GB"), None);
        // Every profile named here exists in scenarios/hardware/.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/hardware");
        for (_, p) in DEVICE_PROFILES {
            if let Some(p) = p {
                assert!(dir.join(format!("{p}.toml")).is_file(), "{p}");
            }
        }
    }

    #[test]
    fn the_choice_says_why_or_refuses_naming_hardware() {
        let h200 = Some(Ok("NVIDIA H200".to_string()));
        let c = choose(None, BackendKind::Nccl, h200.clone()).unwrap();
        assert_eq!(c.name, "nvidia-h200-hgx");
        assert!(c.reason.contains("'NVIDIA H200'"), "{}", c.reason);
        let c = choose(Some("ascend-910c-a3"), BackendKind::Nccl, h200).unwrap();
        assert_eq!(c.name, "ascend-910c-a3");
        assert!(
            c.reason.contains("whose profile is nvidia-h200-hgx"),
            "{}",
            c.reason
        );
        let e = choose(None, BackendKind::Nccl, Some(Ok("NVIDIA A100".into())))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'NVIDIA A100'") && e.contains("--hardware"),
            "{e}"
        );
        let e = choose(None, BackendKind::Hccl, Some(Err("no symbol".into())))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no symbol") && e.contains("--hardware"), "{e}");
        assert_eq!(
            choose(None, BackendKind::InProc, None).unwrap().name,
            "cpu-mpi"
        );
    }
}
