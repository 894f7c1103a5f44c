-- A column's own value rules as domains (spec/performance.md, H-25).
--
-- A table CHECK constraint is kept as text in the catalog and rebuilt (parsed, planned,
-- compiled) by every statement that writes the table, for every one of the table's constraints:
-- on the path of a call that was about a sixth of Postgres's CPU. A domain's rules are built once
-- per connection and cached, and a write checks only the columns it sets. So every rule on one
-- column of the tables a call writes becomes the column's type: the same rule, the same SQLSTATE
-- (23514, check_violation) when a value breaks it, and the same base type to every client.
-- Rules across columns (an outcome exactly when completed, ...) stay table constraints.
--
-- Changing a column to a domain with rules checks every stored value, so this migration rewrites
-- the tables below (and rebuilds their indexes) under an exclusive lock.

CREATE DOMAIN tollgate_kind AS text
    CHECK (VALUE IN ('text', 'json', 'structured', 'step'));
CREATE DOMAIN tollgate_execution_state AS text
    CHECK (VALUE IN ('prepared', 'dispatched', 'completed', 'not_dispatched',
                     'reconciliation_required'));
CREATE DOMAIN tollgate_not_dispatched_cause AS text
    CHECK (VALUE IN ('invalid', 'input', 'aborted', 'audit', 'store', 'expired'));
CREATE DOMAIN tollgate_outcome AS text
    CHECK (VALUE IN ('success', 'invalid', 'refused', 'blocked', 'truncated', 'unavailable'));
CREATE DOMAIN tollgate_reconciliation_reason AS text
    CHECK (VALUE IN ('unpriced_usage', 'no_exact_usage', 'no_response', 'ambiguous_status',
                     'recovery_no_exact_usage', 'recovery_unpriced_usage'));
CREATE DOMAIN tollgate_root_state AS text
    CHECK (VALUE IN ('active', 'closed', 'expired', 'reconciled'));
CREATE DOMAIN tollgate_evidence_source AS text
    CHECK (VALUE IN ('stream', 'late', 'operator'));
CREATE DOMAIN tollgate_settlement_source AS text
    CHECK (VALUE IN ('stream', 'recovery', 'operator'));
CREATE DOMAIN tollgate_currency AS text
    CHECK (VALUE ~ '^[A-Z]{3}$');
-- An amount of money: never negative, at the scale of every stored amount (spec/money.md).
CREATE DOMAIN tollgate_money AS NUMERIC(38, 12)
    CHECK (VALUE >= 0);
