//! Step collector tests (ST-8, ST-9, ST-20..ST-24, RF-1, RF-2), unit and property based.
#![cfg(test)]

use proptest::prelude::*;
use serde_json::json;
use tollgate_core::collector::{
    Collected, Collector, CollectorLimits, Flow, LimitsError, RefusalProof, BLOCKS_MAX,
    MAX_REASONING_CHARS_CEILING,
};
use tollgate_core::event::ProviderEvent as E;
use tollgate_core::invalid::InvalidReason;
use tollgate_core::message::utf16_len;
use tollgate_core::step::{Block, Utf16Range};
use tollgate_core::usage::Usage;

const WIDE: CollectorLimits = CollectorLimits {
    max_output_chars: 100_000,
    max_reasoning_chars: 100_000,
    max_consecutive_reasoning: None,
};

fn collect_with(limits: CollectorLimits, events: Vec<E>) -> Collected {
    let mut c = Collector::new(limits).unwrap();
    for e in events {
        c.push(e);
    }
    c.finish()
}

fn collect(events: Vec<E>) -> Collected {
    collect_with(WIDE, events)
}

fn text(s: &str) -> E {
    E::TextDelta { text: s.into() }
}
fn reasoning(s: &str) -> E {
    E::ReasoningDelta { text: s.into() }
}
fn start(index: u32, name: &str) -> E {
    E::ToolCallStart {
        index,
        id: format!("call_{index}"),
        name: name.into(),
    }
}
fn args(index: u32, delta: &str) -> E {
    E::ToolCallArgsDelta {
        index,
        delta: delta.into(),
    }
}
fn stop(reason: &str) -> E {
    E::Stop {
        reason: reason.into(),
    }
}
fn pref() -> E {
    E::ProviderRef { id: "msg_1".into() }
}
fn usage(input: u64, output: u64, terminal: bool) -> E {
    E::Usage {
        usage: Usage {
            input,
            output,
            ..Usage::ZERO
        },
        terminal,
    }
}

/// `s[range]` in UTF-16 code units.
fn utf16_slice(s: &str, range: Utf16Range) -> String {
    let units: Vec<u16> = s.encode_utf16().collect();
    String::from_utf16(&units[range.start as usize..range.end as usize]).unwrap()
}

#[test]
fn st_21_limits_above_the_reasoning_ceiling_are_rejected() {
    let limits = CollectorLimits {
        max_reasoning_chars: MAX_REASONING_CHARS_CEILING + 1,
        ..WIDE
    };
    assert_eq!(
        Collector::new(limits).err(),
        Some(LimitsError::ReasoningCharsTooLarge)
    );
    let at_ceiling = CollectorLimits {
        max_reasoning_chars: MAX_REASONING_CHARS_CEILING,
        ..WIDE
    };
    assert!(Collector::new(at_ceiling).is_ok());
}

#[test]
fn st_8_adjacent_text_deltas_concatenate_with_utf16_ranges() {
    let c = collect(vec![
        pref(),
        text("a😀"),
        text("𝄞b"),
        reasoning("hmm"),
        text("é😀"),
        stop("end_turn"),
        E::Done,
    ]);
    let s = &c.step;
    assert_eq!(s.text, "a😀𝄞bé😀");
    assert_eq!(s.blocks.len(), 3);
    match &s.blocks[0] {
        Block::Text { order, text, range } => {
            assert_eq!(*order, 0);
            assert_eq!(text, "a😀𝄞b");
            assert_eq!(*range, Utf16Range { start: 0, end: 6 });
            assert_eq!(utf16_slice(&s.text, *range), *text);
        }
        other => panic!("expected text, got {other:?}"),
    }
    match &s.blocks[2] {
        Block::Text { order, text, range } => {
            assert_eq!(*order, 2);
            assert_eq!(text, "é😀");
            assert_eq!(*range, Utf16Range { start: 6, end: 9 });
            assert_eq!(utf16_slice(&s.text, *range), *text);
        }
        other => panic!("expected text, got {other:?}"),
    }
    assert_eq!(s.stop.as_deref(), Some("end_turn"));
    assert_eq!(c.invalid_reason, None);
    assert_eq!(c.refusal, None);
}

