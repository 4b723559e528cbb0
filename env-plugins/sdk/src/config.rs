//! Key/value configuration, checked against the keys a plugin declares.

use crate::types::{ConfigKey, EnvError, ErrorKind};
use std::fmt::Display;
use std::str::FromStr;

/// The settings of one env: every declared key, given or defaulted.
///
/// Built by the SDK before `Environment::new` runs, so an unknown key is
/// rejected in one place for every plugin, with the list of keys that exist.
#[derive(Clone, Debug)]
pub struct Config {
    /// (key, value, given by the user?) for every declared key, in
    /// declaration order.
    entries: Vec<(String, String, bool)>,
}

impl Config {
    /// Resolve `given` against `declared`. Errors on an unknown key or a key
    /// given twice, naming it.
    pub fn resolve(declared: &[ConfigKey], given: &[(String, String)]) -> Result<Self, EnvError> {
        let mut entries: Vec<(String, String, bool)> = declared.iter().map(|k| (k.name.clone(), k.default_value.clone(), false)).collect();
        for (key, value) in given {
            let Some(entry) = entries.iter_mut().find(|e| e.0 == *key) else {
                let known: Vec<&str> = declared.iter().map(|k| k.name.as_str()).collect();
                return Err(EnvError::new(
                    ErrorKind::UnknownKey,
                    format!("unknown config key `{key}`; this plugin accepts: {}", known.join(", ")),
                ));
            };
            if entry.2 {
                return Err(EnvError::bad_value(key, "given more than once; give each key once"));
            }
            entry.1 = value.clone();
            entry.2 = true;
        }
        Ok(Self { entries })
    }

    /// The defaults alone.
    pub fn defaults(declared: &[ConfigKey]) -> Self {
        Self::resolve(declared, &[]).expect("no keys given, none can be unknown")
    }

    fn entry(&self, key: &str) -> &(String, String, bool) {
        // Asking for a key the plugin did not declare is a bug in the plugin,
        // caught by its own tests, not something a user can cause.
        self.entries
            .iter()
            .find(|e| e.0 == key)
            .unwrap_or_else(|| panic!("config key `{key}` is read but not declared in PluginInfo::config_keys"))
    }

    /// The raw value (given or default).
    pub fn str(&self, key: &str) -> &str {
        &self.entry(key).1
    }

    /// Whether the user set this key (rather than taking its default).
    pub fn is_given(&self, key: &str) -> bool {
        self.entry(key).2
    }

    /// Parse the value as `T`; the error names the key, the value and the
    /// type expected.
    pub fn parse<T: FromStr>(&self, key: &str, expected: &str) -> Result<T, EnvError> {
        let raw = self.str(key).trim();
        raw.parse().map_err(|_| EnvError::bad_value(key, format!("`{raw}` is not {expected}")))
    }

    /// An integer in `lo..=hi`.
    pub fn int_in<T>(&self, key: &str, lo: T, hi: T) -> Result<T, EnvError>
    where
        T: FromStr + PartialOrd + Display + Copy,
    {
        let v: T = self.parse(key, "a whole number")?;
        if v < lo || v > hi {
            return Err(EnvError::bad_value(key, format!("{v} is out of range; use {lo}..={hi}")));
        }
        Ok(v)
    }

    /// A finite number in `lo..=hi`.
    pub fn f64_in(&self, key: &str, lo: f64, hi: f64) -> Result<f64, EnvError> {
        let v: f64 = self.parse(key, "a number")?;
        if !v.is_finite() || v < lo || v > hi {
            return Err(EnvError::bad_value(key, format!("{v} is out of range; use a number in [{lo}, {hi}]")));
        }
        Ok(v)
    }

    /// A finite number.
    pub fn f64(&self, key: &str) -> Result<f64, EnvError> {
        self.f64_in(key, f64::MIN, f64::MAX)
    }

    /// `true/false`, `yes/no`, `on/off` or `1/0`.
    pub fn bool(&self, key: &str) -> Result<bool, EnvError> {
        match self.str(key).trim().to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => Ok(true),
            "false" | "no" | "off" | "0" => Ok(false),
            other => Err(EnvError::bad_value(key, format!("`{other}` is not true or false"))),
        }
    }

    /// A non-empty, trimmed string.
    pub fn name(&self, key: &str) -> Result<String, EnvError> {
        let v = self.str(key).trim();
        if v.is_empty() {
            return Err(EnvError::bad_value(key, "must not be empty"));
        }
        Ok(v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Vec<ConfigKey> {
        vec![ConfigKey::new("size", 4, "side"), ConfigKey::new("p", 0.8, "prob"), ConfigKey::new("slip", true, "")]
    }

    fn given(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_and_overrides() {
        let c = Config::resolve(&keys(), &given(&[("p", "0.5")])).unwrap();
        assert_eq!(c.int_in("size", 1u32, 10).unwrap(), 4);
        assert_eq!(c.f64_in("p", 0.0, 1.0).unwrap(), 0.5);
        assert!(c.is_given("p") && !c.is_given("size"));
        assert!(c.bool("slip").unwrap());
    }

    #[test]
    fn unknown_key_is_named_with_the_known_ones() {
        let e = Config::resolve(&keys(), &given(&[("sise", "3")])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownKey);
        assert!(e.message.contains("`sise`") && e.message.contains("size, p, slip"), "{}", e.message);
    }

    #[test]
    fn bad_values_name_the_key() {
        let c = Config::resolve(&keys(), &given(&[("size", "0"), ("p", "lots"), ("slip", "maybe")])).unwrap();
        for (e, key) in [
            (c.int_in("size", 1u32, 10).unwrap_err(), "size"),
            (c.f64_in("p", 0.0, 1.0).unwrap_err(), "p"),
            (c.bool("slip").unwrap_err(), "slip"),
        ] {
            assert_eq!(e.kind, ErrorKind::BadValue);
            assert!(e.message.starts_with(&format!("config key `{key}`")), "{}", e.message);
        }
        let twice = Config::resolve(&keys(), &given(&[("p", "0.1"), ("p", "0.2")])).unwrap_err();
        assert!(twice.message.contains("more than once"));
    }
}
