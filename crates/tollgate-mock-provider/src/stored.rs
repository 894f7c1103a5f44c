//! Responses the mock keeps for `GET /v1/responses/{id}` (OpenAI Responses with `store: true`):
//! the final response object as the provider would hold it once finished — its id, status and
//! usage, with no output (the mock keeps no content). A stream cut on the wire does not stop the
//! provider: its stored response is finished and carries its usage.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

/// Responses kept at most; the oldest is forgotten first.
pub const STORED_RESPONSES_MAX: usize = 100_000;

#[derive(Debug, Default)]
struct Kept {
    by_id: HashMap<String, Value>,
    order: VecDeque<String>,
}

/// The kept responses, shared by the server's tasks.
#[derive(Debug, Clone, Default)]
pub(crate) struct StoredResponses(Arc<Mutex<Kept>>);

impl StoredResponses {
    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `response` under `id`.
    pub(crate) fn put(&self, id: &str, response: Value) {
        let mut kept = self.kept();
        if kept.by_id.insert(id.to_string(), response).is_none() {
            kept.order.push_back(id.to_string());
        }
        while kept.order.len() > STORED_RESPONSES_MAX {
            if let Some(old) = kept.order.pop_front() {
                kept.by_id.remove(&old);
            }
        }
    }

    /// The response kept under `id`.
    pub(crate) fn get(&self, id: &str) -> Option<Value> {
        self.kept().by_id.get(id).cloned()
    }

    /// Forgets every response.
    pub(crate) fn clear(&self) {
        *self.kept() = Kept::default();
    }
}
