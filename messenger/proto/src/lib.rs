//! msgr wire protocol.
