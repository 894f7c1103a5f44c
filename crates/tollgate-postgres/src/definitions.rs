//! The definitions step: every SQL function and composite type of the schema has one live source,
//! a `.sql` file beside the Rust that calls it ([`DEFINITIONS`]), applied after the versioned
//! migrations, like a repeatable migration.
//!
//! The versioned migrations create and change tables, domains and indexes; the migrations that
//! created the functions hold their bodies as they were applied then. A function or composite type
//! changes in its source only. `migrate` compares the SHA-256 of the embedded sources with the
//! digest recorded in `tollgate_definitions` and, when they differ, in one transaction under an
//! advisory lock (so that concurrent callers apply them once):
//!
//! 1. creates every composite type that is missing; a type whose attributes (names, types, order)
//!    differ from its source is dropped and created again, with the functions that name it, unless
//!    a column or another type uses it: then it refuses, since dropping it would drop that column;
//! 2. creates or replaces every function, in the order of [`DEFINITIONS`]; one whose result or
//!    parameter names differ from its source is dropped first, since `CREATE OR REPLACE` cannot
//!    change them;
//! 3. drops every function of ours (in `public`, named `tollgate_…` or by a source) that the
//!    sources no longer define;
//! 4. records the digest.
//!
//! Readiness counts a differing digest as pending, so a role that cannot create functions (the
//! application role, spec/storage.md) starts on a current database and is refused, by its
//! privileges, on a stale one.

use crate::error::{db, sqlstate};
use sha2::{Digest as _, Sha256};
use sqlx::{PgConnection, PgPool};
use std::sync::OnceLock;
use tollgate_store::StoreError;

/// One source of the definitions step: its path under the crate's `src/` and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Definition {
    /// The path of the source under `crates/tollgate-postgres/src/`.
    pub path: &'static str,
    /// The source: `CREATE TYPE … AS (…)` and `CREATE OR REPLACE FUNCTION …` statements only.
    pub sql: &'static str,
}

/// The sources of the schema's functions and composite types, in the order they are applied: a
/// function that a later one calls comes first (the cap rule and the limits before the claim and
/// the settlement; the single functions before the batches that call them).
pub const DEFINITIONS: [Definition; 6] = [
    Definition {
        path: "caps.sql",
        sql: include_str!("caps.sql"),
    },
    Definition {
        path: "audit.sql",
        sql: include_str!("audit.sql"),
    },
    Definition {
        path: "limits.sql",
        sql: include_str!("limits.sql"),
    },
    Definition {
        path: "claim/claim.sql",
        sql: include_str!("claim/claim.sql"),
    },
    Definition {
        path: "settle/settle.sql",
        sql: include_str!("settle/settle.sql"),
    },
    Definition {
        path: "batch/batch.sql",
        sql: include_str!("batch/batch.sql"),
    },
];

/// The SHA-256 of the sources, in their order, each with its path and each part with its length
/// (hex). Computed once: readiness compares it on every probe.
pub(crate) fn digest() -> &'static str {
    static DIGEST: OnceLock<String> = OnceLock::new();
    DIGEST.get_or_init(|| {
        let mut hasher = Sha256::new();
        for definition in &DEFINITIONS {
            for part in [definition.path, definition.sql] {
                hasher.update(u64::try_from(part.len()).unwrap_or(u64::MAX).to_be_bytes());
                hasher.update(part.as_bytes());
            }
        }
        hex::encode(hasher.finalize())
    })
}

/// What one statement of a source defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `CREATE TYPE name AS (…)`.
    Type,
    /// `CREATE OR REPLACE FUNCTION name(…)`.
    Function,
}

/// One statement of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Statement {
    pub(crate) kind: Kind,
    /// The object's name, unqualified (lowercase letters, digits and `_` only).
    pub(crate) name: String,
    /// The statement, without its `;`.
    pub(crate) sql: String,
}

