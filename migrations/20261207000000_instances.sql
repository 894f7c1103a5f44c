-- The instances of `tollgate serve` that share the calls of a cluster by consumer group
-- (spec/performance.md, H-39): each one with `[cluster] url` writes its row every
-- `INSTANCE_HEARTBEAT_MS` and reads the rows seen within `INSTANCE_EXPIRY_MS` by the database's
-- clock, so every instance counts the same members in the same order. The rows decide only which
-- instance sends a call's statements; no answer depends on them.
--
-- One row per `url`: an instance started again at the same address takes its row over (a new
-- `id`), and one that stops sets its `seen_at` to `-infinity`, so the application role deletes
-- nothing here either.
CREATE TABLE instances (
    url text PRIMARY KEY,
    id uuid NOT NULL,
    seen_at timestamptz NOT NULL
);
CREATE INDEX instances_seen_idx ON instances (seen_at);

GRANT SELECT, INSERT, UPDATE ON instances TO tollgate_app;
