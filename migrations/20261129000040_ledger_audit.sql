-- The ledger audit (`tollgate audit ledger`, spec/storage.md) reads one scope's settlements and
-- acknowledged evidence; these indexes keep that read to the scope's own rows. Spend rows,
-- roots, root receipts and executions are already reached through indexes led by the scope.
CREATE INDEX cost_settlements_scope_idx
    ON cost_settlements (scope);
CREATE INDEX usage_inbox_acknowledged_scope_idx
    ON usage_inbox (scope)
    WHERE acknowledged_at IS NOT NULL;
