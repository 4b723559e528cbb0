//! Which contract versions this host accepts, and the checks that decide it
//! before any plugin code runs.

use anyhow::{Result, bail};

/// The WIT package plugins implement.
pub const CONTRACT_PACKAGE: &str = "ragen:env";
/// The version of `wit/env.wit` this host was built against.
pub const CONTRACT_VERSION: ContractVersion = ContractVersion { major: 0, minor: 2, patch: 0 };

const ENVIRONMENT_INTERFACE: &str = "ragen:env/environment";
/// The optional interface of batched calls.
pub(crate) const BATCH_INTERFACE: &str = "ragen:env/batch";
/// The optional interface of the env's own best play.
pub(crate) const ORACLE_INTERFACE: &str = "ragen:env/oracle";

/// A semver version of the contract package.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContractVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl std::fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl ContractVersion {
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.split('.').map(|p| p.parse::<u64>().ok());
        let v = Self { major: parts.next()??, minor: parts.next()??, patch: parts.next()?? };
        parts.next().is_none().then_some(v)
    }

    /// Semver compatibility as Cargo reads it: same major, and below 1.0 the
    /// minor version is the breaking one.
    pub fn is_compatible_with(&self, host: &ContractVersion) -> bool {
        if self.major != host.major {
            return false;
        }
        self.major != 0 || self.minor == host.minor
    }
}

/// What kind of WebAssembly binary `bytes` is, judged by its 8-byte header.
/// wasmtime would reject a core module too, but with a message about
/// component layers; a plugin author needs to hear "this is not a component".
pub(crate) fn check_is_component(bytes: &[u8]) -> Result<()> {
    const MAGIC: &[u8] = b"\0asm";
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        bail!("not a WebAssembly file (no `\\0asm` header); a plugin is a .wasm component built for wasm32-wasip2");
    }
    match &bytes[4..8] {
        // Component binaries: version 0x0d, layer 1.
        [0x0d, 0x00, 0x01, 0x00] => Ok(()),
        [0x01, 0x00, 0x00, 0x00] => bail!(
            "this is a core WebAssembly module, not a component; build the plugin for the \
             wasm32-wasip2 target (`cargo build --target wasm32-wasip2`), or wrap a core module \
             with `wasm-tools component new`"
        ),
        other => bail!("unknown WebAssembly binary version {other:02x?}; expected a component (0d 00 01 00)"),
    }
}

/// Find the environment interface among a component's export names and
/// check its version against ours.
pub(crate) fn check_exports<'a>(exports: impl IntoIterator<Item = &'a str>) -> Result<ContractVersion> {
    let names: Vec<&str> = exports.into_iter().collect();
    let Some(name) = names.iter().find(|n| n.split('@').next() == Some(ENVIRONMENT_INTERFACE)) else {
        bail!(
            "the component does not export `{ENVIRONMENT_INTERFACE}`, so it is not a ragen-rs environment plugin \
             (it exports: {}); implement wit/env.wit, e.g. with ragen-env-sdk's `export_env!`",
            if names.is_empty() { "nothing".to_string() } else { names.join(", ") }
        );
    };
    let version = name
        .split_once('@')
        .and_then(|(_, v)| ContractVersion::parse(v))
        .ok_or_else(|| anyhow::anyhow!("the plugin exports `{name}` without a version; rebuild it from a versioned wit/env.wit"))?;
    if !version.is_compatible_with(&CONTRACT_VERSION) {
        bail!(
            "the plugin was built against {CONTRACT_PACKAGE}@{version}, but this host speaks {CONTRACT_PACKAGE}@{CONTRACT_VERSION} \
             (compatible: {}); rebuild the plugin against wit/env.wit from this ragen-rs release{}",
            compatible_range(),
            if version.major == 0 && version.minor == 1 { MIGRATE_FROM_0_1 } else { "" }
        );
    }
    Ok(version)
}

