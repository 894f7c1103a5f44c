-- Hot-path lookups keep their index in cached plans (spec/performance.md, H-12).
--
-- A pooled connection caches a generic plan for a prepared statement after a few executions.
-- On a freshly migrated database the tables have no statistics yet, every index looks as cheap
-- as any other, and a lookup by (scope, operation_key) or by id could be planned through any
-- index led by `scope`, filtering every row of the scope one by one; such a plan stays cached
-- until the table's next ANALYZE. Here no plain index of `executions` is led by `scope` any
-- more: the key's unique index is led by the operation key, and the listing indexes by the
-- state. A lookup then reaches exactly one index by its leading column, whatever the statistics
-- say. Listings name both `state` and `scope`; the ledger audit names every state. The partial
-- indexes led by `scope` only serve queries that repeat their predicate: the expired-lease scan
-- now reads the scope's open rows through `executions_open_scope_idx`, so the lease index goes
-- (and a lease renewal, which changes no indexed column, can be a HOT update).
ALTER TABLE executions DROP CONSTRAINT executions_scope_operation_key_key;
ALTER TABLE executions
    ADD CONSTRAINT executions_operation_key_scope_key UNIQUE (operation_key, scope);
DROP INDEX executions_scope_state_lease_idx;
DROP INDEX executions_scope_state_created_idx;
CREATE INDEX executions_state_scope_created_idx
    ON executions (state, scope, created_at, id);
