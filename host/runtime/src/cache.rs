//! The compiled-plugin cache: wasmtime's own, so that a plugin is compiled
//! once per machine rather than once per process.
//!
//! A Python or JavaScript plugin carries a whole language runtime, and
//! compiling it takes seconds every time a process loads it. wasmtime's
//! cache keeps the compiled code on disk, keyed by a SHA-256 of the component's bytes, the wasmtime version and
//! every engine setting that affects code generation, so a changed plugin,
//! a new wasmtime or other settings simply miss.
//!
//! **Trust.** The cache holds only this host's own compiler output, written
//! by wasmtime into the user's cache directory; nothing downloaded goes
//! there. Loading from it skips compilation and validation, so its files
//! are as trusted as the `ragen-host` binary itself: whoever can write that
//! directory can run code as the user, exactly as with wasmtime's CLI
//! cache. Never point it at a directory others can write, and never copy
//! files into it from elsewhere (`Component::deserialize` is unsafe on any
//! bytes this host did not write).

use anyhow::Result;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use wasmtime::{Cache, CacheConfig};

/// Where compiled plugins are kept between processes, or nowhere.
///
/// # Examples
///
/// ```
/// use ragen_runtime::{CompileCache, Plugin, SandboxLimits};
///
/// # let path = ragen_test_fixtures::plugin("bandit"); // `make plugins`
/// let dir = std::env::temp_dir().join(format!("ragen-cache-doc-{}", std::process::id()));
/// let cache = CompileCache::Dir(dir.clone());
/// let bytes = std::fs::read(&path)?;
/// let first = Plugin::from_bytes_cached(&bytes, "bandit", SandboxLimits::default(), &cache)?;
/// let second = Plugin::from_bytes_cached(&bytes, "bandit", SandboxLimits::default(), &cache)?;
/// assert_eq!((first.from_cache(), second.from_cache()), (false, true));
/// # // Best effort: wasmtime's cache worker may still be writing its stats.
/// # let _ = std::fs::remove_dir_all(dir);
/// # Ok::<(), anyhow::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileCache {
    /// Compile every time.
    Off,
    /// Keep compiled code in this directory (created when needed).
    Dir(PathBuf),
}

/// The variable that names the cache directory.
pub const CACHE_DIR_VAR: &str = "RAGEN_CACHE_DIR";
/// The variable that turns the cache off (any value but empty or `0`).
pub const NO_CACHE_VAR: &str = "RAGEN_NO_CACHE";

static PROCESS_DEFAULT: OnceLock<CompileCache> = OnceLock::new();

impl CompileCache {
    /// What the environment asks for: off when `RAGEN_NO_CACHE` is set,
    /// else `$RAGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/ragen-rs/compiled`,
    /// else `~/.cache/ragen-rs/compiled`; off when there is no home.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if var(NO_CACHE_VAR).is_some_and(|v| v != "0") {
            return Self::Off;
        }
        if let Some(dir) = var(CACHE_DIR_VAR) {
            return Self::Dir(dir.into());
        }
        let base = var("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")));
        base.map_or(Self::Off, |b| Self::Dir(b.join("ragen-rs").join("compiled")))
    }

    /// The cache plugins of this process use unless told otherwise: the
    /// one [`set_process_default`](Self::set_process_default) chose, else
    /// [`from_env`](Self::from_env).
    pub fn process_default() -> &'static Self {
        PROCESS_DEFAULT.get_or_init(Self::from_env)
    }

    /// Choose the process's cache (a command-line flag's job), before any
    /// plugin is loaded. Returns false when it was already chosen.
    pub fn set_process_default(cache: Self) -> bool {
        PROCESS_DEFAULT.set(cache).is_ok()
    }

    /// wasmtime's cache for this directory: one per directory and process
    /// (each runs a background worker that trims the directory). `None`
    /// when off, or when the directory cannot be used: a cache that fails
    /// costs compile time, never a load.
    pub(crate) fn wasmtime(&self) -> Option<Cache> {
        let Self::Dir(dir) = self else { return None };
        static CACHES: OnceLock<Mutex<HashMap<PathBuf, Option<Cache>>>> = OnceLock::new();
        let mut caches = CACHES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        caches
            .entry(dir.clone())
            .or_insert_with(|| match open(dir) {
                Ok(cache) => Some(cache),
                Err(e) => {
                    tracing::warn!(
                        "compiling plugins without a cache: cannot use `{}` ({e:#}); set {CACHE_DIR_VAR} to a \
                         writable directory, or {NO_CACHE_VAR}=1 to silence this",
                        dir.display()
                    );
                    None
                }
            })
            .clone()
    }
}

fn open(dir: &Path) -> Result<Cache> {
    std::fs::create_dir_all(dir)?;
    let mut config = CacheConfig::new();
    config.with_directory(dir);
    Ok(Cache::new(config)?)
}
