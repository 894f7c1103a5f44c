-- Calls batched into one statement and one commit (spec/performance.md, H-32): the claims (or
-- the settlements) of several calls outside a root, each decided exactly as the single function
-- decides it, in one statement whose one commit they share.
--
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
    limit_tokens bigint[]
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

CREATE OR REPLACE FUNCTION tollgate_claim_batch(p_calls tollgate_claim_call[], p_lock_timeout_ms integer)
RETURNS TABLE (call_index integer, call_state text, call_row executions)
LANGUAGE plpgsql AS $$
DECLARE
    c tollgate_claim_call;
    answer executions;
    g integer;
BEGIN
    -- The calls' chain groups, locked in ascending order before any row (H-35).
    FOR g IN SELECT DISTINCT (x.chain >> 3)::integer FROM unnest(p_calls) AS x ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(1953459308, g);
    END LOOP;
    FOR i IN 1 .. cardinality(p_calls) LOOP
        c := p_calls[i];
        IF i = 2 THEN
            -- From the second call on, a batch that holds locks never waits long for another.
            PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
        END IF;
        call_index := i;
        BEGIN
            SELECT * INTO answer FROM tollgate_claim(c.id, c.scope, c.operation_key, c.kind, c.binding, c.binding_digest, c.accounting_day, c.state, c.fence, c.lease_now, c.lease_ms, c.hold, c.created_at, c.updated_at, c.chain, c.chains, c.hash_prefix, c.hash_mid, c.kinds, c.details, c.ats, c.tails, c.consumer, c.session_id, c.currency, c.session_block, c.daily_block, c.limit_subjects, c.limit_values, c.limit_tokens);
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

CREATE OR REPLACE FUNCTION tollgate_settle_batch(p_calls tollgate_settle_call[], p_lock_timeout_ms integer)
RETURNS TABLE (call_index integer, call_state text, call_row tollgate_settled)
LANGUAGE plpgsql AS $$
DECLARE
    c tollgate_settle_call;
    answer tollgate_settled;
    g integer;
BEGIN
    -- The calls' chain groups, locked in ascending order before any row (H-35).
    FOR g IN SELECT DISTINCT (x.chain >> 3)::integer FROM unnest(p_calls) AS x ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(1953459308, g);
    END LOOP;
    FOR i IN 1 .. cardinality(p_calls) LOOP
        c := p_calls[i];
        IF i = 2 THEN
            -- From the second call on, a batch that holds locks never waits long for another.
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
