//! A source file made readable for the checker: comments, strings and
//! `#[cfg(test)]` modules blanked out, every other byte (newlines above
//! all) kept at its place, so an offset still gives the file's line.

/// `code` with comments, string and character literals blanked out.
pub fn strip_comments_and_strings(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let end = if b[i..].starts_with(b"//") {
            i + b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .unwrap_or(b.len() - i)
        } else if b[i..].starts_with(b"/*") {
            i + 2 + find(&b[i + 2..], b"*/").map_or(b.len() - i - 2, |at| at + 2)
        } else if b[i] == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) {
            // A raw string: r"..." or r#"..."# (r#ident is not one).
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let mut close = vec![b'#'; hashes + 1];
            close[0] = b'"';
            let body = i + 2 + hashes;
            body + find(&b[body..], &close).map_or(b.len() - body, |at| at + close.len())
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(b.len())
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            i + 2
                + b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map_or(0, |at| at + 1)
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i + 3
        } else {
            out.push(b[i]);
            i += 1;
            continue;
        };
        blank(&mut out, &b[i..end]);
        i = end;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `code` (already stripped) without its `#[cfg(test)]` modules: inline
/// ones lose their bodies, `#[cfg(test)] mod x;` its declaration, so the
/// file behind it is not read either.
pub fn blank_test_modules(code: &str) -> String {
    const ATTR: &str = "#[cfg(test)]";
    let mut out = code.to_string();
    let mut from = 0;
    while let Some(at) = out[from..].find(ATTR) {
        let start = from + at;
        let after = &out[start + ATTR.len()..];
        let item = after.trim_start();
        let item = strip_visibility(item);
        let end = match after.find(['{', ';']) {
            Some(at) if item.starts_with("mod ") && after.as_bytes()[at] == b'{' => {
                start + ATTR.len() + at + group_end(&after[at + 1..]) + 2
            }
            Some(at) if item.starts_with("mod ") => start + ATTR.len() + at + 1,
            _ => {
                from = start + 1;
                continue;
            }
        };
        let end = end.min(out.len());
        let blanked: String = out[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..end, &blanked);
        from = end;
    }
    out
}

/// `s` without a leading `pub`, `pub(crate)`, `pub(in path)` and spaces.
pub fn strip_visibility(s: &str) -> &str {
    let Some(rest) = s.strip_prefix("pub") else {
        return s;
    };
    if rest.starts_with(|c: char| is_ident(c as u8)) {
        return s;
    }
    let rest = rest.trim_start();
    match rest.strip_prefix('(') {
        Some(inner) => inner
            .find(')')
            .map_or(rest, |at| inner[at + 1..].trim_start()),
        None => rest,
    }
}

/// Where the `{` group whose body starts `group` closes (the offset of its
/// `}` in `group`, or `group`'s length if it never does).
pub fn group_end(group: &str) -> usize {
    let mut depth = 1usize;
    for (j, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    group.len()
}

/// Whether `c` can be part of an identifier.
pub fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The 1-based line of byte offset `at` in `code`.
pub fn line_of(code: &str, at: usize) -> usize {
    1 + code.as_bytes()[..at.min(code.len())]
        .iter()
        .filter(|&&c| c == b'\n')
        .count()
}

/// `code[range]` replaced by spaces, newlines kept.
pub fn blank_range(code: &mut String, range: std::ops::Range<usize>) {
    let blanked: String = code[range.clone()]
        .chars()
        .map(|c| if c == '\n' { '\n' } else { ' ' })
        .collect();
    code.replace_range(range, &blanked);
}

fn blank(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend(bytes.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_strings_and_test_modules_are_blanked_in_place() {
        let code = "a // c\nb /* d\n e */ \"s\\\"t\" r#\"u\"# 'x' '\\n' r#type\n\
                    #[cfg(test)]\nmod tests { fn f() { crate::x(); } }\n\
                    #[cfg(test)] pub(crate) mod t;\nend";
        let out = blank_test_modules(&strip_comments_and_strings(code));
        assert_eq!(out.len(), code.len());
        assert_eq!(out.lines().count(), code.lines().count());
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(words, ["a", "b", "r#type", "end"]);
    }

    #[test]
    fn visibility_is_stripped() {
        assert_eq!(strip_visibility("pub mod x;"), "mod x;");
        assert_eq!(strip_visibility("pub(crate) mod x;"), "mod x;");
        assert_eq!(strip_visibility("pub(in crate::a) use x;"), "use x;");
        assert_eq!(strip_visibility("public"), "public");
    }
}