#[test]
fn st_8_order_index_preserves_interleaving() {
    let c = collect(vec![
        reasoning("think"),
        E::ReasoningSignature {
            signature: "sig".into(),
        },
        text("Let me call two tools."),
        start(0, "alpha"),
        start(1, "beta"),
        args(1, "{\"b\":"),
        args(0, "{\"a\":"),
        args(0, "1}"),
        args(1, "2}"),
        E::ToolCallEnd { index: 1 },
        E::ProviderBlock {
            block: json!({"type": "server_tool_use", "id": "x"}),
        },
        E::ReasoningOpaque {
            data: "ENCRYPTED".into(),
        },
        E::RefusalDelta { text: "no".into() },
        E::RefusalDelta { text: "pe".into() },
        stop("tool_calls"),
        E::Done,
    ]);
    let s = &c.step;
    let orders: Vec<u32> = s.blocks.iter().map(Block::order).collect();
    assert_eq!(orders, (0..7).collect::<Vec<_>>());
    assert!(
        matches!(&s.blocks[0], Block::Reasoning { text: Some(t), signature: Some(g), opaque: None, .. } if t == "think" && g == "sig")
    );
    assert!(matches!(&s.blocks[1], Block::Text { .. }));
    assert!(matches!(&s.blocks[2], Block::ToolCall { call, .. } if call.name == "alpha"));
    assert!(matches!(&s.blocks[3], Block::ToolCall { call, .. } if call.name == "beta"));
    assert!(matches!(&s.blocks[4], Block::Provider { .. }));
    assert!(
        matches!(&s.blocks[5], Block::Reasoning { opaque: Some(d), text: None, .. } if d == "ENCRYPTED")
    );
    assert!(matches!(&s.blocks[6], Block::Refusal { text, .. } if text == "nope"));
    assert_eq!(s.tool_calls.len(), 2);
    assert_eq!(s.tool_calls[0].input, json!({"a": 1}));
    assert_eq!(s.tool_calls[1].input, json!({"b": 2}));
    assert!(!s.tool_calls[0].malformed && !s.tool_calls[1].malformed);
    assert_eq!(s.reasoning, vec![s.blocks[0].clone(), s.blocks[5].clone()]);
    assert_eq!(s.provider_blocks, vec![s.blocks[4].clone()]);
    assert_eq!(c.invalid_reason, None);
}

#[test]
fn st_8_signed_reasoning_closes_the_block() {
    let c = collect(vec![
        reasoning("one"),
        E::ReasoningSignature {
            signature: "s1".into(),
        },
        reasoning("two"),
        E::ReasoningSignature {
            signature: "s2".into(),
        },
    ]);
    assert_eq!(c.step.reasoning.len(), 2);
    assert!(
        matches!(&c.step.blocks[1], Block::Reasoning { order: 1, text: Some(t), signature: Some(s), .. } if t == "two" && s == "s2")
    );
}

#[test]
fn st_9_malformed_tool_args_are_empty_and_flagged_without_raw_text() {
    let raw = "{\"city\": SECRET-RAW-ARGS";
    let c = collect(vec![
        start(0, "lookup"),
        args(0, &raw[..10]),
        args(0, &raw[10..]),
        E::ToolCallEnd { index: 0 },
        start(1, "list"),
        args(1, "[1,2]"),
        start(2, "empty"),
        stop("tool_calls"),
        E::Done,
    ]);
    let calls = &c.step.tool_calls;
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[0].input, json!({}));
    assert!(calls[0].malformed);
    // A JSON value that is not an object is malformed too.
    assert_eq!(calls[1].input, json!({}));
    assert!(calls[1].malformed);
    // No arguments at all mean `{}`, not malformed.
    assert_eq!(calls[2].input, json!({}));
    assert!(!calls[2].malformed);
    let stored = serde_json::to_string(&c.step).unwrap();
    assert!(!stored.contains("SECRET-RAW-ARGS"));
    assert!(!stored.contains("[1,2]"));
    // Malformed arguments alone are flagged per call, not an invalid step.
    assert_eq!(c.invalid_reason, None);
}

