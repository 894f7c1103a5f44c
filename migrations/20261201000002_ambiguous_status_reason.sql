-- A new reconciliation reason (spec/journal.md, Reconciliation reasons): `ambiguous_status`, an
-- HTTP error status that does not prove the provider left the request unprocessed
-- (spec/providers.md, Send failures). Replaces the column CHECK on reconciliation_reason, whose
-- name Postgres generated, found here as the CHECK on that one column alone.
DO $$
DECLARE
    name text;
BEGIN
    FOR name IN
        SELECT c.conname
        FROM pg_constraint c
        JOIN pg_attribute a
          ON a.attrelid = c.conrelid AND a.attname = 'reconciliation_reason'
        WHERE c.conrelid = 'executions'::regclass
          AND c.contype = 'c'
          AND c.conkey = ARRAY[a.attnum]
    LOOP
        EXECUTE format('ALTER TABLE executions DROP CONSTRAINT %I', name);
    END LOOP;
END
$$;
ALTER TABLE executions
    ADD CONSTRAINT executions_reconciliation_reason_check
        CHECK (reconciliation_reason IN ('unpriced_usage', 'no_exact_usage', 'no_response',
                                         'ambiguous_status', 'recovery_no_exact_usage',
                                         'recovery_unpriced_usage'));
