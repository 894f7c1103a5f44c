//! Runners.
