//! What a simulated world holds: two scopes, two consumers with small block caps,
//! and the four kinds of call (text, json, structured, governed step) with their snapshots.

use tollgate_core::caps::Caps;
use tollgate_core::config::{fixtures, CallConfig, OutputContract};
use tollgate_core::ids::{ConsumerId, Intent, Scope, SessionId};
use tollgate_core::message::{ToolChoice, ToolSpec};
use tollgate_core::money::Money;
use tollgate_core::state::CallKind;

/// Tenants.
pub const SCOPES: [&str; 2] = ["acme", "globex"];
/// Consumers charged.
pub const CONSUMERS: [&str; 2] = ["team-a", "team-b"];
/// Intents: the first is the usual one, the second makes a conflicting binding.
pub const INTENTS: [&str; 2] = ["summarize", "summarize-v2"];
/// The lease a scheduler takes when it recovers an execution.
pub const RECOVERY_LEASE_MS: u64 = 30_000;

/// The four kinds of call the simulation makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `SingleCallRunner`, text.
    Text,
    /// `SingleCallRunner`, json with a schema.
    Json,
    /// `StructuredCallRunner` (owns its root).
    Structured,
    /// `GovernedStepRunner` under a root the driver opened.
    Step,
}

impl Kind {
    /// Short name for the trace.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Text => "text",
            Kind::Json => "json",
            Kind::Structured => "structured",
            Kind::Step => "step",
        }
    }

    /// Whether the kind's answer is a tool call.
    pub fn uses_tools(self) -> bool {
        matches!(self, Kind::Structured | Kind::Step)
    }
}

fn m(s: &str) -> Money {
    Money::parse(s, "sim").unwrap()
}

/// The caps of a consumer: every snapshot of the consumer carries the same ones, so one block
/// level holds for its spend rows whatever kind of call wrote them. The levels are a few
/// worst-case holds, small enough to be hit by concurrent calls.
pub fn caps(consumer: usize) -> Caps {
    let mut caps = Caps::default();
    if consumer == 0 {
        caps.daily_block = Some(m("0.1"));
        caps.daily_warn = Some(m("0.05"));
    } else {
        caps.session_block = Some(m("0.03"));
        caps.daily_block = Some(m("0.15"));
    }
    caps
}

/// Root block cap of governed steps.
pub fn root_block() -> Money {
    m("0.025")
}

fn weather() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Weather by city".into(),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {"city": {"type": "string"}}
        }),
    }
}

/// The snapshot of `kind` for `consumer`.
pub fn config(kind: Kind, consumer: usize) -> CallConfig {
    let mut c = fixtures::text_config();
    c.consumer = ConsumerId::parse(CONSUMERS[consumer]).unwrap();
    c.caps = caps(consumer);
    match kind {
        Kind::Text => {}
        Kind::Json => {
            c.kind = CallKind::Json;
            c.output = Some(OutputContract {
                name: "answer".into(),
                schema: serde_json::json!({
                    "type": "object",
                    "required": ["answer", "ok"],
                    "properties": {"answer": {"type": "string"}, "ok": {"type": "boolean"}}
                }),
            });
        }
        Kind::Structured => {
            c.kind = CallKind::Structured;
            c.tools = vec![weather()];
            c.tool_choice = Some(ToolChoice::Tool {
                name: "get_weather".into(),
            });
        }
        Kind::Step => {
            c.kind = CallKind::Step;
            c.tools = vec![weather()];
            c.caps.root_block = Some(root_block());
        }
    }
    c
}

/// Parsed ids.
/// The one currency of every profile in the universe (the fixtures' price table's).
pub fn currency() -> tollgate_core::money::Currency {
    fixtures::text_config().currency
}

pub fn scope(i: usize) -> Scope {
    Scope::parse(SCOPES[i]).unwrap()
}

/// Parsed ids.
pub fn intent(i: usize) -> Intent {
    Intent::parse(INTENTS[i]).unwrap()
}

/// Ids parsed from the names the model keeps.
pub trait Id: Sized {
    /// Parses `s`, which the simulation made.
    fn id(s: &str) -> Self;
}

macro_rules! ids {
    ($($t:ty),*) => {
        $(impl Id for $t {
            fn id(s: &str) -> Self {
                <$t>::parse(s).unwrap()
            }
        })*
    };
}

ids!(
    Scope,
    ConsumerId,
    SessionId,
    tollgate_core::ids::RootKey,
    tollgate_core::ids::OperationKey
);

/// Parses an id the simulation made.
pub fn id<T: Id>(s: &str) -> T {
    T::id(s)
}
