//! One env's WebSocket session: a frame out, a frame back, each under the
//! call's deadline. A session that fails (refused, closed, silent past its
//! deadline, out of step with the protocol) is dropped; the env's episode
//! is lost, and its next reset connects again, so a server that comes back
//! is used again.

use crate::address::RemoteOptions;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Message, http};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use url::Url;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Why a call got no answer to use.
#[derive(Clone, Debug)]
pub enum CallError {
    /// The server could not be reached, went away, or did not answer in
    /// time: the session is gone.
    Lost(String),
    /// The server answered with an OpenEnv error frame: its `code` and `message`.
    Refused { code: String, message: String },
    /// The server answered with something the protocol does not allow.
    Invalid(String),
}

pub struct Session {
    socket: Option<Socket>,
}

/// Where a session connects, and the settings every session shares.
pub struct Link<'a> {
    /// The session route: `/ws`, or `/ragen/batch?envs=N`.
    pub url: &'a Url,
    pub options: &'a RemoteOptions,
    pub token: Option<&'a str>,
}

impl Session {
    pub fn new() -> Self {
        Self { socket: None }
    }

    pub fn is_open(&self) -> bool {
        self.socket.is_some()
    }

    /// Send `message` (`{"type": …, "data": …}`) and return the answer's
    /// `data` when it is of `expected` type. With `connect`, a closed
    /// session is opened first; without, a closed session is lost.
    pub async fn call(&mut self, link: &Link<'_>, message: Value, expected: &str, connect: bool) -> Result<Value, CallError> {
        self.call_with(link, message, connect, |text| answer(text, expected)).await
    }

    /// [`call`](Self::call), the answer's text read by `decode`.
    pub async fn call_with<T>(
        &mut self,
        link: &Link<'_>,
        message: Value,
        connect: bool,
        decode: impl FnOnce(&str) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        let deadline = link.options.timeout;
        let answer = tokio::time::timeout(deadline, self.exchange(link, message, connect, decode)).await;
        let result = answer.unwrap_or_else(|_| {
            Err(CallError::Lost(format!("{} did not answer within {} s (the address's timeout)", link.url, deadline.as_secs_f64())))
        });
        if matches!(result, Err(CallError::Lost(_) | CallError::Invalid(_))) {
            // Out of step or gone: the next reset starts a fresh session.
            self.socket = None;
        }
        result
    }

    async fn exchange<T>(
        &mut self,
        link: &Link<'_>,
        message: Value,
        connect: bool,
        decode: impl FnOnce(&str) -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        if self.socket.is_none() {
            if !connect {
                return Err(CallError::Lost(format!("the session with {} was lost earlier in this episode", link.url)));
            }
            self.socket = Some(open(link).await?);
        }
        let socket = self.socket.as_mut().expect("opened above");
        let lost = |e: &dyn std::fmt::Display| CallError::Lost(format!("the session with {} broke: {e}", link.url));
        socket.send(Message::Text(message.to_string().into())).await.map_err(|e| lost(&e))?;
        loop {
            let frame = match socket.next().await {
                None => return Err(CallError::Lost(format!("{} closed the session", link.url))),
                Some(Err(e)) => return Err(lost(&e)),
                Some(Ok(frame)) => frame,
            };
            match frame {
                Message::Text(text) => return decode(&text),
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
                Message::Close(close) => {
                    let why = close.map(|c| format!(" ({}: {})", u16::from(c.code), c.reason)).unwrap_or_default();
                    return Err(CallError::Lost(format!("{} closed the session{why}", link.url)));
                }
                Message::Binary(_) => return Err(CallError::Invalid("the server sent a binary frame; OpenEnv's are JSON text".into())),
            }
        }
    }

    /// Say goodbye, as OpenEnv's clients do, without waiting long.
    pub async fn close(&mut self) {
        if let Some(mut socket) = self.socket.take() {
            let bye = async {
                let _ = socket.send(Message::Text(json!({"type": "close"}).to_string().into())).await;
                let _ = socket.close(None).await;
            };
            let _ = tokio::time::timeout(Duration::from_millis(500), bye).await;
        }
    }
}

/// Connect, with the bearer token when there is one.
async fn open(link: &Link<'_>) -> Result<Socket, CallError> {
    let url = &link.url;
    let mut request = url.as_str().into_client_request().map_err(|e| CallError::Lost(format!("{url}: {e}")))?;
    if let Some(token) = link.token {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| CallError::Lost("the token holds characters a header cannot carry".into()))?;
        request.headers_mut().insert(http::header::AUTHORIZATION, value);
    }
    let config =
        WebSocketConfig::default().max_message_size(Some(link.options.max_frame_bytes)).max_frame_size(Some(link.options.max_frame_bytes));
    match tokio_tungstenite::connect_async_with_config(request, Some(config), true).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default();
            let hint = match response.status().as_u16() {
                401 | 403 => " (set RAGEN_REMOTE_TOKEN to the server's bearer token)",
                404 => " (no /ws route: is it an OpenEnv server?)",
                503 => " (the server holds as many sessions as it may)",
                _ => "",
            };
            Err(CallError::Lost(format!(
                "{url} refused the session: HTTP {}{hint}: {}",
                response.status(),
                body.chars().take(300).collect::<String>()
            )))
        }
        Err(e) => Err(CallError::Lost(format!("cannot open a session with {url}: {e}"))),
    }
}

/// The `data` of a frame of type `expected`, or why not.
pub fn answer(text: &str, expected: &str) -> Result<Value, CallError> {
    let frame: Value = serde_json::from_str(text)
        .map_err(|e| CallError::Invalid(format!("the server's frame is not JSON ({e}): {}", text.chars().take(200).collect::<String>())))?;
    let kind = frame.get("type").and_then(Value::as_str).unwrap_or_default();
    let data = frame.get("data").cloned().unwrap_or(Value::Null);
    match kind {
        k if k == expected => Ok(data),
        "error" => Err(CallError::Refused {
            code: data.get("code").and_then(Value::as_str).unwrap_or("UNKNOWN").to_string(),
            message: data.get("message").and_then(Value::as_str).unwrap_or("(no message)").to_string(),
        }),
        other => Err(CallError::Invalid(format!("the server answered with a `{other}` frame where `{expected}` was due"))),
    }
}