#[test]
fn st_9_arguments_cut_by_the_output_limit_are_malformed() {
    let limits = CollectorLimits {
        max_output_chars: 4,
        ..WIDE
    };
    let c = collect_with(
        limits,
        vec![
            start(0, "f"),
            args(0, "{}"),
            args(0, "    "),
            E::ToolCallEnd { index: 0 },
        ],
    );
    assert_eq!(c.invalid_reason, Some(InvalidReason::OutputChars));
    assert!(c.step.tool_calls[0].malformed);
    assert_eq!(c.step.tool_calls[0].input, json!({}));
}

#[test]
fn st_20_first_invalid_reason_wins() {
    let limits = CollectorLimits {
        max_output_chars: 3,
        ..WIDE
    };
    let c = collect_with(
        limits,
        vec![
            args(7, "{}"),
            text("too long"),
            stop("stop"),
            stop("stop"),
            text("after"),
        ],
    );
    assert_eq!(c.invalid_reason, Some(InvalidReason::ToolCall));

    let c = collect_with(
        limits,
        vec![text("too long"), args(7, "{}"), stop("a"), stop("b")],
    );
    assert_eq!(c.invalid_reason, Some(InvalidReason::OutputChars));

    let c = collect(vec![stop("a"), stop("b"), text("x")]);
    assert_eq!(c.invalid_reason, Some(InvalidReason::StopConflict));
    assert_eq!(c.step.stop.as_deref(), Some("a"));
}

#[test]
fn st_20_each_check_names_its_reason() {
    let cases: Vec<(Vec<E>, InvalidReason)> = vec![
        (vec![start(0, "f"), start(0, "g")], InvalidReason::ToolCall),
        (vec![start(0, "")], InvalidReason::ToolCall),
        (vec![E::ToolCallEnd { index: 3 }], InvalidReason::ToolCall),
        (
            vec![start(0, "f"), E::ToolCallEnd { index: 0 }, args(0, "{}")],
            InvalidReason::ToolCall,
        ),
        (
            vec![stop("end_turn"), stop("end_turn")],
            InvalidReason::StopConflict,
        ),
        (
            vec![stop("end_turn"), text("late")],
            InvalidReason::EventType,
        ),
        (vec![E::Done, text("late")], InvalidReason::EventType),
        (vec![E::Done, stop("late")], InvalidReason::EventType),
        (
            vec![E::ProviderBlock {
                block: json!("not an object"),
            }],
            InvalidReason::BlockMalformed,
        ),
    ];
    for (events, reason) in cases {
        let c = collect(events.clone());
        assert_eq!(c.invalid_reason, Some(reason), "{events:?}");
    }
}

#[test]
fn st_20_usage_and_end_after_stop_are_allowed() {
    let c = collect(vec![
        pref(),
        text("hi"),
        start(0, "f"),
        stop("tool_calls"),
        E::ToolCallEnd { index: 0 },
        usage(3, 4, true),
        E::Done,
    ]);
    assert_eq!(c.invalid_reason, None);
    assert_eq!(c.terminal_usage().map(|u| u.output), Some(4));
}

#[test]
fn st_20_blocks_past_the_maximum_are_block_malformed() {
    let mut c = Collector::new(WIDE).unwrap();
    for i in 0..=BLOCKS_MAX {
        // Alternate kinds so that every event opens a new block.
        if i % 2 == 0 {
            c.push(text("t"));
        } else {
            c.push(E::RefusalDelta { text: "r".into() });
        }
    }
    let out = c.finish();
    assert_eq!(out.step.blocks.len(), BLOCKS_MAX);
    assert_eq!(out.invalid_reason, Some(InvalidReason::BlockMalformed));
}