-- A count (tokens, calls, a chain's length).
CREATE DOMAIN tollgate_count AS bigint
    CHECK (VALUE >= 0);
-- A place counted from one (a fence, a chain's seq).
CREATE DOMAIN tollgate_ordinal AS bigint
    CHECK (VALUE >= 1);
-- One of a scope's sixteen audit chains.
CREATE DOMAIN tollgate_chain AS smallint
    CHECK (VALUE BETWEEN 0 AND 15);

-- The single-column rules the domains replace, whatever their names.
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT k.conrelid::regclass AS tab, k.conname
        FROM pg_constraint k
        JOIN pg_attribute a ON a.attrelid = k.conrelid AND k.conkey = ARRAY[a.attnum]
        WHERE k.contype = 'c'
          AND (k.conrelid::regclass::text, a.attname::text) IN (
              ('executions', 'kind'), ('executions', 'state'),
              ('executions', 'not_dispatched_cause'), ('executions', 'outcome'),
              ('executions', 'fence'), ('executions', 'hold'),
              ('executions', 'reconciliation_reason'),
              ('execution_results', 'outcome'),
              ('usage_inbox', 'input_tokens'), ('usage_inbox', 'output_tokens'),
              ('usage_inbox', 'cache_read_tokens'), ('usage_inbox', 'cache_write_tokens'),
              ('usage_inbox', 'reasoning_tokens'), ('usage_inbox', 'source'),
              ('cost_settlements', 'kind'), ('cost_settlements', 'currency'),
              ('cost_settlements', 'input_tokens'), ('cost_settlements', 'output_tokens'),
              ('cost_settlements', 'cache_read_tokens'),
              ('cost_settlements', 'cache_write_tokens'),
              ('cost_settlements', 'reasoning_tokens'), ('cost_settlements', 'amount'),
              ('cost_settlements', 'source'),
              ('spend_sessions', 'settled'), ('spend_sessions', 'held'),
              ('spend_sessions', 'currency'),
              ('spend_days', 'settled'), ('spend_days', 'held'), ('spend_days', 'currency'),
              ('audit_log', 'seq'), ('audit_log', 'chain'),
              ('audit_heads', 'last_seq'), ('audit_heads', 'chain'),
              ('roots', 'state'), ('roots', 'reserved_calls'), ('roots', 'charged'),
              ('roots', 'held'),
              ('root_receipts', 'amount'), ('root_receipts', 'currency'))
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', c.tab, c.conname);
    END LOOP;
END
$$;

-- The finance view names columns of cost_settlements: it is made again below.
DROP VIEW finance.settlements;

ALTER TABLE executions
    ALTER COLUMN kind TYPE tollgate_kind,
    ALTER COLUMN state TYPE tollgate_execution_state,
    ALTER COLUMN not_dispatched_cause TYPE tollgate_not_dispatched_cause,
    ALTER COLUMN outcome TYPE tollgate_outcome,
    ALTER COLUMN fence TYPE tollgate_ordinal,
    ALTER COLUMN hold TYPE tollgate_money,
    ALTER COLUMN reconciliation_reason TYPE tollgate_reconciliation_reason;
ALTER TABLE execution_results
    ALTER COLUMN outcome TYPE tollgate_outcome;
ALTER TABLE usage_inbox
    ALTER COLUMN input_tokens TYPE tollgate_count,
    ALTER COLUMN output_tokens TYPE tollgate_count,
    ALTER COLUMN cache_read_tokens TYPE tollgate_count,
    ALTER COLUMN cache_write_tokens TYPE tollgate_count,
    ALTER COLUMN reasoning_tokens TYPE tollgate_count,
    ALTER COLUMN source TYPE tollgate_evidence_source;
ALTER TABLE cost_settlements
    ALTER COLUMN kind TYPE tollgate_kind,
    ALTER COLUMN currency TYPE tollgate_currency,
    ALTER COLUMN input_tokens TYPE tollgate_count,
    ALTER COLUMN output_tokens TYPE tollgate_count,
    ALTER COLUMN cache_read_tokens TYPE tollgate_count,
    ALTER COLUMN cache_write_tokens TYPE tollgate_count,
    ALTER COLUMN reasoning_tokens TYPE tollgate_count,
    ALTER COLUMN amount TYPE tollgate_money,
    ALTER COLUMN source TYPE tollgate_settlement_source;
ALTER TABLE spend_sessions
    ALTER COLUMN settled TYPE tollgate_money,
    ALTER COLUMN held TYPE tollgate_money,
    ALTER COLUMN currency TYPE tollgate_currency;
ALTER TABLE spend_days
    ALTER COLUMN settled TYPE tollgate_money,
    ALTER COLUMN held TYPE tollgate_money,
    ALTER COLUMN currency TYPE tollgate_currency;
ALTER TABLE audit_log
    ALTER COLUMN seq TYPE tollgate_ordinal,
    ALTER COLUMN chain TYPE tollgate_chain;
ALTER TABLE audit_heads
    ALTER COLUMN last_seq TYPE tollgate_count,
    ALTER COLUMN chain TYPE tollgate_chain;
ALTER TABLE roots
    ALTER COLUMN state TYPE tollgate_root_state,
    ALTER COLUMN reserved_calls TYPE tollgate_count,
    ALTER COLUMN charged TYPE tollgate_money,
    ALTER COLUMN held TYPE tollgate_money;
ALTER TABLE root_receipts
    ALTER COLUMN amount TYPE tollgate_money,
    ALTER COLUMN currency TYPE tollgate_currency;

-- The finance view as before (spec/storage.md, Finance view): the same columns, each with the
-- same base type (`information_schema` lists a domain column by its base type, and clients
-- receive base types), still a plain view over one table that the finance role cannot write.
CREATE VIEW finance.settlements AS
SELECT settlement_id,
       scope,
       consumer,
       session_id,
       accounting_day,
       execution_id,
       operation_key,
       kind,
       provider,
       model,
       price_version,
       policy_version,
       currency,
       input_tokens,
       output_tokens,
       cache_read_tokens,
       cache_write_tokens,
       reasoning_tokens,
       amount,
       source,
       settled_at
FROM cost_settlements;
GRANT SELECT ON finance.settlements TO tollgate_finance;
GRANT SELECT ON finance.settlements TO tollgate_app;

-- The settlement function's answer carries the execution's columns with their types.
ALTER TYPE tollgate_settled
    ALTER ATTRIBUTE kind TYPE tollgate_kind,
    ALTER ATTRIBUTE state TYPE tollgate_execution_state,
    ALTER ATTRIBUTE not_dispatched_cause TYPE tollgate_not_dispatched_cause,
    ALTER ATTRIBUTE outcome TYPE tollgate_outcome,
    ALTER ATTRIBUTE fence TYPE tollgate_ordinal,
    ALTER ATTRIBUTE reconciliation_reason TYPE tollgate_reconciliation_reason;

-- The spend rows' totals after a charge, as plain numerics (see tollgate_settle).
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
