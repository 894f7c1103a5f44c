-- The settlement of a call outside an operation root as one function: the server calls it in one
-- statement, outside an explicit transaction, so the settlement is one round trip and one commit
-- (spec/performance.md, H-18, H-20), with the call's own usage evidence in it (H-15), acknowledged
-- in the same commit when it is exact and its usage is the usage charged (H-28).
--
-- The caller sends what it computed from the row as it last read it (its claim): the charge, the
-- result before the post-call block check, and the `settled` audit row twice (its outcome as
-- requested, and `blocked`), each with its hash input around its seq and previous hash (see
-- `tollgate_claim`). The function decides only what the locked rows decide:
--
-- - The row must still be the one the caller read: same fence, a settleable state, no root, the
--   same binding digest and hold. Otherwise (and when the chain's head or a spend row is missing,
--   or a spend row holds less than the hold) it raises SQLSTATE `TG002`: nothing is written and
--   the caller settles by the general transaction, which states the exact error.
-- - Lock order: the execution, the head of its audit chain, the session spend row, the day spend
--   row, then, for a call admitted under limits (`limit_subjects` on its row), its limit
--   windows. Every call of a consumer takes its day row, so what a settlement does while it
--   holds the spend rows is what one consumer's calls wait for.
-- - A call admitted under limits corrects the windows that counted it to its settled tokens
--   (`tollgate_limits_end`, limits.sql: every input class, output with reasoning, from `p_tokens`
--   in the order input, output, cache read, cache write, reasoning), and leaves flight when it
--   was `dispatched`. A call under none does nothing more.
-- - The post-call caps (`tollgate_crossed`, caps.sql) judge the settled totals after the charge.
--   A crossed block cap turns every outcome but `unavailable` into `blocked` and drops output and
--   step; the cost is settled either way.
-- - When no cap is near, that verdict is known before the spend rows are locked: the function
--   reads the totals without a lock, and when the charge crosses no cap on them, writes the
--   result, the audit row and the completion first and the spend rows last, so they are held for
--   one statement and the commit. It then checks the verdict on the locked totals; if a cap is
--   crossed after all (another call's charge came between), it raises `TG002` and the general
--   transaction settles, under its locks, from the start. When the unlocked totals already cross
--   a cap, the spend rows come before the verdict.
--
-- Answers the completed row and both spend rows' totals after the charge (`tollgate_settled`:
-- the execution's columns with their types, then the totals).
CREATE TYPE tollgate_settled AS (
    id uuid,
    scope text,
    operation_key text,
    kind tollgate_kind,
    root_key text,
    binding jsonb,
    binding_digest text,
    accounting_day date,
    state tollgate_execution_state,
    not_dispatched_cause tollgate_not_dispatched_cause,
    outcome tollgate_outcome,
    fence tollgate_ordinal,
    lease_expires_at timestamptz,
    hold numeric,
    provider_ref text,
    created_at timestamptz,
    updated_at timestamptz,
    reconciliation_reason tollgate_reconciliation_reason,
    session_settled numeric,
    session_held numeric,
    day_settled numeric,
    day_held numeric
);

-- A settlement's charge on its session and day spend rows, in one statement (the session's
-- first: the day's update reads the session's result): the hold released, the amount added; both
-- rows' totals after it, as plain numerics. No row when either row is missing or holds less than
-- the hold.
CREATE OR REPLACE FUNCTION tollgate_charge_spend(
    p_scope text,
    p_consumer text,
    p_session_id text,
    p_day date,
    p_currency text,
    p_amount numeric,
    p_hold numeric
) RETURNS TABLE (
    session_settled numeric,
    session_held numeric,
    day_settled numeric,
    day_held numeric
)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    WITH s AS (
        UPDATE spend_sessions s SET settled = s.settled + p_amount, held = s.held - p_hold
        WHERE s.scope = p_scope AND s.consumer = p_consumer AND s.session_id = p_session_id
            AND s.currency = p_currency AND s.held >= p_hold
        RETURNING s.settled, s.held
    ), d AS (
        UPDATE spend_days d SET settled = d.settled + p_amount, held = d.held - p_hold
        FROM s
        WHERE d.scope = p_scope AND d.consumer = p_consumer AND d.day = p_day
            AND d.currency = p_currency AND d.held >= p_hold
        RETURNING d.settled, d.held
    )
    SELECT s.settled::numeric, s.held::numeric, d.settled::numeric, d.held::numeric FROM s, d;
END
$$;