#[test]
fn st_21_output_limit_counts_text_refusal_tool_and_provider_json() {
    let block = json!({"type": "x"});
    let block_len = utf16_len(&block.to_string());
    let budget = 2 + 2 + 2 + block_len;
    let events = vec![
        text("ab"),
        E::RefusalDelta { text: "cd".into() },
        start(0, "f"),
        args(0, "{}"),
        E::ProviderBlock { block },
    ];
    let exact = CollectorLimits {
        max_output_chars: budget,
        ..WIDE
    };
    assert_eq!(collect_with(exact, events.clone()).invalid_reason, None);
    let short = CollectorLimits {
        max_output_chars: budget - 1,
        ..WIDE
    };
    assert_eq!(
        collect_with(short, events).invalid_reason,
        Some(InvalidReason::OutputChars)
    );
}

#[test]
fn st_21_output_limit_counts_utf16_units() {
    let limits = CollectorLimits {
        max_output_chars: 3,
        ..WIDE
    };
    // "😀😀" is 2 chars but 4 UTF-16 code units.
    let c = collect_with(limits, vec![text("😀😀")]);
    assert_eq!(c.invalid_reason, Some(InvalidReason::OutputChars));
    assert_eq!(c.step.text, "");
}

#[test]
fn st_21_reasoning_counts_toward_reasoning_chars_not_output() {
    let limits = CollectorLimits {
        max_output_chars: 2,
        max_reasoning_chars: 10,
        max_consecutive_reasoning: None,
    };
    let c = collect_with(
        limits,
        vec![
            reasoning("12345"),
            E::ReasoningSignature {
                signature: "67890".into(),
            },
            text("ok"),
        ],
    );
    assert_eq!(c.invalid_reason, None);
    let c = collect_with(limits, vec![reasoning("12345"), reasoning("678901")]);
    assert_eq!(c.invalid_reason, Some(InvalidReason::ReasoningChars));
    // Content past the limit is dropped.
    assert!(matches!(&c.step.reasoning[0], Block::Reasoning { text: Some(t), .. } if t == "12345"));
}

#[test]
fn st_21_encrypted_content_counts_toward_reasoning_chars() {
    let limits = CollectorLimits {
        max_output_chars: 100,
        max_reasoning_chars: 8,
        max_consecutive_reasoning: None,
    };
    let c = collect_with(
        limits,
        vec![E::ReasoningOpaque {
            data: "gAAAAABencrypted".into(),
        }],
    );
    assert_eq!(c.invalid_reason, Some(InvalidReason::ReasoningChars));
    assert!(c.step.reasoning.is_empty());
    let c = collect_with(
        limits,
        vec![E::ReasoningOpaque {
            data: "gAAAAAB".into(),
        }],
    );
    assert_eq!(c.invalid_reason, None);
    assert_eq!(c.step.reasoning.len(), 1);
}

#[test]
fn st_22_reasoning_loop_stops_at_first_event_past_limit() {
    let limits = CollectorLimits {
        max_consecutive_reasoning: Some(3),
        ..WIDE
    };
    let mut c = Collector::new(limits).unwrap();
    // Text and tool calls reset the count.
    for e in [
        reasoning("a"),
        reasoning("b"),
        reasoning("c"),
        text("t"),
        reasoning("d"),
        reasoning("e"),
        reasoning("f"),
        start(0, "f"),
        reasoning("g"),
        reasoning("h"),
        reasoning("i"),
        args(0, "{}"),
        reasoning("j"),
        E::ReasoningSignature {
            signature: "s".into(),
        },
        E::ReasoningOpaque { data: "o".into() },
    ] {
        assert_eq!(c.push(e), Flow::Continue);
    }
    assert_eq!(c.push(reasoning("k")), Flow::Stop);
    assert!(c.stopped_early());
    // Everything afterwards is ignored.
    assert_eq!(c.push(text("late")), Flow::Stop);
    assert_eq!(c.push(usage(1, 1, true)), Flow::Stop);
    assert_eq!(c.push(E::Done), Flow::Stop);
    let out = c.finish();
    assert_eq!(out.invalid_reason, Some(InvalidReason::ReasoningLoop));
    assert!(out.stopped_early);
    assert!(!out.done);
    assert_eq!(out.usage, None);
    assert!(!out.step.text.contains("late"));
    assert!(!serde_json::to_string(&out.step).unwrap().contains("\"k\""));
}

