//! `hpfsdp collbench` and `hpfsdp replay` on the nccl backend against the CPU stand-in of
//! NCCL, the CUDA runtime and driver, and cuBLAS (`backends/tests/fake/`), one rank: the
//! prediction follows the device's name (or refuses it, naming `--hardware`), collbench times
//! device-resident buffers with both nccl-tests blocks, and replay runs compute on the device
//! (the PTX spin kernel, or cuBLAS GEMMs). Needs `--features nccl`:
//! `cargo test --release --features nccl,hccl --test cli_device`.
#![cfg(feature = "nccl")]

#[path = "../backends/tests/fake/mod.rs"]
mod fake;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn hpfsdp(args: &[&str], device: Option<&str>, tag: &str) -> Output {
    let dir = fake::fresh_dir(&format!("cli-device-{tag}"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hpfsdp"));
    cmd.args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .env_remove("FAKE_CUDA_DEVICE_NAME");
    for (k, v) in fake::rank_env(0, 1, &dir) {
        cmd.env(k, v);
    }
    if let Some(name) = device {
        cmd.env("FAKE_CUDA_DEVICE_NAME", name);
    }
    cmd.output().expect("run hpfsdp")
}

fn out_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hpfsdp-cli-device-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn collbench_on_the_device_uses_its_profile_and_both_blocks() {
    let csv = out_dir("collbench").with_extension("csv");
    let o = hpfsdp(
        &[
            "collbench",
            "--backend",
            "nccl",
            "-b",
            "1K",
            "-e",
            "16K",
            "-f",
            "4",
            "-n",
            "3",
            "-w",
            "1",
            "--out",
            csv.to_str().unwrap(),
        ],
        None,
        "collbench",
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("device-resident buffers"), "{out}");
    assert!(out.contains("out of bounds values: 0 OK"), "{out}");
    assert!(out.contains("# Avg bus bandwidth"), "{out}");
    assert!(
        out.contains("# tier from profile nvidia-h200-hgx: the device is 'NVIDIA H200'"),
        "{out}"
    );
    // all-reduce rows carry both blocks; all-to-all has no in-place one.
    let row = |kind: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.trim_start().starts_with(kind))
            .unwrap_or_else(|| panic!("no {kind} row in {out}"))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    let ar = row("all-reduce");
    assert_eq!((ar[9].as_str(), ar[13].as_str()), ("0", "0"), "{ar:?}");
    assert_ne!(ar[10], "N/A", "{ar:?}");
    assert_eq!(row("all-to-all")[10], "N/A");
    let text = std::fs::read_to_string(&csv).unwrap();
    let _ = std::fs::remove_file(&csv);
    assert!(text.starts_with(
        "collective,size,count,type,redop,root,time_us,algbw,busbw,#wrong,tier,ranks\n"
    ));
}

#[test]
fn an_unknown_device_is_refused_naming_hardware_unless_given() {
    let args = [
        "collbench",
        "--backend",
        "nccl",
        "-b",
        "1K",
        "-e",
        "1K",
        "--kinds",
        "all-reduce",
    ];
    let o = hpfsdp(&args, Some("NVIDIA A100-SXM4-80GB"), "unknown");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("'NVIDIA A100-SXM4-80GB'") && err.contains("--hardware"),
        "{err}"
    );
    let mut with = args.to_vec();
    with.extend(["--hardware", "nvidia-h100-hgx"]);
    let o = hpfsdp(&with, Some("NVIDIA A100-SXM4-80GB"), "explicit");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("--hardware nvidia-h100-hgx (the device is 'NVIDIA A100-SXM4-80GB')"),
        "{out}"
    );
}

fn replay(compute: &str) -> Value {
    let dir = out_dir(&format!("replay-{compute}"));
    let o = hpfsdp(
        &[
            "replay",
            "scenarios/verify/dense-fsdp4.toml",
            "--backend",
            "nccl",
            "--ranks",
            "1",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--compute",
            compute,
            "--json",
            "--out",
            dir.to_str().unwrap(),
        ],
        None,
        &format!("replay-{compute}"),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn replay_on_the_device_predicts_on_its_profile_and_runs_compute_there() {
    let busy = replay("busy");
    assert_eq!(busy["hardware"], "nvidia-h200-hgx");
    let reason = busy["hardware_reason"].as_str().unwrap();
    assert!(reason.contains("'NVIDIA H200'"), "{reason}");
    let on = busy["compute_on"].as_str().unwrap();
    assert!(on.contains("PTX spin kernel"), "{on}");
    assert_eq!(busy["measured_steps_ns"].as_array().unwrap().len(), 2);
    assert_eq!(busy["dependency_violations"], 0, "{busy}");
    let real = replay("real");
    let on = real["compute_on"].as_str().unwrap();
    assert!(on.contains("cuBLAS"), "{on}");
    assert_eq!(real["dependency_violations"], 0, "{real}");
}
