-- The rate and concurrency limits (spec/limits.md), decided in the unit of the call they govern:
-- the claim admits (`tollgate_limits_admit`), and the call's end gives back or corrects what it
-- counted (`tollgate_limits_end`), in the transaction of its transition. They are the rule of
-- `tollgate_core::limits` (`admit`, `end`), and a test compares the two on its boundary cases.
--
-- A subject's row of `limit_windows` is locked after every other row of the unit (the day spend
-- row included): it is the last lock of the crate's order. A unit with several subjects locks
-- them in ascending order of their stored text, so two units never wait for each other's.

-- The admission of one claim at `p_now` (the lease's "now": the caller's clock in tests, the
-- database's otherwise) under `p_limits`:
-- `{"charges": [{"subject": "consumer:…", "limits": {"in_flight": n, "requests": n,
-- "input_tokens": n, "output_tokens": n}}], "tokens": {"input": n, "output": n}}` (a kind left
-- out is not limited; the charges in the order their subjects are judged).
--
-- - Every subject's row is locked first (inserted as an empty window opening at `p_now` when
--   missing, which is what no window means), then each charge is judged, in order, on its
--   subject's window as it is now: one that closed (`p_now` at or past `started_at` + 60 s) is
--   read as an empty one opening at `p_now`, its calls in flight carried over. Kinds are judged
--   in_flight, requests, input_tokens, output_tokens; the first whose count would pass its limit
--   refuses.
-- - A refusal raises SQLSTATE `TG003` with the refusal as JSON in its detail (`subject`, `kind`,
--   `limit`, `used`, `asked`, `reset_ms`): the statement fails, so the unit writes nothing, and
--   the caller states it as `LimitRefused`.
-- - Admitted, every window counts the call (one request, its tokens, one call in flight), and the
--   function answers what the execution keeps for its end:
--   `{"windows": [{"subject": …, "started_at": …}], "tokens": {"input": n, "output": n}}`.
CREATE OR REPLACE FUNCTION tollgate_limits_admit(
    p_scope text,
    p_limits jsonb,
    p_now timestamptz
) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    s text;
    c jsonb;
    w limit_windows;
    windows limit_windows[] := '{}';
    kept jsonb := '[]'::jsonb;
    kind text;
    cap numeric;
    used numeric;
    asked numeric;
    reset_ms bigint;
    input numeric := COALESCE((p_limits -> 'tokens' ->> 'input')::numeric, 0);
    output numeric := COALESCE((p_limits -> 'tokens' ->> 'output')::numeric, 0);
    top constant numeric := 9223372036854775807;
BEGIN
    -- Every subject's row, locked in ascending order.
    FOR s IN SELECT DISTINCT x ->> 'subject' FROM jsonb_array_elements(p_limits -> 'charges') x
        ORDER BY 1 LOOP
        PERFORM 1 FROM limit_windows l WHERE l.scope = p_scope AND l.subject = s FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO limit_windows (scope, subject, started_at)
            VALUES (p_scope, s, p_now)
            ON CONFLICT DO NOTHING;
            PERFORM 1 FROM limit_windows l WHERE l.scope = p_scope AND l.subject = s FOR UPDATE;
        END IF;
    END LOOP;

    -- Each charge on its subject's window as it was before this claim.
    FOR c IN SELECT x FROM jsonb_array_elements(p_limits -> 'charges') WITH ORDINALITY AS t(x, n)
        ORDER BY n LOOP
        SELECT * INTO STRICT w FROM limit_windows l
        WHERE l.scope = p_scope AND l.subject = c ->> 'subject';
        IF p_now >= w.started_at + interval '60000 milliseconds' THEN
            w.started_at := p_now;
            w.requests := 0;
            w.input_tokens := 0;
            w.output_tokens := 0;
        END IF;
        FOREACH kind IN ARRAY ARRAY['in_flight', 'requests', 'input_tokens', 'output_tokens'] LOOP
            cap := (c -> 'limits' ->> kind)::numeric;
            CONTINUE WHEN cap IS NULL;
            used := CASE kind WHEN 'in_flight' THEN w.in_flight WHEN 'requests' THEN w.requests
                WHEN 'input_tokens' THEN w.input_tokens ELSE w.output_tokens END;
            asked := CASE kind WHEN 'input_tokens' THEN input WHEN 'output_tokens' THEN output
                ELSE 1 END;
            IF used + asked > cap THEN
                reset_ms := CASE WHEN kind = 'in_flight' THEN 1000 ELSE GREATEST(1, trunc(
                    extract(epoch FROM w.started_at + interval '60000 milliseconds' - p_now)
                    * 1000)::bigint) END;
                RAISE EXCEPTION USING
                    ERRCODE = 'TG003',
                    MESSAGE = 'a limit refuses the call',
                    DETAIL = jsonb_build_object('subject', c ->> 'subject', 'kind', kind,
                        'limit', cap, 'used', used, 'asked', asked, 'reset_ms', reset_ms)::text;
            END IF;
        END LOOP;
        w.requests := LEAST(w.requests + 1::numeric, top);
        w.input_tokens := LEAST(w.input_tokens + input, top);
        w.output_tokens := LEAST(w.output_tokens + output, top);
        w.in_flight := LEAST(w.in_flight + 1::numeric, top);
        windows := windows || w;
        kept := kept || jsonb_build_array(jsonb_build_object('subject', w.subject,
            'started_at', w.started_at));
    END LOOP;

    -- Admitted: every window counts the call.
    FOREACH w IN ARRAY windows LOOP
        UPDATE limit_windows l SET started_at = w.started_at, requests = w.requests,
            input_tokens = w.input_tokens, output_tokens = w.output_tokens,
            in_flight = w.in_flight
        WHERE l.scope = p_scope AND l.subject = w.subject;
    END LOOP;
    RETURN jsonb_build_object('windows', kept, 'tokens',
        jsonb_build_object('input', input, 'output', output));
