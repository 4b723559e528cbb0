//! The wire format: OpenEnv's messages (openenv-core 0.3.0), carrying a
//! plugin's observations, actions and episode state.
//!
//! Over `/ws` a client sends JSON text frames `{"type": …, "data": …}` and
//! gets one frame back for each (none for `close`):
//!
//! | client sends | server answers |
//! |---|---|
//! | `{"type":"reset","data":{"seed":7,"episode_id":"e1"}}` (data optional) | `{"type":"observation","data":{"observation":{…},"reward":null,"done":false}}` |
//! | `{"type":"step","data":{"action":"Up"}}` | `{"type":"observation","data":{"observation":{…},"reward":-0.1,"done":false}}` |
//! | `{"type":"state"}` | `{"type":"state","data":{"episode_id":"e1","step_count":1,…}}` |
//! | `{"type":"close"}` | (the socket closes) |
//! | anything wrong | `{"type":"error","data":{"message":…,"code":…}}`, the socket stays open |
//!
//! The HTTP routes carry the same `data` objects as bodies.
//!
//! An action is `{"action": NAME}` (case-insensitive) or `{"action": ID}`
//! for an env with action names, `{"action": TEXT}` for a text env; a
//! `metadata` object is accepted and ignored, as OpenEnv's `Action` has one.
//! The observation holds the plugin's text and its step info.

use ragen_runtime::{Action, ActionSpace, EnvSpec, PluginInfo, PoolStep, action_name_key};
use serde::Serialize;
use serde_json::{Map, Value, json};

/// Error codes, named as OpenEnv's `WSErrorCode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// The frame is not JSON.
    InvalidJson,
    /// `type` is missing or not one of reset, step, state, close, mcp.
    UnknownType,
    /// The message or its action does not have the expected shape.
    ValidationError,
    /// The env could not do it: a plugin fault, an episode that is over.
    ExecutionError,
    /// The server holds as many sessions as it may.
    CapacityReached,
    /// The session cannot go on (a binary frame, a shutdown).
    SessionError,
}

/// A request the server refuses, with what to do instead.
#[derive(Clone, Debug, PartialEq)]
pub struct ProtocolError {
    pub code: ErrorCode,
    pub message: String,
}

impl ProtocolError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ValidationError, message)
    }

    /// The `/ws` error frame.
    pub fn frame(&self) -> String {
        json!({"type": "error", "data": {"message": self.message, "code": self.code}}).to_string()
    }
}

/// `reset`'s arguments. Without a seed the server picks the next of its
/// own counter; without an episode id it makes one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResetArgs {
    pub seed: Option<u64>,
    pub episode_id: Option<String>,
}

/// One decoded `/ws` message.
#[derive(Clone, Debug, PartialEq)]
pub enum ClientMessage {
    Reset(ResetArgs),
    Step(Action),
    State,
    Close,
    /// A JSON-RPC request for OpenEnv's MCP tools, which plugins do not have.
    Mcp(Value),
}

/// The longest episode id accepted, as OpenEnv's `ResetRequest`.
pub const MAX_EPISODE_ID: usize = 255;

/// Decode a `/ws` text frame.
pub fn parse_message(text: &str, actions: &ActionParser) -> Result<ClientMessage, ProtocolError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ProtocolError::new(ErrorCode::InvalidJson, format!("Invalid JSON: {e}")))?;
    let Value::Object(mut message) = value else {
        return Err(ProtocolError::invalid(
            "a message is a JSON object: {\"type\": \"reset\" | \"step\" | \"state\" | \"close\", \"data\": {…}}",
        ));
    };
    let kind = match message.remove("type") {
        Some(Value::String(kind)) => kind,
        _ => String::new(),
    };
    if let Some(extra) = message.keys().find(|k| *k != "data") {
        return Err(ProtocolError::invalid(format!("unknown field `{extra}`: a message has only `type` and `data`")));
    }
    let data = message.remove("data");
    match kind.as_str() {
        "reset" => match data {
            None | Some(Value::Null) => Ok(ClientMessage::Reset(ResetArgs::default())),
            Some(Value::Object(args)) => parse_reset(&args).map(ClientMessage::Reset),
            Some(_) => Err(ProtocolError::invalid("reset's `data` is an object, e.g. {\"seed\": 7}")),
        },
        "step" => match data {
            Some(Value::Object(action)) => actions.parse(&action).map(ClientMessage::Step),
            None => Err(ProtocolError::invalid(format!("step needs `data`, the action, e.g. {}", actions.example()))),
            Some(_) => Err(ProtocolError::invalid(format!("step's `data` is an object, e.g. {}", actions.example()))),
        },
        "state" if data.is_some() => Err(ProtocolError::invalid("state takes no `data`")),
        "state" => Ok(ClientMessage::State),
        "close" => Ok(ClientMessage::Close),
        "mcp" => Ok(ClientMessage::Mcp(data.unwrap_or(Value::Null))),
        other => Err(ProtocolError::new(
            ErrorCode::UnknownType,
            format!("Unknown message type: {other} (expected reset, step, state, close or mcp)"),
        )),
    }
}

