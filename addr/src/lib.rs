//! Typed entity addresses and entity names.
