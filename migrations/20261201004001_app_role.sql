-- Two database roles (spec/storage.md, Database roles): the role that runs migrations owns the
-- tables (it can alter them and disable the audit log's triggers); the server may run as a login
-- role that is a member of the NOLOGIN group role `tollgate_app`, which can read and write what the
-- call path needs, only INSERT into the audit log (and read it), and change no schema.

-- Roles are cluster-wide: create it once, tolerating a concurrent creator (many databases of one
-- cluster may migrate at the same time).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tollgate_app') THEN
        BEGIN
            CREATE ROLE tollgate_app NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END
$$;

-- No DDL for anyone but the owner (the default on Postgres 15 and later; explicit for older ones).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO tollgate_app;

-- The call path, the operator routes and the scheduler read, insert and update; nothing deletes.
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO tollgate_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO tollgate_app;

-- The audit log is append-only for the application: it may add rows and read them, never change,
-- remove or truncate one. (`audit_heads` stays writable: appends move the head.)
REVOKE UPDATE, DELETE, TRUNCATE ON audit_log FROM tollgate_app;

-- Readiness reads the applied migrations; the application never writes them.
REVOKE INSERT, UPDATE ON _sqlx_migrations FROM tollgate_app;

-- The finance view, as `tollgate finance export` reads it.
GRANT USAGE ON SCHEMA finance TO tollgate_app;
GRANT SELECT ON finance.settlements TO tollgate_app;

-- Tables and sequences that later migrations create (run by the same owner) get the same grants.
-- A later append-only table must revoke UPDATE from tollgate_app in its own migration, as above.
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE ON TABLES TO tollgate_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO tollgate_app;
