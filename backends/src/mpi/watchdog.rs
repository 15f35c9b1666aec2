//! A last-resort guard for the one blocking MPI call the backend makes (communicator creation):
//! if it has not returned by the deadline, print why and end the process, so `mpirun` tears the
//! job down instead of hanging. Everything else polls and returns [`crate::CommError::Timeout`].

use std::sync::mpsc;
use std::time::Duration;

/// Exit status of a process ended by the watchdog (the `timeout` command's convention).
pub const WATCHDOG_EXIT: i32 = 124;

/// Disarms the watchdog when dropped.
pub(crate) struct Guard {
    _disarm: mpsc::Sender<()>,
}

/// Arm a watchdog: unless the returned guard is dropped within `timeout`, print `message` to
/// stderr and exit the process with [`WATCHDOG_EXIT`].
pub(crate) fn arm(timeout: Duration, message: String) -> Guard {
    let (tx, rx) = mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("hpfsdp-mpi-watchdog".into())
        .spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(timeout) {
                eprintln!("{message}");
                std::process::exit(WATCHDOG_EXIT);
            }
        });
    // Without a watchdog thread the call is merely unguarded; MPI itself still works.
    drop(spawned);
    Guard { _disarm: tx }
}
