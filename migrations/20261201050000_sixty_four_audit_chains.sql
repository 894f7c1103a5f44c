-- A scope's audit rows are spread over 64 chains instead of 16 (spec/performance.md, H-31): with
-- 16, the calls in flight in one scope (up to the connection pool, 16 by default) met on one
-- chain's head often enough that one scope served measurably fewer calls than eight. Existing
-- rows keep their chains and hashes; every scope that has heads gets the 48 new ones, empty, so a
-- scope still has every head from its first row on and a missing head stays a finding.
ALTER DOMAIN tollgate_chain DROP CONSTRAINT tollgate_chain_check;
ALTER DOMAIN tollgate_chain ADD CONSTRAINT tollgate_chain_check CHECK (VALUE BETWEEN 0 AND 63);

INSERT INTO audit_heads (scope, chain, last_seq, last_hash)
SELECT s.scope, c.chain, 0, repeat('0', 64)
FROM (SELECT DISTINCT scope FROM audit_heads) AS s CROSS JOIN generate_series(16, 63) AS c(chain)
ORDER BY s.scope, c.chain
ON CONFLICT DO NOTHING;