/// One decoded `/ragen/batch` frame: each call's env and message (an
/// action the env cannot take is that env's error, not the frame's).
#[derive(Clone, Debug, PartialEq)]
pub enum BatchMessage {
    Calls(Vec<(usize, Result<ClientMessage, ProtocolError>)>),
    Close,
}

/// Decode a `/ragen/batch` text frame, for a session of `envs` envs:
///
/// | client sends | server answers |
/// |---|---|
/// | `{"type":"reset","data":{"envs":[0,1],"seeds":[7,7]}}` | `{"type":"observations","data":[{"observation":…,"reward":null,"done":false}, …]}` |
/// | `{"type":"step","data":{"envs":[0,1],"actions":["Up",2]}}` | `{"type":"observations","data":[…, {"error":{"message":…,"code":…}}]}` |
/// | `{"type":"close"}` | (the socket closes) |
///
/// Each answer is what `/ws` would answer that env, in the frame's order.
pub fn parse_batch(text: &str, actions: &ActionParser, envs: usize) -> Result<BatchMessage, ProtocolError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ProtocolError::new(ErrorCode::InvalidJson, format!("Invalid JSON: {e}")))?;
    let kind = value.get("type").and_then(Value::as_str).unwrap_or_default();
    let data = value.get("data").and_then(Value::as_object);
    let example = r#"{"type": "step", "data": {"envs": [0, 1], "actions": ["Up", 2]}}"#;
    let (items_key, data) = match (kind, data) {
        ("close", _) => return Ok(BatchMessage::Close),
        ("reset", Some(d)) => ("seeds", d),
        ("step", Some(d)) => ("actions", d),
        ("reset" | "step", None) => return Err(ProtocolError::invalid(format!("a batched {kind} needs `data`, e.g. {example}"))),
        (other, _) => {
            return Err(ProtocolError::new(
                ErrorCode::UnknownType,
                format!("Unknown message type: `{other}` (expected reset, step or close)"),
            ));
        }
    };
    let ids = data
        .get("envs")
        .and_then(Value::as_array)
        .ok_or_else(|| ProtocolError::invalid(format!("`envs` is a list of env indices, e.g. {example}")))?;
    let items = data
        .get(items_key)
        .and_then(Value::as_array)
        .ok_or_else(|| ProtocolError::invalid(format!("`{items_key}` is a list, one per env")))?;
    if ids.len() != items.len() {
        return Err(ProtocolError::invalid(format!("{} envs but {} {items_key}", ids.len(), items.len())));
    }
    let mut seen = vec![false; envs];
    let mut calls = Vec::with_capacity(ids.len());
    for (id, item) in ids.iter().zip(items) {
        let env = id.as_u64().map(|i| i as usize).filter(|&i| i < envs).ok_or_else(|| {
            ProtocolError::invalid(format!("env {id} is not in this session, which holds envs 0 to {}", envs.saturating_sub(1)))
        })?;
        if std::mem::replace(&mut seen[env], true) {
            return Err(ProtocolError::invalid(format!("env {env} is named twice in one frame")));
        }
        let message = match kind {
            "reset" => match item {
                Value::Null => Ok(ClientMessage::Reset(ResetArgs::default())),
                v => v
                    .as_u64()
                    .map(|seed| ClientMessage::Reset(ResetArgs { seed: Some(seed), episode_id: None }))
                    .ok_or_else(|| ProtocolError::invalid(format!("seed must be an integer from 0 to 2^64-1, not {v}"))),
            },
            _ => actions.action(item).map(ClientMessage::Step),
        };
        calls.push((env, message));
    }
    Ok(BatchMessage::Calls(calls))
}

