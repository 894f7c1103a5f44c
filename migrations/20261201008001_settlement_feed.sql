-- The finance feed (spec/service.md — Finance feed, SC-141): every settlement records the id of the
-- transaction that inserted it (`xid8`, never wraps). The feed orders by (txid, seq) and returns
-- only rows whose transaction is older than the oldest one still running
-- (`pg_snapshot_xmin(pg_current_snapshot())`): those rows can no longer change, and every row
-- committed later sorts after them, so a reader that resumes after its last position misses none.
-- Ordering by `seq` alone would not do: `seq` is drawn at insert, after the settling transaction
-- took its id (the execution row lock), so a lower `seq` can belong to a younger transaction.
--
-- Existing rows take this migration's transaction id (all of them committed already) and keep
-- their relative order through `seq`. The finance view lists its columns, so it is unchanged; the
-- column is covered by the existing table grants of `tollgate_app`.
ALTER TABLE cost_settlements
    ADD COLUMN txid xid8 NOT NULL DEFAULT pg_current_xact_id();

-- The feed of one scope, and across scopes (the operator export), in feed order.
CREATE INDEX cost_settlements_feed_scope_idx ON cost_settlements (scope, txid, seq);
CREATE INDEX cost_settlements_feed_idx ON cost_settlements (txid, seq);
