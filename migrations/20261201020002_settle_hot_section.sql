-- The settlement function with a shorter hot section (spec/performance.md, H-20): the spend
-- rows are the last locks of a settlement (H-13), and every call of a consumer takes its day row,
-- so what the transaction does while it holds them is what one consumer's calls wait for.
--
-- The post-call caps decide the result, its audit row and the completion from the totals after
-- the charge. When no cap is near, that verdict is known before the spend rows are locked: the
-- function reads the totals without a lock, and when the charge crosses no cap on them, writes
-- the result, the audit row and the completion first and updates the spend rows last, so they
-- are held for their two updates and the commit. It then checks the verdict on the locked
-- totals; if a cap is crossed after all (another call's charge came between), it raises
-- SQLSTATE `TG002` and the general transaction settles, under its locks, from the start. When
-- the unlocked totals already cross a cap, the function takes the spend rows before the verdict,
-- as before.

-- The post-call caps crossed by settled totals, in the order of the cap rules: the session's
-- warn then block, then the day's (a warn cap at `settled >= limit`, a block cap at
-- `settled > limit`).
CREATE FUNCTION tollgate_crossed(
    session_settled numeric,
    day_settled numeric,
    session_warn numeric,
    session_block numeric,
    daily_warn numeric,
    daily_block numeric
) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE(jsonb_agg(w ORDER BY n), '[]'::jsonb)
    FROM (VALUES
        (1, CASE WHEN session_warn IS NOT NULL AND session_settled >= session_warn THEN
            jsonb_build_object('cap', 'session', 'level', 'warn', 'limit', session_warn::text,
                'spent', session_settled::text) END),
        (2, CASE WHEN session_block IS NOT NULL AND session_settled > session_block THEN
            jsonb_build_object('cap', 'session', 'level', 'block', 'limit', session_block::text,
                'spent', session_settled::text) END),
        (3, CASE WHEN daily_warn IS NOT NULL AND day_settled >= daily_warn THEN
            jsonb_build_object('cap', 'daily', 'level', 'warn', 'limit', daily_warn::text,
                'spent', day_settled::text) END),
        (4, CASE WHEN daily_block IS NOT NULL AND day_settled > daily_block THEN
            jsonb_build_object('cap', 'daily', 'level', 'block', 'limit', daily_block::text,
                'spent', day_settled::text) END)
    ) AS v(n, w)
    WHERE w IS NOT NULL
$$;

-- A settlement's charge on its session and day spend rows (the session's first): the hold
-- released, the amount added; both rows' totals after it. A missing row, or one that holds less
-- than the hold, raises `TG002` (see `tollgate_settle`).
CREATE FUNCTION tollgate_charge_spend(
    p_scope text,
    p_consumer text,
    p_session_id text,
    p_day date,
    p_currency text,
    p_amount numeric,
    p_hold numeric,
    OUT session_settled numeric,
    OUT session_held numeric,
    OUT day_settled numeric,
    OUT day_held numeric
)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE spend_sessions s SET settled = s.settled + p_amount, held = s.held - p_hold
    WHERE s.scope = p_scope AND s.consumer = p_consumer AND s.session_id = p_session_id
        AND s.currency = p_currency AND s.held >= p_hold
    RETURNING s.settled, s.held INTO session_settled, session_held;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TG002', MESSAGE = 'settle by the general transaction';
    END IF;
    UPDATE spend_days d SET settled = d.settled + p_amount, held = d.held - p_hold
    WHERE d.scope = p_scope AND d.consumer = p_consumer AND d.day = p_day
        AND d.currency = p_currency AND d.held >= p_hold
    RETURNING d.settled, d.held INTO day_settled, day_held;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TG002', MESSAGE = 'settle by the general transaction';
    END IF;