/// `reset`'s `data` (or the HTTP `/reset` body): `seed` and `episode_id`.
pub fn parse_reset(args: &Map<String, Value>) -> Result<ResetArgs, ProtocolError> {
    let mut out = ResetArgs::default();
    for (key, value) in args {
        match (key.as_str(), value) {
            (_, Value::Null) => {}
            ("seed", v) => {
                out.seed =
                    Some(v.as_u64().ok_or_else(|| ProtocolError::invalid(format!("seed must be an integer from 0 to 2^64-1, not {v}")))?)
            }
            ("episode_id", Value::String(id)) if id.len() <= MAX_EPISODE_ID => out.episode_id = Some(id.clone()),
            ("episode_id", _) => {
                return Err(ProtocolError::invalid(format!("episode_id must be a string of at most {MAX_EPISODE_ID} bytes")));
            }
            (other, _) => {
                return Err(ProtocolError::invalid(format!(
                    "reset takes `seed` and `episode_id`, not `{other}` (env settings are fixed when the server starts: --set KEY=VALUE)"
                )));
            }
        }
    }
    Ok(out)
}

/// Turns a step's `data` into a plugin action, by the env's action space.
#[derive(Clone, Debug)]
pub struct ActionParser {
    names: Vec<String>,
    /// `Some(max bytes)` for a text env.
    text_max: Option<u32>,
}

impl ActionParser {
    pub fn new(spec: &EnvSpec) -> Self {
        match &spec.action_space {
            ActionSpace::Names(names) => Self { names: names.clone(), text_max: None },
            ActionSpace::Text(t) => Self { names: Vec::new(), text_max: Some(t.max_bytes) },
        }
    }

    /// A valid action, for messages.
    pub fn example(&self) -> String {
        match self.names.first() {
            Some(name) => json!({"action": name}).to_string(),
            None => json!({"action": "your answer"}).to_string(),
        }
    }

    /// `{"action": …}` with an optional `metadata` object.
    pub fn parse(&self, data: &Map<String, Value>) -> Result<Action, ProtocolError> {
        if let Some(extra) = data.keys().find(|k| *k != "action" && *k != "metadata") {
            return Err(ProtocolError::invalid(format!("unknown field `{extra}` in the action; send {}", self.example())));
        }
        match data.get("action") {
            None => Err(ProtocolError::invalid(format!("the action is missing; send {}", self.example()))),
            Some(value) => self.action(value),
        }
    }

    fn action(&self, value: &Value) -> Result<Action, ProtocolError> {
        if let Some(max) = self.text_max {
            return match value {
                Value::String(text) if text.len() <= max as usize => Ok(Action::Text(text.clone())),
                Value::String(text) => {
                    Err(ProtocolError::invalid(format!("the action is {} bytes; this env takes at most {max}", text.len())))
                }
                other => Err(ProtocolError::invalid(format!("this env takes text actions (a string), not {other}"))),
            };
        }
        let n = self.names.len();
        match value {
            // Matched as the agent's answers are: the runtime refuses a spec
            // whose names this could not tell apart.
            Value::String(name) => {
                let key = action_name_key(name);
                match self.names.iter().position(|a| action_name_key(a) == key) {
                    Some(id) => Ok(Action::Id(id as u32)),
                    None => Err(ProtocolError::invalid(format!("unknown action `{name}`; this env's actions: {}", self.names.join(", ")))),
                }
            }
            Value::Number(id) => match id.as_u64() {
                Some(id) if (id as usize) < n => Ok(Action::Id(id as u32)),
                _ => Err(ProtocolError::invalid(format!(
                    "action id {id} is out of range: this env has {n} actions, 0 to {}",
                    n.saturating_sub(1)
                ))),
            },
            other => Err(ProtocolError::invalid(format!(
                "an action is a name or an id, not {other}; this env's actions: {}",
                self.names.join(", ")
            ))),
        }
    }

    /// The JSON schema of an action, for `/schema`.
    pub fn schema(&self) -> Value {
        let action = match self.text_max {
            Some(max) => json!({"type": "string", "maxLength": max, "description": "the answer, as free text"}),
            None => json!({"anyOf": [
                {"type": "string", "enum": self.names, "description": "an action name (case-insensitive)"},
                {"type": "integer", "minimum": 0, "maximum": self.names.len().saturating_sub(1), "description": "an action id"},
            ]}),
        };
        json!({
            "title": "RagenAction",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "action": action,
                "metadata": {"type": "object", "additionalProperties": true, "description": "accepted and ignored"},
            },
            "required": ["action"],
        })
    }
}

