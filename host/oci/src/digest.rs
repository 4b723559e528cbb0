//! Content digests (`sha256:<64 hex digits>`), the names of everything a
//! registry stores and of every file in the cache.

use anyhow::{Result, bail};
use sha2::{Digest as _, Sha256};
use std::fmt;

/// A SHA-256 content digest, parsed and checked.
///
/// # Examples
///
/// ```
/// use ragen_oci::{Digest, sha256_digest};
///
/// let d = sha256_digest(b"plugin bytes");
/// assert!(d.matches(b"plugin bytes"));
/// assert_eq!(Digest::parse(&d.to_string())?, d);
/// assert!(Digest::parse("sha512:00").is_err());
/// # Ok::<(), anyhow::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// `sha256:` and 64 lower-case hex digits; anything else (another
    /// algorithm, a short or upper-case digest) is refused, since the cache
    /// names files by it.
    pub fn parse(s: &str) -> Result<Self> {
        let Some(hex) = s.strip_prefix("sha256:") else {
            bail!("digest `{s}`: only sha256 digests are supported (sha256:<64 hex digits>)");
        };
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            bail!("digest `{s}`: expected sha256: and 64 lower-case hex digits");
        }
        Ok(Self { hex: hex.to_string() })
    }

    /// The 64 hex digits, without the algorithm.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Whether `bytes` hash to this digest.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        sha256_digest(bytes) == *self
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// The digest of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> Digest {
    let hex = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
    Digest { hex }
}
