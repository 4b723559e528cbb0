//! Registry credentials: from the environment, else from the Docker
//! config (and its credential helpers), else anonymous. They are never
//! printed: [`Credentials`]' `Debug` says only where they came from.

use anyhow::{Result, bail};
use docker_credential::{CredentialRetrievalError, DockerCredential};
use oci_client::secrets::RegistryAuth;
use std::fmt;

/// The user name for every registry, with [`PASSWORD_VAR`] (CI's way).
pub const USERNAME_VAR: &str = "RAGEN_REGISTRY_USERNAME";
/// The password or token that goes with [`USERNAME_VAR`].
pub const PASSWORD_VAR: &str = "RAGEN_REGISTRY_PASSWORD";

/// How to authenticate to one registry.
pub struct Credentials {
    pub(crate) auth: RegistryAuth,
    source: &'static str,
}

impl Credentials {
    /// The credentials for `registry` (`host[:port]`): the environment's
    /// pair when set, else the Docker config's entry (`docker login`),
    /// else none.
    pub fn for_registry(registry: &str) -> Result<Self> {
        let user = std::env::var(USERNAME_VAR).ok().filter(|v| !v.is_empty());
        let password = std::env::var(PASSWORD_VAR).ok().filter(|v| !v.is_empty());
        match (user, password) {
            (Some(u), Some(p)) => return Ok(Self { auth: RegistryAuth::Basic(u, p), source: "the environment" }),
            (Some(_), None) | (None, Some(_)) => {
                bail!("set both {USERNAME_VAR} and {PASSWORD_VAR}, or neither (then the Docker config or no credentials are used)")
            }
            (None, None) => {}
        }
        // Docker keys Docker Hub by this URL, every other registry by its host.
        let key = if registry == "docker.io" { "https://index.docker.io/v1/" } else { registry };
        match docker_credential::get_credential(key) {
            Ok(DockerCredential::UsernamePassword(u, p)) => Ok(Self { auth: RegistryAuth::Basic(u, p), source: "the Docker config" }),
            Ok(DockerCredential::IdentityToken(t)) => Ok(Self { auth: RegistryAuth::Bearer(t), source: "the Docker config" }),
            Err(CredentialRetrievalError::ConfigNotFound | CredentialRetrievalError::NoCredentialConfigured) => Ok(Self::anonymous()),
            // A config that does not mention this registry, or that cannot be
            // read: anonymous, as docker itself does, rather than failing a
            // pull that needs no credentials.
            Err(CredentialRetrievalError::ConfigReadError | CredentialRetrievalError::CredentialDecodingError) => Ok(Self::anonymous()),
            // A helper's output may hold secrets: name the helper only.
            Err(CredentialRetrievalError::HelperFailure { helper, .. }) => bail!(
                "the Docker config's credential helper `{helper}` failed for {registry}; \
                 run `docker login {registry}` again, or set {USERNAME_VAR} and {PASSWORD_VAR}"
            ),
            Err(e) => bail!(
                "cannot read the credentials for {registry} from the Docker config ({e}); \
                 fix its credential helper, or set {USERNAME_VAR} and {PASSWORD_VAR}"
            ),
        }
    }

    pub fn anonymous() -> Self {
        Self { auth: RegistryAuth::Anonymous, source: "none (anonymous)" }
    }

    /// Where the credentials came from, for messages: never the secret.
    pub fn source(&self) -> &'static str {
        self.source
    }

    pub fn is_anonymous(&self) -> bool {
        matches!(self.auth, RegistryAuth::Anonymous)
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials(from {})", self.source)
    }
}
