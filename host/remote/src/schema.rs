//! What a server says about its env, turned into a plugin's [`EnvSpec`],
//! and its frames turned into steps.
//!
//! ragen-host's own server sends the plugin's whole self-description
//! (`/ragen/spec`), so a remote plugin is the same env as a local one. Any
//! other OpenEnv server has only `/schema` and `/metadata`:
//!
//! * **Actions.** The action model must have one field (besides OpenEnv's
//!   `metadata`). A string with an `enum` becomes the action names; a free
//!   string becomes a text action (its `maxLength`, or 1024 bytes).
//! * **Instructions** are the metadata's README, else its description,
//!   else the action model's description.
//! * **Observations** are rendered as text: the one string field when
//!   there is only one, else one `name: value` line per field.
//! * **Limits** are 5 turns of 1 action unless the address sets them.

use crate::address::RemoteOptions;
use crate::session::CallError;
use anyhow::{Result, bail};
use ragen_runtime::{ActionSpace, EnvSpec, Limits, PluginInfo, PoolStep, StepInfo, TextActions};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// How actions and observations travel.
#[derive(Clone, Debug, PartialEq)]
pub enum Dialect {
    /// ragen-host's server: `{"action": NAME}`, observations with step info.
    Ragen,
    /// Any OpenEnv server: the action is `{FIELD: value}`.
    OpenEnv { field: String },
}

/// The spec of a server with `/ragen/spec`, with the address's overrides.
pub fn ragen_spec(description: &Value, options: &RemoteOptions) -> Result<(PluginInfo, EnvSpec)> {
    let (info, mut spec) =
        ragen_runtime::describe_from_json(description).map_err(|e| anyhow::anyhow!("the server's /ragen/spec does not read: {e}"))?;
    let l = &mut spec.limits;
    l.max_turns = options.max_turns.unwrap_or(l.max_turns);
    l.max_actions_per_turn = options.max_actions_per_turn.unwrap_or(l.max_actions_per_turn);
    l.max_actions_per_episode = options.max_actions_per_episode.unwrap_or(l.max_actions_per_episode);
    Ok((info, spec))
}

/// The spec of any OpenEnv server, from its `/schema` and `/metadata`.
pub fn openenv_spec(schema: &Value, metadata: &Value, options: &RemoteOptions) -> Result<(PluginInfo, EnvSpec, Dialect)> {
    let action = schema
        .get("action")
        .filter(|a| a.is_object())
        .ok_or_else(|| anyhow::anyhow!("the server's /schema has no `action` object: is it an OpenEnv server (openenv-core 0.3)?"))?;
    let fields: Vec<(&String, &Value)> = action
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.iter().filter(|(k, _)| *k != "metadata").collect())
        .unwrap_or_default();
    let [(field, property)] = fields[..] else {
        let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        bail!(
            "the server's action has {} fields ({}): a remote env needs an action of one field, a string (an enum of action names, or free text)",
            names.len(),
            names.join(", ")
        );
    };
    let action_space = action_space(field, property, options)?;
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).filter(|s| !s.trim().is_empty()).map(str::to_string);
    let instructions = text(metadata, "readme_content")
        .or_else(|| text(metadata, "description"))
        .or_else(|| text(action, "description"))
        .unwrap_or_default();
    let max_turns = options.max_turns.unwrap_or(5);
    let per_turn = options.max_actions_per_turn.unwrap_or(1);
    let per_episode = options.max_actions_per_episode.unwrap_or(max_turns.saturating_mul(per_turn));
    let limits = Limits { max_actions_per_episode: per_episode, max_actions_per_turn: per_turn, max_turns, max_steps: per_episode };
    let info = PluginInfo {
        name: text(metadata, "name").unwrap_or_else(|| "remote".into()),
        version: text(metadata, "version").unwrap_or_else(|| "0".into()),
        description: text(metadata, "description").unwrap_or_default(),
        multi_turn: max_turns > 1,
        config_keys: Vec::new(),
    };
    let spec = EnvSpec { instructions, legend: Vec::new(), action_space, limits, metrics: Vec::new() };
    Ok((info, spec, Dialect::OpenEnv { field: field.clone() }))
}

