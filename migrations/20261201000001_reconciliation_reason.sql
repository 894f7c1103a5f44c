-- Why an execution waits for an operator (spec/journal.md, Reconciliation reasons): set when it
-- becomes reconciliation_required and kept once an operator settles it.
ALTER TABLE executions
    ADD COLUMN reconciliation_reason text NULL
        CHECK (reconciliation_reason IN ('unpriced_usage', 'no_exact_usage', 'no_response',
                                         'recovery_no_exact_usage', 'recovery_unpriced_usage'));
ALTER TABLE executions
    ADD CONSTRAINT executions_reconciliation_reason_state
        CHECK (reconciliation_reason IS NULL
               OR state IN ('reconciliation_required', 'completed'));