/// What a 0.1 plugin's author changes; wit/README.md has the details.
const MIGRATE_FROM_0_1: &str = ". From 0.1: `step` takes an `action` (an id or text) and `env-spec.actions` became \
     `action-space`; with ragen-env-sdk, update the crate, add `type Action = u32;` to the `Environment` impl and write \
     `action_space: ActionSpace::Names(...)` (see \"From 0.1 to 0.2\" in wit/README.md)";

/// Whether the exports include the optional batched calls at a version
/// compatible with ours.
pub(crate) fn exports_batch<'a>(exports: impl IntoIterator<Item = &'a str>) -> bool {
    exports_optional(exports, BATCH_INTERFACE)
}

/// Whether the exports include the optional oracle at a version compatible
/// with ours.
pub(crate) fn exports_oracle<'a>(exports: impl IntoIterator<Item = &'a str>) -> bool {
    exports_optional(exports, ORACLE_INTERFACE)
}

fn exports_optional<'a>(exports: impl IntoIterator<Item = &'a str>, interface: &str) -> bool {
    exports.into_iter().any(|n| {
        n.split_once('@').is_some_and(|(iface, v)| {
            iface == interface && ContractVersion::parse(v).is_some_and(|v| v.is_compatible_with(&CONTRACT_VERSION))
        })
    })
}

fn compatible_range() -> String {
    let v = CONTRACT_VERSION;
    if v.major == 0 { format!("0.{}.x", v.minor) } else { format!("{}.x", v.major) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compatible_like_cargo() {
        let host = ContractVersion { major: 0, minor: 2, patch: 0 };
        assert!(ContractVersion::parse("0.2.7").unwrap().is_compatible_with(&host));
        assert!(!ContractVersion::parse("0.1.0").unwrap().is_compatible_with(&host));
        assert!(!ContractVersion::parse("0.3.0").unwrap().is_compatible_with(&host));
        assert!(!ContractVersion::parse("1.1.0").unwrap().is_compatible_with(&host));
        let one = ContractVersion { major: 1, minor: 0, patch: 0 };
        assert!(ContractVersion::parse("1.4.2").unwrap().is_compatible_with(&one));
        assert_eq!(ContractVersion::parse("1.2"), None);
        assert_eq!(ContractVersion::parse("1.2.x"), None);
    }

    #[test]
    fn export_check_names_the_problem() {
        assert_eq!(check_exports(["ragen:env/environment@0.2.3"]).unwrap().patch, 3);
        let old = check_exports(["ragen:env/environment@0.1.0"]).unwrap_err().to_string();
        assert!(old.contains("built against ragen:env@0.1.0") && old.contains("type Action = u32"), "{old}");
        assert!(exports_batch(["ragen:env/environment@0.2.0", "ragen:env/batch@0.2.1"]));
        assert!(!exports_batch(["ragen:env/environment@0.2.0", "ragen:env/batch@0.1.0"]));
        assert!(!exports_batch(["ragen:env/environment@0.2.0"]));
        assert!(exports_oracle(["ragen:env/environment@0.2.0", "ragen:env/oracle@0.2.0"]));
        assert!(!exports_oracle(["ragen:env/environment@0.2.0", "ragen:env/batch@0.2.0"]));
        let other = check_exports(["ragen:env/environment@2.0.0"]).unwrap_err().to_string();
        assert!(other.contains("built against ragen:env@2.0.0") && other.contains("rebuild"), "{other}");
        let none = check_exports(["wasi:cli/run@0.2.0"]).unwrap_err().to_string();
        assert!(none.contains("not a ragen-rs environment plugin") && none.contains("wasi:cli/run"), "{none}");
    }

    #[test]
    fn header_check_tells_modules_from_components() {
        assert!(check_is_component(b"\0asm\x0d\x00\x01\x00rest").is_ok());
        let core = check_is_component(b"\0asm\x01\x00\x00\x00").unwrap_err().to_string();
        assert!(core.contains("core WebAssembly module, not a component"), "{core}");
        let text = check_is_component(b"hello world").unwrap_err().to_string();
        assert!(text.contains("not a WebAssembly file"), "{text}");
    }
}
