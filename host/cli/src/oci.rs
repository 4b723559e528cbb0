//! Plugins in OCI registries: `push`, `pull`, and `--env oci://…` on every
//! command that takes a plugin.

use anyhow::{Context, Result, bail};
use ragen_oci::{PluginRef, Pulled, Registry, RegistryOptions};
use ragen_runtime::Plugin;
use std::fmt;
use std::path::{Path, PathBuf};
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
fn announce(p: &Pulled) {
    let whence = if p.from_cache { "from the cache" } else { "pulled" };
    eprintln!("{} ({whence}, {} KiB)", p.reference, p.size.div_ceil(1024));
}

pub fn registry(plain_http: bool) -> Result<Registry> {
    Registry::new(RegistryOptions { plain_http, ..RegistryOptions::default() })
}

/// `ragen-host push`'s options.
pub struct PushOptions {
    pub file: PathBuf,
    pub reference: PluginRef,
    pub force: bool,
    pub plain_http: bool,
    pub validate: crate::validate::Options,
}

/// Validate the plugin (unless forced), then push it with its own
/// name, version, description and contract version as annotations.
pub fn push(opts: PushOptions) -> Result<()> {
    let wasm = std::fs::read(&opts.file).with_context(|| format!("cannot read plugin `{}`", opts.file.display()))?;
    let plugin = Plugin::from_bytes(&wasm, &opts.file.display().to_string(), opts.validate.limits.clone())?;
    let (info, _) = plugin.describe(&opts.validate.settings)?;
    if opts.force {
        eprintln!("--force: pushing without validating");
    } else {
        let report = crate::validate::run_with_spinner(&opts.file, &opts.validate);
        if !report.passed() {
            eprint!("{}", crate::term::escape(&crate::validate::to_text(&report)));
            bail!(
                "refusing to push `{}`: it fails validation (above). Fix the plugin, or push it anyway with --force",
                opts.file.display()
            );
        }
        eprintln!("validate: every check passed");
    }
    let contract = format!("{}@{}", ragen_runtime::CONTRACT_PACKAGE, plugin.contract_version());
    let annotations = ragen_oci::annotations(&info.name, &info.version, &info.description, &contract);
    let pushed = registry(opts.plain_http)?.push(&opts.reference, &wasm, annotations)?;
    println!("{}", pushed.reference);
    eprintln!(
        "pushed {} {} ({} KiB, wasm {}); run it pinned with: ragen-host eval --env {}",
        crate::term::escape(&info.name),
        crate::term::escape(&info.version),
        pushed.size.div_ceil(1024),
        pushed.wasm_digest,
        pushed.reference
    );
    Ok(())
}

/// `ragen-host pull`: the plugin, checked against its digest, copied to
/// `out` (default: `NAME.wasm` here).
pub fn pull(reference: &PluginRef, out: Option<&Path>, plain_http: bool) -> Result<()> {
    let pulled = registry(plain_http)?.pull(reference)?;
    announce(&pulled);
    let out = out.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(format!("{}.wasm", reference.name())));
    std::fs::copy(&pulled.path, &out).with_context(|| format!("cannot write `{}`", out.display()))?;
    println!("{}", pulled.reference);
    let annotation = |key: &str| pulled.annotations.get(key).map(|v| crate::term::escape(v));
    let what = match (annotation("org.opencontainers.image.title"), annotation("org.opencontainers.image.version")) {
        (Some(title), Some(version)) => format!("{title} {version}"),
        (Some(title), None) => title.into_owned(),
        _ => "the plugin".to_string(),
    };
    eprintln!("wrote {what} to {} (wasm {})", out.display(), pulled.wasm_digest);
    Ok(())
}
