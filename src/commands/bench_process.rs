//! One benchmark case in a child process of its own: `hpfsdp` re-executes itself with the
//! hidden `bench-case` subcommand and the case as JSON, reads the case's report from the
//! child's stdout, and takes the child's wall time, CPU time (user + system) and peak
//! resident memory from `wait4`, so no case inherits another's heap or peak.

use anyhow::{Context, Result, bail};
use hpfsdp_sim::BenchReport;
use hpfsdp_sim::bench_case::BenchCase;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// A case run in its own process: its report and the process's own figures.
#[derive(Debug, Clone)]
pub struct CaseRun {
    /// The case.
    pub case: BenchCase,
    /// What the child measured inside (phases, events, predicted step).
    pub report: BenchReport,
    /// Wall seconds of the child process, start to exit.
    pub wall_s: f64,
    /// User plus system CPU seconds of the child process (every thread).
    pub cpu_s: f64,
    /// Peak resident memory of the child process, bytes.
    pub max_rss_bytes: u64,
}

/// Runs `case` on the `hardware` profile in a child process. Errors carry the child's
/// stderr.
pub fn run_in_child(hardware: &str, case: &BenchCase) -> Result<CaseRun> {
    let exe = std::env::current_exe().context("finding this program to run a bench case")?;
    let json = serde_json::to_string(case)?;
    let start = Instant::now();
    let mut child = Command::new(exe)
        .args(["bench-case", "--hardware", hardware, "--case", &json])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting the process of bench case '{}'", case.name()))?;
    let mut stderr = child.stderr.take().context("the child's stderr")?;
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut out = String::new();
    child
        .stdout
        .take()
        .context("the child's stdout")?
        .read_to_string(&mut out)?;
    let (success, usage) = wait_with_usage(&mut child)?;
    let wall_s = start.elapsed().as_secs_f64();
    let errors = errors.join().unwrap_or_default();
    if !success {
        bail!("bench case '{}' failed: {}", case.name(), errors.trim());
    }
    let report: BenchReport = serde_json::from_str(out.trim())
        .with_context(|| format!("reading the report of bench case '{}'", case.name()))?;
    let (cpu_s, max_rss_bytes) = usage.unwrap_or((report.cpu_s, report.peak_rss_bytes));
    Ok(CaseRun {
        case: case.clone(),
        report,
        wall_s,
        cpu_s,
        max_rss_bytes,
    })
}

/// Waits for `child`: whether it exited with status 0, and its CPU seconds and peak
/// resident bytes where the system reports them for one child (`wait4` on Unix).
#[cfg(unix)]
fn wait_with_usage(child: &mut Child) -> Result<(bool, Option<(f64, u64)>)> {
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: wait4 writes into the status and the zeroed rusage we own; `pid` is our child,
    // not yet waited for (std's `Child` is not waited on afterwards).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = loop {
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == -1 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        break r;
    };
    if waited != pid {
        bail!(
            "waiting for the bench case process: {}",
            std::io::Error::last_os_error()
        );
    }
    let success = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    let seconds = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    // ru_maxrss is in kilobytes on Linux and the BSDs, bytes on macOS.
    let scale = if cfg!(target_os = "macos") { 1 } else { 1024 };
    let usage = (
        seconds(ru.ru_utime) + seconds(ru.ru_stime),
        ru.ru_maxrss as u64 * scale,
    );
    Ok((success, Some(usage)))
}

/// Elsewhere the child's own figures stand in (see [`run_in_child`]).
#[cfg(not(unix))]
fn wait_with_usage(child: &mut Child) -> Result<(bool, Option<(f64, u64)>)> {
    Ok((child.wait()?.success(), None))
}
