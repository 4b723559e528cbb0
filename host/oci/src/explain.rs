//! Registry errors a person can act on: what went wrong, with which
//! registry, and what to do, instead of a status line from the protocol.

use crate::{Credentials, PASSWORD_VAR, PluginRef, RegistryOptions, USERNAME_VAR};
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use std::error::Error;

/// What a registry call was doing.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Pull,
    Push,
}

/// What went wrong, as far as the user's next step is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// No connection: the registry is down or the address is wrong.
    Unreachable,
    /// Connected, but no answer in time.
    Timeout,
    /// No such repository, tag or digest.
    NotFound,
    /// The registry wants (other) credentials.
    Unauthorized,
    /// Bytes that do not hash to the digest they were fetched by.
    Tampered {
        expected: String,
        actual: String,
    },
    Other,
}

impl Kind {
    /// The kind of `e`, looking through its chain of causes.
    pub(crate) fn of(e: &(dyn Error + 'static)) -> Kind {
        let mut cause: Option<&(dyn Error + 'static)> = Some(e);
        while let Some(c) = cause {
            if let Some(kind) = Self::one(c) {
                return kind;
            }
            cause = c.source();
        }
        Kind::Other
    }

    fn one(e: &(dyn Error + 'static)) -> Option<Kind> {
        if let Some(DigestError::VerificationError { expected, actual }) = e.downcast_ref::<DigestError>() {
            return Some(Kind::Tampered { expected: expected.clone(), actual: actual.clone() });
        }
        if let Some(r) = e.downcast_ref::<reqwest::Error>() {
            return Self::request(r);
        }
        match e.downcast_ref::<OciDistributionError>()? {
            // Transparent: its `source()` skips the reqwest error itself.
            OciDistributionError::RequestError(r) => Self::request(r),
            OciDistributionError::DigestError(DigestError::VerificationError { expected, actual }) => {
                Some(Kind::Tampered { expected: expected.clone(), actual: actual.clone() })
            }
            OciDistributionError::ImageManifestNotFoundError(_) => Some(Kind::NotFound),
            OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_) => Some(Kind::Unauthorized),
            OciDistributionError::ServerError { code: 401 | 403, .. } => Some(Kind::Unauthorized),
            OciDistributionError::ServerError { code: 404, .. } => Some(Kind::NotFound),
            OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().find_map(|o| match o.code {
                OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::NotFound | OciErrorCode::BlobUnknown => {
                    Some(Kind::NotFound)
                }
                OciErrorCode::Unauthorized | OciErrorCode::Denied => Some(Kind::Unauthorized),
                _ => None,
            }),
            _ => None,
        }
    }

    fn request(r: &reqwest::Error) -> Option<Kind> {
        if r.is_timeout() {
            return Some(Kind::Timeout);
        }
        if r.is_connect() {
            return Some(Kind::Unreachable);
        }
        match r.status().map(|s| s.as_u16()) {
            Some(401 | 403) => Some(Kind::Unauthorized),
            Some(404) => Some(Kind::NotFound),
            _ => None,
        }
    }
}

/// `e` (from a call about `reference`) as an error that says what to do.
pub(crate) fn explain(e: anyhow::Error, reference: &PluginRef, op: Op, opts: &RegistryOptions, creds: &Credentials) -> anyhow::Error {
    let registry = reference.registry();
    let verb = match op {
        Op::Pull => "pull",
        Op::Push => "push",
    };
    let kind = Kind::of(e.as_ref());
    let message = match kind {
        Kind::Unreachable => {
            let tls = if reference.is_loopback() && !opts.plain_http {
                " (a registry on this machine without TLS needs --plain-http)"
            } else {
                ""
            };
            format!("cannot reach the registry {registry} ({}): is it running, and is the address right?{tls}", root_cause(e.as_ref()))
        }
        Kind::Timeout => format!(
            "the registry {registry} did not answer within {} s (connect) / {} s (read): is it up, and reachable from here?",
            opts.connect_timeout.as_secs_f64(),
            opts.read_timeout.as_secs_f64()
        ),
        Kind::NotFound => format!("{reference} is not in the registry: no such repository, tag or digest"),
        Kind::Unauthorized => format!(
            "the registry {registry} refused to let us {verb} {reference} (credentials: {}); \
             log in with `docker login {registry}`, or set {USERNAME_VAR} and {PASSWORD_VAR}",
            creds.source()
        ),
        Kind::Tampered { expected, actual } => format!(
            "refusing {reference}: the registry sent content whose digest is {actual}, not the {expected} it was asked for; \
             it was changed in the registry or on the way, so it is not the plugin that was pushed"
        ),
        Kind::Other => return e.context(format!("cannot {verb} {reference}")),
    };
    anyhow::anyhow!(message)
}

/// The innermost cause's message ("Connection refused (os error 111)").
fn root_cause(e: &(dyn Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}
