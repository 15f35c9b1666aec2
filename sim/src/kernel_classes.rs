//! Device time of one rank's program by step phase and kernel class, before the engine
//! overlaps streams: what a profiler's kernel table sums to, so a user can hold the model's
//! kernels against a measured step class by class (`hpfsdp simulate --kernel-classes`).
//!
//! Every compute op's kernel mix entry is costed on its own ([`crate::compute_cost::kernel_s`],
//! the same cost the engine charges) and every copy at [`crate::cost::copy_work_s`];
//! collectives and host ops are left out (they are not kernels of the rank's own streams).
//! Phases follow the issue order ([`crate::calibration::phases::phase_of_ops`]).

use crate::calibration::phases::{Phase, phase_of_ops};
use crate::compute_cost::kernel_s;
use crate::cost::{compute_work_s, copy_work_s};
use crate::profile::HardwareProfile;
use hpfsdp_program::step::{CopyKind, Payload, StepProgram};
use std::collections::BTreeMap;

/// One row of the breakdown: a phase and a kernel class, with its launches and device time.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClassRow {
    /// `forward`, `backward` or `optimizer`.
    pub phase: &'static str,
    /// Kernel class name ([`hpfsdp_plan::kernel::KernelClass::name`]), `copy`, `chunk-cat`,
    /// `memcpy` for copies, or `unclassified` for compute ops without a kernel mix.
    pub class: &'static str,
    /// Device launches (kernels and driver copies).
    pub launches: u64,
    /// Device time, seconds.
    pub device_s: f64,
}

/// The breakdown of `program` under `profile`, rows in phase order then class name.
pub fn device_time_by_class(program: &StepProgram, profile: &HardwareProfile) -> Vec<ClassRow> {
    let mut rows: BTreeMap<(usize, &'static str), (u64, f64)> = BTreeMap::new();
    let mut add = |phase: Phase, class: &'static str, launches: u64, s: f64| {
        let e = rows.entry((phase.index(), class)).or_insert((0, 0.0));
        e.0 += launches;
        e.1 += s;
    };
    for (op, (phase, _)) in program.ops.iter().zip(phase_of_ops(program)) {
        match &op.payload {
            Payload::Compute(w) => match w.mix.and_then(|id| program.kernel_mixes.get(&id)) {
                Some(mix) => {
                    for k in mix {
                        add(
                            phase,
                            k.class.name(),
                            u64::from(k.count),
                            kernel_s(k, profile),
                        );
                    }
                }
                None => add(
                    phase,
                    "unclassified",
                    u64::from(w.kernels),
                    compute_work_s(w, &program.kernel_mixes, profile),
                ),
            },
            Payload::Copy(w) => {
                let class = match (w.kind, w.kernels, w.memcpys) {
                    (CopyKind::ChunkCat, _, _) => "chunk-cat",
                    (_, 0, m) if m > 0 => "memcpy",
                    _ => "copy",
                };
                let launches = u64::from(w.kernels) + u64::from(w.memcpys);
                add(phase, class, launches, copy_work_s(w, profile));
            }
            Payload::Collective(_) | Payload::Host { .. } => {}
        }
    }
    rows.into_iter()
        .map(|((phase, class), (launches, device_s))| ClassRow {
            phase: Phase::ALL[phase].name(),
            class,
            launches,
            device_s,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario_run::{RunOptions, ScenarioPlans, simulate_strategy};
    use hpfsdp_plan::scenario::Scenario;
    use std::path::Path;

    fn run(name: &str) -> (StepProgram, HardwareProfile, f64) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let s = Scenario::load(&root.join(format!("scenarios/gpu/{name}.toml"))).unwrap();
        let profile = HardwareProfile::builtin("nvidia-h200-hgx").unwrap();
        let plans = ScenarioPlans::new(s);
        let r = simulate_strategy(&plans, "fsdp2", &profile, &RunOptions::default()).unwrap();
        let step = r.result.step_time_s();
        (r.rank0_program, profile, step)
    }

    /// On a one-GPU step (one stream, no collectives) the classes add up to the device time
    /// the engine charges; launches add up to the kernels and memcpys of the program.
    #[test]
    fn classes_cover_every_kernel_of_a_one_gpu_step() {
        let (program, profile, step_s) = run("dense14b-8l-mbs1");
        let rows = device_time_by_class(&program, &profile);
        let total: f64 = rows.iter().map(|r| r.device_s).sum();
        // Device-bound: the device time is the step but for the host's lead-in.
        assert!(
            total <= step_s && total > 0.95 * step_s,
            "{total} vs {step_s}"
        );
        let launches: u64 = rows.iter().map(|r| r.launches).sum();
        let counts = crate::result::LaunchCounts::of(&program);
        assert_eq!(launches, counts.device_kernels + counts.memcpys);
        // Rows come in step order.
        let order = |name: &str| Phase::ALL.iter().position(|p| p.name() == name).unwrap();
        assert!(
            rows.windows(2)
                .all(|w| order(w[0].phase) <= order(w[1].phase))
        );
        let find = |phase, class| rows.iter().find(|r| r.phase == phase && r.class == class);
        assert!(find("forward", "gemm").is_some());
        assert!(find("backward", "chunk-cat").is_some());
        assert_eq!(
            find("optimizer", "multi-tensor-apply").unwrap().launches,
            1608
        );
    }
}
