-- Calls batched into one statement and one commit (spec/performance.md, H-32): the claims (or
-- the settlements) of several calls outside a root, each decided exactly as the single function
-- decides it, in one statement whose one commit they share.
--
-- - The batch is first decided as a whole (H-38, `tollgate_claim_together`,
--   `tollgate_settle_together` below), in a subtransaction: when that raises, it is rolled back
--   (nothing of it is written) and the calls are decided one by one, as follows.
-- - Each call runs in a subtransaction of its own (the `EXCEPTION` block): a call that fails is
--   rolled back alone, nothing of it is written, and its answer is `alone`; the caller then sends
--   it by the single function, which decides it (and states its error) as for any call.
-- - From the second call on, the transaction's lock timeout is `p_lock_timeout_ms` (a few ms; at
--   least 1, since 0 would mean none): a batch that holds the locks of its earlier calls never
--   waits for long for a lock another transaction holds, so it cannot be part of a deadlock,
--   whatever order the other transaction takes its locks in. A call that would have waited longer
--   is rolled back alone (`alone`) and sent by itself afterwards.
-- - The answer is one row per call, in the order of the calls: `row` with the single function's
--   row, `none` when it answered no row (a claim whose key already has a row), or `alone`.
-- - The call types' fields are the single functions' parameters, in their order.
-- - Before any row, the batch takes the advisory lock of each of its calls' audit chain groups
--   (H-35), in ascending order, waiting as long as the session's lock timeout allows: a batch or
--   a single function of another instance on one of those groups runs before or after it, not
--   beside it, so two instances' batches do not leave each other's calls out.

CREATE TYPE tollgate_claim_call AS (
    id uuid,
    scope text,
    operation_key text,
    kind text,
    binding jsonb,
    binding_digest text,
    accounting_day date,
    state text,
    fence bigint,
    lease_now timestamptz,
    lease_ms bigint,
    hold numeric,
    created_at timestamptz,
    updated_at timestamptz,
    chain smallint,
    chains integer,
    hash_prefix bytea,
    hash_mid bytea,
    kinds text[],
    details jsonb,
    ats timestamptz[],
    tails bytea[],
    consumer text,
    session_id text,
    currency text,
    session_block numeric,
    daily_block numeric,
    limit_subjects text[],
    limit_values bigint[],
    limit_tokens bigint[],
    config_digest text
);

CREATE TYPE tollgate_settle_call AS (
    id uuid,
    fence bigint,
    states text[],
    binding_digest text,
    hold numeric,
    provider_ref text,
    now timestamptz,
    evidence_id uuid,
    evidence_provider_ref text,
    evidence_tokens bigint[],
    evidence_exact boolean,
    evidence_source text,
    evidence_at timestamptz,
    evidence_acknowledged_at timestamptz,
    settlement_id uuid,
    consumer text,
    session_id text,
    provider text,
    model text,
    price_version text,
    policy_version text,
    currency text,
    tokens bigint[],
    amount numeric,
    source text,
    outcome text,
    stop text,
    output text,
    step text,
    retention_expires_at timestamptz,
    session_warn numeric,
    session_block numeric,
    daily_warn numeric,
    daily_block numeric,
    chain smallint,
    hash_prefix bytea,
    hash_mid bytea,
    at timestamptz,
    detail jsonb,
    tail bytea,
    blocked_detail jsonb,
    blocked_tail bytea
);

-- A batch decided as a whole (H-38): one statement per table for all of its calls instead of
-- the single function's statements once per call, used when it decides every call as the single
-- functions would, one after the other in the batch's order. Whatever it cannot decide so (a
-- call the caps or the limits refuse, a row that is not the one its caller read, a chain's first
-- append, a lock it would wait for past the batch's lock timeout) it raises: the batch function
-- rolls it back whole (nothing of it is written) and decides the calls one by one.
--
-- Locks, in the crate's order, each kind for every call before the next kind: the execution
-- rows, the heads of the audit chains (ascending), the session spend rows, the day spend rows,
-- then the limit windows of the limited calls' subjects (ascending); a batch waits for any of them
-- at most the batch's lock timeout, which its caller sets.
--
-- Every table is read by index probes for the batch's keys: these functions plan with nested
-- loops only and no sequential scan (`enable_hashjoin`, `enable_mergejoin`, `enable_seqscan`
-- off), so a join of the calls with a table probes its index once per call rather than reading
-- the table (or a whole index) into a hash, and the plan is made once per connection
-- (`plan_cache_mode` `force_generic_plan`): one made while a table was small would otherwise
-- read it whole as it grows, and planning again for each batch's values costs more than it saves.
--
-- The claims: the execution rows by one insert in the calls' order (a key that already has a row,
-- an earlier call's of the batch included, inserts nothing and its call answers no row); the
-- audit rows of every claimed call, hashed from their chain's locked head in the calls' order as
-- each claim alone would hash them, by one insert, and the heads' moves by one update; the holds
-- by one upsert of each kind of spend row (the sum of the holds of its calls). A call's block caps
-- then judge the totals as they were after its own hold alone (the totals after every hold, less
-- the holds of the calls after it); when one refuses, the whole raises. Answers the places of the
-- claimed calls (counted from 1) and their rows, in the calls' order.
CREATE OR REPLACE FUNCTION tollgate_claim_together(
    p_calls tollgate_claim_call[],
    OUT places integer[],
    OUT claimed executions[]
)
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    c tollgate_claim_call;
    head_scopes text[];
    head_chains smallint[];
    head_keys text[];
    head_seqs bigint[];
    head_hashes text[];
    limited boolean;
    h integer;
    seq bigint;
    prev text;
    m integer := 0;
    a_place integer[] := '{}';
    a_k integer[] := '{}';
    a_seq bigint[] := '{}';
    a_prev text[] := '{}';
    a_hash text[] := '{}';
    windows_expected integer;
    windows_counted integer;
    refused boolean;
