//! The figures a measured run can report and the simulator can predict: one enum, each with
//! the snake_case key a runs file names it by (its unit in the name) and a label with unit.

/// The figures the comparison reports, with their units. The order of the variants is the
/// order of a run's rows in every report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Figure {
    /// Mean (or median) step time, seconds.
    StepTimeS,
    /// Device time of the forward pass, seconds: between CUDA (or NPU) events recorded on the
    /// compute stream around the forward call (the loss included), summed over micro-batches.
    ForwardDeviceS,
    /// Device time of the backward pass, seconds: between events around `loss.backward()`.
    BackwardDeviceS,
    /// Device time of the optimizer, seconds: between events around `optimizer.step()` and
    /// `zero_grad()`.
    OptimizerDeviceS,
    /// Exposed communication of one profiled step, seconds.
    ExposedCommS,
    /// Communication overlap rate, fraction.
    OverlapRate,
    /// FSDP2 copy-in + copy-out device time, seconds.
    CopyS,
    /// Device time of the divisions that follow the gradient reductions on the collective
    /// streams (torch_npu's `ReduceOp.AVG`, `hpfsdp_program::strategy::avg_division`), seconds.
    /// Measured for HyperParallel only ("per-parameter post-reduction division"): FSDP2's
    /// table entry is "none" for a per-parameter division, while its 49 per-unit divisions
    /// are a different granularity the table does not report, so the figure is not listed
    /// for FSDP2 (not applicable rather than zero).
    PostReductionDivisionS,
    /// All-gathers per step.
    AllGathers,
    /// Reduce-scatters per step.
    ReduceScatters,
    /// All-gather payload per step, bytes.
    AllGatherBytes,
    /// Reduce-scatter payload per step, bytes.
    ReduceScatterBytes,
    /// Host self time inside collective APIs, seconds.
    HostCollectiveS,
    /// Peak allocated device memory, bytes.
    PeakAllocatedBytes,
    /// Peak memory reserved by the framework's caching allocator, bytes. The simulator has no
    /// allocator-reserve model: reported beside the prediction as "not modelled", never gating.
    PeakReservedBytes,
    /// Weighted bandwidth of the FSDP collectives: their bytes over their transfer time,
    /// bytes per second (the profiler's "weighted HCCS bandwidth").
    WeightedBandwidth,
    /// Device kernels per profiled step on rank 0, communication, memcpy and memset excluded.
    DeviceKernels,
    /// Collectives per profiled step on rank 0.
    Collectives,
    /// Validation-mode overhead: validation minus production mean step time of the same
    /// setup, seconds (derived from the two measured step times, never entered on its own).
    ValidationOverheadS,
    /// Extra CPU operator events per profiled step that validation mode adds (rank 0).
    ValidationCpuEvents,
}

impl Figure {
    /// Every figure, in report order.
    pub const ALL: [Figure; 20] = [
        Figure::StepTimeS,
        Figure::ForwardDeviceS,
        Figure::BackwardDeviceS,
        Figure::OptimizerDeviceS,
        Figure::ExposedCommS,
        Figure::OverlapRate,
        Figure::CopyS,
        Figure::PostReductionDivisionS,
        Figure::AllGathers,
        Figure::ReduceScatters,
        Figure::AllGatherBytes,
        Figure::ReduceScatterBytes,
        Figure::HostCollectiveS,
        Figure::PeakAllocatedBytes,
        Figure::PeakReservedBytes,
        Figure::WeightedBandwidth,
        Figure::DeviceKernels,
        Figure::Collectives,
        Figure::ValidationOverheadS,
        Figure::ValidationCpuEvents,
    ];

