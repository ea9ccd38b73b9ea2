//! msgr.
