//! The operator and finance console (spec/service.md — Console): a page shell and its script and
//! stylesheet, embedded in the binary and served at `/console` under a strict
//! Content-Security-Policy (no inline script or style, nothing from another origin), and the JSON
//! reads under `/v1/console/…` that the script fetches with the key the user pasted.
//!
//! Every read is of the key's scope and shows metadata only: ids, states, amounts, usage counts,
//! versions. Prompts, outputs and system texts never leave the server through the console.
//! Charts are SVG drawn on the server with `plotters`.

pub mod assets;
pub mod audit;
pub mod backlog;
pub mod charts;
pub mod csv;
pub mod execution;
pub mod finance;
pub mod handlers;
pub mod overview;
pub mod session;