-- The settlement itself (see the top of this file).
CREATE OR REPLACE FUNCTION tollgate_settle(
    p_id uuid,
    p_fence bigint,
    p_states text[],
    p_binding_digest text,
    p_hold numeric,
    p_provider_ref text,
    p_now timestamptz,
    -- The call's own usage evidence (`p_evidence_id` NULL: none).
    p_evidence_id uuid,
    p_evidence_provider_ref text,
    p_evidence_tokens bigint[],
    p_evidence_exact boolean,
    p_evidence_source text,
    p_evidence_at timestamptz,
    -- When the settlement acknowledges that evidence (NULL: it stays open).
    p_evidence_acknowledged_at timestamptz,
    -- The charge.
    p_settlement_id uuid,
    p_consumer text,
    p_session_id text,
    p_provider text,
    p_model text,
    p_price_version text,
    p_policy_version text,
    p_currency text,
    p_tokens bigint[],
    p_amount numeric,
    p_source text,
    -- The result before the post-call block check.
    p_outcome text,
    p_stop text,
    p_output text,
    p_step text,
    p_retention_expires_at timestamptz,
    -- The post-call caps.
    p_session_warn numeric,
    p_session_block numeric,
    p_daily_warn numeric,
    p_daily_block numeric,
    -- The `settled` audit row: as requested, then as blocked.
    p_chain smallint,
    p_hash_prefix bytea,
    p_hash_mid bytea,
    p_at timestamptz,
    p_detail jsonb,
    p_tail bytea,
    p_blocked_detail jsonb,
    p_blocked_tail bytea
) RETURNS SETOF tollgate_settled
LANGUAGE plpgsql AS $$
DECLARE
    -- The locked row with its chain's head (`head_last_seq`, `head_last_hash`).
    e record;
    c executions;
    head_seq bigint;
    head_hash text;
    row_hash text;
    session_settled numeric;
    session_held numeric;
    day_settled numeric;
    day_held numeric;
    crossed jsonb := '[]'::jsonb;
    blocked boolean;
    settled_outcome text;
    verdict_first boolean := false;
    no_caps boolean := p_session_warn IS NULL AND p_session_block IS NULL
        AND p_daily_warn IS NULL AND p_daily_block IS NULL;
