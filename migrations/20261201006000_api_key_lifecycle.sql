-- API key lifecycle (spec/service.md, Keys; SC-140): optional expiry, revocation, last use.
-- A revoked or expired key never authenticates; last use is updated at most once a minute
-- per key and process.
ALTER TABLE api_keys
    ADD COLUMN expires_at   timestamptz,
    ADD COLUMN revoked_at   timestamptz,
    ADD COLUMN last_used_at timestamptz;
CREATE INDEX api_keys_scope_idx ON api_keys (scope, created_at);
