//! For the decoders' property tests: JSON values of the shapes a stream event's fields take and
//! the odd values a field might hold instead, and the comparison of a decoder's typed reading of
//! an event with its tree reading (H-42).

use super::SseEvent;
use proptest::prelude::*;
use serde_json::{json, Value};
use tollgate_core::event::ProviderEvent;

/// An event named `name` (its `event:` field) with `data`.
pub(crate) fn sse_event(name: Option<&str>, data: &str) -> SseEvent {
    SseEvent {
        event: name.map(str::to_string),
        data: data.to_string(),
        id: None,
    }
}

/// Whether the typed reading `plain` answers for `ev`; where it does, its event must be what the
/// tree reading `tree` gives for the event's JSON.
pub(crate) fn plain_as_tree(
    ev: &SseEvent,
    plain: fn(&SseEvent) -> Option<Option<ProviderEvent>>,
    tree: impl FnOnce(&SseEvent, &Value) -> Vec<ProviderEvent>,
) -> bool {
    let Some(plain) = plain(ev) else {
        return false;
    };
    let data: Value = serde_json::from_str(&ev.data).expect("a typed reading is of JSON");
    assert_eq!(
        plain.into_iter().collect::<Vec<_>>(),
        tree(ev, &data),
        "{}",
        ev.data
    );
    true
}

/// A JSON scalar among those that tell the decoders' readings apart: null, booleans, small and
/// negative integers, one above `u32`'s range, a fraction, and strings with escapes.
pub(crate) fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-2i64..5).prop_map(Value::from),
        Just(Value::from(u64::from(u32::MAX) + 1)),
        Just(json!(0.5)),
        prop_oneof![
            Just(""),
            Just("a"),
            Just("stop"),
            Just("é\"\\\n\u{1}"),
            Just("chatcmpl-9")
        ]
        .prop_map(Value::from),
    ]
}

/// `value` or one of the odd things a field might hold instead.
pub(crate) fn or_odd(value: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => value,
        1 => scalar(),
        1 => prop::collection::vec(scalar(), 0..3).prop_map(Value::Array),
    ]
}

/// An object of some of `fields`, each present with its probability.
pub(crate) fn object(
    fields: Vec<(&'static str, f64, BoxedStrategy<Value>)>,
) -> BoxedStrategy<Value> {
    let parts: Vec<_> = fields
        .into_iter()
        .map(|(name, p, value)| prop::option::weighted(p, value).prop_map(move |v| (name, v)))
        .collect();
    parts
        .prop_map(|parts| {
            Value::Object(
                parts
                    .into_iter()
                    .filter_map(|(name, v)| v.map(|v| (name.to_string(), v)))
                    .collect(),
            )
        })
        .boxed()
}