/// A one-field action's space: names from an `enum` (also inside `anyOf`),
/// or free text.
fn action_space(field: &str, property: &Value, options: &RemoteOptions) -> Result<ActionSpace> {
    let mut branches = vec![property];
    if let Some(any) = property.get("anyOf").and_then(Value::as_array) {
        branches.extend(any);
    }
    for b in &branches {
        if let Some(names) = b.get("enum").and_then(Value::as_array) {
            let names: Option<Vec<String>> = names.iter().map(|n| n.as_str().map(str::to_string)).collect();
            return match names {
                Some(names) if !names.is_empty() => Ok(ActionSpace::Names(names)),
                _ => bail!("the server's action field `{field}` has an enum that is not a list of names"),
            };
        }
    }
    match branches.iter().find(|b| b.get("type").and_then(Value::as_str) == Some("string")) {
        Some(b) => {
            let schema_max = b.get("maxLength").and_then(Value::as_u64).map(|n| n.min(u32::MAX as u64) as u32);
            let max_bytes = options.max_text_bytes.or(schema_max).unwrap_or(1024);
            let form = property.get("description").and_then(Value::as_str).unwrap_or("free text").to_string();
            Ok(ActionSpace::Text(TextActions { max_bytes, form }))
        }
        None => bail!(
            "the server's action field `{field}` is not a string ({}): a remote env needs actions written as text or chosen from an enum of names",
            property.get("type").map(Value::to_string).unwrap_or_else(|| "no type".into())
        ),
    }
}

/// The `data` of an `observation` frame as a step. A reset's `reward` is
/// `null` (0 here).
pub fn step_of(data: &Value, dialect: &Dialect, metric_names: &[String]) -> Result<PoolStep, String> {
    let observation = data.get("observation").and_then(Value::as_object).ok_or("the frame's data has no `observation` object")?;
    let reward = match data.get("reward") {
        None | Some(Value::Null) => 0.0,
        Some(Value::Bool(b)) => f64::from(u8::from(*b)),
        Some(r) => r.as_f64().filter(|r| r.is_finite()).ok_or_else(|| format!("the reward {r} is not a finite number"))?,
    };
    let done = data.get("done").and_then(Value::as_bool).unwrap_or(false);
    let flag = |k: &str| observation.get(k).and_then(Value::as_bool);
    let (text, info) = match dialect {
        Dialect::Ragen => {
            let o = RagenObservation::deserialize(&data["observation"]).map_err(|e| format!("the observation does not read: {e}"))?;
            o.into_step(metric_names)
        }
        Dialect::OpenEnv { .. } => {
            let success = flag("success")
                .or_else(|| observation.get("metadata").and_then(|m| m.get("success")).and_then(Value::as_bool))
                .unwrap_or(false);
            (render(observation), StepInfo { success, action_is_valid: true, action_is_effective: true, metrics: Vec::new() })
        }
    };
    Ok(PoolStep { observation: text, reward, done, info, autoreset: None })
}

/// ragen-host's observation (`ragen_serve::protocol::observation`): the
/// plugin's text and step info, metrics by name.
#[derive(Deserialize)]
struct RagenObservation {
    text: String,
    success: Option<bool>,
    action_is_valid: Option<bool>,
    action_is_effective: Option<bool>,
    #[serde(default)]
    metrics: HashMap<String, Option<f64>>,
}

impl RagenObservation {
    /// The text, and the step info with the metrics in the spec's order.
    fn into_step(self, metric_names: &[String]) -> (String, StepInfo) {
        let metrics = metric_names.iter().map(|m| self.metrics.get(m).copied().flatten().unwrap_or(0.0)).collect();
        let info = StepInfo {
            success: self.success.unwrap_or(false),
            action_is_valid: self.action_is_valid.unwrap_or(true),
            action_is_effective: self.action_is_effective.unwrap_or(true),
            metrics,
        };
        (self.text, info)
    }
}

/// A batched answer (`/ragen/batch`), decoded straight into each env's
/// step or error: a thousand observations per frame, so no JSON tree.
pub fn batch_answer(text: &str, count: usize, metric_names: &[String]) -> Result<Vec<Result<PoolStep, CallError>>, CallError> {
    #[derive(Deserialize)]
    struct Frame {
        r#type: String,
        data: Option<Vec<Item>>,
    }
    #[derive(Deserialize)]
    struct Item {
        observation: Option<RagenObservation>,
        reward: Option<f64>,
        done: Option<bool>,
        error: Option<ErrorItem>,
    }
    #[derive(Deserialize)]
    struct ErrorItem {
        message: Option<String>,
        code: Option<String>,
    }
    let frame: Frame =
        serde_json::from_str(text).map_err(|e| CallError::Invalid(format!("the server's batched answer does not read: {e}")))?;
    let items = match (frame.r#type.as_str(), frame.data) {
        ("observations", Some(items)) => items,
        ("error", _) => {
            let error: Value = serde_json::from_str(text).unwrap_or_default();
            let message = error["data"]["message"].as_str().unwrap_or("(no message)");
            return Err(CallError::Invalid(format!("the server refused the batched call: {message}")));
        }
        (other, _) => return Err(CallError::Invalid(format!("the server answered with a `{other}` frame where `observations` was due"))),
    };
    if items.len() != count {
        return Err(CallError::Invalid(format!("the server answered {} of {count} envs", items.len())));
    }
    Ok(items
        .into_iter()
        .map(|item| {
            if let Some(e) = item.error {
                let (code, message) = (e.code.unwrap_or_else(|| "UNKNOWN".into()), e.message.unwrap_or_else(|| "(no message)".into()));
                return Err(CallError::Refused { code, message });
            }
            let o = item.observation.ok_or_else(|| CallError::Invalid("an item has neither `observation` nor `error`".into()))?;
            let reward = item.reward.unwrap_or(0.0);
            if !reward.is_finite() {
                return Err(CallError::Invalid(format!("the reward {reward} is not a finite number")));
            }
            let (observation, info) = o.into_step(metric_names);
            Ok(PoolStep { observation, reward, done: item.done.unwrap_or(false), info, autoreset: None })
        })
        .collect())
}

