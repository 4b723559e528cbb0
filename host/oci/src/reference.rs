//! Plugin references: `oci://registry[:port]/namespace/name:tag`, or
//! `…@sha256:…` to pin one exact plugin.

use crate::Digest;
use anyhow::{Result, anyhow, bail};
use oci_client::Reference;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// What marks a `--env` value as a registry reference rather than a file.
pub const SCHEME: &str = "oci://";

/// A plugin in a registry.
///
/// The registry must be named: a bare `namespace/name` would, by Docker's
/// convention, silently mean Docker Hub, and a plugin pushed or pulled
/// somewhere its user did not say is a surprise we can avoid.
///
/// # Examples
///
/// ```
/// use ragen_oci::PluginRef;
///
/// let r = PluginRef::parse("oci://127.0.0.1:5000/ragen/sokoban:0.2")?;
/// assert_eq!(r.registry(), "127.0.0.1:5000");
/// assert_eq!(r.repository(), "ragen/sokoban");
/// assert_eq!(r.tag(), Some("0.2"));
/// assert!(r.is_loopback());
/// assert!(PluginRef::parse("ragen/sokoban:0.2").is_err());
/// # Ok::<(), anyhow::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginRef(Reference);

impl PluginRef {
    /// Parse a reference, with or without the `oci://` prefix.
    pub fn parse(s: &str) -> Result<Self> {
        let body = s.strip_prefix(SCHEME).unwrap_or(s);
        let first = body.split('/').next().unwrap_or_default();
        let names_registry = body.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
        if !names_registry {
            bail!(
                "`{s}` names no registry: write registry[:port]/namespace/name:tag, \
                 e.g. oci://ghcr.io/you/sokoban:0.2 or oci://127.0.0.1:5000/ragen/sokoban:0.2"
            );
        }
        let reference = Reference::from_str(body).map_err(|e| {
            anyhow!("`{s}` is not an OCI reference ({e}); write registry[:port]/namespace/name:tag or …@sha256:<64 hex digits>")
        })?;
        if let Some(d) = reference.digest() {
            Digest::parse(d)?;
        }
        Ok(Self(reference))
    }

    /// `host[:port]` as written.
    pub fn registry(&self) -> &str {
        self.0.registry()
    }

    /// `namespace/name`.
    pub fn repository(&self) -> &str {
        self.0.repository()
    }

    pub fn tag(&self) -> Option<&str> {
        self.0.tag()
    }

    /// The pinned digest, when the reference has one.
    pub fn digest(&self) -> Option<Digest> {
        self.0.digest().map(|d| Digest::parse(d).expect("checked when parsed"))
    }

    /// The same plugin pinned to `digest` (the tag is kept for the reader;
    /// the digest decides).
    pub fn pinned(&self, digest: &Digest) -> Self {
        let (registry, repository) = (self.registry().to_string(), self.repository().to_string());
        Self(match self.tag() {
            Some(tag) => Reference::with_tag_and_digest(registry, repository, tag.to_string(), digest.to_string()),
            None => Reference::with_digest(registry, repository, digest.to_string()),
        })
    }

    /// The last part of the repository: a file name for `pull`.
    pub fn name(&self) -> &str {
        self.repository().rsplit('/').next().unwrap_or("plugin")
    }

    /// Whether the registry is on this machine: the only place plain HTTP
    /// is allowed.
    pub fn is_loopback(&self) -> bool {
        // (An IPv6 literal, `[::1]`, is not a valid reference host.)
        let host = self.registry().split(':').next().unwrap_or_default();
        host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    pub(crate) fn inner(&self) -> &Reference {
        &self.0
    }
}

/// The reference with its `oci://` prefix, as `--env` takes it.
impl fmt::Display for PluginRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}", self.0.whole())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parses_tags_digests_and_ports() {
        let r = PluginRef::parse(&format!("oci://localhost:5000/a/b/sokoban:1.0@{D}")).unwrap();
        assert_eq!((r.registry(), r.repository(), r.tag(), r.name()), ("localhost:5000", "a/b/sokoban", Some("1.0"), "sokoban"));
        assert_eq!(r.digest().unwrap().to_string(), D);
        assert_eq!(r.to_string(), format!("oci://localhost:5000/a/b/sokoban:1.0@{D}"));
        let bare = PluginRef::parse("ghcr.io/you/sokoban").unwrap();
        assert_eq!(bare.digest(), None);
        assert_eq!(bare.pinned(&Digest::parse(D).unwrap()).digest().unwrap().to_string(), D);
    }

    #[test]
    fn loopback_is_only_this_machine() {
        for (r, local) in [
            ("localhost:5000/x/y", true),
            ("127.0.0.1:5000/x/y", true),
            ("127.8.0.1/x/y", true),
            ("10.0.0.1:5000/x/y", false),
            ("ghcr.io/x/y", false),
            ("localhost.example.com/x/y", false),
        ] {
            assert_eq!(PluginRef::parse(r).unwrap().is_loopback(), local, "{r}");
        }
    }

    #[test]
    fn refuses_what_names_no_registry_or_a_bad_digest() {
        for bad in ["sokoban", "ragen/sokoban:1", "oci://", "localhost:5000/x/Y:!", "localhost:5000/x/y@sha256:abc"] {
            let e = PluginRef::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad.strip_prefix(SCHEME).unwrap_or(bad)) || e.contains("digest"), "{bad}: {e}");
        }
    }
}
