//! scripted