END
$$;

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
    e executions;
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
    SELECT * INTO e FROM executions x WHERE x.id = p_id FOR UPDATE;
    IF NOT FOUND OR e.root_key IS NOT NULL OR e.fence <> p_fence
        OR NOT (e.state = ANY (p_states)) OR e.binding_digest <> p_binding_digest
        OR e.hold <> p_hold THEN
        RAISE EXCEPTION USING ERRCODE = 'TG002', MESSAGE = 'settle by the general transaction';
    END IF;
    SELECT h.last_seq, h.last_hash INTO head_seq, head_hash FROM audit_heads h
    WHERE h.scope = e.scope AND h.chain = p_chain FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TG002', MESSAGE = 'settle by the general transaction';
    END IF;

    IF p_evidence_id IS NOT NULL THEN
        INSERT INTO usage_inbox (id, scope, execution_id, operation_key, provider_ref,
            input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
            exact, source, received_at)
        VALUES (p_evidence_id, e.scope, e.id, e.operation_key, p_evidence_provider_ref,
            p_evidence_tokens[1], p_evidence_tokens[2], p_evidence_tokens[3],
            p_evidence_tokens[4], p_evidence_tokens[5], p_evidence_exact, p_evidence_source,
            p_evidence_at);
    END IF;
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
        SELECT s.settled INTO session_settled FROM spend_sessions s
        WHERE s.scope = e.scope AND s.consumer = p_consumer AND s.session_id = p_session_id
            AND s.currency = p_currency;
        SELECT d.settled INTO day_settled FROM spend_days d
        WHERE d.scope = e.scope AND d.consumer = p_consumer AND d.day = e.accounting_day
            AND d.currency = p_currency;
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
        crossed := tollgate_crossed(session_settled, day_settled, p_session_warn,
            p_session_block, p_daily_warn, p_daily_block);
    END IF;
    -- No cap crossed (when the spend rows come last: on the totals read before, checked below).
    blocked := crossed @> '[{"level": "block"}]'::jsonb AND p_outcome <> 'unavailable';
    settled_outcome := CASE WHEN blocked THEN 'blocked' ELSE p_outcome END;

    INSERT INTO execution_results (execution_id, outcome, stop, output, step, warnings,
        retention_expires_at, erased_at)
    VALUES (e.id, settled_outcome, p_stop,
        CASE WHEN blocked THEN NULL ELSE p_output::json END,
        CASE WHEN blocked THEN NULL ELSE p_step::json END,
        crossed, p_retention_expires_at, NULL);

    head_seq := head_seq + 1;
    row_hash := encode(sha256(p_hash_prefix || decode(head_hash, 'hex') || p_hash_mid
        || int8send(head_seq) || CASE WHEN blocked THEN p_blocked_tail ELSE p_tail END), 'hex');
    INSERT INTO audit_log (scope, chain, seq, execution_id, kind, detail, at, prev_hash, hash)
    VALUES (e.scope, p_chain, head_seq, e.id, 'settled',
        CASE WHEN blocked THEN p_blocked_detail ELSE p_detail END, p_at, head_hash, row_hash);
    UPDATE audit_heads SET last_seq = head_seq, last_hash = row_hash
    WHERE scope = e.scope AND chain = p_chain;

    UPDATE executions x SET state = 'completed', outcome = settled_outcome, hold = 0,
        provider_ref = COALESCE(p_provider_ref, x.provider_ref), updated_at = p_now
    WHERE x.id = p_id
    RETURNING x.* INTO c;

    IF NOT verdict_first THEN
        -- The spend rows last: held for these two updates and the commit.
        SELECT t.session_settled, t.session_held, t.day_settled, t.day_held
        INTO session_settled, session_held, day_settled, day_held
        FROM tollgate_charge_spend(e.scope, p_consumer, p_session_id, e.accounting_day,
            p_currency, p_amount, p_hold) t;
        IF NOT no_caps AND tollgate_crossed(session_settled, day_settled, p_session_warn,
            p_session_block, p_daily_warn, p_daily_block) <> '[]'::jsonb THEN
            -- Another call's charge came between: the general transaction decides.
            RAISE EXCEPTION USING ERRCODE = 'TG002', MESSAGE = 'settle by the general transaction';
        END IF;
    END IF;

    RETURN QUERY SELECT c.id, c.scope, c.operation_key, c.kind, c.root_key, c.binding,
        c.binding_digest, c.accounting_day, c.state, c.not_dispatched_cause, c.outcome, c.fence,
        c.lease_expires_at, c.hold::numeric, c.provider_ref, c.created_at, c.updated_at,
        c.reconciliation_reason, session_settled, session_held, day_settled, day_held;
END
$$;
