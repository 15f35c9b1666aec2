//! `hpfsdp collbench`: the nccl-tests / hccl_test sweep on any backend, written as CSV with
//! the columns `hpfsdp calibrate --from` reads, and printed like nccl-tests.
//!
//! On nccl and hccl the sweep runs as nccl-tests does: device-resident buffers allocated once
//! per size, only the collective calls between two device events in the timed region,
//! out-of-place and in-place columns ([`hpfsdp_backends::collbench::device`]). On inproc and
//! mpi it times host buffers (in-place columns `N/A`). Rows are printed as they are measured;
//! the table closes with nccl-tests' `# Avg bus bandwidth` line.
//!
//! `tier` is the slowest link of the benchmarked groups in the hardware profile's topology:
//! `--hardware`, else the profile of the device the run is on (nccl, hccl; from the name the
//! runtime gives it, an unknown device is refused), else `cpu-mpi` (inproc, mpi). The CSV
//! holds the out-of-place column with the columns `calibrate --from` reads.

use super::device_profile::{self, ProfileChoice};
use super::limits;
use anyhow::{Context, Result, bail};
use hpfsdp_backends::DType;
use hpfsdp_backends::collbench::{
    BenchOptions, BenchRow, Timing, parse_bytes, parse_groups, parse_kinds, run_sweep, validate,
};
use hpfsdp_backends::select::{BackendKind, ensure_built, is_device, run_on_backend};
use hpfsdp_sim::HardwareProfile;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Header of the CSV, exactly (read by `hpfsdp calibrate --from`).
pub const COLLBENCH_CSV_HEADER: &str =
    "collective,size,count,type,redop,root,time_us,algbw,busbw,#wrong,tier,ranks";

/// Options of `hpfsdp collbench` (nccl-tests' short flags where it has one).
#[derive(clap::Args)]
pub struct CollbenchArgs {
    /// Collective backend: inproc, mpi, hccl or nccl.
    #[arg(long, value_parser = crate::commands::flags::parse_backend)]
    pub backend: BackendKind,
    /// Collectives to sweep (comma-separated, or all).
    #[arg(
        long,
        default_value = "all-gather,reduce-scatter,all-reduce,broadcast,all-to-all"
    )]
    pub kinds: String,
    /// Smallest size in bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "min-bytes", default_value = "8")]
    pub min_bytes: String,
    /// Largest size in bytes, at most 16G.
    #[arg(short = 'e', long = "max-bytes", default_value = "256M")]
    pub max_bytes: String,
    /// Size multiplier between steps (at least 2).
    #[arg(short = 'f', long, default_value_t = 2)]
    pub factor: u64,
    /// Groups: world, size:K (blocks of K ranks) or explicit 0,1;2,3.
    #[arg(long, default_value = "world")]
    pub groups: String,
    /// Timed calls per size, 1 to 10000.
    #[arg(short = 'n', long, default_value_t = 20,
          value_parser = limits::count_in(1, limits::COLLBENCH_MAX_ITERS))]
    pub iters: usize,
    /// Untimed calls per size before them, 0 to 10000.
    #[arg(short = 'w', long, default_value_t = 5,
          value_parser = limits::count_in(0, limits::COLLBENCH_MAX_WARMUP))]
    pub warmup: usize,
    /// Check every result (1) or not (0: #wrong is N/A), as nccl-tests' -c.
    #[arg(short = 'c', long, default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub check: u8,
    /// Element type: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Ranks (threads) for --backend inproc, 1 to 64; default 4.
    #[arg(long, value_parser = limits::count_in(1, limits::INPROC_MAX_RANKS))]
    pub ranks: Option<usize>,
    /// Write the CSV here.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Hardware profile whose topology gives the tier column (default: the device's own
    /// profile on nccl/hccl, cpu-mpi on inproc/mpi).
    #[arg(long)]
    pub hardware: Option<String>,
    /// After each size, also time a twin one element longer per rank (its buffers not a
    /// multiple of 512 bytes), so `calibrate --from` can fit HCCL's unaligned-buffer factor.
    #[arg(long)]
    pub unaligned: bool,
    /// Bound on any wait for a peer, seconds (up to 86400).
    #[arg(long = "timeout-s", default_value_t = 300.0)]
    pub timeout_s: f64,
}

