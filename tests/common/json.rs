//! Reports' JSON compared across runs.

use serde_json::Value;

/// `v` without the keys `drop` names, at any depth (times, lines a recording lacks).
pub fn without_keys(v: Value, drop: &dyn Fn(&str) -> bool) -> Value {
    match v {
        Value::Object(m) => m
            .into_iter()
            .filter(|(k, _)| !drop(k))
            .map(|(k, v)| (k, without_keys(v, drop)))
            .collect(),
        Value::Array(a) => a.into_iter().map(|v| without_keys(v, drop)).collect(),
        v => v,
    }
}
