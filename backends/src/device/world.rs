//! Where this process sits in a multi-process job: its global rank, the world size and the
//! local device index, taken from arguments or from the launcher's environment.

use crate::error::{CommError, CommResult};

/// Reads one environment variable; injectable so tests never mutate the process environment.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment as an [`EnvLookup`].
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

/// Launcher variable pairs `(rank, world size)`, in the order they are consulted.
const RANK_SIZE_VARS: [(&str, &str); 4] = [
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
];

/// Variables naming the device index on this node, in the order they are consulted.
const LOCAL_RANK_VARS: [&str; 5] = [
    "HPFSDP_DEVICE",
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "SLURM_LOCALID",
];

/// This process's place in the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorldSpec {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes (one rank each).
    pub world_size: usize,
    /// Index of the accelerator this rank drives on its node.
    pub device_index: usize,
}

impl WorldSpec {
    /// A validated spec: `rank < world_size` and `world_size >= 1`.
    pub fn new(rank: usize, world_size: usize, device_index: usize) -> CommResult<WorldSpec> {
        if world_size == 0 || rank >= world_size {
            return Err(CommError::InvalidWorld(format!(
                "rank {rank} in a world of {world_size}: need world_size >= 1 and rank < world_size"
            )));
        }
        Ok(WorldSpec {
            rank,
            world_size,
            device_index,
        })
    }

    /// A one-rank world on device 0 (no launcher needed).
    pub fn single() -> WorldSpec {
        WorldSpec {
            rank: 0,
            world_size: 1,
            device_index: 0,
        }
    }

    /// Read the spec from the process environment (see [`WorldSpec::from_lookup`]).
    pub fn from_env() -> CommResult<WorldSpec> {
        WorldSpec::from_lookup(&process_env)
    }

    /// Read the spec through `lookup`: rank and size from the first pair found among
    /// `RANK`/`WORLD_SIZE` (torchrun), `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE` (Open MPI),
    /// `PMI_RANK`/`PMI_SIZE` (MPICH) and `SLURM_PROCID`/`SLURM_NTASKS`; the device index from
    /// `HPFSDP_DEVICE`, `LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID` or
    /// `SLURM_LOCALID` (default 0). No variable at all means a one-rank world.
    pub fn from_lookup(lookup: EnvLookup<'_>) -> CommResult<WorldSpec> {
        let mut rank_size = None;
        for (rank_var, size_var) in RANK_SIZE_VARS {
            match (lookup(rank_var), lookup(size_var)) {
                (None, None) => continue,
                (Some(r), Some(s)) => {
                    let rank = parse_index(rank_var, &r)?;
                    let size = parse_index(size_var, &s)?;
                    rank_size = Some((rank, size, rank_var, size_var));
                    break;
                }
                (Some(_), None) | (None, Some(_)) => {
                    return Err(CommError::InvalidWorld(format!(
                        "only one of {rank_var} and {size_var} is set; set both (or neither for a one-rank world)"
                    )));
                }
            }
        }
        let mut device_index = 0;
        for var in LOCAL_RANK_VARS {
            if let Some(v) = lookup(var) {
                device_index = parse_index(var, &v)?;
                break;
            }
        }
        let Some((rank, size, rank_var, size_var)) = rank_size else {
            return WorldSpec::new(0, 1, device_index);
        };
        WorldSpec::new(rank, size, device_index).map_err(|_| {
            CommError::InvalidWorld(format!(
                "{rank_var}={rank} is not below {size_var}={size}; fix the launcher's variables"
            ))
        })
    }
}

fn parse_index(var: &str, value: &str) -> CommResult<usize> {
    value.trim().parse::<usize>().map_err(|_| {
        CommError::InvalidWorld(format!(
            "environment variable {var}={value:?} is not a non-negative integer"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn torchrun_then_openmpi_then_default() {
        let e = env(&[("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")]);
        assert_eq!(
            WorldSpec::from_lookup(&e).unwrap(),
            WorldSpec::new(3, 8, 1).unwrap()
        );
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
        ]);
        assert_eq!(
            WorldSpec::from_lookup(&e).unwrap(),
            WorldSpec::new(2, 4, 2).unwrap()
        );
        assert_eq!(
            WorldSpec::from_lookup(&env(&[])).unwrap(),
            WorldSpec::single()
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = env(&[("RANK", "x"), ("WORLD_SIZE", "2")]);
        let msg = WorldSpec::from_lookup(&e).unwrap_err().to_string();
        assert!(msg.contains("RANK=\"x\""), "{msg}");
        let e = env(&[("RANK", "1")]);
        let msg = WorldSpec::from_lookup(&e).unwrap_err().to_string();
        assert!(msg.contains("WORLD_SIZE"), "{msg}");
        let e = env(&[("RANK", "4"), ("WORLD_SIZE", "4")]);
        let msg = WorldSpec::from_lookup(&e).unwrap_err().to_string();
        assert!(msg.contains("RANK=4 is not below WORLD_SIZE=4"), "{msg}");
    }
}
