-- Fewer index entries per call (spec/performance.md, H-29): every index of a table a call
-- inserts into costs an entry per row, and a settlement inserts a charge and an evidence row.
--
-- - `cost_settlements_scope_idx (scope)`: the ledger audit's read of a scope's settlements is
--   served as well by `cost_settlements_feed_scope_idx (scope, txid, seq)`, led by the scope.
-- - `cost_settlements_seq_key` (`seq` UNIQUE): no query looks a charge up by `seq` alone. What
--   must be unique is a charge's position in the finance feed, `(txid, seq)`, which every feed
--   page resumes after; the feed's index across scopes becomes that unique index, so the
--   guarantee is stated where it is relied on (`seq` is still drawn from its sequence).
-- - `usage_inbox_seq_key` (`seq` UNIQUE): no query looks evidence up by `seq` alone, and a
--   generic plan could page a scope's open evidence through it, walking every acknowledged row
--   (the growth section's "open evidence page" plan). The open page keeps its partial index
--   `usage_inbox_open_idx (scope, seq)`; an execution's evidence keeps
--   `usage_inbox_execution_idx (execution_id, seq)`.
DROP INDEX cost_settlements_scope_idx;
CREATE UNIQUE INDEX cost_settlements_feed_key ON cost_settlements (txid, seq);
DROP INDEX cost_settlements_feed_idx;
ALTER TABLE cost_settlements DROP CONSTRAINT cost_settlements_seq_key;
ALTER TABLE usage_inbox DROP CONSTRAINT usage_inbox_seq_key;
