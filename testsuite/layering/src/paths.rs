//! Paths as the source spells them: a `use` tree (`crate::{a, b::{c, d as
//! e}}`) or a path in code (`super::Frame::new`) read into one flat
//! [`Path`] per name it brings in or reaches.

use crate::source::is_ident;

/// One path: its segments as written (`["super", "keys", "Key"]`), the
/// name it brings into scope when it is a `use` (an `as` rename or the
/// last segment), whether it ends in `*`, and where its last segment is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    /// Segments as written, anchor (`crate`, `super`, `self`) included.
    pub segments: Vec<String>,
    /// The name a `use` of it binds, `None` for a glob.
    pub binds: Option<String>,
    /// Byte offset of the last segment in the text read.
    pub at: usize,
}

/// The paths of the tree or path starting at byte `start` of `code`, and
/// the offset just past it.
pub fn read(code: &str, start: usize) -> (Vec<Path>, usize) {
    let mut reader = Reader {
        b: code.as_bytes(),
        i: start,
        out: Vec::new(),
    };
    reader.tree(Vec::new());
    (reader.out, reader.i)
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
    out: Vec<Path>,
}

impl Reader<'_> {
    fn skip_spaces(&mut self) {
        while self.b.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    fn ident(&mut self) -> Option<String> {
        let start = self.i;
        // A raw identifier (r#type) names `type`.
        let name_start = if self.b[self.i..].starts_with(b"r#") {
            start + 2
        } else {
            start
        };
        let mut end = name_start;
        while self.b.get(end).is_some_and(|&c| is_ident(c)) {
            end += 1;
        }
        if end == name_start || self.b[name_start].is_ascii_digit() {
            return None;
        }
        self.i = end;
        Some(String::from_utf8_lossy(&self.b[name_start..end]).into_owned())
    }

    /// One use tree (or path) under `prefix`.
    fn tree(&mut self, mut prefix: Vec<String>) {
        let mut at = self.i;
        loop {
            self.skip_spaces();
            match self.b.get(self.i) {
                Some(b'{') => {
                    self.i += 1;
                    loop {
                        self.skip_spaces();
                        match self.b.get(self.i) {
                            Some(b'}') => {
                                self.i += 1;
                                return;
                            }
                            Some(b',') => self.i += 1,
                            None => return,
                            Some(_) => {
                                let before = self.i;
                                self.tree(prefix.clone());
                                if self.i == before {
                                    self.i += 1;
                                }
                            }
                        }
                    }
                }
                Some(b'*') => {
                    self.i += 1;
                    self.out.push(Path {
                        segments: prefix,
                        binds: None,
                        at,
                    });
                    return;
                }
                _ => {}
            }
            at = self.i;
            let Some(segment) = self.ident() else {
                break;
            };
            prefix.push(segment);
            self.skip_spaces();
            if self.b[self.i..].starts_with(b"::") {
                self.i += 2;
                continue;
            }
            break;
        }
        // `a::{self}` binds `a`.
        if prefix.last().is_some_and(|s| s == "self") && prefix.len() > 1 {
            prefix.pop();
        }
        let Some(last) = prefix.last().cloned() else {
            return;
        };
        let save = self.i;
        self.skip_spaces();
        let binds = if self.b[self.i..].starts_with(b"as")
            && !self.b.get(self.i + 2).is_some_and(|&c| is_ident(c))
        {
            self.i += 2;
            self.skip_spaces();
            self.ident().unwrap_or(last)
        } else {
            self.i = save;
            last
        };
        self.out.push(Path {
            segments: prefix,
            binds: Some(binds),
            at,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segments(code: &str) -> Vec<(String, Option<String>)> {
        read(code, 0)
            .0
            .into_iter()
            .map(|p| (p.segments.join("::"), p.binds))
            .collect()
    }

    #[test]
    fn a_use_tree_is_read_into_one_path_per_name() {
        let got = segments("crate::{a, b::{self, c as d}, e::*,\n f::g}; rest");
        let want = [
            ("crate::a", Some("a")),
            ("crate::b", Some("b")),
            ("crate::b::c", Some("d")),
            ("crate::e", None),
            ("crate::f::g", Some("g")),
        ];
        let want: Vec<_> = want
            .iter()
            .map(|(p, b)| (p.to_string(), b.map(str::to_string)))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_path_in_code_stops_where_the_path_does() {
        assert_eq!(
            segments("super::super::Frame::<u8>::new(x)"),
            [("super::super::Frame".to_string(), Some("Frame".to_string()))]
        );
        let (paths, end) = read("x crate::a::b as c;", 2);
        assert_eq!(paths[0].binds.as_deref(), Some("c"));
        assert_eq!(paths[0].at, 12);
        assert_eq!(end, 18);
    }
}
