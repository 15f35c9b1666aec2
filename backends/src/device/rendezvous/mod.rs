//! Bootstrap of vendor communicators: getting the bytes of an NCCL unique id (128 B) or an HCCL
//! root info (4108 B) from the rank that created it to every other member.
//!
//! [`IdExchange`] is the one interface the backends use. Three implementations live here:
//! - [`FileStore`] (`HPFSDP_RENDEZVOUS=file:/shared/dir`): the creator writes the bytes to a
//!   temporary file and renames it into place (atomic on one file system); readers poll.
//! - [`TcpStore`] (`HPFSDP_RENDEZVOUS=tcp:host:port`): rank 0 serves a small key-value store
//!   over `std::net`; every rank (rank 0 included, in process) puts and gets through it.
//! - [`LocalExchange`]: a one-rank world needs no exchange.
//!
//! The MPI backend can implement [`IdExchange::broadcast_id`] with an `MPI_Bcast` over
//! `MPI_COMM_WORLD`; sub-communicators then come from `ncclCommSplit` where the library has it.
//!
//! Keys are counted per process, store and rank: the `n`-th exchange under one key uses `key.n`,
//! so a process can build several communicators in one job on one store. A store directory or port must be fresh for each job
//! (stale files from an earlier job would be read as this job's ids).

mod file;
mod store;
mod tcp;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

pub use file::FileStore;
pub use store::{DEFAULT_RENDEZVOUS_TIMEOUT, KeyValueStore};
pub use tcp::TcpStore;

use super::world::{EnvLookup, WorldSpec};
use crate::error::{CommError, CommResult};
use crate::group::Group;

/// Environment variable choosing the rendezvous (`file:/path` or `tcp:host:port`).
pub const RENDEZVOUS_ENV: &str = "HPFSDP_RENDEZVOUS";
/// Environment variable bounding every rendezvous wait, in seconds (default 300).
pub const RENDEZVOUS_TIMEOUT_ENV: &str = "HPFSDP_RENDEZVOUS_TIMEOUT_S";

/// Distributes a communicator id from the rank that created it to the other members.
pub trait IdExchange: Send + Sync {
    /// How the exchange works, for messages (`file:/dir`, `tcp:host:port`, `local`, `mpi`).
    fn method(&self) -> String;

    /// Collective over the whole world: every rank calls it with a buffer of the same length;
    /// on return every rank holds world rank 0's bytes.
    fn broadcast_id(&self, bytes: &mut [u8]) -> CommResult<()>;

    /// Collective over the members of `group` only (non-members do not call): on return every
    /// member holds the bytes of the group's first (lowest) rank. `key` names the communicator
    /// and is the same on every member. The default says the exchange cannot do this.
    fn broadcast_group_id(&self, key: &str, group: &Group, bytes: &mut [u8]) -> CommResult<()> {
        let _ = (key, bytes);
        Err(CommError::Rendezvous {
            method: self.method(),
            reason: format!(
                "this exchange only broadcasts over the whole world, so it cannot create a \
                 communicator for group {group}; set {RENDEZVOUS_ENV}=file:/shared/dir or \
                 tcp:host:port, or create the groups collectively (create_groups) with a library \
                 that can split communicators"
            ),
        })
    }
}

/// An [`IdExchange`] over any [`KeyValueStore`]: the root puts, the others get.
pub struct StoreExchange<S: KeyValueStore> {
    store: S,
    rank: usize,
    timeout: Duration,
}

/// How many exchanges each (store, rank, key) has made in this process.
static COUNTERS: Mutex<BTreeMap<(String, usize, String), u64>> = Mutex::new(BTreeMap::new());

impl<S: KeyValueStore> StoreExchange<S> {
    /// An exchange for global rank `rank`, every wait bounded by `timeout`.
    pub fn new(store: S, rank: usize, timeout: Duration) -> StoreExchange<S> {
        StoreExchange {
            store,
            rank,
            timeout,
        }
    }

    /// The store underneath.
    pub fn store(&self) -> &S {
        &self.store
    }

    fn counted_key(&self, key: &str) -> String {
        // Process-wide per (store, rank, key): a second communicator built on the same store in
        // the same job continues the numbering instead of reading the first one's ids.
        let mut counters = COUNTERS.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (self.store.method(), self.rank, key.to_string());
        let n = counters.entry(slot).or_insert(0);
        let counted = format!("{key}.{n}");
        *n += 1;
        counted
    }