#[test]
fn st_22_loop_stops_reading_even_after_another_invalid_reason() {
    let limits = CollectorLimits {
        max_output_chars: 0,
        max_reasoning_chars: 100,
        max_consecutive_reasoning: Some(1),
    };
    let mut c = Collector::new(limits).unwrap();
    assert_eq!(c.push(text("x")), Flow::Continue);
    assert_eq!(c.push(reasoning("a")), Flow::Continue);
    assert_eq!(c.push(reasoning("b")), Flow::Stop);
    assert_eq!(c.finish().invalid_reason, Some(InvalidReason::OutputChars));
}

#[test]
fn st_23_usage_before_cut_is_kept() {
    let c = collect(vec![
        pref(),
        usage(10, 1, false),
        text("partial"),
        usage(10, 7, true),
        E::Error {
            kind: "connection_closed".into(),
            message: "closed".into(),
        },
    ]);
    assert!(c.usage_terminal);
    assert_eq!(c.terminal_usage().map(|u| u.output), Some(7));
    assert_eq!(
        c.stream_error.as_ref().map(|e| e.kind.as_str()),
        Some("connection_closed")
    );
    assert!(!c.done);
    assert_eq!(c.refusal, None);
}

#[test]
fn st_23_cut_before_usage_has_no_terminal_usage() {
    let c = collect(vec![
        pref(),
        usage(10, 1, false),
        text("partial"),
        E::Error {
            kind: "connection_closed".into(),
            message: "closed".into(),
        },
        E::Error {
            kind: "second".into(),
            message: "ignored".into(),
        },
    ]);
    assert!(!c.usage_terminal);
    assert_eq!(c.terminal_usage(), None);
    assert_eq!(c.usage.map(|u| u.input), Some(10));
    assert_eq!(
        c.stream_error.as_ref().map(|e| e.kind.as_str()),
        Some("connection_closed")
    );
}

#[test]
fn st_23_last_usage_replaces_earlier_ones() {
    let c = collect(vec![usage(1, 1, true), usage(2, 2, false)]);
    assert_eq!(c.usage.map(|u| u.input), Some(2));
    assert!(!c.usage_terminal);
}

#[test]
fn st_23_first_provider_ref_wins() {
    let c = collect(vec![
        E::ProviderRef { id: "req_1".into() },
        E::ProviderRef { id: "msg_2".into() },
    ]);
    assert_eq!(c.provider_ref.as_deref(), Some("req_1"));
}

fn empty_refusal() -> Vec<E> {
    vec![
        pref(),
        usage(20, 0, false),
        stop("refusal"),
        usage(20, 0, true),
        E::Done,
    ]
}

#[test]
fn rf_1_empty_refusal_proof() {
    let c = collect(empty_refusal());
    assert_eq!(c.refusal, Some(RefusalProof::EmptyRefusal));
    assert_eq!(c.step.stop.as_deref(), Some("refusal"));
    // An empty text delta (Anthropic's empty text block) carries no content.
    let mut events = empty_refusal();
    events.insert(1, text(""));
    assert_eq!(collect(events).refusal, Some(RefusalProof::EmptyRefusal));
}

