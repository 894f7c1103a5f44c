-- The digest of the SQL functions and composite types applied by the definitions step
-- (spec/storage.md, SQL functions): their live bodies are the `.sql` sources of the Postgres crate,
-- not these migrations. After the versioned migrations, `migrate` compares the SHA-256 of the
-- sources it embeds with the digest recorded here and, when they differ, applies the sources and
-- records theirs; readiness counts a differing digest as pending. One row.
CREATE TABLE tollgate_definitions (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    digest     text NOT NULL,
    applied_at timestamptz NOT NULL
);

-- Readiness reads the digest; only the owner, which applies the definitions, writes it.
REVOKE INSERT, UPDATE ON tollgate_definitions FROM tollgate_app;
GRANT SELECT ON tollgate_definitions TO tollgate_app;
