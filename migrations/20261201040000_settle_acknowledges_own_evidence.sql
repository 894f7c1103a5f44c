-- A settlement acknowledges the call's own usage evidence in its commit (spec/journal.md,
-- Settlement; spec/performance.md, H-28): the caller passes `p_evidence_acknowledged_at` when that
-- evidence is exact and its usage is the usage charged, which is what usage reconciliation would
-- find and acknowledge later. The row then goes into the inbox already acknowledged, and the
-- scheduler never writes it again. Otherwise the function is `tollgate_settle` as before
-- (`20261201020001_settle_function.sql`); only its signature gains that parameter.
DROP FUNCTION tollgate_settle(
    uuid, bigint, text[], text, numeric, text, timestamptz, uuid, text, bigint[], boolean, text,
    timestamptz, uuid, text, text, text, text, text, text, text, bigint[], numeric, text, text,
    text, text, text, timestamptz, numeric, numeric, numeric, numeric, smallint, bytea, bytea,
    timestamptz, jsonb, bytea, jsonb, bytea
);

CREATE FUNCTION tollgate_settle(
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

    RETURN QUERY SELECT c.id, c.scope, c.operation_key, c.kind, c.root_key, c.binding,
        c.binding_digest, c.accounting_day, c.state, c.not_dispatched_cause, c.outcome, c.fence,
        c.lease_expires_at, c.hold::numeric, c.provider_ref, c.created_at, c.updated_at,
        c.reconciliation_reason, session_settled, session_held, day_settled, day_held;
END
$$;