    /// The key a runs file names the figure by: snake_case, unit last (`step_time_s`,
    /// `peak_allocated_bytes`; counts have no unit).
    pub fn key(self) -> &'static str {
        match self {
            Figure::StepTimeS => "step_time_s",
            Figure::ForwardDeviceS => "forward_device_s",
            Figure::BackwardDeviceS => "backward_device_s",
            Figure::OptimizerDeviceS => "optimizer_device_s",
            Figure::ExposedCommS => "exposed_comm_s",
            Figure::OverlapRate => "overlap_fraction",
            Figure::CopyS => "copy_device_s",
            Figure::PostReductionDivisionS => "post_reduction_division_device_s",
            Figure::AllGathers => "all_gathers",
            Figure::ReduceScatters => "reduce_scatters",
            Figure::AllGatherBytes => "all_gather_bytes",
            Figure::ReduceScatterBytes => "reduce_scatter_bytes",
            Figure::HostCollectiveS => "host_collective_api_s",
            Figure::PeakAllocatedBytes => "peak_allocated_bytes",
            Figure::PeakReservedBytes => "peak_reserved_bytes",
            Figure::WeightedBandwidth => "weighted_bandwidth_bytes_per_s",
            Figure::DeviceKernels => "device_kernels",
            Figure::Collectives => "collectives",
            Figure::ValidationOverheadS => "validation_overhead_s",
            Figure::ValidationCpuEvents => "validation_cpu_events",
        }
    }

    /// The figure a runs-file key names, if any.
    pub fn from_key(key: &str) -> Option<Figure> {
        Figure::ALL.into_iter().find(|f| f.key() == key)
    }

    /// Human-readable name with unit.
    pub fn label(self) -> &'static str {
        match self {
            Figure::StepTimeS => "step time (s)",
            Figure::ForwardDeviceS => "forward device time (s)",
            Figure::BackwardDeviceS => "backward device time (s)",
            Figure::OptimizerDeviceS => "optimizer device time (s)",
            Figure::ExposedCommS => "exposed communication (s)",
            Figure::OverlapRate => "communication overlap rate",
            Figure::CopyS => "copy-in/copy-out device time (s)",
            Figure::PostReductionDivisionS => "post-reduction division device time (s)",
            Figure::AllGathers => "all-gathers per step",
            Figure::ReduceScatters => "reduce-scatters per step",
            Figure::AllGatherBytes => "all-gather payload per step (GB)",
            Figure::ReduceScatterBytes => "reduce-scatter payload per step (GB)",
            Figure::HostCollectiveS => "host time in collective APIs (s)",
            Figure::PeakAllocatedBytes => "peak allocated memory (GB)",
            Figure::PeakReservedBytes => "peak reserved memory (GB)",
            Figure::WeightedBandwidth => "weighted FSDP collective bandwidth (GB/s)",
            Figure::DeviceKernels => "device kernels per step (rank 0)",
            Figure::Collectives => "collectives per step (rank 0)",
            Figure::ValidationOverheadS => "validation-mode overhead (s)",
            Figure::ValidationCpuEvents => "extra CPU operator events per step (validation)",
        }
    }

    /// The unit of the figure's values: `s`, `B`, `B/s`, `count` or `fraction`.
    pub fn unit(self) -> &'static str {
        match self {
            Figure::AllGatherBytes
            | Figure::ReduceScatterBytes
            | Figure::PeakAllocatedBytes
            | Figure::PeakReservedBytes => "B",
            Figure::WeightedBandwidth => "B/s",
            Figure::OverlapRate => "fraction",
            Figure::AllGathers
            | Figure::ReduceScatters
            | Figure::DeviceKernels
            | Figure::Collectives
            | Figure::ValidationCpuEvents => "count",
            _ => "s",
        }
    }

    /// False for a figure the simulator has no model of (shown as "not modelled", never
    /// compared).
    pub fn modelled(self) -> bool {
        self != Figure::PeakReservedBytes
    }

    /// True for a figure a runs file never enters: it is derived from other measured figures
    /// when the runs file is loaded.
    pub fn derived(self) -> bool {
        self == Figure::ValidationOverheadS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_snake_case_and_round_trip() {
        let mut keys: Vec<&str> = Figure::ALL.iter().map(|f| f.key()).collect();
        for (f, k) in Figure::ALL.iter().zip(&keys) {
            assert_eq!(Figure::from_key(k), Some(*f));
            assert!(k.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{k}");
        }
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), Figure::ALL.len());
        assert_eq!(Figure::from_key("step_time"), None);
        for f in Figure::ALL {
            let unit_suffix = match f.unit() {
                "s" => "_s",
                "B" => "_bytes",
                "B/s" => "_bytes_per_s",
                _ => "",
            };
            assert!(f.key().ends_with(unit_suffix), "{f:?}");
        }
        let mut sorted = Figure::ALL;
        sorted.sort();
        assert_eq!(sorted, Figure::ALL, "ALL is in declaration (report) order");
    }
}
