//! The profile constants calibration can read and write by dotted key
//! (`calibration.copy_efficiency`, `tiers.intra_machine.efficiency`): one list, so a runs
//! file's `[[fit]]` key, a measured constant or a sourced range naming anything else is
//! refused when the file is read.

use crate::profile::HardwareProfile;

macro_rules! profile_keys {
    (
        $($key:literal => $($field:ident).+;)*
        optional: $($okey:literal => $($ofield:ident).+;)*
    ) => {
        /// Every key [`get`] and [`set`] know, in table order.
        pub const KEYS: &[&str] = &[$($key,)* $($okey),*];

        /// Reads a constant of a profile by its dotted key; `None` for a key not in [`KEYS`]
        /// (and for an optional key the profile leaves unset).
        pub fn get(profile: &HardwareProfile, key: &str) -> Option<f64> {
            Some(match key {
                $($key => profile.$($field).+,)*
                $($okey => return profile.$($ofield).+,)*
                _ => return None,
            })
        }

        /// Writes a constant of a profile by its dotted key; false for a key not in [`KEYS`].
        pub fn set(profile: &mut HardwareProfile, key: &str, value: f64) -> bool {
            match key {
                $($key => profile.$($field).+ = value,)*
                $($okey => profile.$($ofield).+ = Some(value),)*
                _ => return false,
            }
            true
        }
    };
}

profile_keys! {
    "calibration.gemm_ceiling" => calibration.gemm_ceiling;
    "calibration.hbm_efficiency" => calibration.hbm_efficiency;
    "calibration.copy_efficiency" => calibration.copy_efficiency;
    "calibration.device_launch_us_per_kernel" => calibration.device_launch_us_per_kernel;
    "calibration.collective_base_latency_us" => calibration.collective_base_latency_us;
    "calibration.host_launch_us_per_kernel" => calibration.host_launch_us_per_kernel;
    "calibration.host_unmodelled_us_per_kernel" => calibration.host_unmodelled_us_per_kernel;
    "calibration.host_launch_us_per_collective" => calibration.host_launch_us_per_collective;
    "calibration.host_d2h_sync_us" => calibration.host_d2h_sync_us;
    "calibration.validation_us_per_cpu_event" => calibration.validation_us_per_cpu_event;
    "calibration.host_backward_event_cost_ratio" => calibration.host_backward_event_cost_ratio;
    "calibration.unaligned_bandwidth_factor" => calibration.unaligned_bandwidth_factor;
    "compute.attention_relative_efficiency" => compute.attention_relative_efficiency;
    "compute.attention_seq_half" => compute.attention_seq_half;
    "compute.gemm_m_half" => compute.gemm_m_half;
    "compute.gemm_n_half" => compute.gemm_n_half;
    "compute.gemm_k_half" => compute.gemm_k_half;
    "tiers.intra_machine.efficiency" => tiers.intra_machine.efficiency;
    "tiers.intra_machine.latency_us" => tiers.intra_machine.latency_us;
    "tiers.intra_supernode.efficiency" => tiers.intra_supernode.efficiency;
    "tiers.intra_supernode.latency_us" => tiers.intra_supernode.latency_us;
    "tiers.inter_supernode.efficiency" => tiers.inter_supernode.efficiency;
    "tiers.inter_supernode.latency_us" => tiers.inter_supernode.latency_us;
    optional:
    "calibration.host_us_per_cpu_event" => calibration.host_us_per_cpu_event;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_then_get_round_trips_every_key_and_unknown_keys_are_refused() {
        let mut profile = HardwareProfile::builtin("ascend-910c-a3").unwrap();
        for (i, key) in KEYS.iter().enumerate() {
            let v = 0.25 + i as f64;
            assert!(set(&mut profile, key, v), "{key}");
            assert_eq!(get(&profile, key), Some(v), "{key}");
        }
        assert!(!set(&mut profile, "calibration.no_such_key", 1.0));
        assert_eq!(get(&profile, "calibration.no_such_key"), None);
    }
}
