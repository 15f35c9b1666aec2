//! The `hpfsdp` command line: plan, (later) simulate, verify, replay, sweep and gate
//! HyperParallel-FSDP training plans.

mod commands;
mod table;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Check a HyperParallel-FSDP training plan before it reaches the hardware.
#[derive(Parser)]
#[command(name = "hpfsdp", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Derive and lint the sharding, FSDP/HSDP and Muon plans of a scenario and print them.
    Plan {
        /// Scenario file (TOML).
        scenario: PathBuf,
        /// Print the whole plan as JSON.
        #[arg(long)]
        json: bool,
        /// Explain why a parameter got its role and placement (full FQN).
        #[arg(long, value_name = "PARAM")]
        explain: Option<String>,
        /// List every parameter instead of folding repeated layers.
        #[arg(long)]
        all: bool,
    },
    /// Time the simulator itself: wall time per simulated step and events per second for a
    /// synthetic 48-layer SPMD step on 768 ranks (folded and unfolded) and on ~100k ranks.
    Bench {
        /// Hardware profile name (scenarios/hardware/<name>.toml or a built-in copy).
        #[arg(long, default_value = "ascend-910c-a3")]
        hardware: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan {
            scenario,
            json,
            explain,
            all,
        } => commands::plan::run(&scenario, json, explain.as_deref(), all),
        Command::Bench { hardware } => commands::bench::run(&hardware),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
