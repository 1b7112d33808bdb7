//! Whether an object in the cluster already is as we want it (pure): every field we set has our
//! value, whatever other writers and defaults added. A converged object costs no write.

use serde::Serialize;
use serde_json::Value;

/// True when every field set in `desired` has the same value in `current`. Maps may carry extra
/// keys (other writers' labels, defaulted fields); lists must match element by element.
pub fn is_subset(desired: &Value, current: &Value) -> bool {
    match (desired, current) {
        (Value::Object(want), Value::Object(have)) => want
            .iter()
            .all(|(key, value)| have.get(key).is_some_and(|current| is_subset(value, current))),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| is_subset(w, h))
        }
        _ => desired == current,
    }
}

/// Whether `current` (if any) already has every field of `desired`.
pub fn is_converged<K: Serialize>(desired: &K, current: Option<&K>) -> bool {
    let Some(current) = current else { return false };
    match (serde_json::to_value(desired), serde_json::to_value(current)) {
        (Ok(desired), Ok(current)) => is_subset(&desired, &current),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subsets() {
        let want = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [{"port": 2049}]}});
        let cases = [
            (
                json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"ports": [{"port": 2049, "protocol": "TCP"}], "clusterIP": "10.0.0.1"}}),
                true,
            ),
            (
                json!({"metadata": {"labels": {"a": "2"}}, "spec": {"ports": [{"port": 2049}]}}),
                false,
            ),
            (json!({"metadata": {}, "spec": {"ports": [{"port": 2049}]}}), false),
            (
                json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [{"port": 2049}, {"port": 111}]}}),
                false,
            ),
            (
                json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [{"port": 2050}]}}),
                false,
            ),
        ];
        for (current, expected) in cases {
            assert_eq!(is_subset(&want, &current), expected, "{current}");
        }
    }
}
