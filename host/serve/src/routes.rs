//! The HTTP routes and the WebSocket session loop.

use crate::App;
use crate::protocol::{self, BatchMessage, ClientMessage, ErrorCode, ProtocolError};
use crate::session::{EnvRequest, Session};
use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ragen_runtime::PoolStep;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use tracing::{debug, warn};

/// WebSocket close codes (RFC 6455).
const CLOSE_NORMAL: u16 = 1000;
const CLOSE_GOING_AWAY: u16 = 1001;
const CLOSE_UNSUPPORTED: u16 = 1003;
const CLOSE_TOO_BIG: u16 = 1009;

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/ws", get(ws))
        .route("/reset", post(reset))
        .route("/step", post(step))
        .route("/state", get(state))
        .route("/schema", get(|State(app): State<Arc<App>>| async move { Json(protocol::schema(&app.actions)) }))
        .route("/metadata", get(|State(app): State<Arc<App>>| async move { Json(protocol::metadata(&app.info, &app.spec)) }))
        .route("/ragen/batch", get(batch_ws))
        .route("/ragen/spec", get(|State(app): State<Arc<App>>| async move { Json(ragen_runtime::describe_json(&app.info, &app.spec)) }))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/mcp", post(mcp))
        .route("/openapi.json", get(openapi))
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .layer(DefaultBodyLimit::max(app.config.max_request_bytes))
        .with_state(app)
}

/// An HTTP error with a JSON body `{"detail": …}`, as FastAPI answers.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"detail": self.1}))).into_response()
    }
}

fn error(status: StatusCode, detail: impl Into<String>) -> Response {
    Refusal(status, detail.into()).into_response()
}

/// Every request: the bearer token when the server has one, and no new
/// work once shutdown has begun.
async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    if let Some(token) = &app.config.token {
        let sent = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        match sent {
            None => {
                app.envs.metrics.reject("unauthorized");
                return error(
                    StatusCode::UNAUTHORIZED,
                    "missing bearer token: send `Authorization: Bearer <token>` with the token in the server's --token-file",
                );
            }
            Some(sent) if !same_secret(sent.trim().as_bytes(), token.as_bytes()) => {
                app.envs.metrics.reject("unauthorized");
                return error(StatusCode::UNAUTHORIZED, "wrong bearer token: it does not match the server's --token-file");
            }
            Some(_) => {}
        }
    }
    if app.shutdown.is_cancelled() {
        app.envs.metrics.reject("shutting_down");
        return error(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down");
    }
    next.run(request).await
}

/// Compares without stopping at the first difference, so that the time
/// taken says nothing about how much of a guess was right.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn capacity_error(app: &App) -> Response {
    app.envs.metrics.reject("capacity");
    let n = app.envs.slots.capacity();
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("server at capacity: {n}/{n} sessions active; try again when one closes, or start the server with a larger --max-sessions"),
    )
}

/// A JSON object from a body; an empty body is `{}` when `empty_ok`.
fn body_object(body: Result<Bytes, BytesRejection>, app: &App, empty_ok: bool) -> Result<Map<String, Value>, Refusal> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            app.envs.metrics.reject("too_large");
            let limit = app.config.max_request_bytes;
            Refusal(StatusCode::PAYLOAD_TOO_LARGE, format!("request body over {limit} bytes (the server's --max-request-bytes)"))
        } else {
            Refusal(rejection.status(), rejection.body_text())
        }
    })?;
    if body.iter().all(u8::is_ascii_whitespace) && empty_ok {
        return Ok(Map::new());
    }
    match serde_json::from_slice(&body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Refusal(StatusCode::UNPROCESSABLE_ENTITY, "the body must be a JSON object".into())),
        Err(e) => Err(Refusal(StatusCode::UNPROCESSABLE_ENTITY, format!("the body is not JSON: {e}"))),
    }
}

fn refused(e: ProtocolError) -> Refusal {
    let status = match e.code {
        ErrorCode::ExecutionError => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::CapacityReached | ErrorCode::SessionError => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    };
    Refusal(status, e.message)
}

