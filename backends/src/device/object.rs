//! [`DeviceCollective`]: an object-safe view of a [`DeviceComm`] whatever its vendor library,
//! so a runner can hold `Box<dyn DeviceCollective>` chosen at run time and still read device
//! times and use device-resident buffers (`&dyn DeviceCollective` upcasts to
//! `&dyn Collective`).

use std::sync::Arc;

use super::buffer::DeviceBuffer;
use super::comm::{DeviceComm, DeviceOp, DeviceP2p, DeviceTiming, DeviceWork};
use super::kernels::DeviceKernels;
use super::library::CollLibrary;
use super::runtime::{DeviceRuntime, Stream};
use crate::buffer::Buffer;
use crate::collective::Collective;
use crate::error::CommResult;
use crate::group::Group;
use crate::types::DType;

/// A [`Collective`] on an accelerator: device times and device-resident buffers.
/// Each method forwards to the [`DeviceComm`] method of the same name.
pub trait DeviceCollective: Collective {
    /// Library version, files, device and rendezvous, for run metadata.
    fn describe(&self) -> String;
    /// Device microseconds of the most recently completed call.
    fn last_device_time_us(&self) -> Option<f64>;
    /// Device times of every completed call, in completion order.
    fn device_times(&self) -> Vec<DeviceTiming>;
    /// Take (and clear) the device times logged so far.
    fn take_device_times(&self) -> Vec<DeviceTiming>;
    /// Issue queued send/recv calls and block until everything enqueued has finished.
    fn synchronize(&self) -> CommResult<()>;
    /// Create group communicators collectively (same list, same order on every rank).
    fn create_groups(&self, groups: &[Group]) -> CommResult<()>;
    /// Allocate a device buffer (contents undefined).
    fn alloc_device(&self, dtype: DType, len: usize) -> CommResult<DeviceBuffer>;
    /// Allocate a device buffer holding a copy of `host`.
    fn upload(&self, host: &Buffer) -> CommResult<DeviceBuffer>;
    /// Enqueue a collective on device buffers.
    fn issue_device<'a>(&self, group: &Group, op: DeviceOp<'a>) -> CommResult<DeviceWork<'a>>;
    /// Enqueue a batch of device sends/receives.
    fn issue_device_p2p<'a>(&self, ops: &[DeviceP2p<'a>], tag: u64) -> CommResult<DeviceWork<'a>>;
    /// Enqueue a collective on device buffers on the caller's stream, no events, no wait.
    fn enqueue_on(&self, group: &Group, op: DeviceOp<'_>, stream: Stream) -> CommResult<()>;
    /// Enqueue a batch of device sends/receives on the caller's stream, no events, no wait.
    fn enqueue_p2p_on(&self, ops: &[DeviceP2p<'_>], tag: u64, stream: Stream) -> CommResult<()>;
    /// Device microseconds of `calls` back-to-back launches between two events.
    fn time_calls(&self, group: &Group, op: DeviceOp<'_>, calls: usize) -> CommResult<f64>;
    /// The runtime's name for this rank's device.
    fn device_name(&self) -> CommResult<String>;
    /// The accelerator runtime.
    fn runtime(&self) -> Arc<dyn DeviceRuntime>;
    /// This rank's device index.
    fn device_index(&self) -> usize;
    /// Device-side compute (spin kernel; GEMMs when `gemm`), `None` where unavailable.
    fn load_kernels(&self, gemm: bool) -> CommResult<Option<Box<dyn DeviceKernels>>>;
}

impl<L: CollLibrary> DeviceCollective for DeviceComm<L> {
    fn describe(&self) -> String {
        DeviceComm::describe(self)
    }
    fn last_device_time_us(&self) -> Option<f64> {
        DeviceComm::last_device_time_us(self)
    }
    fn device_times(&self) -> Vec<DeviceTiming> {
        DeviceComm::device_times(self)
    }
    fn take_device_times(&self) -> Vec<DeviceTiming> {
        DeviceComm::take_device_times(self)
    }
    fn synchronize(&self) -> CommResult<()> {
        DeviceComm::synchronize(self)
    }
    fn create_groups(&self, groups: &[Group]) -> CommResult<()> {
        DeviceComm::create_groups(self, groups)
    }
    fn alloc_device(&self, dtype: DType, len: usize) -> CommResult<DeviceBuffer> {
        DeviceComm::alloc_device(self, dtype, len)
    }
    fn upload(&self, host: &Buffer) -> CommResult<DeviceBuffer> {
        DeviceComm::upload(self, host)
    }
    fn issue_device<'a>(&self, group: &Group, op: DeviceOp<'a>) -> CommResult<DeviceWork<'a>> {
        DeviceComm::issue_device(self, group, op)
    }
    fn issue_device_p2p<'a>(&self, ops: &[DeviceP2p<'a>], tag: u64) -> CommResult<DeviceWork<'a>> {
        DeviceComm::issue_device_p2p(self, ops, tag)
    }
    fn enqueue_on(&self, group: &Group, op: DeviceOp<'_>, stream: Stream) -> CommResult<()> {
        DeviceComm::enqueue_on(self, group, op, stream)
    }
    fn enqueue_p2p_on(&self, ops: &[DeviceP2p<'_>], tag: u64, stream: Stream) -> CommResult<()> {
        DeviceComm::enqueue_p2p_on(self, ops, tag, stream)
    }
    fn time_calls(&self, group: &Group, op: DeviceOp<'_>, calls: usize) -> CommResult<f64> {
        DeviceComm::time_calls(self, group, op, calls)
    }
    fn device_name(&self) -> CommResult<String> {
        DeviceComm::device_name(self)
    }
    fn runtime(&self) -> Arc<dyn DeviceRuntime> {
        DeviceComm::runtime(self)
    }
    fn device_index(&self) -> usize {
        DeviceComm::device_index(self)
    }
    fn load_kernels(&self, gemm: bool) -> CommResult<Option<Box<dyn DeviceKernels>>> {
        DeviceComm::load_kernels(self, gemm)
    }
}