/// An OpenEnv observation as text (see the module docs).
fn render(observation: &Map<String, Value>) -> String {
    let fields: Vec<(&String, &Value)> =
        observation.iter().filter(|(k, _)| !matches!(k.as_str(), "metadata" | "done" | "reward" | "success")).collect();
    if let [(_, Value::String(only))] = fields[..] {
        return only.clone();
    }
    fields
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}: {s}"),
            other => format!("{k}: {other}"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The schema openenv-core 0.3's template env (`openenv init`) serves.
    fn echo_schema() -> Value {
        json!({"action": {"title": "EchoAction", "type": "object", "description": "Action for the Echo environment",
            "properties": {"metadata": {"type": "object"}, "message": {"type": "string", "description": "Message to echo back"}},
            "required": ["message"]}})
    }

    #[test]
    fn a_free_string_field_is_a_text_action_and_observations_read_as_lines() {
        let meta =
            json!({"name": "EchoEnvironment", "description": "EchoEnvironment environment", "readme_content": null, "version": "1.0.0"});
        let (info, spec, dialect) = openenv_spec(&echo_schema(), &meta, &RemoteOptions::default()).unwrap();
        assert_eq!(dialect, Dialect::OpenEnv { field: "message".into() });
        assert_eq!(spec.action_space, ActionSpace::Text(TextActions { max_bytes: 1024, form: "Message to echo back".into() }));
        assert_eq!((info.name.as_str(), spec.instructions.as_str()), ("EchoEnvironment", "EchoEnvironment environment"));
        assert_eq!((spec.limits.max_turns, spec.limits.max_actions_per_episode), (5, 5));
        let data = json!({"observation": {"echoed_message": "hi", "message_length": 2}, "reward": 0.2, "done": false});
        let step = step_of(&data, &dialect, &[]).unwrap();
        assert_eq!(step.observation, "echoed_message: hi\nmessage_length: 2");
        assert_eq!(step.reward, 0.2);
    }

    #[test]
    fn an_enum_field_gives_action_names_and_the_address_sets_the_limits() {
        let schema =
            json!({"action": {"properties": {"move": {"anyOf": [{"type": "string", "enum": ["Up", "Down"]}, {"type": "integer"}]}}}});
        let options = RemoteOptions { max_turns: Some(8), max_actions_per_turn: Some(2), ..RemoteOptions::default() };
        let (info, spec, _) = openenv_spec(&schema, &json!({}), &options).unwrap();
        assert_eq!(spec.action_space, ActionSpace::Names(vec!["Up".into(), "Down".into()]));
        assert_eq!((spec.limits.max_turns, spec.limits.max_actions_per_turn, spec.limits.max_actions_per_episode), (8, 2, 16));
        assert!(info.multi_turn);
    }

    #[test]
    fn a_schema_with_no_usable_action_says_what_is_needed() {
        let err = |schema: Value| openenv_spec(&schema, &json!({}), &RemoteOptions::default()).unwrap_err().to_string();
        assert!(err(json!({"detail": "Not Found"})).contains("is it an OpenEnv server"));
        let two = json!({"action": {"properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}});
        assert!(err(two).contains("2 fields (x, y)"));
        let number = json!({"action": {"properties": {"x": {"type": "integer"}}}});
        assert!(err(number).contains("`x` is not a string"));
    }

    #[test]
    fn a_bad_reward_or_a_frame_without_observation_is_refused() {
        let d = Dialect::OpenEnv { field: "m".into() };
        assert!(step_of(&json!({"reward": 1}), &d, &[]).unwrap_err().contains("no `observation`"));
        assert!(step_of(&json!({"observation": {}, "reward": "x"}), &d, &[]).unwrap_err().contains("not a finite number"));
        let ours = json!({"observation": {"text": "#", "success": true, "metrics": {"boxes": 1.0}}, "reward": null, "done": true});
        let s = step_of(&ours, &Dialect::Ragen, &["boxes".into()]).unwrap();
        assert_eq!((s.observation.as_str(), s.reward, s.done, s.info.success, s.info.metrics), ("#", 0.0, true, true, vec![1.0]));
    }
}