/// The body of a reset or step reply: `{"observation": {…}, "reward", "done"}`.
/// A reset has `reward: null`, as OpenEnv's.
pub fn observation(step: &PoolStep, metric_names: &[String], reset: bool) -> Value {
    serde_json::to_value(ObservationBody::new(step, metric_names, reset)).expect("an observation serializes")
}

/// [`observation`]'s shape, serialized without building a JSON tree (a
/// batched answer holds a thousand of them).
#[derive(Serialize)]
pub struct ObservationBody<'a> {
    observation: ObservationFields<'a>,
    reward: Option<f64>,
    done: bool,
}

#[derive(Serialize)]
struct ObservationFields<'a> {
    text: &'a str,
    success: bool,
    action_is_valid: bool,
    action_is_effective: bool,
    metrics: Metrics<'a>,
}

/// The step's metrics by name, as a JSON object.
struct Metrics<'a>(&'a [String], &'a [f64]);

impl Serialize for Metrics<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().zip(self.1))
    }
}

impl<'a> ObservationBody<'a> {
    pub fn new(step: &'a PoolStep, metric_names: &'a [String], reset: bool) -> Self {
        let info = &step.info;
        Self {
            observation: ObservationFields {
                text: &step.observation,
                success: info.success,
                action_is_valid: info.action_is_valid,
                action_is_effective: info.action_is_effective,
                metrics: Metrics(metric_names, &info.metrics),
            },
            reward: if reset { None } else { Some(step.reward) },
            done: step.done,
        }
    }
}

/// One item of a batched answer: the env's observation, or its error.
#[derive(Serialize)]
#[serde(untagged)]
pub enum BatchItem<'a> {
    Observation(ObservationBody<'a>),
    Error { error: ErrorBody<'a> },
}

#[derive(Serialize)]
pub struct ErrorBody<'a> {
    message: &'a str,
    code: ErrorCode,
}