BEGIN
    -- The chain group's lock across instances (H-35), before any row.
    PERFORM pg_advisory_xact_lock(1953459308, (p_chain >> 3)::integer);
    -- The row, then the head of its chain: one statement, in the lock order.
    WITH x AS (SELECT * FROM executions x WHERE x.id = p_id FOR UPDATE)
    SELECT x.*, h.last_seq AS head_last_seq, h.last_hash AS head_last_hash INTO e
    FROM x LEFT JOIN LATERAL (
        SELECT h.last_seq, h.last_hash FROM audit_heads h
        WHERE h.scope = x.scope AND h.chain = p_chain FOR UPDATE
    ) h ON true;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TG002', MESSAGE = 'settle by the general transaction';
    END IF;
    head_seq := e.head_last_seq;
    head_hash := e.head_last_hash;
    IF e.root_key IS NOT NULL OR e.fence <> p_fence
        OR NOT (e.state = ANY (p_states)) OR e.binding_digest <> p_binding_digest
        OR e.hold <> p_hold OR head_seq IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'TG002', MESSAGE = 'settle by the general transaction';
    END IF;

    -- The evidence (when given) and the charge.
    WITH ev AS (
        INSERT INTO usage_inbox (id, scope, execution_id, operation_key, provider_ref,
            input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
            exact, source, received_at, acknowledged_at)
        SELECT p_evidence_id, e.scope, e.id, e.operation_key, p_evidence_provider_ref,
            p_evidence_tokens[1], p_evidence_tokens[2], p_evidence_tokens[3],
            p_evidence_tokens[4], p_evidence_tokens[5], p_evidence_exact, p_evidence_source,
            p_evidence_at, p_evidence_acknowledged_at
        WHERE p_evidence_id IS NOT NULL
    )
    INSERT INTO cost_settlements (settlement_id, execution_id, scope, operation_key, kind,
        consumer, session_id, accounting_day, provider, model, price_version, policy_version,
        currency, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
        reasoning_tokens, amount, source, settled_at)
    VALUES (p_settlement_id, e.id, e.scope, e.operation_key, e.kind, p_consumer, p_session_id,
        e.accounting_day, p_provider, p_model, p_price_version, p_policy_version, p_currency,
        p_tokens[1], p_tokens[2], p_tokens[3], p_tokens[4], p_tokens[5], p_amount, p_source,
        p_now);

    -- The verdict the charge would get on the totals as they are now (read without a lock).
    IF NOT no_caps THEN
        SELECT
            (SELECT s.settled FROM spend_sessions s
             WHERE s.scope = e.scope AND s.consumer = p_consumer AND s.session_id = p_session_id
                 AND s.currency = p_currency),
            (SELECT d.settled FROM spend_days d
             WHERE d.scope = e.scope AND d.consumer = p_consumer AND d.day = e.accounting_day
                 AND d.currency = p_currency)
        INTO session_settled, day_settled;
        verdict_first := tollgate_crossed(COALESCE(session_settled, 0) + p_amount,
            COALESCE(day_settled, 0) + p_amount, p_session_warn, p_session_block, p_daily_warn,
            p_daily_block) <> '[]'::jsonb;
    END IF;

    IF verdict_first THEN
        -- A cap is near: the spend rows first, then the verdict on their locked totals.
        SELECT t.session_settled, t.session_held, t.day_settled, t.day_held
        INTO session_settled, session_held, day_settled, day_held
        FROM tollgate_charge_spend(e.scope, p_consumer, p_session_id, e.accounting_day,
            p_currency, p_amount, p_hold) t;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'TG002', MESSAGE = 'settle by the general transaction';
        END IF;
        crossed := tollgate_crossed(session_settled, day_settled, p_session_warn,
            p_session_block, p_daily_warn, p_daily_block);
    END IF;
    -- No cap crossed when the spend rows come last (on the totals read before; checked below).
    blocked := crossed @> '[{"level": "block"}]'::jsonb AND p_outcome <> 'unavailable';
    settled_outcome := CASE WHEN blocked THEN 'blocked' ELSE p_outcome END;
    head_seq := head_seq + 1;
    row_hash := encode(sha256(p_hash_prefix || decode(head_hash, 'hex') || p_hash_mid
        || int8send(head_seq) || CASE WHEN blocked THEN p_blocked_tail ELSE p_tail END), 'hex');

    -- The result, the audit row, the head and the completion: one statement.
    WITH r AS (
        INSERT INTO execution_results (execution_id, outcome, stop, output, step, warnings,
            retention_expires_at, erased_at)
        VALUES (e.id, settled_outcome, p_stop,
            CASE WHEN blocked THEN NULL ELSE p_output::json END,
            CASE WHEN blocked THEN NULL ELSE p_step::json END,
            crossed, p_retention_expires_at, NULL)
    ), a AS (
        INSERT INTO audit_log (scope, chain, seq, execution_id, kind, detail, at, prev_hash,
            hash)
        VALUES (e.scope, p_chain, head_seq, e.id, 'settled',
            CASE WHEN blocked THEN p_blocked_detail ELSE p_detail END, p_at, head_hash, row_hash)
    ), h AS (
        UPDATE audit_heads SET last_seq = head_seq, last_hash = row_hash
        WHERE scope = e.scope AND chain = p_chain
    )
    UPDATE executions x SET state = 'completed', outcome = settled_outcome, hold = 0,
        provider_ref = COALESCE(p_provider_ref, x.provider_ref), updated_at = p_now
    WHERE x.id = p_id
    RETURNING x.* INTO c;

    IF NOT verdict_first THEN
        -- The spend rows last: held for this statement and the commit.
        SELECT t.session_settled, t.session_held, t.day_settled, t.day_held
        INTO session_settled, session_held, day_settled, day_held
        FROM tollgate_charge_spend(e.scope, p_consumer, p_session_id, e.accounting_day,
            p_currency, p_amount, p_hold) t;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'TG002', MESSAGE = 'settle by the general transaction';
        END IF;
        IF NOT no_caps AND tollgate_crossed(session_settled, day_settled, p_session_warn,
            p_session_block, p_daily_warn, p_daily_block) <> '[]'::jsonb THEN
            -- Another call's charge came between: the general transaction decides.
            RAISE EXCEPTION USING ERRCODE = 'TG002', MESSAGE = 'settle by the general transaction';
        END IF;
    END IF;

    IF e.limit_subjects IS NOT NULL THEN
        -- The limit windows last, after the spend rows.
        PERFORM tollgate_limits_end(e.scope, e.limit_subjects, e.limit_input_tokens,
            e.limit_output_tokens, e.limit_admitted_at, 'settled',
            LEAST(p_tokens[1]::numeric + p_tokens[3] + p_tokens[4], 9223372036854775807)::bigint,
            LEAST(p_tokens[2]::numeric + p_tokens[5], 9223372036854775807)::bigint,
            e.state = 'dispatched');
    END IF;

    RETURN QUERY SELECT c.id, c.scope, c.operation_key, c.kind, c.root_key, c.binding,
        c.binding_digest, c.accounting_day, c.state, c.not_dispatched_cause, c.outcome, c.fence,
        c.lease_expires_at, c.hold::numeric, c.provider_ref, c.created_at, c.updated_at,
        c.reconciliation_reason, session_settled, session_held, day_settled, day_held;
END
$$;
