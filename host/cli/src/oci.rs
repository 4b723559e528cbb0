//! Where envs come from ([`PluginSource`]: a file, `--env oci://…` on every
//! command that takes a plugin, or a server's `ws://…`), and the registry
//! the `push` and `pull` commands talk to.

use crate::output::errln;
use anyhow::{Context, Result, bail};
use ragen_oci::{PluginRef, PublicKey, Pulled, Registry, RegistryOptions, Trust};
use ragen_remote::RemoteAddress;
use ragen_runtime::{EnvProvider, LocalPlugin, Plugin, SandboxLimits};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

/// Where an env comes from: a plugin's `.wasm` file, a plugin in a
/// registry (`oci://registry/…`), or servers (`ws://host:port`, see
/// ragen-remote).
#[derive(Clone, Debug)]
pub enum PluginSource {
    File(PathBuf),
    Oci(PluginRef),
    Remote(RemoteAddress),
}

impl FromStr for PluginSource {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        if s.starts_with(ragen_oci::SCHEME) {
            return Ok(Self::Oci(PluginRef::parse(s)?));
        }
        if ragen_remote::is_remote(s) {
            return Ok(Self::Remote(s.parse()?));
        }
        Ok(Self::File(PathBuf::from(s)))
    }
}

impl fmt::Display for PluginSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Oci(r) => write!(f, "{r}"),
            Self::Remote(a) => write!(f, "{a}"),
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
    pub fn fetch(&self, access: &crate::oci::Access) -> Result<Fetched> {
        match self {
            Self::File(path) if access.trust.is_required() => bail!(
                "`{}` is a file, and the trust policy asks for signed plugins: only oci:// references carry signatures \
                 (push it with `ragen-host push --sign KEY`), or drop --verify/--trust-policy to run a local file",
                path.display()
            ),
            Self::File(path) => Ok(Fetched { path: path.clone(), pulled: None }),
            Self::Oci(reference) => {
                let pulled = registry(access)?.pull(reference)?;
                announce(&pulled);
                Ok(Fetched { path: pulled.path.clone(), pulled: Some(pulled) })
            }
            Self::Remote(address) => bail!(
                "`{address}` is a server, and this command needs the plugin itself: give its .wasm file or oci:// reference \
                 (inspect, play, eval and train take a server's ws:// address)"
            ),
        }
    }

    /// The envs this source runs: a plugin (fetched as [`fetch`](Self::fetch)
    /// does) in this process under `limits`, or a server's.
    pub fn provider(&self, access: &crate::oci::Access, limits: SandboxLimits) -> Result<Arc<dyn EnvProvider>> {
        match self {
            Self::Remote(address) => ragen_remote::Remote::connect(address),
            _ => Ok(LocalPlugin::provider(Plugin::from_file_with(self.local(access)?, limits)?)),
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
    pub fn local(&self, access: &crate::oci::Access) -> Result<PathBuf> {
        Ok(self.fetch(access)?.path)
    }
}

/// One line on stderr (stdout may be a `--json` report) saying which
/// plugin a reference turned out to be.
pub fn announce(p: &Pulled) {
    let whence = if p.from_cache { "from the cache" } else { "pulled" };
    let signed = p.signed_by.as_ref().map(|s| format!(", signed by {s}")).unwrap_or_default();
    errln!("{} ({whence}, {} KiB{signed})", p.reference, p.size.div_ceil(1024));
}

pub fn registry(access: &Access) -> Result<Registry> {
    Registry::new(RegistryOptions { plain_http: access.plain_http, trust: access.trust.clone(), ..RegistryOptions::default() })
}

/// How commands reach registries: the global `--plain-http`, `--verify`
/// and `--trust-policy` flags.
#[derive(Clone, Debug, Default)]
pub struct Access {
    pub plain_http: bool,
    /// Which plugins must be signed, by whom.
    pub trust: Trust,
}

/// The environment variable naming a trust policy file, for every command.
pub const TRUST_POLICY_VAR: &str = "RAGEN_TRUST_POLICY";

/// The global registry flags, shared by every command.
#[derive(clap::Args, Debug)]
pub struct AccessArgs {
    /// Reach an `oci://` registry on this machine (localhost or
    /// 127.0.0.0/8) over plain HTTP instead of HTTPS, e.g. a test registry
    /// started with `docker-registry serve`. Refused for any other host.
    #[arg(long, global = true)]
    plain_http: bool,
    /// Refuse an `oci://` plugin unless this public key (a cosign
    /// NAME.pub) signed it; give it more than once to accept any of
    /// several keys. Runs record who signed the plugin.
    #[arg(long = "verify", global = true, value_name = "KEY")]
    verify: Vec<PathBuf>,
    /// A trust policy (TOML): which keys must have signed plugins from
    /// which registries and namespaces, and whether plugins from anywhere
    /// else are refused (docs/plugins.md, "Signed plugins"). Default:
    /// $RAGEN_TRUST_POLICY when set.
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "verify")]
    trust_policy: Option<PathBuf>,
}

impl AccessArgs {
    pub fn access(&self) -> Result<Access> {
        let from_env = std::env::var_os(TRUST_POLICY_VAR).filter(|v| !v.is_empty() && self.verify.is_empty()).map(PathBuf::from);
        let trust = match self.trust_policy.as_ref().or(from_env.as_ref()) {
            Some(path) => Trust::from_file(path)?,
            None => Trust::keys(self.verify.iter().map(|k| PublicKey::from_file(k)).collect::<Result<_>>()?),
        };
        Ok(Access { plain_http: self.plain_http, trust })
    }
}
