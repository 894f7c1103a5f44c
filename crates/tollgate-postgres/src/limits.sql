-- The rate and concurrency limits (spec/limits.md), decided in the unit of the call they govern:
-- the claim admits (`tollgate_limits_admit`), and the call's end gives back or corrects what it
-- counted (`tollgate_limits_end`), in the transaction of its transition. They are the rule of
-- `tollgate_core::limits` (`admit`, `end`), and a test compares the two on its boundary cases.
--
-- A subject's row of `limit_windows` is locked after every other row of the unit (the day spend
-- row included): it is the last lock of the crate's order. A unit with several subjects locks
-- them in ascending order of their stored text, so two units never wait for each other's.

-- The admission of one claim at `p_now` (the lease's "now": the caller's clock in tests, the
-- database's otherwise; the execution keeps it as `admitted_at`) under `p_limits`:
-- `{"subjects": ["consumer:…", "key:…"], "limits": [{"in_flight": n, "requests": n,
-- "input_tokens": n, "output_tokens": n}, …], "tokens": {"input": n, "output": n}}` (each
-- subject's limits at its place in `limits`; a kind left out is not limited; one entry per
-- subject). The execution keeps it without `limits` and with `admitted_at`: what its end needs.
--
-- - Each subject, in ascending order of its stored text, is one upsert of its row that counts the
--   call (one request, its tokens, one call in flight) on its window as it is now: a missing row
--   is an empty window opening at `p_now`, and a window that closed (`p_now` at or past
--   `started_at` + 60 s) restarts at `p_now` with zero counts, its calls in flight carried over.
--   The upsert answers the counts after it, so one statement locks, judges and writes the row.
-- - The subject's limits then judge those counts, kinds in the order in_flight, requests,
--   input_tokens, output_tokens: the call passes a limit when the count after it does (what was
--   used is the count after less what the call asks). Counts stop at bigint's top, which no
--   limit reaches.
-- - A refusal raises SQLSTATE `TG003` with the refusal as JSON in its detail (`subject`, `kind`,
--   `limit`, `used`, `asked`, `reset_ms`): the statement fails, so the unit writes nothing (the
--   upserts are undone with it), and the caller states it as `LimitRefused`.
-- - The function runs no query but the upserts (and, for several subjects, the one that orders
--   them): it is in the claim of every limited call, and its statements are most of its cost.
CREATE OR REPLACE FUNCTION tollgate_limits_admit(
    p_scope text,
    p_limits jsonb,
    p_now timestamptz
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    subjects jsonb := p_limits -> 'subjects';
    n integer := jsonb_array_length(p_limits -> 'subjects');
    ordered integer[] := '{0}';
    i integer;
    v_subject text;
    v_limits jsonb;
    started timestamptz;
    n_requests numeric;
    n_input numeric;
    n_output numeric;
    n_flight numeric;
    kind text;
    cap numeric;
    after numeric;
    asked numeric;
    input numeric := COALESCE((p_limits -> 'tokens' ->> 'input')::numeric, 0);
    output numeric := COALESCE((p_limits -> 'tokens' ->> 'output')::numeric, 0);
    top constant numeric := 9223372036854775807;
BEGIN
    IF n = 0 THEN
        RETURN;
    ELSIF n > 1 THEN
        SELECT array_agg(t.i - 1 ORDER BY t.s) INTO ordered
        FROM jsonb_array_elements_text(subjects) WITH ORDINALITY AS t(s, i);
    END IF;
    FOREACH i IN ARRAY ordered LOOP
        v_subject := subjects ->> i;
        v_limits := p_limits -> 'limits' -> i;
        INSERT INTO limit_windows AS w (scope, subject, started_at, requests, input_tokens,
            output_tokens, in_flight)
        VALUES (p_scope, v_subject, p_now, 1, LEAST(input, top), LEAST(output, top), 1)
        ON CONFLICT (scope, subject) DO UPDATE SET
            started_at = CASE WHEN p_now >= w.started_at + interval '60000 milliseconds'
                THEN p_now ELSE w.started_at END,
            requests = CASE WHEN p_now >= w.started_at + interval '60000 milliseconds'
                THEN 1 ELSE LEAST(w.requests + 1::numeric, top) END,
            input_tokens = CASE WHEN p_now >= w.started_at + interval '60000 milliseconds'
                THEN EXCLUDED.input_tokens ELSE LEAST(w.input_tokens + input, top) END,
            output_tokens = CASE WHEN p_now >= w.started_at + interval '60000 milliseconds'
                THEN EXCLUDED.output_tokens ELSE LEAST(w.output_tokens + output, top) END,
            in_flight = LEAST(w.in_flight + 1::numeric, top)
        RETURNING w.started_at, w.requests, w.input_tokens, w.output_tokens, w.in_flight
        INTO started, n_requests, n_input, n_output, n_flight;
        -- The common case, admitted, in one test; the refusing kind is sought on a refusal only.
        CONTINUE WHEN (n_flight > (v_limits ->> 'in_flight')::numeric
            OR n_requests > (v_limits ->> 'requests')::numeric
            OR n_input > (v_limits ->> 'input_tokens')::numeric
            OR n_output > (v_limits ->> 'output_tokens')::numeric) IS NOT TRUE;
        FOREACH kind IN ARRAY ARRAY['in_flight', 'requests', 'input_tokens', 'output_tokens'] LOOP
            cap := (v_limits ->> kind)::numeric;
            after := CASE kind WHEN 'in_flight' THEN n_flight WHEN 'requests' THEN n_requests
                WHEN 'input_tokens' THEN n_input ELSE n_output END;
            asked := CASE kind WHEN 'input_tokens' THEN input WHEN 'output_tokens' THEN output
                ELSE 1 END;
            IF after > cap THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'TG003',
                    MESSAGE = 'a limit refuses the call',
                    DETAIL = jsonb_build_object('subject', v_subject, 'kind', kind,
                        'limit', cap, 'used', GREATEST(after - asked, 0), 'asked', asked,
                        'reset_ms', CASE WHEN kind = 'in_flight' THEN 1000 ELSE GREATEST(1, trunc(
                            extract(epoch FROM started + interval '60000 milliseconds' - p_now)
                            * 1000)::bigint) END)::text;
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- The end of a call that `tollgate_limits_admit` counted (`p_limits`: what the execution keeps,
-- `{"subjects": […], "tokens": {"input": n, "output": n}, "admitted_at": …}`), in the
-- transaction of the call's transition, after its spend rows:
--
-- - `not_sent` (`not_dispatched`): a call in flight ends, and the window that counted the call
--   gives its request and tokens back;
-- - `parked` (`reconciliation_required`): a call in flight ends; the tokens stay as counted;
-- - `settled`: the window that counted the call is corrected from the tokens counted to
--   `p_input`/`p_output` (the settled usage); a call in flight ends when `p_from_flight` (it was
--   `dispatched` until now).
--
-- A subject's window is the one that counted the call when it contains the admission time
-- (`started_at <= admitted_at < started_at + 60 s`): a subject's windows are disjoint and
-- ordered, so no other does. A window that has opened since is left as it is (the one that
-- counted the call has been judged), but a call in flight ends either way. No count goes below
-- zero. A subject without a row is left alone. Subjects are updated one statement each, in
-- ascending order, as the admission takes them.
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
    subjects jsonb := p_limits -> 'subjects';
    n integer := jsonb_array_length(p_limits -> 'subjects');
    ordered integer[] := '{0}';
    i integer;
    admitted timestamptz := (p_limits ->> 'admitted_at')::timestamptz;
    held_input numeric := COALESCE((p_limits -> 'tokens' ->> 'input')::numeric, 0);
    held_output numeric := COALESCE((p_limits -> 'tokens' ->> 'output')::numeric, 0);
    settled boolean := p_end = 'settled';
    flight boolean := p_end IN ('not_sent', 'parked') OR (p_end = 'settled' AND p_from_flight);
    top constant numeric := 9223372036854775807;
BEGIN
    IF p_end NOT IN ('not_sent', 'parked', 'settled') THEN
        RAISE EXCEPTION 'unknown limit end %', p_end;
    END IF;
    IF n = 0 THEN
        RETURN;
    ELSIF n > 1 THEN
        SELECT array_agg(t.i - 1 ORDER BY t.s) INTO ordered
        FROM jsonb_array_elements_text(subjects) WITH ORDINALITY AS t(s, i);
    END IF;
    FOREACH i IN ARRAY ordered LOOP
        UPDATE limit_windows l SET
            in_flight = CASE WHEN flight THEN GREATEST(l.in_flight - 1, 0) ELSE l.in_flight END,
            requests = CASE WHEN p_end = 'not_sent' AND l.started_at <= admitted
                AND admitted < l.started_at + interval '60000 milliseconds'
                THEN GREATEST(l.requests - 1, 0) ELSE l.requests END,
            input_tokens = CASE WHEN NOT (l.started_at <= admitted
                AND admitted < l.started_at + interval '60000 milliseconds') THEN l.input_tokens
                WHEN p_end = 'not_sent' THEN GREATEST(l.input_tokens - held_input, 0)
                WHEN settled THEN LEAST(GREATEST(l.input_tokens - held_input, 0) + p_input, top)
                ELSE l.input_tokens END,
            output_tokens = CASE WHEN NOT (l.started_at <= admitted
                AND admitted < l.started_at + interval '60000 milliseconds') THEN l.output_tokens
                WHEN p_end = 'not_sent' THEN GREATEST(l.output_tokens - held_output, 0)
                WHEN settled
                    THEN LEAST(GREATEST(l.output_tokens - held_output, 0) + p_output, top)
                ELSE l.output_tokens END
        WHERE l.scope = p_scope AND l.subject = subjects ->> i;
    END LOOP;
END
$$;
