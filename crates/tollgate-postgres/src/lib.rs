//! Postgres stores.