/// `POST /reset`: as OpenEnv's HTTP route, stateless: a fresh env is reset
/// (with the body's `seed`, else the server's next) and its first
/// observation returned. Episodes are played over `/ws`.
async fn reset(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let args = match body_object(body, &app, true).and_then(|b| protocol::parse_reset(&b).map_err(refused)) {
        Ok(args) => args,
        Err(refusal) => return refusal.into_response(),
    };
    let Some(slot) = app.envs.slots.take() else { return capacity_error(&app) };
    let mut session = Session::new(slot);
    match session.reset(&app.envs, args).await {
        Ok(first) => Json(protocol::observation(&first, &app.spec.metrics, true)).into_response(),
        Err(e) => refused(e).into_response(),
    }
}

/// `POST /step` `{"action": {…}, "seed"?: n}`: stateless like OpenEnv's: a
/// fresh env is reset with `seed` (default 0) and takes the one action.
/// OpenEnv's `timeout_s` and `request_id` are accepted and ignored.
async fn step(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let mut body = match body_object(body, &app, false) {
        Ok(body) => body,
        Err(refusal) => return refusal.into_response(),
    };
    let seed = body.remove("seed");
    let action = match body.remove("action") {
        Some(Value::Object(action)) => app.actions.parse(&action),
        _ => Err(ProtocolError::new(
            ErrorCode::ValidationError,
            format!("the body needs `action`, e.g. {{\"action\": {}}}", app.actions.example()),
        )),
    };
    if let Some(extra) = body.keys().find(|k| !matches!(k.as_str(), "timeout_s" | "request_id")) {
        return error(StatusCode::UNPROCESSABLE_ENTITY, format!("unknown field `{extra}`: the body has `action` and optionally `seed`"));
    }
    let args = protocol::parse_reset(&seed.map(|s| Map::from_iter([("seed".to_string(), s)])).unwrap_or_default());
    let (action, mut args) = match (action, args) {
        (Ok(action), Ok(args)) => (action, args),
        (Err(e), _) | (_, Err(e)) => return refused(e).into_response(),
    };
    args.seed = Some(args.seed.unwrap_or(0));
    let Some(slot) = app.envs.slots.take() else { return capacity_error(&app) };
    let mut session = Session::new(slot);
    if let Err(e) = session.reset(&app.envs, args).await {
        return refused(e).into_response();
    }
    match session.step(&app.envs, action).await {
        Ok(step) => Json(protocol::observation(&step, &app.spec.metrics, false)).into_response(),
        Err(e) => refused(e).into_response(),
    }
}

/// `GET /state`: a fresh session's state, as OpenEnv's stateless route.
async fn state() -> Json<Value> {
    Json(json!({"episode_id": null, "step_count": 0}))
}

async fn health(State(app): State<Arc<App>>) -> Json<Value> {
    Json(json!({"status": "healthy", "sessions": app.envs.slots.in_use(), "max_sessions": app.envs.slots.capacity()}))
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], app.envs.metrics.render()).into_response()
}

