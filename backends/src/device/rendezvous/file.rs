//! A key-value store in a shared directory: one file per key, written atomically.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::store::KeyValueStore;
use crate::error::{CommError, CommResult};

/// First bytes of every value file, so foreign or truncated files are recognised.
const MAGIC: &[u8; 12] = b"HPFSDP-RDV1\n";

/// A [`KeyValueStore`] in a directory every rank can read (NFS, Lustre or a local directory
/// for ranks on one node). A value is written to a temporary file in the same directory and
/// renamed to `<key>.id`, so a reader sees either nothing or the whole value.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    /// A store in `dir`, created if it does not exist.
    pub fn new(dir: impl AsRef<Path>) -> CommResult<FileStore> {
        let dir = dir.as_ref().to_path_buf();
        if dir.as_os_str().is_empty() {
            return Err(CommError::Rendezvous {
                method: "file:".into(),
                reason: "no directory given: write file:/path/to/shared/dir".into(),
            });
        }
        fs::create_dir_all(&dir).map_err(|e| CommError::Rendezvous {
            method: format!("file:{}", dir.display()),
            reason: format!("cannot create the directory: {e}"),
        })?;
        Ok(FileStore { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds `key`.
    pub fn path_of(&self, key: &str) -> PathBuf {
        let safe: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir.join(format!("{safe}.id"))
    }

    fn error(&self, reason: String) -> CommError {
        CommError::Rendezvous {
            method: self.method(),
            reason,
        }
    }

    fn read_value(&self, path: &Path) -> CommResult<Vec<u8>> {
        let raw = fs::read(path)
            .map_err(|e| self.error(format!("cannot read {}: {e}", path.display())))?;
        let body = raw
            .strip_prefix(MAGIC.as_slice())
            .filter(|b| b.len() >= 8)
            .ok_or_else(|| {
                self.error(format!(
                    "{} is not a rendezvous file written by hpfsdp; remove it or use a fresh directory",
                    path.display()
                ))
            })?;
        let (len, value) = body.split_at(8);
        let len = u64::from_le_bytes(len.try_into().unwrap_or([0; 8]));
        if len != value.len() as u64 {
            return Err(self.error(format!(
                "{} says {len} bytes but holds {}; remove it or use a fresh directory",
                path.display(),
                value.len()
            )));
        }
        Ok(value.to_vec())
    }
}

impl KeyValueStore for FileStore {
    fn method(&self) -> String {
        format!("file:{}", self.dir.display())
    }

    fn put(&self, key: &str, bytes: &[u8]) -> CommResult<()> {
        let target = self.path_of(key);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let tmp = self
            .dir
            .join(format!(".{key}.{}.{nanos}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(&(bytes.len() as u64).to_le_bytes())?;
            f.write_all(bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, &target)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            self.error(format!("cannot publish {}: {e}", target.display()))
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> CommResult<Vec<u8>> {
        let path = self.path_of(key);
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            if path.exists() {
                return self.read_value(&path);
            }
            if start.elapsed() >= timeout {
                return Err(self.error(format!(
                    "{} did not appear within {:.1} s: is the creating rank running, and does every \
                     rank see the same directory?",
                    path.display(),
                    timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}
