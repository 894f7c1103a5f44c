-- The finance view (spec/storage.md, Finance view): a stable, documented view over cost_settlements and a
-- read-only role that can read it and nothing else. Changing the view needs a migration note.
CREATE SCHEMA finance;

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

-- Roles are cluster-wide: create it once, tolerating a concurrent creator.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tollgate_finance') THEN
        BEGIN
            CREATE ROLE tollgate_finance NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA finance TO tollgate_finance;
GRANT SELECT ON finance.settlements TO tollgate_finance;
