//! caps