fn options(args: &CollbenchArgs, world: usize) -> Result<BenchOptions> {
    let dtype = match args.dtype.as_str() {
        "f32" | "float" => DType::F32,
        "bf16" | "bfloat16" => DType::Bf16,
        other => bail!("--dtype {other}: use f32 or bf16"),
    };
    let o = BenchOptions {
        kinds: parse_kinds(&args.kinds).map_err(anyhow::Error::msg)?,
        min_bytes: parse_bytes(&args.min_bytes).map_err(|e| anyhow::anyhow!("--min-bytes: {e}"))?,
        max_bytes: parse_bytes(&args.max_bytes).map_err(|e| anyhow::anyhow!("--max-bytes: {e}"))?,
        factor: args.factor,
        iters: args.iters,
        warmup: args.warmup,
        dtype,
        groups: parse_groups(&args.groups, world).map_err(anyhow::Error::msg)?,
        unaligned_twins: args.unaligned,
        check: args.check == 1,
    };
    validate(&o).map_err(|e| anyhow::anyhow!("{e}"))?;
    if o.max_bytes > limits::COLLBENCH_MAX_BYTES {
        bail!(
            "-e/--max-bytes {}: at most {} bytes (16G)",
            o.max_bytes,
            limits::COLLBENCH_MAX_BYTES
        );
    }
    Ok(o)
}

/// Peak host memory of one rank of a host-buffer sweep, in multiples of the largest size:
/// its input, the copy a call takes, the output, the expected output (f32) and the backend's
/// own copies. Measured peak resident memory on inproc, 2 ranks at 256 MiB: f32 4.0 (all-reduce,
/// broadcast) to 4.5 (all-to-all, which slices before it concatenates); bf16 up to 5.5
/// (the expected output and the reduction are f32). Rounded up by half a size.
fn host_peak_factor(dtype: &str) -> u64 {
    match dtype {
        "bf16" | "bfloat16" => 6,
        _ => 5,
    }
}

/// Refuses a host-buffer sweep whose buffers would not fit in this machine's memory
/// ([`host_peak_factor`] times the largest size per rank of this process). Two checks: against the memory the system
/// reports available, then by reserving that much address space fallibly (and releasing it at
/// once), so a process limit (`ulimit -v`, a container's) ends the run with this message
/// instead of an allocation abort in the middle of the sweep.
fn check_host_memory(args: &CollbenchArgs, threads: usize) -> Result<()> {
    let max = parse_bytes(&args.max_bytes).map_err(|e| anyhow::anyhow!("--max-bytes: {e}"))?;
    let ranks = if args.backend.ranks_are_threads() {
        threads as u64
    } else {
        1
    };
    let need = max
        .saturating_mul(host_peak_factor(&args.dtype))
        .saturating_mul(ranks);
    if let Some(available) = crate::commands::replay::available_memory_bytes()
        && need > available
    {
        bail!(
            "-e/--max-bytes {}: {ranks} rank(s) of this process need about {:.1} GiB of buffers but {:.1} GiB of memory is available; lower -e/--max-bytes or --ranks",
            args.max_bytes,
            need as f64 / (1u64 << 30) as f64,
            available as f64 / (1u64 << 30) as f64
        );
    }
    reserve_probe(need).map_err(|e| {
        anyhow::anyhow!(
            "-e/--max-bytes {}: {ranks} rank(s) of this process need about {:.1} GiB of buffers but this process may not allocate that much ({e}); lower -e/--max-bytes or --ranks",
            args.max_bytes,
            need as f64 / (1u64 << 30) as f64
        )
    })
}

/// Reserves `bytes` of address space fallibly and releases it at once (nothing is written, so
/// no page is touched).
fn reserve_probe(bytes: u64) -> Result<(), std::collections::TryReserveError> {
    let mut probe: Vec<u8> = Vec::new();
    probe.try_reserve_exact(usize::try_from(bytes).unwrap_or(usize::MAX))
}

fn wrong_cell(w: Option<u64>) -> String {
    w.map_or_else(|| "N/A".into(), |w| w.to_string())
}