impl Statement {
    /// The statement with the object in the session's temporary schema instead: a copy to
    /// compare with the object in `public`, which it leaves alone.
    fn in_temp_schema(&self) -> String {
        let head = match self.kind {
            Kind::Type => "CREATE TYPE ",
            Kind::Function => "CREATE OR REPLACE FUNCTION ",
        };
        let at = self.sql.find(head).unwrap_or(0) + head.len();
        format!("{}pg_temp.{}", &self.sql[..at], &self.sql[at..])
    }
}

/// The statements of `sql`, split at each `;` outside comments, quoted strings and dollar
/// quotes.
fn split(sql: &str) -> Vec<&str> {
    let bytes = sql.as_bytes();
    let mut out = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = sql[i..].find('\n').map_or(bytes.len(), |n| i + n);
            }
            b'\'' => {
                i = sql[i + 1..].find('\'').map_or(bytes.len(), |n| i + 1 + n);
            }
            b'$' => {
                let tag_len = sql[i + 1..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(0);
                if bytes.get(i + 1 + tag_len) == Some(&b'$') {
                    let tag = &sql[i..i + tag_len + 2];
                    let body = i + tag.len();
                    i = sql[body..]
                        .find(tag)
                        .map_or(bytes.len(), |n| body + n + tag.len() - 1);
                }
            }
            b';' => {
                out.push(&sql[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(&sql[start..]);
    out
}

/// The text of a statement after its leading blank lines and `--` comments.
fn code_of(statement: &str) -> &str {
    let mut rest = statement.trim_start();
    while rest.starts_with("--") {
        rest = rest.find('\n').map_or("", |n| &rest[n + 1..]).trim_start();
    }
    rest
}

/// The statements of one source.
///
/// # Errors
/// [`StoreError::Corrupt`] when a statement is neither `CREATE TYPE name AS (…)` nor
/// `CREATE OR REPLACE FUNCTION name(…)` on an unqualified name.
pub(crate) fn statements(definition: &Definition) -> Result<Vec<Statement>, StoreError> {
    let bad = |why: &str| StoreError::Corrupt(format!("definitions: {}: {why}", definition.path));
    let mut out = Vec::new();
    for statement in split(definition.sql) {
        let code = code_of(statement);
        if code.is_empty() {
            continue;
        }
        let (kind, rest) = if let Some(rest) = code.strip_prefix("CREATE TYPE ") {
            (Kind::Type, rest)
        } else if let Some(rest) = code.strip_prefix("CREATE OR REPLACE FUNCTION ") {
            (Kind::Function, rest)
        } else {
            return Err(bad("a statement that defines no type or function"));
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        let after = rest[name.len()..].trim_start();
        let well_formed = match kind {
            Kind::Type => after.starts_with("AS ("),
            Kind::Function => after.starts_with('('),
        };
        if name.is_empty() || !well_formed {
            return Err(bad(
                "a name that is not one unqualified lowercase identifier",
            ));
        }
        out.push(Statement {
            kind,
            name,
            sql: code.to_string(),
        });
    }
    Ok(out)
}

/// Every statement of [`DEFINITIONS`], in order.
pub(crate) fn all_statements() -> Result<Vec<Statement>, StoreError> {
    let mut out = Vec::new();
    for definition in &DEFINITIONS {
        out.extend(statements(definition)?);
    }
    Ok(out)
}

/// Serializes the definitions step of concurrent callers on one database (an arbitrary constant,
/// apart from the key sqlx's migrator derives from the database's name).
const LOCK: &str = "SELECT pg_advisory_xact_lock(7385129346118234001)";

/// The recorded digest.
const RECORDED: &str = "SELECT digest FROM tollgate_definitions WHERE singleton";

/// Records the digest of the applied sources.
const RECORD: &str = "INSERT INTO tollgate_definitions (singleton, digest, applied_at) \
     VALUES (true, $1, clock_timestamp()) \
     ON CONFLICT (singleton) DO UPDATE SET digest = EXCLUDED.digest, \
     applied_at = EXCLUDED.applied_at";

/// Whether `public` has the composite type `$1`.
const TYPE_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM pg_type t \
     WHERE t.typnamespace = 'public'::regnamespace AND t.typname::text = $1 AND t.typtype = 'c')";

/// Whether the composite type `$1` in `public` has the attributes of its copy in the temporary
/// schema: names, types (with modifiers and collations) and order.
const SAME_ATTRIBUTES: &str = "SELECT a IS NOT DISTINCT FROM b FROM \
     (SELECT array_agg(ROW(a.attname, a.atttypid, a.atttypmod, a.attcollation)::text \
        ORDER BY a.attnum) AS a \
      FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid \
      WHERE t.typnamespace = 'public'::regnamespace AND t.typname::text = $1 \
        AND a.attnum > 0 AND NOT a.attisdropped) x, \
     (SELECT array_agg(ROW(a.attname, a.atttypid, a.atttypmod, a.attcollation)::text \
        ORDER BY a.attnum) AS b \
      FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid \
      WHERE t.typnamespace = pg_my_temp_schema() AND t.typname::text = $1 \
        AND a.attnum > 0 AND NOT a.attisdropped) y";

/// A column (of a table, a view or another type) that uses the composite type `$1` of `public`
/// or its array, as `relation.column`.
const TYPE_USED_BY: &str = "SELECT c.oid::regclass::text || '.' || a.attname::text \
     FROM pg_type t \
     JOIN pg_attribute a ON a.atttypid IN (t.oid, t.typarray) AND NOT a.attisdropped \
     JOIN pg_class c ON c.oid = a.attrelid \
     WHERE t.typnamespace = 'public'::regnamespace AND t.typname::text = $1 \
       AND c.oid <> t.typrelid \
     ORDER BY 1 LIMIT 1";

/// The function `$1` as copied into the temporary schema: its signature (to drop it), its
/// argument types, and the function of `public` with the same argument types, when there is one:
/// its oid, its signature, and whether `CREATE OR REPLACE` can turn it into the copy (the same
/// result and the same arguments, names and defaults included).
const FUNCTION_COPY: &str = "SELECT t.oid::regprocedure::text, t.proargtypes::text, \
       o.oid::int8, o.oid::regprocedure::text, \
       pg_get_function_result(o.oid) IS NOT DISTINCT FROM pg_get_function_result(t.oid) \
       AND pg_get_function_arguments(o.oid) IS NOT DISTINCT FROM pg_get_function_arguments(t.oid) \
     FROM pg_proc t \
     LEFT JOIN pg_proc o ON o.pronamespace = 'public'::regnamespace AND o.proname = t.proname \
       AND o.proargtypes = t.proargtypes \
     WHERE t.pronamespace = pg_my_temp_schema() AND t.proname::text = $1";

/// The function `$1` of `public` with the argument types `$2`.
const FUNCTION_OID: &str = "SELECT p.oid::int8 FROM pg_proc p \
     WHERE p.pronamespace = 'public'::regnamespace AND p.proname::text = $1 \
       AND p.proargtypes = $2::oidvector";

/// The functions of ours in `public` (named `tollgate_…` or by a source, `$1`) other than the
/// ones the sources define (`$2`), by signature.
const UNDEFINED_FUNCTIONS: &str = "SELECT p.oid::regprocedure::text FROM pg_proc p \
     WHERE p.pronamespace = 'public'::regnamespace \
       AND (p.proname::text LIKE 'tollgate\\_%' OR p.proname::text = ANY($1)) \
       AND NOT (p.oid::int8 = ANY($2)) \
     ORDER BY 1";

/// A failure of the step, with its SQLSTATE; `42501` (insufficient privilege) when the role may
/// not create functions or types.
fn step_error(error: sqlx::Error) -> StoreError {
    let privilege = sqlstate(&error).as_deref() == Some("42501");
    match db(error) {
        StoreError::Unavailable(reason) if privilege => StoreError::Unavailable(format!(
            "definitions: {reason} (insufficient privilege to create the SQL functions)"
        )),
        StoreError::Unavailable(reason) => {
            StoreError::Unavailable(format!("definitions: {reason}"))
        }
        other => other,
    }
}

/// Whether the recorded digest differs from the sources' (no row: it does).
pub(crate) fn is_pending(recorded: Option<&str>) -> bool {
    recorded != Some(digest())
}

/// Runs a statement of our own: a source's, or one naming an identifier read from the catalog
/// or from a source (identifiers cannot be bound).
async fn execute(conn: &mut PgConnection, sql: &str) -> Result<(), StoreError> {
    sqlx::raw_sql(sql)
        .execute(&mut *conn)
        .await
        .map(|_| ())
        .map_err(step_error)
}

/// Applies the sources when their digest differs from the recorded one (see the module's
/// documentation).
///
/// # Errors
/// [`StoreError::Unavailable`] when a statement fails (nothing of the step is then committed), or a
/// composite type whose attributes changed is used by a column; [`StoreError::Corrupt`] when a
/// source is malformed.
pub(crate) async fn apply(pool: &PgPool) -> Result<(), StoreError> {
    let digest = digest();
    let mut tx = pool.begin().await.map_err(step_error)?;
    execute(&mut tx, LOCK).await?;
    let recorded: Option<String> = sqlx::query_scalar(RECORDED)
        .fetch_optional(&mut *tx)
        .await
        .map_err(step_error)?;
    if recorded.as_deref() == Some(digest) {
        return tx.commit().await.map_err(step_error);
    }
    // The sources name the schema's objects unqualified, as the migrations do.
    execute(&mut tx, "SET LOCAL search_path = public").await?;
    let statements = all_statements()?;
    for statement in statements.iter().filter(|s| s.kind == Kind::Type) {
        apply_type(&mut tx, statement).await?;
    }
    let mut defined = Vec::new();
    for statement in statements.iter().filter(|s| s.kind == Kind::Function) {
        defined.push(apply_function(&mut tx, statement).await?);
    }
    let names: Vec<&str> = statements
        .iter()
        .filter(|s| s.kind == Kind::Function)
        .map(|s| s.name.as_str())
        .collect();
    let undefined: Vec<String> = sqlx::query_scalar(UNDEFINED_FUNCTIONS)
        .bind(&names)
        .bind(&defined)
        .fetch_all(&mut *tx)
        .await
        .map_err(step_error)?;
    for signature in undefined {
        execute(&mut tx, &format!("DROP FUNCTION {signature}")).await?;
    }
    sqlx::query(RECORD)
        .bind(digest)
        .execute(&mut *tx)
        .await
        .map_err(step_error)?;
    tx.commit().await.map_err(step_error)
}

/// Step 1 for one composite type: created when missing, dropped and created again when its
/// attributes differ from the source and no column uses it.
async fn apply_type(conn: &mut PgConnection, statement: &Statement) -> Result<(), StoreError> {
    let name = &statement.name;
    let exists: bool = sqlx::query_scalar(TYPE_EXISTS)
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .map_err(step_error)?;
    if !exists {
        return execute(conn, &statement.sql).await;
    }
    execute(conn, &statement.in_temp_schema()).await?;
    let same: bool = sqlx::query_scalar(SAME_ATTRIBUTES)
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .map_err(step_error)?;
    // The copy goes at once: the temporary schema comes first in type lookups.
    execute(conn, &format!("DROP TYPE pg_temp.{name}")).await?;
    if same {
        return Ok(());
    }
    let used_by: Option<String> = sqlx::query_scalar(TYPE_USED_BY)
        .bind(name)
        .fetch_optional(&mut *conn)
        .await
        .map_err(step_error)?;
    if let Some(column) = used_by {
        return Err(StoreError::Unavailable(format!(
            "definitions: type {name} differs from its source, but {column} uses it: \
             change it by a versioned migration"
        )));
    }
    // The functions that name the type go with it; step 2 creates them again.
    execute(conn, &format!("DROP TYPE public.{name} CASCADE")).await?;
    execute(conn, &statement.sql).await
}

/// Step 2 for one function: created or replaced (dropped first when `CREATE OR REPLACE` cannot
/// turn the existing one into the source's). Returns its oid.
async fn apply_function(conn: &mut PgConnection, statement: &Statement) -> Result<i64, StoreError> {
    let name = &statement.name;
    execute(conn, &statement.in_temp_schema()).await?;
    let (copy, argument_types, existing, existing_signature, replaceable): (
        String,
        String,
        Option<i64>,
        Option<String>,
        Option<bool>,
    ) = sqlx::query_as(FUNCTION_COPY)
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .map_err(step_error)?;
    execute(conn, &format!("DROP FUNCTION {copy}")).await?;
    if let (Some(_), Some(signature), Some(false)) = (existing, existing_signature, replaceable) {
        execute(conn, &format!("DROP FUNCTION {signature}")).await?;
    }
    execute(conn, &statement.sql).await?;
    sqlx::query_scalar(FUNCTION_OID)
        .bind(name)
        .bind(argument_types)
        .fetch_one(&mut *conn)
        .await
        .map_err(step_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_is_types_and_functions_on_unqualified_names() {
        let statements = all_statements().unwrap();
        let names: Vec<(Kind, &str)> = statements
            .iter()
            .map(|s| (s.kind, s.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                (Kind::Function, "tollgate_cap_crossed"),
                (Kind::Function, "tollgate_crossed"),
                (Kind::Function, "audit_log_append_only"),
                (Kind::Function, "tollgate_limits_admit"),
                (Kind::Function, "tollgate_limits_end"),
                (Kind::Function, "tollgate_config_missing"),
                (Kind::Function, "tollgate_claim"),
                (Kind::Type, "tollgate_settled"),
                (Kind::Function, "tollgate_charge_spend"),
                (Kind::Function, "tollgate_settle"),
                (Kind::Type, "tollgate_claim_call"),
                (Kind::Type, "tollgate_settle_call"),
                (Kind::Function, "tollgate_claim_together"),
                (Kind::Function, "tollgate_settle_together"),
                (Kind::Function, "tollgate_claim_calls"),
                (Kind::Function, "tollgate_settle_calls"),
                (Kind::Function, "tollgate_lock_groups"),
                (Kind::Function, "tollgate_claim_batch"),
                (Kind::Function, "tollgate_settle_batch"),
                (Kind::Function, "tollgate_shard_batch"),
            ]
        );
        for s in &statements {
            assert!(s.in_temp_schema().contains(&format!("pg_temp.{}", s.name)));
        }
    }

    #[test]
    fn split_keeps_semicolons_in_comments_quotes_and_dollar_quotes() {
        let sql = "-- a; comment\nCREATE TYPE a AS (x int);\n\
                   CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$\n\
                   BEGIN RAISE NOTICE 'x;y'; RETURN 1; END $$;\n\
                   CREATE OR REPLACE FUNCTION g() RETURNS text LANGUAGE sql AS $body$ SELECT ';' $body$;\n";
        let parts: Vec<&str> = split(sql).into_iter().map(code_of).collect();
        assert_eq!(parts.len(), 4, "{parts:?}");
        assert_eq!(parts[0], "CREATE TYPE a AS (x int)");
        assert!(parts[1].ends_with("RETURN 1; END $$"), "{}", parts[1]);
        assert!(
            parts[2].ends_with("$body$ SELECT ';' $body$"),
            "{}",
            parts[2]
        );
        assert_eq!(parts[3], "");
    }

    #[test]
    fn a_statement_that_is_not_a_definition_is_refused() {
        let bad = Definition {
            path: "bad.sql",
            sql: "CREATE TABLE t (x int);",
        };
        assert!(matches!(statements(&bad), Err(StoreError::Corrupt(_))));
        let qualified = Definition {
            path: "bad.sql",
            sql:
                "CREATE OR REPLACE FUNCTION public.f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;",
        };
        assert!(matches!(
            statements(&qualified),
            Err(StoreError::Corrupt(_))
        ));
    }

    #[test]
    fn the_digest_covers_every_source() {
        assert_eq!(digest().len(), 64);
        assert!(is_pending(None));
        assert!(is_pending(Some("0")));
        assert!(!is_pending(Some(digest())));
    }
}
