-- API keys of the HTTP service (spec/service.md, Auth): only the SHA-256 of a key is stored;
-- the key decides the scope and the role (SC-10). Keys are created by `tollgate keys create`.
CREATE TABLE api_keys (
    sha256     text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    scope      text NOT NULL CHECK (length(scope) BETWEEN 1 AND 200),
    role       text NOT NULL CHECK (role IN ('caller', 'operator', 'finance')),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The scheduler's "scopes with work" query (backend.rs) reads only open rows: these partial
-- indexes keep it from scanning finished executions and reconciled roots.
CREATE INDEX executions_open_scope_idx
    ON executions (scope)
    WHERE state IN ('prepared', 'dispatched', 'reconciliation_required');
CREATE INDEX roots_open_scope_idx
    ON roots (scope)
    WHERE state IN ('active', 'closed', 'expired');
