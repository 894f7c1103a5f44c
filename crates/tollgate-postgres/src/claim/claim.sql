-- The claim of a new key outside an operation root as one function: the server calls it in one
-- statement, outside an explicit transaction, so the claim is one round trip and one commit, and
-- the locks it takes are held for the function and the commit only (spec/performance.md, H-17).
--
-- In the crate's lock order: the chain group's advisory lock, the new execution row (the insert),
-- the head of its audit chain, the session spend row, the day spend row, and last, for a call
-- under limits, its subjects' limit windows.
--
-- - The key already has a row: nothing is written and no row is returned (the caller reads the
--   existing row). The insert waits for a concurrent claimer of the key, so that row is committed.
-- - The audit rows (`claimed`, then `dispatched` for a claim that is also the dispatch mark) are
--   hashed here, because only the locked head decides their seq and previous hash: the caller
--   sends each row's hash input around those two parts (`prefix`, `mid`, `tails`), so
--   `hash = sha256(prefix || prev || mid || seq as 8 bytes big-endian || tail)`, the same hash the
--   audit verifier recomputes.
-- - The hold is added to both spend rows, then the block caps judge the totals with it
--   (`tollgate_cap_crossed` on `settled + held`, i.e. the totals before it plus the hold). A
--   refusal raises SQLSTATE `TG001` with the totals before the hold in its detail
--   (`session_settled session_held day_settled day_held`): the statement fails, so the
--   transaction writes nothing, and the caller states the refusal from those totals.
-- - Under limits (`p_limit_subjects`, `p_limit_values`, `p_limit_tokens`, as
--   `tollgate_limits_admit` takes them; NULL subjects for a call under none, which then does no
--   more), the row is inserted with what its end needs (`limit_subjects`, `limit_input_tokens`,
--   `limit_output_tokens`, and `limit_admitted_at`, the lease's "now", known before the insert,
--   so the row is written once); after the caps, the limits admit the
--   call at that time (`tollgate_limits_admit`, limits.sql), writing the window rows only. A
--   refusal raises SQLSTATE `TG003`, and again nothing is written. A replay never gets here: the
--   insert found the key new.
-- - `p_binding` is the binding without its config when `p_config_digest` names the config, which
--   the server stores in `binding_configs` by its own statement first (H-40). A digest that names
--   no stored config raises SQLSTATE `TG005` before anything is locked or written; the caller
--   stores the config and claims again.
-- Raises SQLSTATE `TG005`: a claim names a config by digest (H-40) that `binding_configs` does
-- not hold. A function, so that a batch's statement can raise it for any of its calls.
CREATE OR REPLACE FUNCTION tollgate_config_missing() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'TG005', MESSAGE = 'binding config not stored';
END
$$;

CREATE OR REPLACE FUNCTION tollgate_claim(
    p_id uuid,
    p_scope text,
    p_operation_key text,
    p_kind text,
    p_binding jsonb,
    p_binding_digest text,
    p_accounting_day date,
    p_state text,
    p_fence bigint,
    p_lease_now timestamptz,
    p_lease_ms bigint,
    p_hold numeric,
    p_created_at timestamptz,
    p_updated_at timestamptz,
    p_chain smallint,
    p_chains integer,
    p_hash_prefix bytea,
    p_hash_mid bytea,
    p_kinds text[],
    p_details jsonb,
    p_ats timestamptz[],
    p_tails bytea[],
    p_consumer text,
    p_session_id text,
    p_currency text,
    p_session_block numeric,
    p_daily_block numeric,
    p_limit_subjects text[],
    p_limit_values bigint[],
    p_limit_tokens bigint[],
    p_config_digest text
) RETURNS SETOF executions
LANGUAGE plpgsql AS $$
DECLARE
    claimed executions;
    head_seq bigint;
    head_hash text;
    row_hash text;
    first_seq bigint;
    prevs text[] := '{}';
    hashes text[] := '{}';
    session_settled numeric;
    session_held numeric;
    day_settled numeric;
    day_held numeric;
    v_now timestamptz;
