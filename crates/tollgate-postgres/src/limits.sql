-- The rate and concurrency limits (spec/limits.md), decided in the unit of the call they govern:
-- the claim admits (`tollgate_limits_admit`), and the call's end gives back or corrects what it
-- counted (`tollgate_limits_end`), in the transaction of its transition. They are the rule of
-- `tollgate_core::limits` (`admit`, `end`), and a test compares the two on its boundary cases.
--
-- A subject's row of `limit_windows` is locked after every other row of the unit (the day spend
-- row included): it is the last lock of the crate's order. A unit with several subjects locks
-- them in ascending order of their stored text, so two units never wait for each other's.

-- The admission of one claim at `p_now` (the lease's "now": the caller's clock in tests, the
-- database's otherwise; the execution keeps it as `limit_admitted_at`) under the limits of its
-- subjects: `p_subjects` (their stored text, `consumer:…`, `key:…`), `p_values` (four per
-- subject, at its place: in_flight, requests, input_tokens, output_tokens; NULL: that kind is
-- not limited) and `p_tokens` (what the call counts: input, output). Typed arrays rather than a
-- document: the function is in the claim of every limited call, and reading a JSON document
-- costs more than its one statement per subject.
--
-- - Each subject, in ascending order of its stored text, is one update of its row that counts the
--   call (one request, its tokens, one call in flight) on its window as it is now, answering
--   the counts after it: a window that closed (`p_now` at or past `started_at` + 60 s) restarts
--   at `p_now` with zero counts, its calls in flight carried over. A subject without a row gets
--   an empty window opening at `p_now` first (an insert that leaves a row another claim inserted
--   meanwhile as it is), and the update then counts the call on it. Counts stop at bigint's top,
--   which no limit reaches.
-- - The subject's limits then judge those counts, kinds in the order in_flight, requests,
--   input_tokens, output_tokens: the call passes a limit when the count after it does (what was
--   used is the count after less what the call asks).
-- - A refusal raises SQLSTATE `TG003` with the refusal as JSON in its detail (`subject`, `kind`,
--   `limit`, `used`, `asked`, `reset_ms`): the statement fails, so the unit writes nothing (the
--   updates are undone with it), and the caller states it as `LimitRefused`.
CREATE OR REPLACE FUNCTION tollgate_limits_admit(
    p_scope text,
    p_subjects text[],
    p_values bigint[],
    p_tokens bigint[],
    p_now timestamptz
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    ordered integer[];
    i integer;
    b integer;
    started timestamptz;
    n_requests numeric;
    n_input numeric;
    n_output numeric;
    n_flight numeric;
    kind text;
    cap numeric;
    after numeric;
    asked numeric;
BEGIN
    IF cardinality(p_subjects) = 1 THEN
        ordered := '{1}';
    ELSE
        SELECT array_agg(t.i ORDER BY t.s) INTO ordered
        FROM unnest(p_subjects) WITH ORDINALITY AS t(s, i);
    END IF;
    FOREACH i IN ARRAY ordered LOOP
        LOOP
            UPDATE limit_windows w SET
                started_at = CASE WHEN p_now >= w.started_at + interval '60000 milliseconds'
                    THEN p_now ELSE w.started_at END,
                requests = CASE WHEN p_now >= w.started_at + interval '60000 milliseconds'
                    THEN 1 ELSE LEAST(w.requests + 1::numeric, 9223372036854775807) END,
                input_tokens = CASE WHEN p_now >= w.started_at + interval '60000 milliseconds'
                    THEN p_tokens[1]
                    ELSE LEAST(w.input_tokens + p_tokens[1]::numeric, 9223372036854775807) END,
                output_tokens = CASE WHEN p_now >= w.started_at + interval '60000 milliseconds'
                    THEN p_tokens[2]
                    ELSE LEAST(w.output_tokens + p_tokens[2]::numeric, 9223372036854775807) END,
                in_flight = LEAST(w.in_flight + 1::numeric, 9223372036854775807)
            WHERE w.scope = p_scope AND w.subject = p_subjects[i]
            RETURNING w.started_at, w.requests, w.input_tokens, w.output_tokens, w.in_flight
            INTO started, n_requests, n_input, n_output, n_flight;
            EXIT WHEN FOUND;
            -- The subject's first admission: an empty window at `p_now`, then the update.
            INSERT INTO limit_windows (scope, subject, started_at)
            VALUES (p_scope, p_subjects[i], p_now)
            ON CONFLICT (scope, subject) DO NOTHING;
        END LOOP;
        b := (i - 1) * 4;
        -- The common case, admitted, in one test; the refusing kind is sought on a refusal only.
        CONTINUE WHEN (n_flight > p_values[b + 1] OR n_requests > p_values[b + 2]
            OR n_input > p_values[b + 3] OR n_output > p_values[b + 4]) IS NOT TRUE;
        FOREACH kind IN ARRAY ARRAY['in_flight', 'requests', 'input_tokens', 'output_tokens'] LOOP
            CASE kind
                WHEN 'in_flight' THEN
                    cap := p_values[b + 1]; after := n_flight; asked := 1;
                WHEN 'requests' THEN
                    cap := p_values[b + 2]; after := n_requests; asked := 1;
                WHEN 'input_tokens' THEN
                    cap := p_values[b + 3]; after := n_input; asked := p_tokens[1];
                ELSE
                    cap := p_values[b + 4]; after := n_output; asked := p_tokens[2];
            END CASE;
            IF after > cap THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'TG003',
                    MESSAGE = 'a limit refuses the call',
                    DETAIL = jsonb_build_object('subject', p_subjects[i], 'kind', kind,
                        'limit', cap, 'used', GREATEST(after - asked, 0), 'asked', asked,
                        'reset_ms', CASE WHEN kind = 'in_flight' THEN 1000 ELSE GREATEST(1, trunc(
                            extract(epoch FROM started + interval '60000 milliseconds' - p_now)
                            * 1000)::bigint) END)::text;
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- The end of a call that `tollgate_limits_admit` counted, from what its execution keeps
-- (`p_subjects`, `p_held_input`, `p_held_output`, `p_admitted`: its `limit_subjects`,
-- `limit_input_tokens`, `limit_output_tokens`, `limit_admitted_at`), in the transaction of the
-- call's transition, after its spend rows:
--
-- - `not_sent` (`not_dispatched`): a call in flight ends, and the window that counted the call
--   gives its request and tokens back;
-- - `parked` (`reconciliation_required`): a call in flight ends; the tokens stay as counted;
-- - `settled`: the window that counted the call is corrected from the tokens counted to
--   `p_input`/`p_output` (the settled usage); a call in flight ends when `p_from_flight` (it was
--   `dispatched` until now).
--
-- A subject's window is the one that counted the call when it contains the admission time
-- (`started_at <= p_admitted < started_at + 60 s`): a subject's windows are disjoint and
-- ordered, so no other does. A window that has opened since is left as it is (the one that
-- counted the call has been judged), but a call in flight ends either way. No count goes below
-- zero. A subject without a row is left alone. Subjects are updated one statement each, in
-- ascending order, as the admission takes them.
CREATE OR REPLACE FUNCTION tollgate_limits_end(
    p_scope text,
    p_subjects text[],
    p_held_input bigint,
    p_held_output bigint,
    p_admitted timestamptz,
    p_end text,
    p_input bigint,
    p_output bigint,
    p_from_flight boolean
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    ordered integer[];
    i integer;
    flight boolean;
BEGIN
    IF p_end NOT IN ('not_sent', 'parked', 'settled') THEN
        RAISE EXCEPTION 'unknown limit end %', p_end;
    END IF;
    flight := p_end <> 'settled' OR p_from_flight;
    IF cardinality(p_subjects) = 1 THEN
        ordered := '{1}';
    ELSE
        SELECT array_agg(t.i ORDER BY t.s) INTO ordered
        FROM unnest(p_subjects) WITH ORDINALITY AS t(s, i);
    END IF;
    FOREACH i IN ARRAY COALESCE(ordered, '{}') LOOP
        UPDATE limit_windows l SET
            in_flight = CASE WHEN flight THEN GREATEST(l.in_flight - 1, 0) ELSE l.in_flight END,
            requests = CASE WHEN p_end = 'not_sent' AND l.started_at <= p_admitted
                AND p_admitted < l.started_at + interval '60000 milliseconds'
                THEN GREATEST(l.requests - 1, 0) ELSE l.requests END,
            input_tokens = CASE WHEN NOT (l.started_at <= p_admitted
                AND p_admitted < l.started_at + interval '60000 milliseconds') THEN l.input_tokens
                WHEN p_end = 'not_sent' THEN GREATEST(l.input_tokens - p_held_input, 0)
                WHEN p_end = 'settled' THEN LEAST(GREATEST(l.input_tokens::numeric
                    - p_held_input, 0) + p_input, 9223372036854775807)
                ELSE l.input_tokens END,
            output_tokens = CASE WHEN NOT (l.started_at <= p_admitted
                AND p_admitted < l.started_at + interval '60000 milliseconds') THEN l.output_tokens
                WHEN p_end = 'not_sent' THEN GREATEST(l.output_tokens - p_held_output, 0)
                WHEN p_end = 'settled' THEN LEAST(GREATEST(l.output_tokens::numeric
                    - p_held_output, 0) + p_output, 9223372036854775807)
                ELSE l.output_tokens END
        WHERE l.scope = p_scope AND l.subject = p_subjects[i];
    END LOOP;
END
$$;
