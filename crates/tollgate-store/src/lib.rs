//! Store traits, in-memory stores and the conformance suite.