BEGIN
    -- A binding whose config is stored apart names it by digest (H-40): the config must be
    -- stored, or the row would name a config no reader finds. Nothing is locked yet.
    IF p_config_digest IS NOT NULL
        AND NOT EXISTS (SELECT FROM binding_configs b WHERE b.digest = p_config_digest) THEN
        PERFORM tollgate_config_missing();
    END IF;
    -- The chain group's lock across instances (H-35), before any row.
    PERFORM pg_advisory_xact_lock(1953459308, (p_chain >> 3)::integer);
    -- The lease's "now": the lease runs from it, and the limits admit the call at it.
    v_now := COALESCE(p_lease_now, clock_timestamp());
    INSERT INTO executions (id, scope, operation_key, kind, root_key, binding, binding_digest,
        accounting_day, state, not_dispatched_cause, outcome, fence, lease_expires_at, hold,
        provider_ref, created_at, updated_at, reconciliation_reason, limit_subjects,
        limit_input_tokens, limit_output_tokens, limit_admitted_at, config_digest)
    VALUES (p_id, p_scope, p_operation_key, p_kind, NULL, p_binding, p_binding_digest,
        p_accounting_day, p_state, NULL, NULL, p_fence,
        v_now + p_lease_ms * interval '1 millisecond',
        p_hold, NULL, p_created_at, p_updated_at, NULL,
        p_limit_subjects, p_limit_tokens[1], p_limit_tokens[2],
        CASE WHEN p_limit_subjects IS NOT NULL THEN v_now END, p_config_digest)
    ON CONFLICT (scope, operation_key) DO NOTHING
    RETURNING * INTO claimed;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    SELECT h.last_seq, h.last_hash INTO head_seq, head_hash FROM audit_heads h
    WHERE h.scope = p_scope AND h.chain = p_chain FOR UPDATE;
    IF NOT FOUND THEN
        -- The scope's first append: every head, in chain order (so two first appends of one
        -- scope wait for one another instead of deadlocking).
        INSERT INTO audit_heads (scope, chain, last_seq, last_hash)
        SELECT p_scope, c, 0, repeat('0', 64) FROM generate_series(0, p_chains - 1) AS c
        ORDER BY c
        ON CONFLICT DO NOTHING;
        SELECT h.last_seq, h.last_hash INTO STRICT head_seq, head_hash FROM audit_heads h
        WHERE h.scope = p_scope AND h.chain = p_chain FOR UPDATE;
    END IF;
    -- Each row's place and hash follow from the head; the rows and the head's move are then
    -- written by one statement.
    first_seq := head_seq + 1;
    FOR i IN 1 .. cardinality(p_kinds) LOOP
        head_seq := head_seq + 1;
        row_hash := encode(sha256(p_hash_prefix || decode(head_hash, 'hex') || p_hash_mid
            || int8send(head_seq) || p_tails[i]), 'hex');
        prevs := prevs || head_hash;
        hashes := hashes || row_hash;
        head_hash := row_hash;
    END LOOP;
    WITH h AS (
        UPDATE audit_heads SET last_seq = head_seq, last_hash = head_hash
        WHERE scope = p_scope AND chain = p_chain
    )
    INSERT INTO audit_log (scope, chain, seq, execution_id, kind, detail, at, prev_hash, hash)
    SELECT p_scope, p_chain, first_seq + i - 1, p_id, p_kinds[i], p_details -> (i - 1), p_ats[i],
        prevs[i], hashes[i]
    FROM generate_subscripts(p_kinds, 1) AS i;

    -- The hold on both spend rows in one statement, the session's first (the day's insert reads
    -- the session's result).
    WITH s AS (
        INSERT INTO spend_sessions AS s (scope, consumer, session_id, currency, held)
        VALUES (p_scope, p_consumer, p_session_id, p_currency, p_hold)
        ON CONFLICT (scope, consumer, session_id, currency)
        DO UPDATE SET held = s.held + EXCLUDED.held
        RETURNING s.settled, s.held
    ), d AS (
        INSERT INTO spend_days AS d (scope, consumer, day, currency, held)
        SELECT p_scope, p_consumer, p_accounting_day, p_currency, p_hold FROM s
        ON CONFLICT (scope, consumer, day, currency)
        DO UPDATE SET held = d.held + EXCLUDED.held
        RETURNING d.settled, d.held
    )
    SELECT s.settled, s.held, d.settled, d.held
    INTO session_settled, session_held, day_settled, day_held
    FROM s, d;
    IF tollgate_cap_crossed('block', session_settled + session_held, p_session_block)
        OR tollgate_cap_crossed('block', day_settled + day_held, p_daily_block) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'TG001',
            MESSAGE = 'a block cap refuses the hold',
            DETAIL = concat_ws(' ', session_settled, session_held - p_hold, day_settled,
                day_held - p_hold);
    END IF;
    IF p_limit_subjects IS NOT NULL THEN
        -- The limit windows last, after the day spend row.
        PERFORM tollgate_limits_admit(p_scope, p_limit_subjects, p_limit_values, p_limit_tokens,
            v_now);
    END IF;
    RETURN NEXT claimed;
END
$$;
