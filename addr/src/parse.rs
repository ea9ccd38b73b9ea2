//! Small lexical helpers shared by the parsers.

use std::str::FromStr;

use crate::error::AddrParseError;

/// Rejects empty input and input longer than `max` bytes, before any other
/// work is done on it.
pub(crate) fn check_len(s: &str, max: usize) -> Result<(), AddrParseError> {
    if s.is_empty() {
        Err(AddrParseError::Empty)
    } else if s.len() > max {
        Err(AddrParseError::TooLong { len: s.len(), max })
    } else {
        Ok(())
    }
}

/// Parses a canonical unsigned decimal: one or more ASCII digits, no sign, no
/// leading zero unless the number is exactly `0`, and in range for `T`.
pub(crate) fn parse_decimal<T: FromStr>(s: &str) -> Option<T> {
    let digits_only = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let leading_zero = s.len() > 1 && s.starts_with('0');
    if digits_only && !leading_zero {
        s.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_is_canonical_only() {
        assert_eq!(parse_decimal::<u8>("0"), Some(0));
        assert_eq!(parse_decimal::<u8>("255"), Some(255));
        assert_eq!(parse_decimal::<u8>("256"), None);
        assert_eq!(parse_decimal::<u8>("01"), None);
        assert_eq!(parse_decimal::<u8>("+1"), None);
        assert_eq!(parse_decimal::<u8>(""), None);
        assert_eq!(parse_decimal::<u8>("1 "), None);
        assert_eq!(parse_decimal::<u64>("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_decimal::<u64>("18446744073709551616"), None);
    }

    #[test]
    fn len_bounds() {
        assert_eq!(check_len("", 4), Err(AddrParseError::Empty));
        assert_eq!(check_len("abcd", 4), Ok(()));
        assert_eq!(
            check_len("abcde", 4),
            Err(AddrParseError::TooLong { len: 5, max: 4 })
        );
    }
}
