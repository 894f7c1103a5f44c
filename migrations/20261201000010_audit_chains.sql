-- A scope's audit trail is kept in 16 hash chains instead of one, so that appends for different
-- executions of one scope do not wait on one head. An execution's rows all go to one chain, chosen
-- from its id; rows of no execution go to chain 0. Every existing row and head becomes chain 0,
-- whose rows hash exactly as before, and the other 15 heads of every existing scope are created
-- empty: a scope has all 16 heads from its first row on, so a missing head is itself a finding.
ALTER TABLE audit_log ADD COLUMN chain smallint NOT NULL DEFAULT 0 CHECK (chain BETWEEN 0 AND 15);
ALTER TABLE audit_log ALTER COLUMN chain DROP DEFAULT;
ALTER TABLE audit_log DROP CONSTRAINT audit_log_pkey;
ALTER TABLE audit_log ADD PRIMARY KEY (scope, chain, seq);

ALTER TABLE audit_heads ADD COLUMN chain smallint NOT NULL DEFAULT 0 CHECK (chain BETWEEN 0 AND 15);
ALTER TABLE audit_heads ALTER COLUMN chain DROP DEFAULT;
ALTER TABLE audit_heads DROP CONSTRAINT audit_heads_pkey;
ALTER TABLE audit_heads ADD PRIMARY KEY (scope, chain);

INSERT INTO audit_heads (scope, chain, last_seq, last_hash)
SELECT h.scope, c.chain, 0, repeat('0', 64)
FROM audit_heads h CROSS JOIN generate_series(1, 15) AS c(chain)
ON CONFLICT DO NOTHING;
