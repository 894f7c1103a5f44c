//! Mapping of sqlx errors to [`StoreError`]s.
//!
//! Messages name codes, constraints and columns only: never row content, never connection
//! strings (H-1, SC-53).

use tollgate_store::StoreError;

/// SQLSTATE of a unique violation.
const UNIQUE_VIOLATION: &str = "23505";

/// SQLSTATE of a missing relation (e.g. migrations not applied).
pub(crate) const UNDEFINED_TABLE: &str = "42P01";

/// Maps a sqlx error: decoding problems are [`StoreError::Corrupt`], everything else
/// [`StoreError::Unavailable`] (the transaction did not commit).
pub(crate) fn db(error: sqlx::Error) -> StoreError {
    use sqlx::Error as E;
    match error {
        E::Database(e) => {
            let code = e.code().map(|c| c.into_owned()).unwrap_or_default();
            match e.constraint() {
                Some(constraint) => StoreError::Unavailable(format!(
                    "database error {code} on constraint {constraint}"
                )),
                None => StoreError::Unavailable(format!("database error {code}")),
            }
        }
        E::ColumnDecode { index, .. } => {
            StoreError::Corrupt(format!("column {index} could not be decoded"))
        }
        E::Decode(_) => StoreError::Corrupt("a value could not be decoded".into()),
        E::ColumnNotFound(name) => StoreError::Corrupt(format!("column {name} is missing")),
        E::Io(e) => StoreError::Unavailable(format!("database i/o error: {}", e.kind())),
        E::PoolTimedOut => StoreError::Unavailable("database pool timed out".into()),
        E::PoolClosed => StoreError::Unavailable("database pool closed".into()),
        E::Configuration(_) => StoreError::Unavailable("invalid database configuration".into()),
        E::Tls(_) => StoreError::Unavailable("database tls error".into()),
        E::Protocol(_) => StoreError::Unavailable("database protocol error".into()),
        _ => StoreError::Unavailable("database error".into()),
    }
}

/// `.store_err()` on a sqlx result: the error mapped by [`db`].
pub(crate) trait DbResultExt<T> {
    /// Maps the error to a [`StoreError`] (see [`db`]).
    fn store_err(self) -> Result<T, StoreError>;
}

impl<T> DbResultExt<T> for Result<T, sqlx::Error> {
    fn store_err(self) -> Result<T, StoreError> {
        self.map_err(db)
    }
}

/// Whether `error` is a unique violation (of `constraint`, when given).
pub(crate) fn is_unique_violation(error: &sqlx::Error, constraint: Option<&str>) -> bool {
    let sqlx::Error::Database(e) = error else {
        return false;
    };
    e.code().as_deref() == Some(UNIQUE_VIOLATION)
        && constraint.is_none_or(|c| e.constraint() == Some(c))
}

/// Whether `error` leaves its connection unusable, so that the connection must be closed rather
/// than used again: anything but an error the database answered (i/o, protocol, a decoding
/// failure mid-answer), and the database's errors of the classes `08` (connection exception) and
/// `57` (operator intervention: the backend was terminated, the server is shutting down or
/// starting) or of severity `FATAL` or `PANIC`.
pub(crate) fn ends_connection(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(e) = error else {
        return true;
    };
    let class = e.code().map(|c| c.chars().take(2).collect::<String>());
    if matches!(class.as_deref(), Some("08" | "57")) {
        return true;
    }
    e.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some_and(|e| {
            matches!(
                e.severity(),
                sqlx::postgres::PgSeverity::Fatal | sqlx::postgres::PgSeverity::Panic
            )
        })
}

/// The SQLSTATE of a database error, if it is one.
pub(crate) fn sqlstate(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(e) => e.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// The `DETAIL` of a database error our functions raise (a refusal's facts), if any.
pub(crate) fn detail(error: &sqlx::Error) -> Option<&str> {
    match error {
        sqlx::Error::Database(e) => e
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .and_then(sqlx::postgres::PgDatabaseError::detail),
        _ => None,
    }
}

/// A stored value that does not decode; names the field, never the value.
pub(crate) fn corrupt(field: &str) -> StoreError {
    StoreError::Corrupt(format!("{field} is not valid"))
}

/// A value that cannot be stored (out of the column's range); names the field only.
pub(crate) fn unstorable(field: &str) -> StoreError {
    StoreError::Corrupt(format!("{field} is out of the stored range"))
}
