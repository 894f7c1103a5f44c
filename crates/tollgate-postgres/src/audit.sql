-- The audit log's triggers refuse every UPDATE, DELETE and TRUNCATE of `audit_log`: the log is
-- append-only even for a client that bypasses the stores (the application role cannot change a
-- row by its privileges either; the owner could disable the triggers).
CREATE OR REPLACE FUNCTION audit_log_append_only() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP;
END;
$$;