BEGIN
    -- The rows, in the calls' order; each lease runs from its "now", at which a limited call is
    -- also admitted (`limit_admitted_at`). Then, in the same statement, the heads of the claimed
    -- calls' chains, locked in ascending order (one index probe per distinct (scope, chain)):
    -- the heads' probes read the distinct pairs of every claimed row, so the insert has run to
    -- its end before the first head is locked.
    WITH x AS MATERIALIZED (
        SELECT x.*, COALESCE(x.lease_now, clock_timestamp()) AS v_now,
            -- A config named by digest must be stored (H-40), as for the single function.
            CASE WHEN x.config_digest IS NOT NULL AND NOT EXISTS
                (SELECT FROM binding_configs b WHERE b.digest = x.config_digest)
                THEN tollgate_config_missing() END AS config_missing
        FROM unnest(p_calls) WITH ORDINALITY AS x
    ), ins AS (
        INSERT INTO executions (id, scope, operation_key, kind, root_key, binding, binding_digest,
            accounting_day, state, not_dispatched_cause, outcome, fence, lease_expires_at, hold,
            provider_ref, created_at, updated_at, reconciliation_reason, limit_subjects,
            limit_input_tokens, limit_output_tokens, limit_admitted_at, config_digest)
        SELECT x.id, x.scope, x.operation_key, x.kind, NULL, x.binding, x.binding_digest,
            x.accounting_day, x.state, NULL, NULL, x.fence,
            x.v_now + x.lease_ms * interval '1 millisecond', x.hold, NULL, x.created_at,
            x.updated_at, NULL, x.limit_subjects, x.limit_tokens[1], x.limit_tokens[2],
            CASE WHEN x.limit_subjects IS NOT NULL THEN x.v_now END, x.config_digest
        FROM x ORDER BY x.ordinality
        ON CONFLICT (scope, operation_key) DO NOTHING
        RETURNING *
    ), p AS MATERIALIZED (
        SELECT x.ordinality::integer AS place, x.chain, ins::executions AS row
        FROM ins JOIN x ON x.id = ins.id
    ), hd AS MATERIALIZED (
        SELECT hd.scope, hd.chain, hd.last_seq, hd.last_hash
        FROM (SELECT DISTINCT (p.row).scope, p.chain FROM p) AS k
        JOIN audit_heads hd ON hd.scope = k.scope AND hd.chain = k.chain
        ORDER BY hd.scope, hd.chain
        FOR UPDATE OF hd
    )
    SELECT COALESCE((SELECT array_agg(p.place ORDER BY p.place) FROM p), '{}'),
        COALESCE((SELECT array_agg(p.row ORDER BY p.place) FROM p), '{}'),
        (SELECT bool_or((p.row).limit_subjects IS NOT NULL) FROM p),
        array_agg(hd.scope), array_agg(hd.chain), array_agg(hd.chain || ':' || hd.scope),
        array_agg(hd.last_seq), array_agg(hd.last_hash)
    INTO places, claimed, limited, head_scopes, head_chains, head_keys, head_seqs, head_hashes
    FROM hd;
    IF cardinality(places) = 0 THEN
        RETURN;
    END IF;

    -- Each claimed call's audit rows, hashed from its head in the calls' order.
    FOR j IN 1 .. cardinality(places) LOOP
        c := p_calls[places[j]];
        h := array_position(head_keys, c.chain || ':' || c.scope);
        IF h IS NULL THEN
            -- The scope's first append: the single function makes its heads.
            RAISE EXCEPTION USING ERRCODE = 'TG004', MESSAGE = 'decide the batch call by call';
        END IF;
        seq := head_seqs[h];
        prev := head_hashes[h];
        FOR k IN 1 .. cardinality(c.kinds) LOOP
            seq := seq + 1;
            m := m + 1;
            a_place[m] := places[j];
            a_k[m] := k;
            a_seq[m] := seq;
            a_prev[m] := prev;
            prev := encode(sha256(c.hash_prefix || decode(prev, 'hex') || c.hash_mid
                || int8send(seq) || c.tails[k]), 'hex');
            a_hash[m] := prev;
        END LOOP;
        head_seqs[h] := seq;
        head_hashes[h] := prev;
    END LOOP;
    WITH hd AS (
        UPDATE audit_heads hd SET last_seq = u.seq, last_hash = u.hash
        FROM unnest(head_scopes, head_chains, head_seqs, head_hashes) AS u(scope, chain, seq, hash)
        WHERE hd.scope = u.scope AND hd.chain = u.chain
    )
    INSERT INTO audit_log (scope, chain, seq, execution_id, kind, detail, at, prev_hash, hash)
    SELECT x.scope, x.chain, a.seq, x.id, x.kinds[a.k], x.details -> (a.k - 1), x.ats[a.k],
        a.prev, a.hash
    FROM unnest(a_place, a_k, a_seq, a_prev, a_hash) WITH ORDINALITY
        AS a(place, k, seq, prev, hash, n)
    JOIN unnest(p_calls) WITH ORDINALITY AS x ON x.ordinality = a.place
    ORDER BY a.n;

    -- The holds: each session row, then each day row, with the sum of its calls' holds (the day
    -- rows' upsert waits for the count of every session row's, so it locks none before them);
    -- then each call's block caps on the totals after its own hold, from the rows as the upserts
    -- left them.
    WITH x AS MATERIALIZED (
        SELECT x.* FROM unnest(p_calls) WITH ORDINALITY AS x WHERE x.ordinality = ANY (places)
    ), ss AS (
        INSERT INTO spend_sessions AS s (scope, consumer, session_id, currency, held)
        SELECT x.scope, x.consumer, x.session_id, x.currency, sum(x.hold) FROM x
        GROUP BY x.scope, x.consumer, x.session_id, x.currency
        ORDER BY x.scope, x.consumer, x.session_id, x.currency
        ON CONFLICT (scope, consumer, session_id, currency)
        DO UPDATE SET held = s.held + EXCLUDED.held
        RETURNING s.scope, s.consumer, s.session_id, s.currency, s.settled + s.held AS total
    ), sd AS (
        INSERT INTO spend_days AS d (scope, consumer, day, currency, held)
        SELECT x.scope, x.consumer, x.accounting_day, x.currency, sum(x.hold) FROM x
        WHERE (SELECT count(*) FROM ss) > 0
        GROUP BY x.scope, x.consumer, x.accounting_day, x.currency
        ORDER BY x.scope, x.consumer, x.accounting_day, x.currency
        ON CONFLICT (scope, consumer, day, currency)
        DO UPDATE SET held = d.held + EXCLUDED.held
        RETURNING d.scope, d.consumer, d.day, d.currency, d.settled + d.held AS total
    )
    SELECT COALESCE(bool_or(tollgate_cap_crossed('block', t.session_total, t.session_block)
            OR tollgate_cap_crossed('block', t.day_total, t.daily_block)), true)
    INTO refused
    FROM (
        SELECT x.session_block, x.daily_block,
            ss.total - COALESCE(sum(x.hold) OVER (
                PARTITION BY x.scope, x.consumer, x.session_id, x.currency
                ORDER BY x.ordinality ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING), 0)
                AS session_total,
            sd.total - COALESCE(sum(x.hold) OVER (
                PARTITION BY x.scope, x.consumer, x.accounting_day, x.currency
                ORDER BY x.ordinality ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING), 0)
                AS day_total
        FROM x
        JOIN ss ON ss.scope = x.scope AND ss.consumer = x.consumer
            AND ss.session_id = x.session_id AND ss.currency = x.currency
        JOIN sd ON sd.scope = x.scope AND sd.consumer = x.consumer
            AND sd.day = x.accounting_day AND sd.currency = x.currency
    ) t;
    IF refused THEN
        RAISE EXCEPTION USING ERRCODE = 'TG004', MESSAGE = 'decide the batch call by call';
    END IF;

    -- The limits last: each subject's window counts every limited call of the batch on it in one
    -- update, the subjects in ascending order, when the window is open at every call's admission
    -- time (a window to restart, or a subject's first admission, raises). Each call is then judged
    -- on the counts after its own admission (the counts after the batch's, less what the calls
    -- after it counted), kinds as `tollgate_limits_admit` judges them; a refusal, or a count at
    -- bigint's top, raises.
    IF limited THEN
        WITH u AS MATERIALIZED (
            SELECT j.j AS n, (claimed[j.j]).scope, t.subject,
                (claimed[j.j]).limit_admitted_at AS at,
                (claimed[j.j]).limit_input_tokens::bigint AS input,
                (claimed[j.j]).limit_output_tokens::bigint AS output,
                (p_calls[places[j.j]]).limit_values[(t.k - 1) * 4 + 1] AS max_flight,
                (p_calls[places[j.j]]).limit_values[(t.k - 1) * 4 + 2] AS max_requests,
                (p_calls[places[j.j]]).limit_values[(t.k - 1) * 4 + 3] AS max_input,
                (p_calls[places[j.j]]).limit_values[(t.k - 1) * 4 + 4] AS max_output
            FROM generate_subscripts(places, 1) AS j(j)
            CROSS JOIN LATERAL unnest((claimed[j.j]).limit_subjects) WITH ORDINALITY
                AS t(subject, k)
        ), w AS MATERIALIZED (
            SELECT u.scope, u.subject, count(*) AS calls, sum(u.input) AS input,
                sum(u.output) AS output, max(u.at) AS last_at
            FROM u GROUP BY u.scope, u.subject ORDER BY u.scope, u.subject
        ), up AS (
            UPDATE limit_windows l SET
                requests = LEAST(l.requests + w.calls::numeric, 9223372036854775807),
                input_tokens = LEAST(l.input_tokens + w.input, 9223372036854775807),
                output_tokens = LEAST(l.output_tokens + w.output, 9223372036854775807),
                in_flight = LEAST(l.in_flight + w.calls::numeric, 9223372036854775807)
            FROM w
            WHERE l.scope = w.scope AND l.subject = w.subject
                AND w.last_at < l.started_at + interval '60000 milliseconds'
            RETURNING l.scope, l.subject, l.requests, l.input_tokens, l.output_tokens, l.in_flight
        )
        SELECT (SELECT count(*) FROM w), (SELECT count(*) FROM up), (
            SELECT bool_or(t.flight > t.max_flight OR t.requests > t.max_requests
                OR t.input > t.max_input OR t.output > t.max_output OR t.top)
            FROM (
                SELECT u.max_flight, u.max_requests, u.max_input, u.max_output,
                    up.in_flight - count(*) OVER later AS flight,
                    up.requests - count(*) OVER later AS requests,
                    up.input_tokens - COALESCE(sum(u.input) OVER later, 0) AS input,
                    up.output_tokens - COALESCE(sum(u.output) OVER later, 0) AS output,
                    9223372036854775807 IN (up.requests, up.input_tokens, up.output_tokens,
                        up.in_flight) AS top
                FROM u JOIN up ON up.scope = u.scope AND up.subject = u.subject
                WINDOW later AS (PARTITION BY u.scope, u.subject ORDER BY u.n
                    ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING)
            ) t)
        INTO windows_expected, windows_counted, refused;
        IF windows_counted <> windows_expected OR refused THEN
            RAISE EXCEPTION USING ERRCODE = 'TG004', MESSAGE = 'decide the batch call by call';
        END IF;
    END IF;
END
$$;

-- The settlements (see `tollgate_claim_together`): the rows locked in id order, each the row its
-- caller read (as the single function checks it); the heads of their chains locked in ascending
-- order; each call's `settled` audit row hashed from its head in the calls' order; the evidence,
-- the charges, the results, the audit rows, the heads' moves and the completions by one statement;
-- then each session row, and each day row, charged with the sum of its calls' amounts and
-- released of the sum of their holds (a row that holds less raises). Each call's post-call caps
-- then judge the totals as they were after its own charge (the totals after every charge, less
-- the amounts of the calls after it): when one is crossed, a warning or a block, the whole raises,
-- since the single function then decides on locked totals what this one would not. A limited
-- call's windows are then corrected as its settlement alone corrects them. Answers each call's
-- `tollgate_settled` row, in the calls' order, with the totals after its own charge.
CREATE OR REPLACE FUNCTION tollgate_settle_together(p_calls tollgate_settle_call[])
RETURNS tollgate_settled[]
LANGUAGE plpgsql
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    n integer := cardinality(p_calls);
    c tollgate_settle_call;
    locked executions[];
    head_scopes text[];
    head_chains smallint[];
    head_keys text[];
    head_seqs bigint[];
    head_hashes text[];
    limited boolean;
    h integer;
    a_seq bigint[] := '{}';
    a_prev text[] := '{}';
    a_hash text[] := '{}';
    rows_expected integer;
    rows_charged integer;
    crossed boolean;
    answers tollgate_settled[];
BEGIN
    -- The rows, locked in id order, in the calls' order, each of which must be the row its
    -- caller read; then, in the same statement, the heads of their chains, locked in ascending
    -- order (one index probe per distinct (scope, chain)): the heads' probes read the distinct
    -- pairs of every row, so every row is locked before the first head.
    WITH e AS MATERIALIZED (
        SELECT e.* FROM executions e
        WHERE e.id = ANY (ARRAY(SELECT x.id FROM unnest(p_calls) AS x))
        ORDER BY e.id FOR UPDATE
    ), r AS MATERIALIZED (
        SELECT x.ordinality AS n, x.chain, e::executions AS row
        FROM unnest(p_calls) WITH ORDINALITY AS x JOIN e ON e.id = x.id
        WHERE e.root_key IS NULL AND e.fence = x.fence AND e.state = ANY (x.states)
            AND e.binding_digest = x.binding_digest AND e.hold = x.hold
    ), hd AS MATERIALIZED (
        SELECT hd.scope, hd.chain, hd.last_seq, hd.last_hash
        FROM (SELECT DISTINCT (r.row).scope, r.chain FROM r) AS k
        JOIN audit_heads hd ON hd.scope = k.scope AND hd.chain = k.chain
        ORDER BY hd.scope, hd.chain
        FOR UPDATE OF hd
    )
    SELECT (SELECT count(DISTINCT x.id) FROM unnest(p_calls) AS x),
        (SELECT array_agg(r.row ORDER BY r.n) FROM r),
        (SELECT bool_or((r.row).limit_subjects IS NOT NULL) FROM r),
        array_agg(hd.scope), array_agg(hd.chain), array_agg(hd.chain || ':' || hd.scope),
        array_agg(hd.last_seq), array_agg(hd.last_hash)
    INTO rows_expected, locked, limited, head_scopes, head_chains, head_keys, head_seqs,
        head_hashes
    FROM hd;
    IF rows_expected <> n OR cardinality(locked) IS DISTINCT FROM n THEN
        RAISE EXCEPTION USING ERRCODE = 'TG004', MESSAGE = 'decide the batch call by call';
    END IF;

    -- Each call's `settled` row, hashed from its head in the calls' order.
    FOR i IN 1 .. n LOOP
        c := p_calls[i];
        h := array_position(head_keys, c.chain || ':' || locked[i].scope);
        IF h IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'TG004', MESSAGE = 'decide the batch call by call';
        END IF;
        a_seq[i] := head_seqs[h] + 1;
        a_prev[i] := head_hashes[h];
        a_hash[i] := encode(sha256(c.hash_prefix || decode(a_prev[i], 'hex') || c.hash_mid
            || int8send(a_seq[i]) || c.tail), 'hex');
        head_seqs[h] := a_seq[i];
        head_hashes[h] := a_hash[i];
    END LOOP;

    -- The evidence, the charges, the results, the audit rows, the heads and the completions;
    -- the charges of each session row, then of each day row, by the sums of its calls (the day
    -- rows' sums wait for the count of every session row's update, so none is locked before
    -- them); and each call's totals after its own charge, with its post-call caps on them, from
    -- the rows as the updates left them.
    WITH x AS MATERIALIZED (
        SELECT x.ordinality AS n, x.id, x.provider_ref, x.now, x.evidence_id,
            x.evidence_provider_ref, x.evidence_tokens, x.evidence_exact, x.evidence_source,
            x.evidence_at, x.evidence_acknowledged_at, x.settlement_id, x.consumer, x.session_id,
            x.provider, x.model, x.price_version, x.policy_version, x.currency, x.tokens, x.amount,
            x.source, x.outcome, x.stop, x.output, x.step, x.retention_expires_at, x.chain, x.at,
            x.detail, x.hold, x.session_warn, x.session_block, x.daily_warn, x.daily_block,
            r.scope, r.operation_key, r.kind, r.accounting_day, a.seq, a.prev, a.hash
        FROM unnest(p_calls) WITH ORDINALITY AS x
        JOIN unnest(locked) WITH ORDINALITY AS r ON r.ordinality = x.ordinality
        JOIN unnest(a_seq, a_prev, a_hash) WITH ORDINALITY AS a(seq, prev, hash, n)
            ON a.n = x.ordinality
    ), ev AS (
        INSERT INTO usage_inbox (id, scope, execution_id, operation_key, provider_ref,
            input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
            exact, source, received_at, acknowledged_at)
        SELECT x.evidence_id, x.scope, x.id, x.operation_key, x.evidence_provider_ref,
            x.evidence_tokens[1], x.evidence_tokens[2], x.evidence_tokens[3],
            x.evidence_tokens[4], x.evidence_tokens[5], x.evidence_exact, x.evidence_source,
            x.evidence_at, x.evidence_acknowledged_at
        FROM x WHERE x.evidence_id IS NOT NULL ORDER BY x.n
    ), st AS (
        INSERT INTO cost_settlements (settlement_id, execution_id, scope, operation_key, kind,
            consumer, session_id, accounting_day, provider, model, price_version, policy_version,
            currency, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
            reasoning_tokens, amount, source, settled_at)
        SELECT x.settlement_id, x.id, x.scope, x.operation_key, x.kind, x.consumer, x.session_id,
            x.accounting_day, x.provider, x.model, x.price_version, x.policy_version, x.currency,
            x.tokens[1], x.tokens[2], x.tokens[3], x.tokens[4], x.tokens[5], x.amount, x.source,
            x.now
        FROM x ORDER BY x.n
    ), rs AS (
        INSERT INTO execution_results (execution_id, outcome, stop, output, step, warnings,
            retention_expires_at, erased_at)
        SELECT x.id, x.outcome, x.stop, x.output::json, x.step::json, '[]'::jsonb,
            x.retention_expires_at, NULL
        FROM x ORDER BY x.n
    ), al AS (
        INSERT INTO audit_log (scope, chain, seq, execution_id, kind, detail, at, prev_hash,
            hash)
        SELECT x.scope, x.chain, x.seq, x.id, 'settled', x.detail, x.at, x.prev, x.hash
        FROM x ORDER BY x.n
    ), hd AS (
        UPDATE audit_heads hd SET last_seq = u.seq, last_hash = u.hash
        FROM unnest(head_scopes, head_chains, head_seqs, head_hashes) AS u(scope, chain, seq, hash)
        WHERE hd.scope = u.scope AND hd.chain = u.chain
    ), up AS (
        UPDATE executions e SET state = 'completed', outcome = x.outcome, hold = 0,
            provider_ref = COALESCE(x.provider_ref, e.provider_ref), updated_at = x.now
        FROM x WHERE e.id = x.id
        RETURNING e.*, x.n
    ), ks AS MATERIALIZED (
        SELECT x.scope, x.consumer, x.session_id, x.currency, sum(x.amount) AS amount,
            sum(x.hold) AS hold
        FROM x GROUP BY x.scope, x.consumer, x.session_id, x.currency
    ), ss AS (
        UPDATE spend_sessions s SET settled = s.settled + ks.amount, held = s.held - ks.hold
        FROM ks
        WHERE s.scope = ks.scope AND s.consumer = ks.consumer AND s.session_id = ks.session_id
            AND s.currency = ks.currency AND s.held >= ks.hold
        RETURNING s.scope, s.consumer, s.session_id, s.currency, s.settled, s.held
    ), kd AS MATERIALIZED (
        SELECT x.scope, x.consumer, x.accounting_day, x.currency, sum(x.amount) AS amount,
            sum(x.hold) AS hold
        FROM x WHERE (SELECT count(*) FROM ss) > 0
        GROUP BY x.scope, x.consumer, x.accounting_day, x.currency
    ), sd AS (
        UPDATE spend_days d SET settled = d.settled + kd.amount, held = d.held - kd.hold
        FROM kd
        WHERE d.scope = kd.scope AND d.consumer = kd.consumer AND d.day = kd.accounting_day
            AND d.currency = kd.currency AND d.held >= kd.hold
        RETURNING d.scope, d.consumer, d.day, d.currency, d.settled, d.held
    )
    SELECT (SELECT count(*) FROM ks) + (SELECT count(*) FROM kd),
        (SELECT count(*) FROM ss) + (SELECT count(*) FROM sd),
        array_agg(ROW(up.id, up.scope, up.operation_key, up.kind, up.root_key, up.binding,
            up.binding_digest, up.accounting_day, up.state, up.not_dispatched_cause, up.outcome,
            up.fence, up.lease_expires_at, up.hold::numeric, up.provider_ref, up.created_at,
            up.updated_at, up.reconciliation_reason, t.session_settled, t.session_held,
            t.day_settled, t.day_held)::tollgate_settled ORDER BY t.n),
        bool_or(tollgate_cap_crossed('warn', t.session_settled, t.session_warn)
            OR tollgate_cap_crossed('block', t.session_settled, t.session_block)
            OR tollgate_cap_crossed('warn', t.day_settled, t.daily_warn)
            OR tollgate_cap_crossed('block', t.day_settled, t.daily_block))
    INTO rows_expected, rows_charged, answers, crossed
    FROM (
        SELECT x.n, x.session_warn, x.session_block, x.daily_warn, x.daily_block,
            ss.settled - COALESCE(sum(x.amount) OVER later_in_session, 0) AS session_settled,
            ss.held + COALESCE(sum(x.hold) OVER later_in_session, 0) AS session_held,
            sd.settled - COALESCE(sum(x.amount) OVER later_in_day, 0) AS day_settled,
            sd.held + COALESCE(sum(x.hold) OVER later_in_day, 0) AS day_held
        FROM x
        JOIN ss ON ss.scope = x.scope AND ss.consumer = x.consumer
            AND ss.session_id = x.session_id AND ss.currency = x.currency
        JOIN sd ON sd.scope = x.scope AND sd.consumer = x.consumer
            AND sd.day = x.accounting_day AND sd.currency = x.currency
        WINDOW later_in_session AS (PARTITION BY x.scope, x.consumer, x.session_id, x.currency
                ORDER BY x.n ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING),
            later_in_day AS (PARTITION BY x.scope, x.consumer, x.accounting_day, x.currency
                ORDER BY x.n ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING)
    ) t
    JOIN up ON up.n = t.n;
    IF rows_charged IS DISTINCT FROM rows_expected OR crossed
        OR cardinality(answers) IS DISTINCT FROM n THEN
        RAISE EXCEPTION USING ERRCODE = 'TG004', MESSAGE = 'decide the batch call by call';
    END IF;

    -- The limits last: each subject's window ends every limited call of the batch on it in one
    -- update, the subjects in ascending order, as `tollgate_limits_end` ends them one by one
    -- ('settled'): a call that was dispatched leaves flight, and the window that counted a call
    -- (the one open at its admission time) is corrected from the tokens it counted to its
    -- settled usage. When a count could stop at zero or at bigint's top on the way, or a subject
    -- has no row, the whole raises.
    IF limited THEN
        WITH u AS MATERIALIZED (
            SELECT e.scope, t.subject, e.limit_admitted_at AS at,
                e.limit_input_tokens::bigint AS held_input,
                e.limit_output_tokens::bigint AS held_output,
                LEAST(x.tokens[1]::numeric + x.tokens[3] + x.tokens[4],
                    9223372036854775807)::bigint AS input,
                LEAST(x.tokens[2]::numeric + x.tokens[5], 9223372036854775807)::bigint AS output,
                (e.state = 'dispatched') AS flight
            FROM unnest(locked) WITH ORDINALITY AS e
            JOIN unnest(p_calls) WITH ORDINALITY AS x ON x.ordinality = e.ordinality
            CROSS JOIN LATERAL unnest(e.limit_subjects) AS t(subject)
        ), w AS MATERIALIZED (
            SELECT u.scope, u.subject, count(*) FILTER (WHERE u.flight) AS flights
            FROM u GROUP BY u.scope, u.subject ORDER BY u.scope, u.subject
        ), up AS (
            -- The corrections read the calls that the window, as it is locked, counted (those
            -- admitted while it was open).
            UPDATE limit_windows l SET
                in_flight = l.in_flight - w.flights,
                input_tokens = l.input_tokens + (
                    SELECT COALESCE(sum(u.input - u.held_input), 0) FROM u
                    WHERE u.scope = l.scope AND u.subject = l.subject
                        AND u.at >= l.started_at
                        AND u.at < l.started_at + interval '60000 milliseconds'),
                output_tokens = l.output_tokens + (
                    SELECT COALESCE(sum(u.output - u.held_output), 0) FROM u
                    WHERE u.scope = l.scope AND u.subject = l.subject
                        AND u.at >= l.started_at
                        AND u.at < l.started_at + interval '60000 milliseconds')
            FROM w
            WHERE l.scope = w.scope AND l.subject = w.subject
                AND l.in_flight >= w.flights
                AND (
                    SELECT bool_and(l.input_tokens >= sum_held_input
                        AND l.output_tokens >= sum_held_output
                        AND l.input_tokens + sum_input <= 9223372036854775807
                        AND l.output_tokens + sum_output <= 9223372036854775807)
                    FROM (
                        SELECT COALESCE(sum(u.held_input), 0) AS sum_held_input,
                            COALESCE(sum(u.held_output), 0) AS sum_held_output,
                            COALESCE(sum(u.input), 0) AS sum_input,
                            COALESCE(sum(u.output), 0) AS sum_output
                        FROM u
                        WHERE u.scope = l.scope AND u.subject = l.subject
                            AND u.at >= l.started_at
                            AND u.at < l.started_at + interval '60000 milliseconds'
                    ) t)
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM w), (SELECT count(*) FROM up)
        INTO rows_expected, rows_charged;
        IF rows_charged <> rows_expected THEN
            RAISE EXCEPTION USING ERRCODE = 'TG004', MESSAGE = 'decide the batch call by call';
        END IF;
    END IF;
    RETURN answers;
END
$$;

-- The calls of one kind decided after the batch's advisory locks are taken (the batch functions
-- below): as a whole first, then one by one. `p_holding`: the transaction already holds rows'
-- locks (a shard batch's settlements, before its claims), so the lock timeout applies from the
-- first call on rather than from the second.
CREATE OR REPLACE FUNCTION tollgate_claim_calls(
    p_calls tollgate_claim_call[],
    p_lock_timeout_ms integer,
    p_holding boolean
)
RETURNS TABLE (call_index integer, call_state text, call_row executions)
LANGUAGE plpgsql AS $$
DECLARE
    c tollgate_claim_call;
    answer executions;
    places integer[];
    claimed executions[];
BEGIN
    IF COALESCE(cardinality(p_calls), 0) = 0 THEN
        RETURN;
    END IF;
    -- The batch as a whole (H-38), waiting for any lock at most the batch's lock timeout; when
    -- it raises, it is rolled back whole (the lock timeout with it) and the calls go one by one.
    BEGIN
        PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
        SELECT t.places, t.claimed INTO places, claimed FROM tollgate_claim_together(p_calls) t;
    EXCEPTION WHEN OTHERS THEN
        places := NULL;
    END;
    IF places IS NOT NULL THEN
        RETURN QUERY
        SELECT i, CASE WHEN p.n IS NULL THEN 'none' ELSE 'row' END, claimed[p.n]
        FROM generate_series(1, cardinality(p_calls)) AS i
        LEFT JOIN unnest(places) WITH ORDINALITY AS p(place, n) ON p.place = i
        ORDER BY i;
        RETURN;
    END IF;
    FOR i IN 1 .. cardinality(p_calls) LOOP
        c := p_calls[i];
        IF i = 2 OR (i = 1 AND p_holding) THEN
            -- Once the batch holds locks, it never waits long for another.
            PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
        END IF;
        call_index := i;
        BEGIN
            SELECT * INTO answer FROM tollgate_claim(c.id, c.scope, c.operation_key, c.kind, c.binding, c.binding_digest, c.accounting_day, c.state, c.fence, c.lease_now, c.lease_ms, c.hold, c.created_at, c.updated_at, c.chain, c.chains, c.hash_prefix, c.hash_mid, c.kinds, c.details, c.ats, c.tails, c.consumer, c.session_id, c.currency, c.session_block, c.daily_block, c.limit_subjects, c.limit_values, c.limit_tokens, c.config_digest);
            IF FOUND THEN
                call_state := 'row';
                call_row := answer;
            ELSE
                call_state := 'none';
                call_row := NULL;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            -- Rolled back to the start of this call: nothing of it is written.
            call_state := 'alone';
            call_row := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION tollgate_settle_calls(
    p_calls tollgate_settle_call[],
    p_lock_timeout_ms integer,
    p_holding boolean
)
RETURNS TABLE (call_index integer, call_state text, call_row tollgate_settled)
LANGUAGE plpgsql AS $$
DECLARE
    c tollgate_settle_call;
    answer tollgate_settled;
    answers tollgate_settled[];
BEGIN
    IF COALESCE(cardinality(p_calls), 0) = 0 THEN
        RETURN;
    END IF;
    -- The batch as a whole (H-38), as the claims' batch tries it.
    BEGIN
        PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
        answers := tollgate_settle_together(p_calls);
    EXCEPTION WHEN OTHERS THEN
        answers := NULL;
    END;
    IF answers IS NOT NULL THEN
        RETURN QUERY
        SELECT i, 'row'::text, answers[i] FROM generate_subscripts(answers, 1) AS i ORDER BY i;
        RETURN;
    END IF;
    FOR i IN 1 .. cardinality(p_calls) LOOP
        c := p_calls[i];
        IF i = 2 OR (i = 1 AND p_holding) THEN
            -- Once the batch holds locks, it never waits long for another.
            PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
        END IF;
        call_index := i;
        BEGIN
            SELECT * INTO answer FROM tollgate_settle(c.id, c.fence, c.states, c.binding_digest, c.hold, c.provider_ref, c.now, c.evidence_id, c.evidence_provider_ref, c.evidence_tokens, c.evidence_exact, c.evidence_source, c.evidence_at, c.evidence_acknowledged_at, c.settlement_id, c.consumer, c.session_id, c.provider, c.model, c.price_version, c.policy_version, c.currency, c.tokens, c.amount, c.source, c.outcome, c.stop, c.output, c.step, c.retention_expires_at, c.session_warn, c.session_block, c.daily_warn, c.daily_block, c.chain, c.hash_prefix, c.hash_mid, c.at, c.detail, c.tail, c.blocked_detail, c.blocked_tail);
            IF FOUND THEN
                call_state := 'row';
                call_row := answer;
            ELSE
                call_state := 'none';
                call_row := NULL;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            -- Rolled back to the start of this call: nothing of it is written.
            call_state := 'alone';
            call_row := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The advisory locks of the chain groups (H-35) of `p_chains`, in ascending order.
CREATE OR REPLACE FUNCTION tollgate_lock_groups(p_chains smallint[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1953459308, k.g)
    FROM (SELECT DISTINCT (c >> 3)::integer AS g FROM unnest(p_chains) AS c ORDER BY 1) AS k;
END
$$;

CREATE OR REPLACE FUNCTION tollgate_claim_batch(p_calls tollgate_claim_call[], p_lock_timeout_ms integer)
RETURNS TABLE (call_index integer, call_state text, call_row executions)
LANGUAGE plpgsql AS $$
BEGIN
    -- The calls' chain groups, locked in ascending order before any row (H-35).
    PERFORM tollgate_lock_groups(ARRAY(SELECT x.chain FROM unnest(p_calls) AS x));
    RETURN QUERY SELECT * FROM tollgate_claim_calls(p_calls, p_lock_timeout_ms, false);
END
$$;

CREATE OR REPLACE FUNCTION tollgate_settle_batch(p_calls tollgate_settle_call[], p_lock_timeout_ms integer)
RETURNS TABLE (call_index integer, call_state text, call_row tollgate_settled)
LANGUAGE plpgsql AS $$
BEGIN
    -- The calls' chain groups, locked in ascending order before any row (H-35).
    PERFORM tollgate_lock_groups(ARRAY(SELECT x.chain FROM unnest(p_calls) AS x));
    RETURN QUERY SELECT * FROM tollgate_settle_calls(p_calls, p_lock_timeout_ms, false);
END
$$;

-- A shard's settlements and claims in one statement and one commit (H-43): the chain groups of
-- all of them locked in ascending order (H-35), then the settlements decided as
-- `tollgate_settle_batch` decides them, then the claims as `tollgate_claim_batch` does, their
-- lock timeout from the first claim on when settlements came first (their locks are held).
-- Answers the settlements' rows as `call_index` 1 .. settlements, then the claims' as
-- settlements + 1 .., each claim's row in `tollgate_settled`'s shape (its execution columns;
-- the totals NULL).
CREATE OR REPLACE FUNCTION tollgate_shard_batch(
    p_settles tollgate_settle_call[],
    p_claims tollgate_claim_call[],
    p_lock_timeout_ms integer
)
RETURNS TABLE (call_index integer, call_state text, call_row tollgate_settled)
LANGUAGE plpgsql AS $$
DECLARE
    settles integer := COALESCE(cardinality(p_settles), 0);
BEGIN
    PERFORM tollgate_lock_groups(ARRAY(SELECT x.chain FROM unnest(p_settles) AS x
        UNION ALL SELECT x.chain FROM unnest(p_claims) AS x));
    RETURN QUERY SELECT * FROM tollgate_settle_calls(p_settles, p_lock_timeout_ms, false);
    RETURN QUERY
    SELECT c.call_index + settles, c.call_state,
        CASE WHEN c.call_state = 'row' THEN ROW((c.call_row).id, (c.call_row).scope,
            (c.call_row).operation_key, (c.call_row).kind, (c.call_row).root_key,
            (c.call_row).binding, (c.call_row).binding_digest, (c.call_row).accounting_day,
            (c.call_row).state, (c.call_row).not_dispatched_cause, (c.call_row).outcome,
            (c.call_row).fence, (c.call_row).lease_expires_at, (c.call_row).hold,
            (c.call_row).provider_ref, (c.call_row).created_at, (c.call_row).updated_at,
            (c.call_row).reconciliation_reason, NULL, NULL, NULL, NULL)::tollgate_settled END
    FROM tollgate_claim_calls(p_claims, p_lock_timeout_ms, settles > 0) AS c
    ORDER BY c.call_index;
END
$$;
