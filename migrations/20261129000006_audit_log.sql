-- The audit log: append-only, hash-chained per scope, metadata only (never content).
CREATE TABLE audit_log (
    scope        text NOT NULL,
    seq          bigint NOT NULL CHECK (seq >= 1),
    execution_id uuid NULL,
    kind         text NOT NULL,
    detail       jsonb NOT NULL,
    at           timestamptz NOT NULL,
    prev_hash    text NOT NULL,
    hash         text NOT NULL,
    PRIMARY KEY (scope, seq)
);

-- The head of each scope's chain. Appends lock it, so a scope's rows are written one at a
-- time with gapless seqs.
CREATE TABLE audit_heads (
    scope     text PRIMARY KEY,
    last_seq  bigint NOT NULL CHECK (last_seq >= 0),
    last_hash text NOT NULL
);

CREATE FUNCTION audit_log_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP;
END;
$$;

CREATE TRIGGER audit_log_no_update_delete
    BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();

CREATE TRIGGER audit_log_no_truncate
    BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
