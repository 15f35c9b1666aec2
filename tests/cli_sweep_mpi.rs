//! `hpfsdp sweep --under-mpi` under `mpirun`: the points are spread over the ranks and rank 0
//! writes byte-identical `sweep.csv` / `sweep.html` to a one-process sweep, whatever the
//! process count. Built only with `--features mpi`; needs `mpirun` (OpenMPI) on `PATH`.
#![cfg(feature = "mpi")]

mod common;

use common::{fresh_dir, hpfsdp, text};
use std::path::Path;
use std::process::Command;

const SCENARIO: &str = "scenarios/verify/dense-fsdp4.toml";
const VARY: [&str; 4] = [
    "--vary",
    "fsdp.prefetch_depth=0,1,2",
    "--vary",
    "train.micro_batch=1,2,3",
];

/// `mpirun -np <np> hpfsdp sweep ... --under-mpi --out <dir>`: (exit code, output).
fn sweep_under_mpi(np: usize, dir: &Path) -> (Option<i32>, String) {
    let o = Command::new("mpirun")
        .args([
            "--oversubscribe",
            "--allow-run-as-root",
            "-np",
            &np.to_string(),
        ])
        .arg(env!("CARGO_BIN_EXE_hpfsdp"))
        .args(["sweep", SCENARIO])
        .args(VARY)
        .args(["--under-mpi", "--out", dir.to_str().unwrap()])
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("mpirun must be installed (apt-get install openmpi-bin libopenmpi-dev)");
    (o.status.code(), text(&o))
}

#[test]
fn points_spread_over_ranks_give_the_one_process_outputs() {
    let single = fresh_dir("sweep-mpi", "single");
    let o = hpfsdp(
        &[
            &["sweep", SCENARIO][..],
            &VARY[..],
            &["--out", single.to_str().unwrap()][..],
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    for np in [2, 3] {
        let dir = fresh_dir("sweep-mpi", &format!("np{np}"));
        let (code, out) = sweep_under_mpi(np, &dir);
        assert_eq!(code, Some(0), "mpirun -np {np}: {out}");
        // Only rank 0 reports: one summary line, not one per rank.
        assert_eq!(out.matches("best feasible point").count(), 1, "{out}");
        for file in ["sweep.csv", "sweep.html"] {
            let a = std::fs::read(single.join(file)).unwrap();
            let b = std::fs::read(dir.join(file)).unwrap();
            assert!(
                a == b,
                "{file} differs between one process and {np} MPI ranks"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
    std::fs::remove_dir_all(&single).ok();
}