END
$$;

-- The end of a call that `tollgate_limits_admit` counted (`p_limits`: what it answered, kept on
-- the execution), in the transaction of the call's transition, after its spend rows:
--
-- - `not_sent` (`not_dispatched`): a call in flight ends, and the window that counted the call
--   gives its request and tokens back;
-- - `parked` (`reconciliation_required`): a call in flight ends; the tokens stay as counted;
-- - `settled`: the window that counted the call is corrected from the tokens counted to
--   `p_input`/`p_output` (the settled usage); a call in flight ends when `p_from_flight` (it was
--   `dispatched` until now).
--
-- A window is the one that counted the call when its `started_at` is the one kept; a window that
-- has opened since is left as it is (the one that counted the call has been judged), but a call
-- in flight ends either way. No count goes below zero. A subject without a row is left alone.
CREATE OR REPLACE FUNCTION tollgate_limits_end(
    p_scope text,
    p_limits jsonb,
    p_end text,
    p_input bigint,
    p_output bigint,
    p_from_flight boolean
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    a record;
    held_input numeric := COALESCE((p_limits -> 'tokens' ->> 'input')::numeric, 0);
    held_output numeric := COALESCE((p_limits -> 'tokens' ->> 'output')::numeric, 0);
    settled boolean := p_end = 'settled';
    flight boolean := p_end IN ('not_sent', 'parked') OR (p_end = 'settled' AND p_from_flight);
    top constant numeric := 9223372036854775807;
BEGIN
    IF p_end NOT IN ('not_sent', 'parked', 'settled') THEN
        RAISE EXCEPTION 'unknown limit end %', p_end;
    END IF;
    -- One update per subject, in ascending order of the subjects.
    FOR a IN SELECT x ->> 'subject' AS subject, (x ->> 'started_at')::timestamptz AS started_at
        FROM jsonb_array_elements(p_limits -> 'windows') x ORDER BY 1 LOOP
        UPDATE limit_windows l SET
            in_flight = CASE WHEN flight THEN GREATEST(l.in_flight - 1, 0) ELSE l.in_flight END,
            requests = CASE WHEN p_end = 'not_sent' AND l.started_at = a.started_at
                THEN GREATEST(l.requests - 1, 0) ELSE l.requests END,
            input_tokens = CASE WHEN l.started_at <> a.started_at THEN l.input_tokens
                WHEN p_end = 'not_sent' THEN GREATEST(l.input_tokens - held_input, 0)
                WHEN settled THEN LEAST(GREATEST(l.input_tokens - held_input, 0) + p_input, top)
                ELSE l.input_tokens END,
            output_tokens = CASE WHEN l.started_at <> a.started_at THEN l.output_tokens
                WHEN p_end = 'not_sent' THEN GREATEST(l.output_tokens - held_output, 0)
                WHEN settled
                    THEN LEAST(GREATEST(l.output_tokens - held_output, 0) + p_output, top)
                ELSE l.output_tokens END
        WHERE l.scope = p_scope AND l.subject = a.subject;
    END LOOP;
END
$$;
