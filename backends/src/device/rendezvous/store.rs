//! The key-value store interface that [`super::StoreExchange`] runs on ([`super::FileStore`],
//! [`super::TcpStore`]), and the default bound on its waits.

use std::time::Duration;

use crate::error::CommResult;

/// Default bound on a rendezvous wait.
pub const DEFAULT_RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(300);

/// A key-value store that rendezvous exchanges are built on.
pub trait KeyValueStore: Send + Sync {
    /// How the store is reached, for messages.
    fn method(&self) -> String;
    /// Publish `bytes` under `key` (keys are written once).
    fn put(&self, key: &str, bytes: &[u8]) -> CommResult<()>;
    /// Wait until `key` exists (at most `timeout`) and return its bytes.
    fn get(&self, key: &str, timeout: Duration) -> CommResult<Vec<u8>>;
}