/// The CSV text of the rows (their out-of-place column), each with its tier name.
pub fn csv(rows: &[BenchRow], tier: &str) -> String {
    let mut out = String::from(COLLBENCH_CSV_HEADER);
    out.push('\n');
    for r in rows {
        let t = &r.out_of_place;
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{}\n",
            r.kind.name(),
            r.size_bytes,
            r.count,
            r.type_name(),
            r.redop,
            r.root,
            t.time_us,
            t.algbw_gbps,
            t.busbw_gbps,
            wrong_cell(t.wrong),
            tier,
            r.group_ranks
        ));
    }
    out
}

/// nccl-tests' header: the out-of-place and in-place blocks.
pub fn table_header() -> String {
    let block = |a: &str, b: &str, c: &str, d: &str| format!("{a:>10} {b:>8} {c:>8} {d:>6}");
    let lead = |a: &str, b: &str, c: &str, d: &str, e: &str, f: &str| {
        format!("#{a:>14} {b:>12} {c:>12} {d:>9} {e:>6} {f:>5}")
    };
    format!(
        "{:66}{:^35}  {:^35}\n{}  {}  {}\n{}  {}  {}\n",
        "#",
        "out-of-place",
        "in-place",
        lead("collective", "size", "count", "type", "redop", "root"),
        block("time", "algbw", "busbw", "#wrong"),
        block("time", "algbw", "busbw", "#wrong"),
        lead("", "(B)", "(elements)", "", "", ""),
        block("(us)", "(GB/s)", "(GB/s)", ""),
        block("(us)", "(GB/s)", "(GB/s)", ""),
    )
}

/// One table line, printed as soon as the row is measured.
pub fn table_row(r: &BenchRow) -> String {
    let block = |t: Option<&Timing>| match t {
        Some(t) => format!(
            "{:>10.2} {:>8.2} {:>8.2} {:>6}",
            t.time_us,
            t.algbw_gbps,
            t.busbw_gbps,
            wrong_cell(t.wrong)
        ),
        None => format!("{:>10} {:>8} {:>8} {:>6}", "N/A", "N/A", "N/A", "N/A"),
    };
    format!(
        "{:>15} {:>12} {:>12} {:>9} {:>6} {:>5}  {}  {}\n",
        r.kind.name(),
        r.size_bytes,
        r.count,
        r.type_name(),
        r.redop,
        r.root,
        block(Some(&r.out_of_place)),
        block(r.in_place.as_ref())
    )
}

/// nccl-tests' closing lines: wrong values, the average bus bandwidth over every timed
/// column of every row, and the tier.
pub fn table_footer(rows: &[BenchRow], tier: &str) -> String {
    let wrong: Option<u64> = rows.iter().map(BenchRow::wrong).sum();
    let bw: Vec<f64> = rows
        .iter()
        .flat_map(|r| std::iter::once(r.out_of_place).chain(r.in_place))
        .map(|t| t.busbw_gbps)
        .collect();
    let avg = if bw.is_empty() {
        0.0
    } else {
        bw.iter().sum::<f64>() / bw.len() as f64
    };
    let status = match wrong {
        Some(0) => "0 OK".to_string(),
        Some(w) => format!("{w} FAILED"),
        None => "N/A (not checked: -c 0)".to_string(),
    };
    format!(
        "# tier: {tier}; out of bounds values: {status}\n# Avg bus bandwidth    : {avg:.4}\n#\n"
    )
}

/// Prints each row as the sweep measures it (rank 0 only).
fn printer(rank: usize) -> impl FnMut(&BenchRow) {
    move |r: &BenchRow| {
        if rank == 0 {
            print!("{}", table_row(r));
            let _ = std::io::stdout().flush();
        }
    }
}

/// The tier of the benchmarked groups on `profile`'s topology.
fn tier_of(
    profile: &HardwareProfile,
    world: usize,
    groups: &[hpfsdp_backends::Group],
) -> &'static str {
    let topology = profile.topology_for(world);
    groups
        .iter()
        .map(|g| topology.tier_of(g.ranks()))
        .max()
        .map_or("intra-machine", |t| t.name())
}

