//! Reading a file the user names (scenario, model, hardware profile, measured table, gate
//! lock) with a size cap, refusing anything that is not a regular file.
//!
//! `std::fs::read_to_string` on `/dev/zero` reads until memory runs out, on `/dev/urandom` it
//! never ends, and on a FIFO it blocks until a writer appears; a symlink to any of them does
//! the same. [`read_text`] follows symlinks, refuses devices, FIFOs, sockets and directories
//! before reading a byte, opens without blocking, and stops at the kind's byte cap
//! ([`crate::limits::FileLimit`]), so every such input ends in a clean error naming the file,
//! what it resolved to, the cap and the fix.

use crate::limits::FileLimit;
use std::fmt;
use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

/// Why a file could not be read: the file as written, and the reason with its fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// The path as the user gave it.
    pub file: String,
    /// What the file is for (`scenario file`, `GEMM table`...).
    pub what: &'static str,
    /// What is wrong and how to fix it (does not repeat the file).
    pub reason: String,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot read the {} {}: {}",
            self.what, self.file, self.reason
        )
    }
}

impl std::error::Error for ReadError {}

/// Reads `path` as UTF-8 text of at most `limit.max_bytes` bytes; anything that is not a
/// regular file (after following symlinks), is larger, or is not UTF-8 is an error.
pub fn read_text(path: &Path, limit: &FileLimit) -> Result<String, ReadError> {
    let err = |reason: String| ReadError {
        file: path.display().to_string(),
        what: limit.what,
        reason,
    };
    // stat first: a FIFO or a device is refused without being opened.
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    check_regular(path, &meta, limit).map_err(err)?;
    check_size(meta.len(), limit).map_err(err)?;
    let file = open_nonblocking(path).map_err(|e| err(e.to_string()))?;
    // The path may have been swapped between the stat and the open: check what was opened.
    let meta = file.metadata().map_err(|e| err(e.to_string()))?;
    check_regular(path, &meta, limit).map_err(err)?;
    let mut bytes = Vec::new();
    file.take(limit.max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| err(e.to_string()))?;
    check_size(bytes.len() as u64, limit).map_err(err)?;
    String::from_utf8(bytes).map_err(|e| {
        err(format!(
            "not UTF-8 text (invalid byte at offset {}); give the path of {}",
            e.utf8_error().valid_up_to(),
            limit.expect
        ))
    })
}

/// Opens for reading without blocking on a FIFO that slipped past the stat.
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// Refuses everything but a regular file, naming what the path is (and resolves to).
fn check_regular(path: &Path, meta: &Metadata, limit: &FileLimit) -> Result<(), String> {
    if meta.is_file() {
        return Ok(());
    }
    let resolved = match std::fs::canonicalize(path) {
        Ok(target) if target != path => format!(" (it resolves to {})", target.display()),
        _ => String::new(),
    };
    Err(format!(
        "it is {}{resolved}, not a regular file; give the path of {}",
        kind_of(meta),
        limit.expect
    ))
}

/// Refuses a size above the cap.
fn check_size(bytes: u64, limit: &FileLimit) -> Result<(), String> {
    if bytes <= limit.max_bytes {
        return Ok(());
    }
    Err(format!(
        "it holds more than {} bytes ({} MiB), the limit for a {} ({}); give the path of {}",
        crate::limits::group(limit.max_bytes),
        limit.max_bytes >> 20,
        limit.what,
        limit.why,
        limit.expect
    ))
}

/// `a directory`, `a character device`, `a FIFO`... for error messages.
fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a file"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::SCENARIO_FILE;
    use std::path::PathBuf;

    fn temp_dir(test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("hpfsdp-input-file-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    const TINY: FileLimit = FileLimit {
        max_bytes: 8,
        ..SCENARIO_FILE
    };

    #[test]
    fn a_small_regular_file_is_read_whole() {
        let dir = temp_dir("small");
        let path = dir.join("a.toml");
        std::fs::write(&path, "x = 1\n").unwrap();
        assert_eq!(read_text(&path, &TINY).unwrap(), "x = 1\n");
        std::fs::write(&path, "12345678").unwrap();
        assert_eq!(read_text(&path, &TINY).unwrap(), "12345678");
    }

    #[test]
    fn a_file_over_the_cap_is_refused_naming_file_limit_and_fix() {
        let dir = temp_dir("big");
        let path = dir.join("big.toml");
        std::fs::write(&path, "123456789").unwrap();
        let e = read_text(&path, &TINY).unwrap_err().to_string();
        assert!(e.contains("big.toml"), "{e}");
        assert!(e.contains("more than 8 bytes"), "{e}");
        assert!(e.contains("the limit for a scenario file"), "{e}");
        assert!(e.contains("give the path of"), "{e}");
    }

    #[test]
    fn a_directory_and_a_missing_file_are_errors() {
        let dir = temp_dir("dir");
        let e = read_text(&dir, &TINY).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let e = read_text(&dir.join("absent.toml"), &TINY).unwrap_err();
        assert!(e.reason.contains("No such file"), "{e}");
    }

    #[test]
    fn invalid_utf8_names_the_offset() {
        let dir = temp_dir("utf8");
        let path = dir.join("bin.toml");
        std::fs::write(&path, b"ab\xffc").unwrap();
        let e = read_text(&path, &TINY).unwrap_err().to_string();
        assert!(e.contains("not UTF-8") && e.contains("offset 2"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn devices_fifos_and_symlinks_to_them_are_refused_without_reading() {
        let dir = temp_dir("special");
        for (dev, kind) in [
            ("/dev/zero", "a character device"),
            ("/dev/urandom", "a character device"),
        ] {
            let e = read_text(Path::new(dev), &SCENARIO_FILE)
                .unwrap_err()
                .to_string();
            assert!(e.contains(kind) && e.contains(dev), "{e}");
            let link = dir.join(format!("{}.json", dev.trim_start_matches("/dev/")));
            std::os::unix::fs::symlink(dev, &link).unwrap();
            let e = read_text(&link, &SCENARIO_FILE).unwrap_err().to_string();
            assert!(e.contains(&format!("resolves to {dev}")), "{e}");
        }
        let fifo = dir.join("fifo.toml");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path and a plain mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_text(&fifo, &SCENARIO_FILE).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
    }
}
