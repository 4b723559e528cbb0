//! A plugin's self-description as JSON, for a server to send and a remote
//! client to read back (`ragen-host serve`'s `/ragen/spec`): with it, an env
//! played over the network gets the same prompt, legend, limits and metric
//! names as the plugin played in this process. What is read back is a
//! stranger's answer and goes through the same checks as a plugin's
//! ([`ReportLimits`](crate::ReportLimits)).

use crate::{ActionSpace, ConfigKey, EnvSpec, LegendEntry, Limits, PluginInfo, TextActions};
use serde_json::{Value, json};

/// `{"info": {…}, "spec": {…}}`, field names as in `wit/env.wit`.
pub fn describe_json(info: &PluginInfo, spec: &EnvSpec) -> Value {
    let keys: Vec<Value> =
        info.config_keys.iter().map(|k| json!({"name": k.name, "default_value": k.default_value, "description": k.description})).collect();
    let legend: Vec<Value> = spec.legend.iter().map(|e| json!({"symbol": e.symbol, "meaning": e.meaning})).collect();
    let actions = match &spec.action_space {
        ActionSpace::Names(names) => json!({"names": names}),
        ActionSpace::Text(t) => json!({"text": {"max_bytes": t.max_bytes, "form": t.form}}),
    };
    let l = &spec.limits;
    json!({
        "info": {
            "name": info.name,
            "version": info.version,
            "description": info.description,
            "multi_turn": info.multi_turn,
            "config_keys": keys,
        },
        "spec": {
            "instructions": spec.instructions,
            "legend": legend,
            "action_space": actions,
            "limits": {
                "max_actions_per_episode": l.max_actions_per_episode,
                "max_actions_per_turn": l.max_actions_per_turn,
                "max_turns": l.max_turns,
                "max_steps": l.max_steps,
            },
            "metrics": spec.metrics,
        },
    })
}

/// The inverse of [`describe_json`]; `Err` names the first field missing
/// or of the wrong type.
pub fn describe_from_json(value: &Value) -> Result<(PluginInfo, EnvSpec), String> {
    let info = field(value, "info")?;
    let spec = field(value, "spec")?;
    let keys = list(info, "config_keys")?
        .iter()
        .map(|k| Ok(ConfigKey { name: text(k, "name")?, default_value: text(k, "default_value")?, description: text(k, "description")? }))
        .collect::<Result<_, String>>()?;
    let info = PluginInfo {
        name: text(info, "name")?,
        version: text(info, "version")?,
        description: text(info, "description")?,
        multi_turn: field(info, "multi_turn")?.as_bool().ok_or("info.multi_turn is not a boolean")?,
        config_keys: keys,
    };
    let legend = list(spec, "legend")?
        .iter()
        .map(|e| Ok(LegendEntry { symbol: text(e, "symbol")?, meaning: text(e, "meaning")? }))
        .collect::<Result<_, String>>()?;
    let space = field(spec, "action_space")?;
    let action_space = match (space.get("names"), space.get("text")) {
        (Some(_), None) => ActionSpace::Names(list(space, "names")?.iter().map(|n| as_text(n, "action name")).collect::<Result<_, _>>()?),
        (None, Some(t)) => ActionSpace::Text(TextActions { max_bytes: number(t, "max_bytes")?, form: text(t, "form")? }),
        _ => return Err("spec.action_space holds neither `names` nor `text`".into()),
    };
    let l = field(spec, "limits")?;
    let limits = Limits {
        max_actions_per_episode: number(l, "max_actions_per_episode")?,
        max_actions_per_turn: number(l, "max_actions_per_turn")?,
        max_turns: number(l, "max_turns")?,
        max_steps: number(l, "max_steps")?,
    };
    let metrics = list(spec, "metrics")?.iter().map(|m| as_text(m, "metric name")).collect::<Result<_, _>>()?;
    let spec = EnvSpec { instructions: text(spec, "instructions")?, legend, action_space, limits, metrics };
    Ok((info, spec))
}

fn field<'v>(v: &'v Value, name: &str) -> Result<&'v Value, String> {
    v.get(name).ok_or_else(|| format!("`{name}` is missing"))
}

fn text(v: &Value, name: &str) -> Result<String, String> {
    as_text(field(v, name)?, name)
}

fn as_text(v: &Value, what: &str) -> Result<String, String> {
    v.as_str().map(str::to_string).ok_or_else(|| format!("{what} is not a string"))
}

fn number(v: &Value, name: &str) -> Result<u32, String> {
    field(v, name)?.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| format!("`{name}` is not an integer from 0 to 2^32-1"))
}

fn list<'v>(v: &'v Value, name: &str) -> Result<&'v Vec<Value>, String> {
    field(v, name)?.as_array().ok_or_else(|| format!("`{name}` is not a list"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_reads_back_as_it_was_written() {
        let info = PluginInfo {
            name: "grid".into(),
            version: "1.2.0".into(),
            description: "a grid".into(),
            multi_turn: true,
            config_keys: vec![ConfigKey { name: "size".into(), default_value: "6".into(), description: "side".into() }],
        };
        let limits = Limits { max_actions_per_episode: 10, max_actions_per_turn: 5, max_turns: 5, max_steps: 100 };
        let names = EnvSpec {
            instructions: "push {legend}".into(),
            legend: vec![LegendEntry { symbol: "#".into(), meaning: "wall".into() }],
            action_space: ActionSpace::Names(vec!["Up".into(), "Down".into()]),
            limits,
            metrics: vec!["boxes".into()],
        };
        let text =
            EnvSpec { action_space: ActionSpace::Text(TextActions { max_bytes: 64, form: "an expression".into() }), ..names.clone() };
        for spec in [&names, &text] {
            assert_eq!(describe_from_json(&describe_json(&info, spec)).unwrap(), (info.clone(), spec.clone()));
        }
        let mut broken = describe_json(&info, &names);
        broken["spec"]["limits"]["max_turns"] = json!(-1);
        assert!(describe_from_json(&broken).unwrap_err().contains("max_turns"), "the error names the field");
        broken["spec"]["action_space"] = json!({});
        assert!(describe_from_json(&broken).is_err());
    }
}
