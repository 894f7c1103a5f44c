//! What tollgate's tests share, and only its tests. A dev-dependency of the crates whose tests
//! use it, never a normal dependency: a build of the binary (`cargo build --release -p tollgate
//! --no-default-features`) holds none of it, and `tests/release.rs` checks that.
//!
//! - [`conformance`]: the store conformance suite, one set of cases every store implementation
//!   runs ([`store_conformance!`] and the suites it includes), and its fixtures (`text_config`,
//!   `claim_req`, `settle_req`, ...);
//! - [`pg`]: a brand-new, migrated Postgres database per test ([`pg::TestDatabase`],
//!   [`pg::fresh_test_database`]), a login role in `tollgate_app` for it, and the test SQL that
//!   reads and damages one behind the stores' back;
//! - [`bench`]: what the performance harness and the plan checks read from a test database
//!   (statistics, seeding, plans, the call path's statements and their indexes);
//! - [`captured`]: where the captured provider streams are;
//! - [`sdk_tour`]: the official OpenAI SDKs as clients of the front door;
//! - `mutation` (feature `mutation-skip-settle-fence`): the deliberate store defect the
//!   simulation must catch.
//!
//! Test SQL lives here (in [`pg`] and [`bench`]); the product's SQL stays in `tollgate-postgres`,
//! which names its statements for the plan checks through its `test_support` seam.
#![warn(missing_docs)]

pub mod bench;
pub mod captured;
pub mod conformance;
#[cfg(feature = "mutation-skip-settle-fence")]
pub mod mutation;
pub mod pg;
pub mod sdk_tour;
