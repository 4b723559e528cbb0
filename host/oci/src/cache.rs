//! The content-addressed store of pulled plugins and manifests.
//!
//! Every file is named by the SHA-256 of its bytes (`blobs/sha256/<hex>`)
//! and checked against that name whenever it is read: a file changed on
//! disk is removed and fetched again, never used. So a reference pinned by
//! digest needs the registry only once, and a run is offline after that.

use crate::{Digest, sha256_digest};
use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The variable that names the cache directory.
pub const CACHE_DIR_VAR: &str = "RAGEN_OCI_CACHE";

/// A directory of blobs named by their digest.
///
/// # Examples
///
/// ```
/// use ragen_oci::{Cache, sha256_digest};
///
/// let dir = std::env::temp_dir().join(format!("ragen-oci-doc-{}", std::process::id()));
/// let cache = Cache::at(&dir);
/// let digest = sha256_digest(b"\0asm");
/// let path = cache.put(&digest, b"\0asm")?;
/// assert_eq!(cache.get(&digest)?.as_deref(), Some(path.as_path()));
/// std::fs::write(&path, b"tampered")?;
/// assert_eq!(cache.get(&digest)?, None, "a changed file is not used");
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), anyhow::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    /// A cache rooted at `root` (created on first write).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// `$RAGEN_OCI_CACHE`, else `$XDG_CACHE_HOME/ragen-rs/oci`, else
    /// `~/.cache/ragen-rs/oci`.
    pub fn from_env() -> Result<Self> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(dir) = var(CACHE_DIR_VAR) {
            return Ok(Self::at(PathBuf::from(dir)));
        }
        let base = var("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")));
        match base {
            Some(b) => Ok(Self::at(b.join("ragen-rs").join("oci"))),
            None => bail!("no home directory for the plugin cache: set {CACHE_DIR_VAR} to a directory"),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the blob `digest` lives (whether or not it is there).
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs").join("sha256").join(digest.hex())
    }

    /// The blob's path when it is cached with the right bytes. A file
    /// whose bytes no longer hash to its name is removed.
    pub fn get(&self, digest: &Digest) -> Result<Option<PathBuf>> {
        Ok(self.read(digest)?.map(|_| self.path(digest)))
    }

    /// The blob's bytes when cached and intact (as [`get`](Self::get)).
    pub fn read(&self, digest: &Digest) -> Result<Option<Vec<u8>>> {
        let path = self.path(digest);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read the cached blob {}", path.display())),
        };
        if digest.matches(&bytes) {
            return Ok(Some(bytes));
        }
        std::fs::remove_file(&path).with_context(|| format!("cannot remove the damaged cached blob {}", path.display()))?;
        Ok(None)
    }

    /// Store `bytes` as `digest`, refusing bytes that do not hash to it.
    /// Written to a temporary file and renamed, so a reader never sees
    /// half a blob and a full disk loses nothing already cached.
    pub fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<PathBuf> {
        let actual = sha256_digest(bytes);
        if actual != *digest {
            bail!("content does not match its digest: expected {digest}, got {actual}; it was changed on the way or in the registry");
        }
        let path = self.path(digest);
        let dir = path.parent().expect("blobs/sha256 is a parent");
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create the plugin cache {}", dir.display()))?;
        let tmp = dir.join(format!(".{}.{}.tmp", digest.hex(), std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("cannot write {} into the plugin cache {}", digest, self.root.display()));
        }
        Ok(path)
    }
}
