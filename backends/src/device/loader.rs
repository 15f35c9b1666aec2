//! Opening vendor libraries at run time: a search list, an override variable, and an error
//! that names every path tried with the loader's message.

use std::mem::ManuallyDrop;

use libloading::Library;

use super::world::EnvLookup;
use crate::error::{CommError, CommResult};

/// Where to look for one vendor library.
#[derive(Debug, Clone, Copy)]
pub struct LibrarySpec {
    /// Backend the library serves (`nccl`, `hccl`), for messages.
    pub backend: &'static str,
    /// Human name of the library (`NCCL`, `CUDA runtime`, ...), for messages.
    pub library: &'static str,
    /// Environment variable whose value (a full path) replaces the search list.
    pub env_var: &'static str,
    /// File names tried in order through the dynamic loader's search path.
    pub candidates: &'static [&'static str],
}

/// One or more opened libraries whose symbols are resolved in order (HCCL's functions may live
/// in `libhccl.so` or, on newer CANN, in `libhcomm.so`).
///
/// Libraries are never closed: vendor runtimes keep threads and device contexts that crash the
/// process at exit when their code is unmapped early, so the mapping stays until the process
/// ends (a later load of the same file only bumps the loader's reference count).
pub struct LibrarySet {
    backend: &'static str,
    libs: Vec<(String, ManuallyDrop<Library>)>,
}

impl std::fmt::Debug for LibrarySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibrarySet")
            .field("backend", &self.backend)
            .field("paths", &self.paths())
            .finish()
    }
}

/// `dlopen` one file with `RTLD_NOW | RTLD_GLOBAL` (vendor libraries often expect their
/// dependencies' symbols to be global).
fn open_one(path: &str) -> Result<Library, String> {
    #[cfg(unix)]
    let opened = unsafe {
        // SAFETY: opening a library runs its initialisers; the vendor libraries are trusted
        // system components chosen by the user through the search list or override variable.
        use libloading::os::unix::{Library as UnixLibrary, RTLD_GLOBAL, RTLD_NOW};
        UnixLibrary::open(Some(path), RTLD_NOW | RTLD_GLOBAL).map(Library::from)
    };
    #[cfg(not(unix))]
    let opened = unsafe {
        // SAFETY: as above.
        Library::new(path)
    };
    opened.map_err(|e| {
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            source = s.source();
        }
        msg
    })
}

impl LibrarySet {
    /// Open the first loadable file of `spec` (or exactly the file its variable names).
    pub fn open(spec: &LibrarySpec, lookup: EnvLookup<'_>) -> CommResult<LibrarySet> {
        LibrarySet::open_any(spec.backend, &[spec], lookup)
    }

    /// Open, for each spec in `specs`, its first loadable file; succeed if at least one spec
    /// gave a library (symbols are then resolved in `specs` order). The error lists every
    /// attempt of every spec.
    pub fn open_any(
        backend: &'static str,
        specs: &[&LibrarySpec],
        lookup: EnvLookup<'_>,
    ) -> CommResult<LibrarySet> {
        let mut libs = Vec::new();
        let mut attempts = Vec::new();
        for spec in specs {
            let forced = lookup(spec.env_var);
            let candidates: Vec<String> = match &forced {
                Some(path) => vec![path.clone()],
                None => spec.candidates.iter().map(|c| c.to_string()).collect(),
            };
            let before = libs.len();
            for path in candidates {
                match open_one(&path) {
                    Ok(lib) => {
                        libs.push((path, ManuallyDrop::new(lib)));
                        break;
                    }
                    Err(e) => attempts.push(format!("{path}: {e}")),
                }
            }
            // An explicit override that fails is an error even if another spec would load.
            if forced.is_some() && libs.len() == before {
                return Err(CommError::LibraryLoad {
                    backend: backend.to_string(),
                    library: spec.library.to_string(),
                    env_var: spec.env_var.to_string(),
                    attempts,
                });
            }
        }
        if libs.is_empty() {
            let first = specs.first();
            let env_vars: Vec<&str> = specs.iter().map(|s| s.env_var).collect();
            return Err(CommError::LibraryLoad {
                backend: backend.to_string(),
                library: first.map_or("vendor", |s| s.library).to_string(),
                env_var: env_vars.join(" or "),
                attempts,
            });
        }
        Ok(LibrarySet { backend, libs })
    }

    /// The paths that were opened, in resolution order.
    pub fn paths(&self) -> Vec<&str> {
        self.libs.iter().map(|(p, _)| p.as_str()).collect()
    }

    /// Resolve `name` as a function pointer of type `T`, if any library exports it.
    ///
    /// # Safety
    /// `T` must be the exact `extern "C"` function-pointer type of the symbol.
    pub unsafe fn optional<T: Copy>(&self, name: &str) -> Option<T> {
        self.libs.iter().find_map(|(_, lib)| {
            // SAFETY: the caller guarantees `T` matches the symbol's type.
            unsafe { lib.get::<T>(name).ok().map(|s| *s) }
        })
    }

    /// Resolve `name`, or fail naming the symbol, the libraries searched and the likely cause.
    ///
    /// # Safety
    /// As for [`LibrarySet::optional`].
    pub unsafe fn required<T: Copy>(&self, name: &str) -> CommResult<T> {
        // SAFETY: forwarded to the caller.
        unsafe { self.optional(name) }.ok_or_else(|| CommError::Unavailable {
            backend: self.backend.to_string(),
            reason: format!(
                "symbol {name} not found in {}; the library is too old or not the expected one",
                self.paths().join(", ")
            ),
        })
    }
}
