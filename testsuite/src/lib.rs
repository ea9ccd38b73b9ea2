//! testsuite.
#![warn(missing_docs)]

pub mod guest;
pub mod stress;
