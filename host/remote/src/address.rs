//! `ws://host:port[/path][?option=value&…]`, or several such addresses
//! joined by commas: where a remote env's servers are, and the settings
//! OpenEnv's protocol cannot carry.

use anyhow::{Context, Result, bail};
use std::fmt;
use std::time::Duration;
use url::Url;

/// The schemes a remote env source starts with.
pub const SCHEMES: [&str; 2] = ["ws://", "wss://"];

/// Whether `s` names a remote env source (rather than a file or `oci://`).
pub fn is_remote(s: &str) -> bool {
    SCHEMES.iter().any(|scheme| s.starts_with(scheme))
}

/// One server: its WebSocket session URL and the base of its HTTP routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `ws://host:port/base/ws`
    pub ws: Url,
    /// `http://host:port/base/`
    pub http: Url,
}

impl Endpoint {
    fn parse(s: &str) -> Result<(Self, Vec<(String, String)>)> {
        let url = Url::parse(s).with_context(|| format!("`{s}` is not a URL: write ws://HOST:PORT or wss://HOST:PORT"))?;
        let http_scheme = match url.scheme() {
            "ws" => "http",
            "wss" => "https",
            other => bail!("`{s}`: the scheme is `{other}`; a remote env is ws://HOST:PORT or wss://HOST:PORT"),
        };
        if url.host_str().is_none_or(str::is_empty) {
            bail!("`{s}` names no host: write ws://HOST:PORT");
        }
        let query: Vec<(String, String)> = url.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
        // The base path is what comes before the session route, given or not.
        let base = url.path().trim_end_matches('/').trim_end_matches("/ws").trim_end_matches('/').to_string();
        let mut ws = url.clone();
        ws.set_query(None);
        ws.set_fragment(None);
        ws.set_path(&format!("{base}/ws"));
        let mut http = ws.clone();
        http.set_path(&format!("{base}/"));
        let http = Url::parse(&http.as_str().replacen(url.scheme(), http_scheme, 1)).context("the server's HTTP address")?;
        Ok((Self { ws, http }, query))
    }

    /// The batched session route of ragen-host's server, for `envs` envs.
    pub fn batch(&self, envs: usize) -> Url {
        let mut url = self.ws.clone();
        let base = url.path().trim_end_matches("/ws").to_string();
        url.set_path(&format!("{base}/ragen/batch"));
        url.set_query(Some(&format!("envs={envs}")));
        url
    }

    /// The HTTP route `route` (e.g. `schema`) of this server.
    pub fn route(&self, route: &str) -> Url {
        self.http.join(route).expect("a relative route joins any base URL")
    }
}

/// What the protocol leaves unsaid, as the address's query sets it. An
/// OpenEnv server reports its actions and instructions but not how long
/// an episode may run; ragen-host's own server reports everything, and
/// these override it.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteOptions {
    pub max_turns: Option<u32>,
    pub max_actions_per_turn: Option<u32>,
    pub max_actions_per_episode: Option<u32>,
    /// The longest text action, when the action schema gives no `maxLength`.
    pub max_text_bytes: Option<u32>,
    /// Every call's deadline (connecting, resetting, stepping).
    pub timeout: Duration,
    /// The largest frame accepted from the server.
    pub max_frame_bytes: usize,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            max_turns: None,
            max_actions_per_turn: None,
            max_actions_per_episode: None,
            max_text_bytes: None,
            timeout: Duration::from_secs(30),
            max_frame_bytes: 4 << 20,
        }
    }
}

/// The options the query may set, with what each means (for errors and `--help`).
pub const OPTIONS: &[(&str, &str)] = &[
    ("max_turns", "replies per episode (default: the server's, or 5)"),
    ("max_actions_per_turn", "actions per reply (default: the server's, or 1)"),
    ("max_actions_per_episode", "actions per episode (default: the server's, or turns x actions per turn)"),
    ("max_text_bytes", "the longest text action (default: the schema's maxLength, or 1024)"),
    ("timeout", "seconds each call may take (default 30)"),
    ("max_frame_bytes", "the largest frame accepted from the server (default 4194304)"),
];