#[test]
fn rf_1_whitespace_invalidates_empty_refusal() {
    for content in [
        text(" "),
        text("\n"),
        E::RefusalDelta { text: " ".into() },
        reasoning("."),
        start(0, "f"),
        E::ProviderBlock {
            block: json!({"type": "x"}),
        },
    ] {
        let mut events = empty_refusal();
        events.insert(1, content.clone());
        assert_eq!(collect(events).refusal, None, "{content:?}");
    }
}

#[test]
fn rf_1_missing_provider_ref_invalidates() {
    let events: Vec<E> = empty_refusal().into_iter().skip(1).collect();
    assert_eq!(collect(events).refusal, None);
}

#[test]
fn rf_1_duplicate_stop_invalidates() {
    let mut events = empty_refusal();
    events.insert(3, stop("refusal"));
    let c = collect(events);
    assert_eq!(c.refusal, None);
    assert_eq!(c.invalid_reason, Some(InvalidReason::StopConflict));
    let mut events = empty_refusal();
    events.insert(3, stop("end_turn"));
    assert_eq!(collect(events).refusal, None);
}

#[test]
fn rf_1_other_stops_stream_failures_and_missing_end_invalidate() {
    let mut events = empty_refusal();
    events[2] = stop("end_turn");
    assert_eq!(collect(events).refusal, None);
    let mut events = empty_refusal();
    events.insert(
        4,
        E::Error {
            kind: "overloaded_error".into(),
            message: "m".into(),
        },
    );
    assert_eq!(collect(events).refusal, None);
    let mut events = empty_refusal();
    events.pop();
    assert_eq!(collect(events).refusal, None);
}

#[test]
fn rf_2_prestream_refusal_proof() {
    let c = collect(vec![pref(), E::Done]);
    assert_eq!(c.refusal, Some(RefusalProof::PreStream));
    assert_eq!(c.step.stop, None);
    let c = collect(vec![pref(), usage(0, 0, false), usage(0, 0, true), E::Done]);
    assert_eq!(c.refusal, Some(RefusalProof::PreStream));
}

#[test]
fn rf_2_stream_failure_is_not_a_refusal() {
    let failure = E::Error {
        kind: "connection_closed".into(),
        message: "closed".into(),
    };
    assert_eq!(collect(vec![pref(), failure.clone()]).refusal, None);
    assert_eq!(collect(vec![pref(), failure, E::Done]).refusal, None);
    // Any other evidence means unknown usage, not a refusal.
    assert_eq!(collect(vec![pref()]).refusal, None);
    assert_eq!(collect(vec![E::Done]).refusal, None);
    assert_eq!(
        collect(vec![pref(), usage(5, 0, true), E::Done]).refusal,
        None
    );
    assert_eq!(collect(vec![pref(), stop("stop"), E::Done]).refusal, None);
    assert_eq!(collect(vec![pref(), text(" "), E::Done]).refusal, None);
}

// ---------------------------------------------------------------------------------------------
// Properties over random event sequences.

fn piece() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "", " ", "a", "bc", "😀", "𝄞x", "é", "{", "}", "{}", "\"k\":1", "zz",
    ])
    .prop_map(String::from)
}

fn event() -> impl Strategy<Value = E> {
    prop_oneof![
        4 => piece().prop_map(|text| E::TextDelta { text }),
        1 => piece().prop_map(|text| E::RefusalDelta { text }),
        3 => piece().prop_map(|text| E::ReasoningDelta { text }),
        1 => piece().prop_map(|signature| E::ReasoningSignature { signature }),
        1 => piece().prop_map(|data| E::ReasoningOpaque { data }),
        2 => (0u32..3, prop::sample::select(vec!["", "f", "g"])).prop_map(|(index, name)| {
            E::ToolCallStart { index, id: format!("c{index}"), name: name.into() }
        }),
        3 => (0u32..3, piece()).prop_map(|(index, delta)| E::ToolCallArgsDelta { index, delta }),
        1 => (0u32..3).prop_map(|index| E::ToolCallEnd { index }),
        1 => prop_oneof![Just(json!({"type": "x"})), Just(json!([1]))]
            .prop_map(|block| E::ProviderBlock { block }),
        1 => prop::sample::select(vec!["stop", "refusal"]).prop_map(|r| E::Stop { reason: r.into() }),
        1 => (0u64..3, any::<bool>()).prop_map(|(n, terminal)| E::Usage {
            usage: Usage { input: n, ..Usage::ZERO },
            terminal,
        }),
        1 => Just(E::ProviderRef { id: "r".into() }),
        1 => Just(E::Error { kind: "k".into(), message: "m".into() }),
        1 => Just(E::Done),
    ]
}

