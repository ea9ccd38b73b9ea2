//! How msgr's errors read: Debug as Display, and long input cut.

use std::borrow::Cow;

/// How much of a bad input an error message quotes ([`excerpt`]).
pub const EXCERPT_LEN: usize = 80;

/// `text` as an error message quotes it: whole up to [`EXCERPT_LEN`]
/// bytes, else its start, `…` and its length, so that 100 KB of bad
/// input is not echoed into a terminal or a log line.
///
/// ```
/// let long = "x".repeat(100_000);
/// let shown = msgr_addr::excerpt(&long);
/// assert!(shown.ends_with("… (100000 bytes)"), "{shown}");
/// assert!(shown.len() < 100);
/// assert_eq!(msgr_addr::excerpt("tcp://x"), "tcp://x");
/// ```
pub fn excerpt(text: &str) -> Cow<'_, str> {
    if text.len() <= EXCERPT_LEN {
        return Cow::Borrowed(text);
    }
    let mut end = EXCERPT_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes)", &text[..end], text.len()))
}

/// Implements `Debug` for the error types listed as their `Display`: the
/// text a user reads, as `std::io::Error`'s Debug carries its message.
/// `fn main() -> Result<(), Box<dyn Error>>` prints an error it returns
/// with Debug, so `Error: Config(UnknownKey("bnid"))` would lose the
/// "did you mean `bind`?" that Display says. msgr's error types of every
/// crate (address, protocol, messenger) use this one macro.
///
/// ```
/// #[derive(thiserror::Error)]
/// enum ParseError {
///     #[error("unknown key {0:?} (did you mean `bind`?)")]
///     UnknownKey(String),
/// }
/// msgr_addr::debug_is_display!(ParseError);
/// let e = ParseError::UnknownKey("bnid".into());
/// assert_eq!(format!("{e:?}"), r#"unknown key "bnid" (did you mean `bind`?)"#);
/// ```
#[macro_export]
macro_rules! debug_is_display {
    ($($error:ty),+ $(,)?) => {
        $(
            impl ::core::fmt::Debug for $error {
                fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                    ::core::fmt::Display::fmt(self, f)
                }
            }
        )+
    };
}
