//! Plugins in OCI registries: `--env oci://…` on every command that takes a
//! plugin ([`PluginSource`]), and the registry the `push` and `pull`
//! commands talk to.

use crate::output::errln;
use anyhow::{Context, Result};
use ragen_oci::{PluginRef, Pulled, Registry, RegistryOptions};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Where a plugin comes from: a `.wasm` file, or `oci://registry/…`.
#[derive(Clone, Debug)]
pub enum PluginSource {
    File(PathBuf),
    Oci(PluginRef),
}

impl FromStr for PluginSource {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        if s.starts_with(ragen_oci::SCHEME) {
            return Ok(Self::Oci(PluginRef::parse(s)?));
        }
        Ok(Self::File(PathBuf::from(s)))
    }
}

impl fmt::Display for PluginSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Oci(r) => write!(f, "{r}"),
        }
    }
}

/// A plugin on disk, and what was pulled to get it there.
pub struct Fetched {
    pub path: PathBuf,
    pub pulled: Option<Pulled>,
}

impl PluginSource {
    /// The plugin as a local file: a file as it is, a reference pulled into
    /// the cache (or found there, when pinned by digest).
    pub fn fetch(&self, plain_http: bool) -> Result<Fetched> {
        match self {
            Self::File(path) => Ok(Fetched { path: path.clone(), pulled: None }),
            Self::Oci(reference) => {
                let pulled = registry(plain_http)?.pull(reference)?;
                announce(&pulled);
                Ok(Fetched { path: pulled.path.clone(), pulled: Some(pulled) })
            }
        }
    }

    /// What a training run's `[plugin] source` says, as it said it (a tag
    /// stays a tag).
    pub fn recorded(record: &ragen_learner::PluginRecord) -> Result<Self> {
        let source = record.source.as_deref().context("the run's config.toml names no plugin ([plugin] source): pass --env")?;
        source.parse()
    }

    /// The plugin a training run recorded in its `[plugin]`: its registry
    /// reference pinned by the digest it trained on, or its file.
    pub fn of_run(record: &ragen_learner::PluginRecord) -> Result<Self> {
        Ok(match (Self::recorded(record)?, &record.digest) {
            (Self::Oci(r), Some(d)) => Self::Oci(r.pinned(&ragen_oci::Digest::parse(d).context("the run's [plugin] digest")?)),
            (other, _) => other,
        })
    }

    /// [`fetch`](Self::fetch), when only the path is needed.
    pub fn local(&self, plain_http: bool) -> Result<PathBuf> {
        Ok(self.fetch(plain_http)?.path)
    }
}

/// One line on stderr (stdout may be a `--json` report) saying which
/// plugin a reference turned out to be.
pub fn announce(p: &Pulled) {
    let whence = if p.from_cache { "from the cache" } else { "pulled" };
    errln!("{} ({whence}, {} KiB)", p.reference, p.size.div_ceil(1024));
}

pub fn registry(plain_http: bool) -> Result<Registry> {
    Registry::new(RegistryOptions { plain_http, ..RegistryOptions::default() })
}