/// A batched answer frame: `{"type": "observations", "data": [item, …]}`.
pub fn batch_answer(results: &[(Result<PoolStep, ProtocolError>, bool)], metric_names: &[String]) -> String {
    let items: Vec<BatchItem> = results
        .iter()
        .map(|(r, reset)| match r {
            Ok(step) => BatchItem::Observation(ObservationBody::new(step, metric_names, *reset)),
            Err(e) => BatchItem::Error { error: ErrorBody { message: &e.message, code: e.code } },
        })
        .collect();
    #[derive(Serialize)]
    struct Frame<'a> {
        r#type: &'static str,
        data: Vec<BatchItem<'a>>,
    }
    serde_json::to_string(&Frame { r#type: "observations", data: items }).expect("an answer serializes")
}

/// `/schema`: JSON schemas of the action, the observation and the state.
pub fn schema(actions: &ActionParser) -> Value {
    json!({
        "action": actions.schema(),
        "observation": {
            "title": "RagenObservation",
            "type": "object",
            "properties": {
                "text": {"type": "string", "description": "the state as the plugin renders it"},
                "success": {"type": "boolean"},
                "action_is_valid": {"type": "boolean"},
                "action_is_effective": {"type": "boolean"},
                "metrics": {"type": "object", "additionalProperties": {"type": ["number", "null"]}},
            },
        },
        "state": {
            "title": "RagenState",
            "type": "object",
            "additionalProperties": true,
            "properties": {
                "episode_id": {"type": ["string", "null"]},
                "step_count": {"type": "integer", "minimum": 0},
                "seed": {"type": ["integer", "null"], "minimum": 0},
                "done": {"type": "boolean"},
                "success": {"type": "boolean"},
                "total_reward": {"type": "number"},
            },
        },
    })
}

/// `/metadata`, as OpenEnv's `EnvironmentMetadata`; the README is the
/// env's instructions.
pub fn metadata(info: &PluginInfo, spec: &EnvSpec) -> Value {
    json!({
        "name": info.name,
        "description": info.description,
        "readme_content": spec.instructions,
        "version": info.version,
        "author": null,
        "documentation_url": null,
    })
}

/// The answer to a JSON-RPC request on `/mcp`: plugins have no MCP tools.
pub fn mcp_unsupported(request: &Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": request.get("id").cloned().unwrap_or(Value::Null),
        "error": {"code": -32603, "message": "this environment does not support MCP (ragen plugins have no tools)", "data": null},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> ActionParser {
        ActionParser { names: vec!["Up".into(), "Down".into()], text_max: None }
    }

    #[test]
    fn messages_decode_as_openenv_sends_them() {
        let p = names();
        let reset = parse_message(r#"{"type": "reset", "data": {"seed": 42, "episode_id": "ep-1"}}"#, &p).unwrap();
        assert_eq!(reset, ClientMessage::Reset(ResetArgs { seed: Some(42), episode_id: Some("ep-1".into()) }));
        assert_eq!(parse_message(r#"{"type":"reset"}"#, &p).unwrap(), ClientMessage::Reset(ResetArgs::default()));
        assert_eq!(parse_message(r#"{"type":"step","data":{"action":"down"}}"#, &p).unwrap(), ClientMessage::Step(Action::Id(1)));
        assert_eq!(parse_message(r#"{"type":"step","data":{"action":0,"metadata":{}}}"#, &p).unwrap(), ClientMessage::Step(Action::Id(0)));
        assert_eq!(parse_message(r#"{"type":"state"}"#, &p).unwrap(), ClientMessage::State);
        assert_eq!(parse_message(r#"{"type":"close"}"#, &p).unwrap(), ClientMessage::Close);
    }

    #[test]
    fn bad_messages_get_openenv_codes_and_say_what_to_send() {
        let p = names();
        let code = |text: &str| parse_message(text, &p).unwrap_err();
        assert_eq!(code("not json{").code, ErrorCode::InvalidJson);
        assert_eq!(code(r#"{"type":"frobnicate"}"#).code, ErrorCode::UnknownType);
        assert_eq!(code(r#"{"data":{}}"#).code, ErrorCode::UnknownType);
        assert_eq!(code(r#"{"type":"state","data":{}}"#).code, ErrorCode::ValidationError);
        assert_eq!(code(r#"{"type":"step"}"#).code, ErrorCode::ValidationError);
        assert_eq!(code(r#"{"type":"step","data":{"action":"Up"},"extra":1}"#).code, ErrorCode::ValidationError);
        let unknown = code(r#"{"type":"step","data":{"action":"Jump"}}"#);
        assert!(unknown.message.contains("unknown action `Jump`; this env's actions: Up, Down"), "{}", unknown.message);
        let range = code(r#"{"type":"step","data":{"action":2}}"#);
        assert!(range.message.contains("0 to 1"), "{}", range.message);
        let seed = code(r#"{"type":"reset","data":{"seed":-1}}"#);
        assert!(seed.message.contains("seed must be an integer"), "{}", seed.message);
        let key = code(r#"{"type":"reset","data":{"difficulty":"hard"}}"#);
        assert!(key.message.contains("not `difficulty`") && key.message.contains("--set"), "{}", key.message);
    }

    #[test]
    fn batched_frames_name_their_envs_and_a_bad_action_is_that_envs_error() {
        let p = names();
        let calls = |text: &str| match parse_batch(text, &p, 3).unwrap() {
            BatchMessage::Calls(calls) => calls,
            BatchMessage::Close => panic!("not a close"),
        };
        let resets = calls(r#"{"type":"reset","data":{"envs":[2,0],"seeds":[7,null]}}"#);
        assert_eq!(resets[0], (2, Ok(ClientMessage::Reset(ResetArgs { seed: Some(7), episode_id: None }))));
        assert_eq!(resets[1], (0, Ok(ClientMessage::Reset(ResetArgs::default()))));
        let steps = calls(r#"{"type":"step","data":{"envs":[1,0],"actions":["down","Jump"]}}"#);
        assert_eq!(steps[0], (1, Ok(ClientMessage::Step(Action::Id(1)))));
        assert!(steps[1].1.as_ref().unwrap_err().message.contains("unknown action `Jump`"));
        assert_eq!(parse_batch(r#"{"type":"close"}"#, &p, 3).unwrap(), BatchMessage::Close);
        let err = |text: &str| parse_batch(text, &p, 3).unwrap_err().message;
        assert!(err(r#"{"type":"step","data":{"envs":[3],"actions":["Up"]}}"#).contains("envs 0 to 2"));
        assert!(err(r#"{"type":"step","data":{"envs":[1,1],"actions":["Up","Up"]}}"#).contains("named twice"));
        assert!(err(r#"{"type":"step","data":{"envs":[1],"actions":[]}}"#).contains("1 envs but 0 actions"));
        assert_eq!(parse_batch(r#"{"type":"state"}"#, &p, 3).unwrap_err().code, ErrorCode::UnknownType);
    }

    #[test]
    fn text_actions_are_strings_up_to_the_limit() {
        let p = ActionParser { names: vec![], text_max: Some(8) };
        let step = |a: Value| p.parse(json!({ "action": a }).as_object().unwrap());
        assert_eq!(step(json!("1+2")).unwrap(), Action::Text("1+2".into()));
        assert!(step(json!("123456789")).unwrap_err().message.contains("at most 8"));
        assert!(step(json!(3)).unwrap_err().message.contains("text actions"));
    }

    #[test]
    fn error_frames_are_openenv_shaped() {
        let frame: Value = serde_json::from_str(&ProtocolError::new(ErrorCode::ExecutionError, "boom").frame()).unwrap();
        assert_eq!(frame, json!({"type": "error", "data": {"message": "boom", "code": "EXECUTION_ERROR"}}));
    }
}

/// Fuzzing the frames: a `/ws` text frame is bytes anyone on the network
/// wrote, so any frame decodes or is refused with an OpenEnv error frame,
/// never a panic (`make fuzz` runs it longer). Frames are assembled from
/// the protocol's own pieces (types, fields, actions, seeds, ids), values
/// at and past every bound, and nesting deep enough to overflow a
/// recursive parser's stack.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    const KEYS: &[&str] = &["type", "data", "seed", "episode_id", "action", "metadata", "extra", "", "\\u0000"];
    const TYPES: &[&str] = &["reset", "step", "state", "close", "mcp", "RESET", "", "step\\u0000"];
    const VALUES: &[&str] = &[
        "null",
        "true",
        "0",
        "1",
        "-1",
        "4294967295",
        "4294967296",
        "18446744073709551615",
        "18446744073709551616",
        "1e400",
        "-0.0",
        "0.5",
        "\"up\"",
        "\"UP\"",
        "\"\\ud800\"",
        "\"\\u202e\"",
        "[]",
        "{}",
        "\"\"",
    ];

    /// A JSON value built from the pieces, nested to `depth`.
    fn value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            prop::sample::select(VALUES).prop_map(str::to_string),
            prop::sample::select(TYPES).prop_map(|t| format!("\"{t}\"")),
            "[ -~]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            (0usize..300).prop_map(|n| format!("\"{}\"", "x".repeat(n))),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((prop::sample::select(KEYS), inner), 0..4)
                    .prop_map(|kv| format!("{{{}}}", kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect::<Vec<_>>().join(","))),
            ]
        })
    }

    /// A frame: a message of the protocol's shape, any JSON value, deep
    /// nesting, or any text at all.
    fn frame() -> impl Strategy<Value = String> {
        prop_oneof![
            (prop::sample::select(TYPES), prop::option::of(value()), prop::option::of((prop::sample::select(KEYS), value()))).prop_map(
                |(kind, data, extra)| {
                    let mut fields = vec![format!("\"type\":\"{kind}\"")];
                    fields.extend(data.map(|d| format!("\"data\":{d}")));
                    fields.extend(extra.map(|(k, v)| format!("\"{k}\":{v}")));
                    format!("{{{}}}", fields.join(","))
                }
            ),
            value(),
            (1usize..100_000, prop::bool::ANY).prop_map(|(n, arrays)| if arrays { "[".repeat(n) } else { "{\"data\":".repeat(n) }),
            ".{0,64}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
            failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::WithSource("regressions"))),
            ..ProptestConfig::default()
        })]

        #[test]
        fn any_frame_decodes_or_gets_an_error_frame_never_panics(text in frame(), text_env in prop::bool::ANY) {
            let actions = if text_env {
                ActionParser { names: Vec::new(), text_max: Some(16) }
            } else {
                ActionParser { names: vec!["Up".into(), "Down".into()], text_max: None }
            };
            match parse_message(&text, &actions) {
                Ok(ClientMessage::Step(Action::Id(id))) => prop_assert!((id as usize) < actions.names.len()),
                Ok(ClientMessage::Step(Action::Text(t))) => prop_assert!(text_env && t.len() <= 16),
                Ok(ClientMessage::Reset(args)) => prop_assert!(args.episode_id.is_none_or(|id| id.len() <= MAX_EPISODE_ID)),
                Ok(_) => {}
                Err(e) => {
                    let frame: Value = serde_json::from_str(&e.frame()).expect("an error frame is JSON");
                    prop_assert_eq!(&frame["type"], "error");
                }
            }
        }
    }
}