    fn exchange(&self, key: &str, root: usize, bytes: &mut [u8]) -> CommResult<()> {
        let key = self.counted_key(key);
        if self.rank == root {
            return self.store.put(&key, bytes);
        }
        let got = self.store.get(&key, self.timeout)?;
        if got.len() != bytes.len() {
            return Err(CommError::Rendezvous {
                method: self.store.method(),
                reason: format!(
                    "key {key} holds {} bytes but {} were expected; is the store shared with \
                     another job or another backend? Use a fresh directory or port per job",
                    got.len(),
                    bytes.len()
                ),
            });
        }
        bytes.copy_from_slice(&got);
        Ok(())
    }
}

impl<S: KeyValueStore> IdExchange for StoreExchange<S> {
    fn method(&self) -> String {
        self.store.method()
    }

    fn broadcast_id(&self, bytes: &mut [u8]) -> CommResult<()> {
        self.exchange("world", 0, bytes)
    }

    fn broadcast_group_id(&self, key: &str, group: &Group, bytes: &mut [u8]) -> CommResult<()> {
        if !group.contains(self.rank) {
            return Err(CommError::NotInGroup {
                rank: self.rank,
                group: group.label().to_string(),
                ranks: group.ranks().to_vec(),
            });
        }
        self.exchange(&format!("group-{key}"), group.ranks()[0], bytes)
    }
}

/// The exchange of a one-rank world: the only rank is every root, nothing moves.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalExchange;

impl IdExchange for LocalExchange {
    fn method(&self) -> String {
        "local".into()
    }
    fn broadcast_id(&self, _bytes: &mut [u8]) -> CommResult<()> {
        Ok(())
    }
    fn broadcast_group_id(&self, _key: &str, _group: &Group, _bytes: &mut [u8]) -> CommResult<()> {
        Ok(())
    }
}

/// The exchange `HPFSDP_RENDEZVOUS` asks for, read through `lookup`.
///
/// `file:/dir` gives a [`FileStore`], `tcp:host:port` a [`TcpStore`] (rank 0 serves it); with
/// the variable unset, `MASTER_ADDR`/`MASTER_PORT` (torchrun's) give a TCP store on
/// `MASTER_PORT + 1`, and a one-rank world needs nothing. Waits are bounded by
/// `HPFSDP_RENDEZVOUS_TIMEOUT_S` (default 300 s).
pub fn exchange_from_lookup(
    world: &WorldSpec,
    lookup: EnvLookup<'_>,
) -> CommResult<Box<dyn IdExchange>> {
    let timeout = match lookup(RENDEZVOUS_TIMEOUT_ENV) {
        None => DEFAULT_RENDEZVOUS_TIMEOUT,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Duration::from_secs_f64(s),
            _ => {
                return Err(CommError::Rendezvous {
                    method: "env".into(),
                    reason: format!(
                        "{RENDEZVOUS_TIMEOUT_ENV}={v:?} is not a positive number of seconds"
                    ),
                });
            }
        },
    };
    let spec = match lookup(RENDEZVOUS_ENV) {
        Some(spec) => spec,
        None => match (lookup("MASTER_ADDR"), lookup("MASTER_PORT")) {
            (Some(addr), Some(port)) => {
                let port: u16 = port.trim().parse().map_err(|_| CommError::Rendezvous {
                    method: "env".into(),
                    reason: format!("MASTER_PORT={port:?} is not a port number"),
                })?;
                format!("tcp:{addr}:{}", port.wrapping_add(1))
            }
            _ if world.world_size == 1 => return Ok(Box::new(LocalExchange)),
            _ => {
                return Err(CommError::Rendezvous {
                    method: "env".into(),
                    reason: format!(
                        "a world of {} ranks needs a rendezvous to share the communicator id: set \
                         {RENDEZVOUS_ENV}=file:/shared/dir (a directory every rank can read, fresh \
                         per job) or {RENDEZVOUS_ENV}=tcp:host:port (rank 0's host)",
                        world.world_size
                    ),
                });
            }
        },
    };
    exchange_from_spec(&spec, world, timeout)
}

/// Build the exchange named by a `file:/dir` or `tcp:host:port` string.
pub fn exchange_from_spec(
    spec: &str,
    world: &WorldSpec,
    timeout: Duration,
) -> CommResult<Box<dyn IdExchange>> {
    let spec = spec.trim();
    if let Some(dir) = spec.strip_prefix("file:") {
        let store = FileStore::new(dir)?;
        return Ok(Box::new(StoreExchange::new(store, world.rank, timeout)));
    }
    if let Some(addr) = spec.strip_prefix("tcp:") {
        let store = if world.rank == 0 {
            TcpStore::serve(addr)?
        } else {
            TcpStore::connect(addr)?
        };
        return Ok(Box::new(StoreExchange::new(store, world.rank, timeout)));
    }
    Err(CommError::Rendezvous {
        method: spec.to_string(),
        reason: format!("{RENDEZVOUS_ENV}={spec:?} is neither file:/path nor tcp:host:port"),
    })
}
