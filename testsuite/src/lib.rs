//! testsuite.
pub mod guest;
pub mod stress;
