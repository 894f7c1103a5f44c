//! Helpers shared by the protocol decoders: JSON payloads, error events, the end-of-stream
//! bookkeeping. Error messages produced here never contain stream content.

use super::{SseEvent, SSE_EVENT_BYTES_MAX};
use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use tollgate_core::event::{error_kind, ProviderEvent};

/// An error event.
pub(crate) fn error(kind: &str, message: impl Into<String>) -> ProviderEvent {
    ProviderEvent::Error {
        kind: kind.to_string(),
        message: message.into(),
    }
}

/// The event's data as JSON, or a `malformed_event` error (without the data).
pub(crate) fn json_data(ev: &SseEvent) -> Result<Value, ProviderEvent> {
    if ev.is_overflow() {
        return Err(error(
            error_kind::MALFORMED_EVENT,
            format!("stream event larger than {SSE_EVENT_BYTES_MAX} bytes"),
        ));
    }
    serde_json::from_str(&ev.data).map_err(|e| {
        error(
            error_kind::MALFORMED_EVENT,
            format!(
                "stream event is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
    })
}

/// The string at `path`, if present.
pub(crate) fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(v, path).and_then(Value::as_str)
}

/// The value at `path`, if present and not null.
pub(crate) fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut cur = v;
    for key in path {
        cur = cur.get(key)?;
    }
    (!cur.is_null()).then_some(cur)
}

/// A JSON index as `u32`, if it is one.
pub(crate) fn index_u32(v: &Value, key: &str) -> Option<u32> {
    v.get(key)
        .and_then(Value::as_u64)
        .and_then(|i| u32::try_from(i).ok())
}

/// A non-empty string at `path` as an owned string.
pub(crate) fn non_empty(v: &Value, path: &[&str]) -> Option<String> {
    str_at(v, path)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// An error event built from a provider's `error` object (`type`/`code` and `message`).
pub(crate) fn provider_error(err: &Value, default_kind: &str) -> ProviderEvent {
    let kind = str_at(err, &["type"])
        .or_else(|| str_at(err, &["code"]))
        .filter(|s| !s.is_empty())
        .unwrap_or(default_kind);
    let message = str_at(err, &["message"]).unwrap_or("provider reported an error");
    error(kind, message)
}

/// Whether a decoder's stream is over: its end marker arrived, or it reported an error. Events
/// after that are ignored, and [`Lifecycle::finish`] reports a missing end marker.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lifecycle {
    done: bool,
    failed: bool,
}

/// One decoder step: nothing is decoded once the stream is closed (its end marker or an error
/// arrived); otherwise `decode` runs and the end marker or error among its events is noted.
pub(crate) fn guarded<D>(
    decoder: &mut D,
    life: fn(&mut D) -> &mut Lifecycle,
    decode: impl FnOnce(&mut D) -> Vec<ProviderEvent>,
) -> Vec<ProviderEvent> {
    if life(decoder).closed() {
        return Vec::new();
    }
    let out = decode(decoder);
    life(decoder).record(&out);
    out
}

/// Runs `decode` on the event's JSON data, or yields the parse error as the event.
pub(crate) fn with_json(
    ev: &SseEvent,
    decode: impl FnOnce(&Value) -> Vec<ProviderEvent>,
) -> Vec<ProviderEvent> {
    match json_data(ev) {
        Ok(data) => decode(&data),
        Err(e) => vec![e],
    }
}

impl Lifecycle {
    /// Whether no further events are accepted.
    pub(crate) fn closed(&self) -> bool {
        self.done || self.failed
    }

    /// Notes the end marker or an error among `events`.
    pub(crate) fn record(&mut self, events: &[ProviderEvent]) {
        for e in events {
            match e {
                ProviderEvent::Done => self.done = true,
                ProviderEvent::Error { .. } => self.failed = true,
                _ => {}
            }
        }
    }

    /// At end of input: `connection_closed` when neither the end marker nor an error arrived.
    pub(crate) fn finish(&mut self) -> Vec<ProviderEvent> {
        if self.closed() {
            return Vec::new();
        }
        self.failed = true;
        vec![error(
            error_kind::CONNECTION_CLOSED,
            "the stream ended before the protocol's end marker",
        )]
    }
}

/// A JSON object read as `T`, and nothing else: a derived struct would also take an array of
/// its fields in order, where the tree reading finds no field in an array.
pub(crate) struct MapOnly<T>(pub(crate) T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for MapOnly<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Object<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        deserializer
            .deserialize_map(Object(PhantomData))
            .map(MapOnly)
    }
}

/// A non-empty string, owned.
pub(crate) fn plain_text(s: Option<Cow<'_, str>>) -> Option<String> {
    s.filter(|s| !s.is_empty()).map(Cow::into_owned)
}