fn load_profile(choice: &ProfileChoice) -> Result<HardwareProfile> {
    HardwareProfile::load_named(&choice.name, "scenarios/hardware").with_context(|| {
        format!(
            "loading hardware profile '{}' ({})",
            choice.name, choice.reason
        )
    })
}

/// What a rank ends the sweep with.
type RankRows = (usize, Vec<BenchRow>, &'static str, ProfileChoice);

/// Runs the command. Exit status 1 when any result was wrong.
pub fn run(args: &CollbenchArgs) -> Result<ExitCode> {
    ensure_built(args.backend)?;
    if !args.backend.ranks_are_threads() && args.ranks.is_some() {
        bail!(
            "--ranks is for --backend inproc; with {} the launcher's process count sets the ranks",
            args.backend
        );
    }
    if let Some(h) = &args.hardware {
        crate::commands::preflight::check_hardware_flag(h)?;
    }
    limits::check_timeout_s(args.timeout_s)?;
    let threads = args.ranks.unwrap_or(4);
    // Every option but the groups (they need the world size) is checked before any backend
    // starts; inproc knows its world already.
    if args.backend.ranks_are_threads() {
        options(args, threads)?;
    } else {
        options(args, 1).map(|_| ()).or_else(|e| {
            if e.to_string().starts_with("--groups") {
                Ok(())
            } else {
                Err(e)
            }
        })?;
    }
    let first = if is_device(args.backend) {
        run_device(args)?
    } else {
        check_host_memory(args, threads)?;
        let choice = device_profile::choose(args.hardware.as_deref(), args.backend, None)?;
        let profile = load_profile(&choice)?;
        let timeout = Duration::from_secs_f64(args.timeout_s);
        let results = run_on_backend(args.backend, threads, timeout, |comm| {
            let o = options(args, comm.world_size())?;
            if comm.rank() == 0 {
                print!(
                    "# collbench on {} ({} ranks, host buffers)\n{}",
                    args.backend,
                    comm.world_size(),
                    table_header()
                );
            }
            let rows = run_sweep(comm, &o, &mut printer(comm.rank()))?;
            let tier = tier_of(&profile, comm.world_size(), &o.groups);
            Ok::<_, anyhow::Error>((comm.rank(), rows, tier, choice.clone()))
        })?;
        let Some(first) = results.into_iter().next() else {
            bail!("the backend ran no rank");
        };
        first?
    };
    let (rank, rows, tier, choice) = first;
    if rank != 0 {
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", table_footer(&rows, tier));
    println!("# tier from profile {}: {}", choice.name, choice.reason);
    if let Some(path) = &args.out {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, csv(&rows, tier))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let wrong: u64 = rows.iter().filter_map(BenchRow::wrong).sum();
    Ok(if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The sweep on an accelerator backend: device-resident buffers, the tier from the device's
/// own profile.
#[cfg(any(feature = "nccl", feature = "hccl"))]
fn run_device(args: &CollbenchArgs) -> Result<RankRows> {
    use hpfsdp_backends::collbench::device::run_device_sweep;
    use hpfsdp_backends::select::run_on_device_backend;
    run_on_device_backend(args.backend, |comm| -> Result<RankRows> {
        let device = comm.device_name().map_err(|e| e.to_string());
        let choice = device_profile::choose(args.hardware.as_deref(), args.backend, Some(device))?;
        let profile = load_profile(&choice)?;
        let o = options(args, comm.world_size())?;
        if comm.rank() == 0 {
            print!(
                "# collbench on {} ({} ranks, device-resident buffers; {})\n{}",
                args.backend,
                comm.world_size(),
                comm.describe(),
                table_header()
            );
        }
        let rows = run_device_sweep(comm, &o, &mut printer(comm.rank()))?;
        let tier = tier_of(&profile, comm.world_size(), &o.groups);
        Ok((comm.rank(), rows, tier, choice))
    })?
}

/// Without an accelerator backend compiled in, `ensure_built` has already refused.
#[cfg(not(any(feature = "nccl", feature = "hccl")))]
fn run_device(args: &CollbenchArgs) -> Result<RankRows> {
    ensure_built(args.backend)?;
    bail!("--backend {} is not an accelerator backend", args.backend)
}
