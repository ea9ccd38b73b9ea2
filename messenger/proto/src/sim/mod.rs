//! Test support behind the `sim` feature: the fuzz target bodies ([`fuzz`]).
pub mod fuzz;
