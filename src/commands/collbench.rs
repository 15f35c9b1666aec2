//! `hpfsdp collbench`: the nccl-tests / hccl_test sweep on any backend, written as CSV with
//! the columns `hpfsdp calibrate --from` reads, and printed like nccl-tests.
//!
//! `tier` is the slowest link of the benchmarked groups in the hardware profile's topology
//! (`--hardware`; default `cpu-mpi` for inproc and mpi, `nvidia-h100-hgx` for nccl,
//! `ascend-910c-a3` for hccl).

use anyhow::{Context, Result, bail};
use hpfsdp_backends::DType;
use hpfsdp_backends::collbench::{
    BenchOptions, BenchRow, parse_bytes, parse_groups, parse_kinds, run_sweep, validate,
};
use hpfsdp_backends::select::{BackendKind, ensure_built, run_on_backend};
use hpfsdp_sim::HardwareProfile;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Header of the CSV, exactly (read by `hpfsdp calibrate --from`).
pub const COLLBENCH_CSV_HEADER: &str =
    "collective,size,count,type,redop,root,time_us,algbw,busbw,#wrong,tier,ranks";

/// Options of `hpfsdp collbench`.
#[derive(clap::Args)]
pub struct CollbenchArgs {
    /// Collective backend: inproc, mpi, hccl or nccl.
    #[arg(long, value_parser = crate::parse_backend)]
    pub backend: BackendKind,
    /// Collectives to sweep (comma-separated, or all).
    #[arg(
        long,
        default_value = "all-gather,reduce-scatter,all-reduce,broadcast,all-to-all"
    )]
    pub kinds: String,
    /// Smallest size in bytes (K, M, G suffixes).
    #[arg(long = "min-bytes", default_value = "8")]
    pub min_bytes: String,
    /// Largest size in bytes.
    #[arg(long = "max-bytes", default_value = "256M")]
    pub max_bytes: String,
    /// Size multiplier between steps.
    #[arg(long, default_value_t = 2)]
    pub factor: u64,
    /// Groups: world, size:K (blocks of K ranks) or explicit 0,1;2,3.
    #[arg(long, default_value = "world")]
    pub groups: String,
    /// Timed calls per size.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed calls per size.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Element type: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Ranks (threads) for --backend inproc; default 4.
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Write the CSV here.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Hardware profile whose topology gives the tier column.
    #[arg(long)]
    pub hardware: Option<String>,
    /// After each size, also time a twin one element longer per rank (its buffers not a
    /// multiple of 512 bytes), so `calibrate --from` can fit HCCL's unaligned-buffer factor.
    #[arg(long)]
    pub unaligned: bool,
    /// Bound on any wait for a peer, seconds.
    #[arg(long = "timeout-s", default_value_t = 300.0)]
    pub timeout_s: f64,
}

fn default_hardware(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::InProc | BackendKind::Mpi => "cpu-mpi",
        BackendKind::Nccl => "nvidia-h100-hgx",
        BackendKind::Hccl => "ascend-910c-a3",
    }
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
    };
    validate(&o).map_err(|e| anyhow::anyhow!("{e}"))?;
    if o.iters == 0 {
        bail!("--iters 0: time at least one call");
    }
    Ok(o)
}

/// The CSV text of the rows, each with its tier name.
pub fn csv(rows: &[BenchRow], tier: &str) -> String {
    let mut out = String::from(COLLBENCH_CSV_HEADER);
    out.push('\n');
    for r in rows {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{}\n",
            r.kind.name(),
            r.size_bytes,
            r.count,
            r.type_name(),
            r.redop,
            r.root,
            r.time_us,
            r.algbw_gbps,
            r.busbw_gbps,
            r.wrong,
            tier,
            r.group_ranks
        ));
    }
    out
}

/// The nccl-tests-style table.
fn table(rows: &[BenchRow], tier: &str) -> String {
    let mut out = format!(
        "#{:>14} {:>12} {:>12} {:>9} {:>6} {:>6} {:>12} {:>8} {:>8} {:>7}\n",
        "collective",
        "size(B)",
        "count",
        "type",
        "redop",
        "root",
        "time(us)",
        "algbw",
        "busbw",
        "#wrong"
    );
    for r in rows {
        out.push_str(&format!(
            "{:>15} {:>12} {:>12} {:>9} {:>6} {:>6} {:>12.2} {:>8.3} {:>8.3} {:>7}\n",
            r.kind.name(),
            r.size_bytes,
            r.count,
            r.type_name(),
            r.redop,
            r.root,
            r.time_us,
            r.algbw_gbps,
            r.busbw_gbps,
            r.wrong
        ));
    }
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    out.push_str(&format!(
        "# tier: {tier}; out of bounds values: {wrong} {}\n",
        if wrong == 0 { "OK" } else { "FAILED" }
    ));
    out
}

/// Runs the command. Exit status 1 when any result was wrong.
pub fn run(args: &CollbenchArgs) -> Result<ExitCode> {
    ensure_built(args.backend)?;
    if !args.backend.ranks_are_threads() && args.ranks.is_some() {
        bail!(
            "--ranks is for --backend inproc; with {} the launcher's process count sets the ranks",
            args.backend
        );
    }
    let threads = args.ranks.unwrap_or(4);
    if threads == 0 {
        bail!("--ranks 0: run at least one rank");
    }
    let hardware = args
        .hardware
        .clone()
        .unwrap_or_else(|| default_hardware(args.backend).to_string());
    let profile = HardwareProfile::load_named(&hardware, "scenarios/hardware")
        .with_context(|| format!("loading hardware profile '{hardware}'"))?;
    let timeout = Duration::from_secs_f64(args.timeout_s.max(0.001));
    let results = run_on_backend(args.backend, threads, timeout, |comm| {
        let o = options(args, comm.world_size())?;
        let rows = run_sweep(comm, &o)?;
        let topology = profile.topology_for(comm.world_size());
        let tier = o
            .groups
            .iter()
            .map(|g| topology.tier_of(g.ranks()))
            .max()
            .map_or("intra-machine", |t| t.name());
        Ok::<_, anyhow::Error>((comm.rank(), rows, tier))
    })?;
    let Some(first) = results.into_iter().next() else {
        bail!("the backend ran no rank");
    };
    let (rank, rows, tier) = first?;
    if rank != 0 {
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", table(&rows, tier));
    if let Some(path) = &args.out {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, csv(&rows, tier))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    Ok(if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
