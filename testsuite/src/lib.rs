//! testsuite.
pub mod guest;
