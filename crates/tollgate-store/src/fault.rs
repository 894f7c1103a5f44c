//! fault
