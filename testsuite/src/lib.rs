//! testsuite.
#![warn(missing_docs)]

pub mod cli;
pub mod guest;
pub mod stress;