impl RemoteOptions {
    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let count = || -> Result<u32> {
            value.parse::<u32>().ok().filter(|&n| n > 0).with_context(|| format!("`{key}={value}`: a count of at least 1"))
        };
        match key {
            "max_turns" => self.max_turns = Some(count()?),
            "max_actions_per_turn" => self.max_actions_per_turn = Some(count()?),
            "max_actions_per_episode" => self.max_actions_per_episode = Some(count()?),
            "max_text_bytes" => self.max_text_bytes = Some(count()?),
            "max_frame_bytes" => self.max_frame_bytes = count()? as usize,
            "timeout" => {
                let s: f64 = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
                    .with_context(|| format!("`timeout={value}`: seconds, more than 0 and at most 86400"))?;
                self.timeout = Duration::from_secs_f64(s);
            }
            other => {
                let known: Vec<String> = OPTIONS.iter().map(|(k, what)| format!("{k} ({what})")).collect();
                bail!("unknown option `{other}` in the address; the options are: {}", known.join(", "))
            }
        }
        Ok(())
    }
}

/// Where a remote env's servers are and how to talk to them. Envs are
/// spread over the servers in turn: env `i` plays on server `i % n`.
///
/// # Examples
///
/// ```
/// use ragen_remote::RemoteAddress;
/// let a: RemoteAddress = "ws://127.0.0.1:8000?max_turns=10,ws://127.0.0.1:8001".parse()?;
/// assert_eq!(a.endpoints.len(), 2);
/// assert_eq!(a.endpoints[1].ws.as_str(), "ws://127.0.0.1:8001/ws");
/// assert_eq!(a.options.max_turns, Some(10));
/// # Ok::<(), anyhow::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteAddress {
    pub endpoints: Vec<Endpoint>,
    pub options: RemoteOptions,
    written: String,
}

impl std::str::FromStr for RemoteAddress {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let mut endpoints = Vec::new();
        let mut options = RemoteOptions::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (endpoint, query) = Endpoint::parse(part)?;
            for (k, v) in query {
                // One message, not a chain: clap prints only the outer one.
                options.set(&k, &v).map_err(|e| anyhow::anyhow!("in `{part}`: {e:#}"))?;
            }
            endpoints.push(endpoint);
        }
        if endpoints.is_empty() {
            bail!("`{s}` names no server: write ws://HOST:PORT, or several joined by commas");
        }
        Ok(Self { endpoints, options, written: s.to_string() })
    }
}

impl fmt::Display for RemoteAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_name_the_session_route_and_the_http_routes() {
        let a: RemoteAddress = "wss://envs.example.com/team/sokoban/ws?timeout=2.5&max_turns=3".parse().unwrap();
        let e = &a.endpoints[0];
        assert_eq!(e.ws.as_str(), "wss://envs.example.com/team/sokoban/ws");
        assert_eq!(e.route("schema").as_str(), "https://envs.example.com/team/sokoban/schema");
        assert_eq!(a.options.timeout, Duration::from_millis(2500));
        assert_eq!(a.options.max_turns, Some(3));
        assert_eq!(e.batch(8).as_str(), "wss://envs.example.com/team/sokoban/ragen/batch?envs=8");
        let plain: RemoteAddress = "ws://localhost:9/".parse().unwrap();
        assert_eq!(plain.endpoints[0].route("ragen/spec").as_str(), "http://localhost:9/ragen/spec");
    }

    #[test]
    fn bad_addresses_say_what_to_write() {
        let err = |s: &str| format!("{:#}", s.parse::<RemoteAddress>().unwrap_err());
        assert!(err("ws://h:1?turns=3").contains("unknown option `turns`"), "{}", err("ws://h:1?turns=3"));
        assert!(err("ws://h:1?max_turns=0").contains("at least 1"));
        assert!(err("ws://h:1?timeout=-1").contains("seconds"));
        assert!(err("http://h:1").contains("ws://HOST:PORT"));
        assert!(err(",").contains("names no server"));
    }
}