async fn mcp(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    match body_object(body, &app, true) {
        Ok(request) => Json(protocol::mcp_unsupported(&Value::Object(request))).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// A minimal OpenAPI document: what `openenv validate --url` looks for.
async fn openapi(State(app): State<Arc<App>>) -> Json<Value> {
    let op = |summary: &str| json!({"summary": summary, "responses": {"200": {"description": "OK"}}});
    Json(json!({
        "openapi": "3.1.0",
        "info": {"title": format!("ragen-rs: {}", app.info.name), "version": "1.0.0"},
        "paths": {
            "/reset": {"post": op("Reset a fresh env (stateless; play episodes over /ws)")},
            "/step": {"post": op("Reset a fresh env with `seed` and take one action (stateless)")},
            "/state": {"get": op("A fresh session's state")},
            "/schema": {"get": op("JSON schemas of action, observation and state")},
            "/metadata": {"get": op("The plugin's name, version, description and instructions")},
            "/ragen/batch": {"get": op("A WebSocket session for many envs (?envs=N): one frame resets or steps a batch, for ragen-host's --env ws://")},
            "/ragen/spec": {"get": op("The plugin's whole self-description (legend, limits, metric names), for ragen-host's --env ws://")},
            "/health": {"get": op("Liveness and session count")},
            "/metrics": {"get": op("Prometheus metrics")},
            "/mcp": {"post": op("JSON-RPC; plugins have no MCP tools")},
        },
    }))
}

/// `GET /ws`: one session for the life of the socket. At capacity the
/// upgrade is refused with 503 and a JSON body.
async fn ws(State(app): State<Arc<App>>, upgrade: WebSocketUpgrade) -> Response {
    let Some(slot) = app.envs.slots.take() else { return capacity_error(&app) };
    let limit = app.config.max_request_bytes;
    let tracker = app.tracker.clone();
    upgrade
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| tracker.track_future(session_loop(app, Session::new(slot), socket)))
}

async fn session_loop(app: Arc<App>, mut session: Session, mut socket: WebSocket) {
    let metrics = &app.envs.metrics;
    metrics.sessions_opened.inc();
    metrics.sessions_active.inc();
    debug!(sessions = app.envs.slots.in_use(), "session opened");
    let close = loop {
        let text = match next_text(&app, &mut socket).await {
            Received::Text(text) => text,
            Received::End(close) => break close,
        };
        let reply = match protocol::parse_message(&text, &app.actions) {
            Ok(ClientMessage::Close) => break Some((CLOSE_NORMAL, String::new())),
            Ok(message) => answer(&app, &mut session, message).await,
            Err(e) => e.frame(),
        };
        if socket.send(Message::Text(reply.into())).await.is_err() {
            break None;
        }
    };
    // The env goes back before the session stops counting as open, so that
    // a client seeing the count drop can open a session at once.
    drop(session);
    end_session(&mut socket, close).await;
    metrics.sessions_active.dec();
    debug!("session closed");
}

/// What a session's socket gave: a text frame, or the end of the session
/// (with the close frame to send, if any).
enum Received {
    Text(axum::extract::ws::Utf8Bytes),
    End(Option<(u16, String)>),
}

/// The next text frame, skipping pings; the end on shutdown, idleness,
/// a close, a binary frame or an oversized message.
async fn next_text(app: &App, socket: &mut WebSocket) -> Received {
    let metrics = &app.envs.metrics;
    loop {
        let received = tokio::select! {
            biased;
            _ = app.shutdown.cancelled() => return Received::End(Some((CLOSE_GOING_AWAY, "the server is shutting down".to_string()))),
            _ = tokio::time::sleep(app.config.idle_timeout) => {
                metrics.sessions_reaped.inc();
                return Received::End(Some((CLOSE_NORMAL, format!("idle for {} s: session closed", app.config.idle_timeout.as_secs_f64()))));
            }
            received = socket.recv() => received,
        };
        return match received {
            None | Some(Ok(Message::Close(_))) => Received::End(None),
            Some(Ok(Message::Text(text))) => Received::Text(text),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Binary(_))) => {
                let e = ProtocolError::new(ErrorCode::SessionError, "binary frames are not part of the protocol: send JSON text frames");
                let _ = socket.send(Message::Text(e.frame().into())).await;
                Received::End(Some((CLOSE_UNSUPPORTED, "binary frame".into())))
            }
            Some(Err(e)) => {
                metrics.reject("too_large");
                debug!("session read error: {e}");
                let limit = app.config.max_request_bytes;
                Received::End(Some((CLOSE_TOO_BIG, format!("unreadable or oversized message (limit {limit} bytes, --max-request-bytes)"))))
            }
        };
    }
}

async fn end_session(socket: &mut WebSocket, close: Option<(u16, String)>) {
    if let Some((code, reason)) = close {
        let _ = socket.send(Message::Close(Some(CloseFrame { code, reason: reason.into() }))).await;
    }
}

/// `GET /ragen/batch?envs=N`: one WebSocket session for N envs, so that a
/// client with many envs (ragen-host's `--env ws://`) makes one connection
/// and one frame per call instead of N (see `protocol::parse_batch`). Its
/// own route, so OpenEnv's clients see `/ws` exactly as before. All N slots
/// or none: at capacity the upgrade is refused with 503.
async fn batch_ws(
    State(app): State<Arc<App>>,
    axum::extract::Query(query): axum::extract::Query<std::collections::HashMap<String, String>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let n = match query.get("envs").map(|n| n.parse::<usize>()) {
        Some(Ok(n)) if n >= 1 => n,
        _ => return error(StatusCode::BAD_REQUEST, "give the number of envs this session holds: /ragen/batch?envs=N, N at least 1"),
    };
    let Some(slots) = app.envs.slots.take_many(n) else { return capacity_error(&app) };
    let limit = app.config.max_request_bytes;
    let tracker = app.tracker.clone();
    let sessions: Vec<Session> = slots.into_iter().map(Session::new).collect();
    upgrade.max_message_size(limit).max_frame_size(limit).on_upgrade(move |socket| tracker.track_future(batch_loop(app, sessions, socket)))
}

