-- The instances of `tollgate serve` that share the calls of a cluster by consumer group
-- (spec/performance.md, H-39): each one with `[cluster] url` writes its row every
-- `INSTANCE_HEARTBEAT_MS` and reads the rows seen within `INSTANCE_EXPIRY_MS` by the database's
-- clock, so every instance counts the same members in the same order. The rows decide only which
-- instance sends a call's statements; no answer depends on them.
--
-- One row per `url`: an instance started again at the same address takes its row over (a new
-- `id`), and one that stops sets its `seen_at` to `-infinity`, so the application role deletes
-- nothing here either. `config_digest` is the SHA-256 of the member's profiles (their call
-- snapshots, prices and caps): members forward calls only to members of the same digest, which
-- serve every profile they serve. `proof` is the HMAC-SHA256 of the row's id, url and digest
-- under the members' shared secret: a row without a valid proof (written by anyone who can write
-- this table but does not hold the secret) is no member, so no request and no API key is sent
-- to an address only the database names.
CREATE TABLE instances (
    url text PRIMARY KEY,
    id uuid NOT NULL,
    config_digest text NOT NULL,
    proof text NOT NULL,
    seen_at timestamptz NOT NULL
);
CREATE INDEX instances_seen_idx ON instances (seen_at);

GRANT SELECT, INSERT, UPDATE ON instances TO tollgate_app;
