//! A key-value store served by rank 0 over TCP (`std::net` only).
//!
//! Wire format, little-endian, one request per connection:
//! - put: `1u8, key_len u32, key, value_len u32, value` → `0u8`;
//! - get: `2u8, key_len u32, key, timeout_ms u64` → `0u8, len u32, value` or `1u8` (timed out).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::store::{DEFAULT_RENDEZVOUS_TIMEOUT, KeyValueStore};
use crate::error::{CommError, CommResult};

const OP_PUT: u8 = 1;
const OP_GET: u8 = 2;
const MAX_KEY_BYTES: u32 = 4096;
const MAX_VALUE_BYTES: u32 = 1 << 20;

/// Stores this process serves, by the address asked for (port 0 excluded).
static SERVERS: Mutex<BTreeMap<String, (Arc<Table>, SocketAddr)>> = Mutex::new(BTreeMap::new());

#[derive(Default)]
struct Table {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl Table {
    fn put(&self, key: &str, value: &[u8]) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(key.to_string(), value.to_vec());
        self.changed.notify_all();
    }

    fn get(&self, key: &str, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = map.get(key) {
                return Some(v.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            map = self
                .changed
                .wait_timeout(map, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

enum Role {
    Server {
        table: Arc<Table>,
        local: SocketAddr,
    },
    Client,
}

/// A [`KeyValueStore`] held by rank 0 and reached over TCP by the other ranks.
pub struct TcpStore {
    addr: String,
    role: Role,
    connect_timeout: Duration,
}

impl TcpStore {
    /// Serve the store on `addr` (`host:port`; port 0 picks a free port, see
    /// [`TcpStore::local_addr`]). If `host` is not an address of this machine, the store listens
    /// on all interfaces at `port`. The server thread lives until the process exits, not just as
    /// long as this value: ranks that create group communicators after rank 0 has dropped its
    /// communicator must still reach it.
    pub fn serve(addr: &str) -> CommResult<TcpStore> {
        let mut servers = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((table, local)) = servers.get(addr) {
            // This process already serves `addr` (an earlier communicator): share it.
            return Ok(TcpStore {
                addr: addr.to_string(),
                role: Role::Server {
                    table: Arc::clone(table),
                    local: *local,
                },
                connect_timeout: DEFAULT_RENDEZVOUS_TIMEOUT,
            });
        }
        let method = format!("tcp:{addr}");
        let listener = TcpListener::bind(addr).or_else(|first| {
            let port = addr.rsplit(':').next().unwrap_or("");
            TcpListener::bind(format!("0.0.0.0:{port}")).map_err(|_| first)
        });
        let listener = listener.map_err(|e| CommError::Rendezvous {
            method: method.clone(),
            reason: format!("rank 0 cannot listen on {addr}: {e}; choose a free port"),
        })?;
        let local = listener.local_addr().map_err(|e| CommError::Rendezvous {
            method: method.clone(),
            reason: format!("cannot read the listening address: {e}"),
        })?;
        let table = Arc::new(Table::default());
        let t = Arc::clone(&table);
        std::thread::Builder::new()
            .name("hpfsdp-rendezvous".into())
            .spawn(move || accept_loop(listener, t))
            .map_err(|e| CommError::Rendezvous {
                method,
                reason: format!("cannot start the server thread: {e}"),
            })?;
        if !addr.ends_with(":0") {
            servers.insert(addr.to_string(), (Arc::clone(&table), local));
        }
        Ok(TcpStore {
            addr: addr.to_string(),
            role: Role::Server { table, local },
            connect_timeout: DEFAULT_RENDEZVOUS_TIMEOUT,
        })
    }

    /// A client of the store rank 0 serves at `addr` (connections are made per request,
    /// retrying until rank 0 listens).
    pub fn connect(addr: &str) -> CommResult<TcpStore> {
        Ok(TcpStore {
            addr: addr.to_string(),
            role: Role::Client,
            connect_timeout: DEFAULT_RENDEZVOUS_TIMEOUT,
        })
    }

    /// Bound the wait for rank 0 to start listening (default 300 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> TcpStore {
        self.connect_timeout = timeout;
        self
    }

    /// The address the server listens on (`None` on a client).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.role {
            Role::Server { local, .. } => Some(*local),
            Role::Client => None,
        }
    }

    fn error(&self, reason: String) -> CommError {
        CommError::Rendezvous {
            method: self.method(),
            reason,
        }
    }

    fn open(&self) -> CommResult<TcpStream> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(5);
        loop {
            match TcpStream::connect(&self.addr) {
                Ok(s) => return Ok(s),
                Err(e) if start.elapsed() >= self.connect_timeout => {
                    return Err(self.error(format!(
                        "cannot reach rank 0's store at {} within {:.1} s: {e}; is rank 0 running \
                         and is the port open?",
                        self.addr,
                        self.connect_timeout.as_secs_f64()
                    )));
                }
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    fn request(&self, frame: &[u8], read_timeout: Duration) -> CommResult<(u8, Vec<u8>)> {
        let io = |e: std::io::Error| self.error(format!("talking to rank 0's store: {e}"));
        let mut s = self.open()?;
        s.set_read_timeout(Some(read_timeout + Duration::from_secs(5)))
            .map_err(io)?;
        s.write_all(frame).map_err(io)?;
        let status = read_u8(&mut s).map_err(io)?;
        if status != 0 || frame[0] == OP_PUT {
            return Ok((status, Vec::new()));
        }
        let len = read_u32(&mut s).map_err(io)?;
        if len > MAX_VALUE_BYTES {
            return Err(self.error(format!(
                "store answered with an implausible {len}-byte value"
            )));
        }
        let mut value = vec![0u8; len as usize];
        s.read_exact(&mut value).map_err(io)?;
        Ok((0, value))
    }
}

impl KeyValueStore for TcpStore {
    fn method(&self) -> String {
        format!("tcp:{}", self.addr)
    }

    fn put(&self, key: &str, bytes: &[u8]) -> CommResult<()> {
        if bytes.len() > MAX_VALUE_BYTES as usize || key.len() > MAX_KEY_BYTES as usize {
            return Err(self.error(format!(
                "key {key:?} or its {}-byte value is too large",
                bytes.len()
            )));
        }
        if let Role::Server { table, .. } = &self.role {
            table.put(key, bytes);
            return Ok(());
        }
        let mut frame = vec![OP_PUT];
        push_bytes(&mut frame, key.as_bytes());
        push_bytes(&mut frame, bytes);
        self.request(&frame, self.connect_timeout).map(|_| ())
    }

    fn get(&self, key: &str, timeout: Duration) -> CommResult<Vec<u8>> {
        let found = if let Role::Server { table, .. } = &self.role {
            table.get(key, timeout)
        } else {
            let mut frame = vec![OP_GET];
            push_bytes(&mut frame, key.as_bytes());
            frame.extend_from_slice(&(timeout.as_millis() as u64).to_le_bytes());
            match self.request(&frame, timeout)? {
                (0, v) => Some(v),
                _ => None,
            }
        };
        found.ok_or_else(|| {
            self.error(format!(
                "key {key} was not published within {:.1} s: did the creating rank fail?",
                timeout.as_secs_f64()
            ))
        })
    }
}

fn push_bytes(frame: &mut Vec<u8>, bytes: &[u8]) {
    frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    frame.extend_from_slice(bytes);
}

fn read_u8(s: &mut impl Read) -> std::io::Result<u8> {
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(b[0])
}

fn read_u32(s: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_limited(s: &mut impl Read, limit: u32) -> std::io::Result<Vec<u8>> {
    let len = read_u32(s)?;
    if len > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{len} bytes exceed the limit of {limit}"),
        ));
    }
    let mut v = vec![0u8; len as usize];
    s.read_exact(&mut v)?;
    Ok(v)
}

fn accept_loop(listener: TcpListener, table: Arc<Table>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let table = Arc::clone(&table);
        // A failed request only affects its own client, which reports the broken connection.
        let _ = std::thread::Builder::new()
            .name("hpfsdp-rendezvous-conn".into())
            .spawn(move || {
                let _ = serve_one(conn, &table);
            });
    }
}

fn serve_one(mut s: TcpStream, table: &Table) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let op = read_u8(&mut s)?;
    let key = String::from_utf8_lossy(&read_limited(&mut s, MAX_KEY_BYTES)?).into_owned();
    match op {
        OP_PUT => {
            let value = read_limited(&mut s, MAX_VALUE_BYTES)?;
            table.put(&key, &value);
            s.write_all(&[0])
        }
        OP_GET => {
            let mut ms = [0u8; 8];
            s.read_exact(&mut ms)?;
            let timeout = Duration::from_millis(u64::from_le_bytes(ms));
            match table.get(&key, timeout) {
                Some(v) => {
                    let mut out = vec![0u8];
                    push_bytes(&mut out, &v);
                    s.write_all(&out)
                }
                None => s.write_all(&[1]),
            }
        }
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unknown store request {op}"),
        )),
    }
}