async fn batch_loop(app: Arc<App>, mut sessions: Vec<Session>, mut socket: WebSocket) {
    let metrics = &app.envs.metrics;
    let n = sessions.len() as i64;
    metrics.sessions_opened.inc_by(n as u64);
    metrics.sessions_active.inc_by(n);
    debug!(envs = n, sessions = app.envs.slots.in_use(), "batched session opened");
    let close = loop {
        let text = match next_text(&app, &mut socket).await {
            Received::Text(text) => text,
            Received::End(close) => break close,
        };
        let reply = match protocol::parse_batch(&text, &app.actions, sessions.len()) {
            Ok(BatchMessage::Close) => break Some((CLOSE_NORMAL, String::new())),
            Ok(BatchMessage::Calls(calls)) => answer_batch(&app, &mut sessions, calls).await,
            Err(e) => e.frame(),
        };
        if socket.send(Message::Text(reply.into())).await.is_err() {
            break None;
        }
    };
    drop(sessions);
    end_session(&mut socket, close).await;
    metrics.sessions_active.dec_by(n);
    debug!("batched session closed");
}

/// Every call of a batched frame handed to the stepping thread together
/// and answered together; the answers in the frame's order.
async fn answer_batch(app: &App, sessions: &mut [Session], calls: Vec<(usize, Result<ClientMessage, ProtocolError>)>) -> String {
    let mut by_env: Vec<Option<(usize, EnvRequest)>> = (0..sessions.len()).map(|_| None).collect();
    let mut results: Vec<(Result<PoolStep, ProtocolError>, bool)> = Vec::with_capacity(calls.len());
    for (pos, (env, message)) in calls.into_iter().enumerate() {
        let (request, reset) = match message {
            Ok(ClientMessage::Reset(args)) => (EnvRequest::Reset(args), true),
            Ok(ClientMessage::Step(action)) => (EnvRequest::Step(action), false),
            Ok(_) => unreachable!("parse_batch gives only resets and steps"),
            Err(e) => {
                results.push((Err(e), false));
                continue;
            }
        };
        by_env[env] = Some((pos, request));
        // A placeholder, replaced by the answer below.
        results.push((Err(ProtocolError::new(ErrorCode::ExecutionError, "")), reset));
    }
    let mut order = Vec::new();
    let calls: Vec<(&mut Session, EnvRequest)> = sessions
        .iter_mut()
        .zip(by_env)
        .filter_map(|(session, call)| {
            let (pos, request) = call?;
            order.push(pos);
            Some((session, request))
        })
        .collect();
    for (pos, answer) in order.into_iter().zip(Session::call_many(&app.envs, calls).await) {
        results[pos].0 = answer;
    }
    protocol::batch_answer(&results, &app.spec.metrics)
}

/// One message's reply frame.
async fn answer(app: &App, session: &mut Session, message: ClientMessage) -> String {
    let result = match message {
        ClientMessage::Reset(args) => {
            session.reset(&app.envs, args).await.map(|first| ("observation", protocol::observation(&first, &app.spec.metrics, true)))
        }
        ClientMessage::Step(action) => {
            session.step(&app.envs, action).await.map(|step| ("observation", protocol::observation(&step, &app.spec.metrics, false)))
        }
        ClientMessage::State => Ok(("state", session.state())),
        ClientMessage::Mcp(request) => Ok(("mcp", protocol::mcp_unsupported(&request))),
        ClientMessage::Close => unreachable!("handled by the loop"),
    };
    match result {
        Ok((kind, data)) => json!({"type": kind, "data": data}).to_string(),
        Err(e) => {
            // A plugin failure is the operator's business; a malformed
            // message is only the client's.
            if e.code == ErrorCode::ExecutionError {
                warn!("{}", e.message);
            } else {
                debug!("refused: {}", e.message);
            }
            e.frame()
        }
    }
}
