//! Process resources for the benchmark: CPU time (user + system, every thread) and peak
//! resident memory, measured around one run.
//!
//! On Linux the peak is reset before a run (`/proc/self/clear_refs`, value 5) and read after
//! it (`VmHWM` in `/proc/self/status`), so each run gets its own peak; elsewhere the figure is
//! the process's peak so far (`getrusage`'s `ru_maxrss`), an upper bound.

use std::time::Instant;

/// CPU time, wall time and peak memory of one measured section.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// User plus system CPU seconds of every thread of the process.
    pub cpu_s: f64,
    /// Peak resident memory in bytes during the section (see the module documentation).
    pub peak_rss_bytes: u64,
}

/// A running measurement; [`Meter::stop`] ends it.
#[derive(Debug)]
pub struct Meter {
    wall: Instant,
    cpu_s: f64,
}

impl Meter {
    /// Resets the peak-memory mark (where the system allows it) and starts measuring.
    pub fn start() -> Self {
        // Best effort: without it the peak is the process's so far.
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        Self {
            wall: Instant::now(),
            cpu_s: cpu_seconds(),
        }
    }

    /// The usage since [`Meter::start`].
    pub fn stop(&self) -> Usage {
        Usage {
            wall_s: self.wall.elapsed().as_secs_f64(),
            cpu_s: cpu_seconds() - self.cpu_s,
            peak_rss_bytes: peak_rss_bytes(),
        }
    }
}

/// User plus system CPU seconds of the whole process so far (0 where unknown).
pub fn cpu_seconds() -> f64 {
    #[cfg(unix)]
    {
        // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is valid.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
            let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
            return t(ru.ru_utime) + t(ru.ru_stime);
        }
    }
    0.0
}

/// Peak resident bytes: `VmHWM` on Linux, else `ru_maxrss`; 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status")
        && let Some(kb) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    {
        return kb * 1024;
    }
    #[cfg(unix)]
    {
        // SAFETY: as in cpu_seconds.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
            // Kilobytes on Linux and the BSDs, bytes on macOS.
            let scale = if cfg!(target_os = "macos") { 1 } else { 1024 };
            return ru.ru_maxrss as u64 * scale;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_that_allocates_and_works_is_measured() {
        let m = Meter::start();
        let v: Vec<u64> = (0..2_000_000).collect();
        let s: u64 = v.iter().sum();
        let u = m.stop();
        assert_eq!(s, 1_999_999 * 1_000_000);
        assert!(u.wall_s >= 0.0 && u.cpu_s >= 0.0);
        if cfg!(target_os = "linux") {
            assert!(u.peak_rss_bytes >= 16_000_000, "{u:?}");
        }
    }
}