fn limits() -> impl Strategy<Value = CollectorLimits> {
    (0u64..40, 0u64..40, prop::option::of(0u32..6)).prop_map(|(o, r, n)| CollectorLimits {
        max_output_chars: o,
        max_reasoning_chars: r,
        max_consecutive_reasoning: n,
    })
}

fn run_checked(limits: CollectorLimits, events: &[E]) -> (Collected, Option<usize>) {
    let mut c = Collector::new(limits).unwrap();
    let mut stopped_at = None;
    let mut first_reason = None;
    for (i, e) in events.iter().enumerate() {
        let flow = c.push(e.clone());
        if stopped_at.is_some() {
            assert_eq!(flow, Flow::Stop);
        } else if flow == Flow::Stop {
            stopped_at = Some(i);
        }
        // The invalid reason never changes once set.
        if first_reason.is_some() {
            assert_eq!(c.invalid_reason(), first_reason);
        }
        first_reason = c.invalid_reason();
    }
    (c.finish(), stopped_at)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn st_8_property_orders_are_contiguous_and_copies_follow_block_order(
        limits in limits(), events in prop::collection::vec(event(), 0..40)
    ) {
        let (c, _) = run_checked(limits, &events);
        let s = &c.step;
        let orders: Vec<u32> = s.blocks.iter().map(Block::order).collect();
        prop_assert_eq!(orders, (0..s.blocks.len() as u32).collect::<Vec<_>>());
        let calls: Vec<_> = s.blocks.iter().filter_map(|b| match b {
            Block::ToolCall { call, .. } => Some(call.clone()),
            _ => None,
        }).collect();
        prop_assert_eq!(&s.tool_calls, &calls);
        let reasoning: Vec<_> = s.blocks.iter().filter(|b| matches!(b, Block::Reasoning { .. })).cloned().collect();
        prop_assert_eq!(&s.reasoning, &reasoning);
        let provider: Vec<_> = s.blocks.iter().filter(|b| matches!(b, Block::Provider { .. })).cloned().collect();
        prop_assert_eq!(&s.provider_blocks, &provider);
        // No two adjacent text blocks, no empty blocks.
        for pair in s.blocks.windows(2) {
            let both_text =
                matches!(pair[0], Block::Text { .. }) && matches!(pair[1], Block::Text { .. });
            let both_refusal =
                matches!(pair[0], Block::Refusal { .. }) && matches!(pair[1], Block::Refusal { .. });
            prop_assert!(!both_text, "adjacent text blocks");
            prop_assert!(!both_refusal, "adjacent refusal blocks");
        }
    }

    #[test]
    fn st_8_property_text_ranges_slice_step_text(
        limits in limits(), events in prop::collection::vec(event(), 0..40)
    ) {
        let (c, _) = run_checked(limits, &events);
        let s = &c.step;
        let mut joined = String::new();
        let mut cursor = 0u64;
        for b in &s.blocks {
            if let Block::Text { text, range, .. } = b {
                prop_assert!(!text.is_empty());
                prop_assert_eq!(range.start, cursor);
                prop_assert_eq!(range.end - range.start, utf16_len(text));
                prop_assert_eq!(&utf16_slice(&s.text, *range), text);
                cursor = range.end;
                joined.push_str(text);
            }
        }
        prop_assert_eq!(&joined, &s.text);
    }

    #[test]
    fn st_21_property_kept_content_never_exceeds_the_limits(
        limits in limits(), events in prop::collection::vec(event(), 0..40)
    ) {
        let (c, _) = run_checked(limits, &events);
        let mut output = 0u64;
        let mut reasoning = 0u64;
        for b in &c.step.blocks {
            match b {
                Block::Text { text, .. } | Block::Refusal { text, .. } => output += utf16_len(text),
                Block::Provider { block, .. } => output += utf16_len(&block.to_string()),
                Block::Reasoning { text, opaque, signature, .. } => {
                    for part in [text, opaque, signature].into_iter().flatten() {
                        reasoning += utf16_len(part);
                    }
                }
                Block::ToolCall { .. } => {}
            }
        }
        prop_assert!(output <= limits.max_output_chars);
        prop_assert!(reasoning <= limits.max_reasoning_chars);
        if output > 0 || reasoning > 0 {
            prop_assert_eq!(c.refusal, None);
        }
    }

    #[test]
    fn st_9_property_malformed_calls_carry_empty_input(
        limits in limits(), events in prop::collection::vec(event(), 0..40)
    ) {
        let (c, _) = run_checked(limits, &events);
        for call in &c.step.tool_calls {
            prop_assert!(call.input.is_object());
            if call.malformed {
                prop_assert_eq!(&call.input, &json!({}));
            }
            prop_assert!(!call.name.is_empty());
        }
    }

    #[test]
    fn st_22_property_pushing_after_stop_changes_nothing(
        limits in limits(), events in prop::collection::vec(event(), 0..40)
    ) {
        let (full, stopped_at) = run_checked(limits, &events);
        prop_assert_eq!(full.stopped_early, stopped_at.is_some());
        if let Some(i) = stopped_at {
            let (prefix, _) = run_checked(limits, &events[..=i]);
            prop_assert_eq!(&full, &prefix);
            prop_assert_eq!(full.invalid_reason.is_some(), true);
        }
    }

    #[test]
    fn rf_property_refusal_proof_needs_clean_empty_evidence(
        limits in limits(), events in prop::collection::vec(event(), 0..40)
    ) {
        let (c, _) = run_checked(limits, &events);
        if let Some(proof) = c.refusal {
            prop_assert!(c.step.blocks.is_empty());
            prop_assert!(c.step.text.is_empty());
            prop_assert!(c.provider_ref.is_some());
            prop_assert!(c.done);
            prop_assert!(c.stream_error.is_none());
            prop_assert!(c.invalid_reason.is_none());
            match proof {
                RefusalProof::PreStream => {
                    prop_assert_eq!(c.step.stop, None);
                    prop_assert!(c.usage.is_none_or(|u| u.is_zero()));
                }
                RefusalProof::EmptyRefusal => {
                    prop_assert_eq!(c.step.stop.as_deref(), Some("refusal"));
                }
            }
        }
    }
}

#[test]
fn st_24_reading_continues_after_a_rejection_to_collect_usage() {
    let limits = CollectorLimits {
        max_output_chars: 2,
        ..WIDE
    };
    let mut c = Collector::new(limits).unwrap();
    for e in [
        pref(),
        text("abc"),
        text("d"),
        stop("length"),
        usage(4, 9, true),
    ] {
        assert_eq!(c.push(e), Flow::Continue);
    }
    assert_eq!(c.push(E::Done), Flow::Continue);
    let out = c.finish();
    assert_eq!(out.invalid_reason, Some(InvalidReason::OutputChars));
    // Content past the limit is dropped, later events are still recorded.
    assert_eq!(out.step.text, "");
    assert_eq!(out.step.stop.as_deref(), Some("length"));
    assert_eq!(out.terminal_usage().map(|u| u.output), Some(9));
    assert!(out.done);
    assert!(!out.stopped_early);
}
