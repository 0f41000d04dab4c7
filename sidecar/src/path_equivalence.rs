//! `--path-equivalence FROM,TO`, as llvm-cov's `-path-equivalence`: the
//! paths of a report made inside an image or on a build machine put where
//! the sources are here. One type for every command that takes the flag:
//! `merge` and `report` re-key their merged records with
//! [`PathEquivalence::rewrite`] (records that end up with one path merge);
//! `convert`, `collect` and `sidecar` rewrite the `SF:` lines of the LCOV
//! they write or serve with [`PathEquivalence::rewrite_lcov`], every other
//! line as it was (llvm-cov's summary records stay llvm-cov's).

use std::borrow::Cow;

/// `--path-equivalence FROM,TO`: a path whose folders start with FROM's
/// starts with TO's instead, as llvm-cov's `-path-equivalence` rewrites:
/// both sides and the path are normalized (`.` and `..` resolved as text,
/// repeated separators collapsed), and the first equivalence that applies
/// wins; a path none applies to is left as it is.
#[derive(Debug, Clone)]
pub struct PathEquivalence {
    /// Normalized, ending in `/` (or empty, which every path starts with).
    from: String,
    to: String,
}

impl PathEquivalence {
    pub fn parse(s: &str) -> Result<PathEquivalence, String> {
        match s.split_once(',') {
            Some((from, to)) if !from.is_empty() && !to.is_empty() => {
                Ok(PathEquivalence { from: with_separator(normalize(from)), to: with_separator(normalize(to)) })
            }
            _ => Err(format!(
                "{s:?} is not FROM,TO: give the folder as the paths have it, a comma, and the folder to put \
                 instead, such as /build/src,/home/me/project/src"
            )),
        }
    }

    /// `path` rewritten by the first of `equivalences` that applies.
    pub fn rewrite(equivalences: &[PathEquivalence], path: &str) -> String {
        if equivalences.is_empty() {
            return path.to_owned();
        }
        let normal = normalize(path);
        for e in equivalences {
            if let Some(rest) = normal.strip_prefix(e.from.as_str()) {
                return format!("{}{rest}", e.to);
            }
        }
        path.to_owned()
    }

    /// `lcov` with the path of every `SF:` line rewritten by
    /// [`rewrite`](PathEquivalence::rewrite), byte for byte the same
    /// otherwise (a path that is not UTF-8 is left as it is).
    pub fn rewrite_lcov<'a>(equivalences: &[PathEquivalence], lcov: &'a [u8]) -> Cow<'a, [u8]> {
        if equivalences.is_empty() {
            return Cow::Borrowed(lcov);
        }
        let mut out = Vec::with_capacity(lcov.len());
        for line in lcov.split_inclusive(|&b| b == b'\n') {
            let rewritten = line.strip_prefix(b"SF:").and_then(|rest| {
                let end = rest.iter().rposition(|&b| b != b'\n' && b != b'\r').map_or(0, |i| i + 1);
                let path = std::str::from_utf8(&rest[..end]).ok()?;
                Some((PathEquivalence::rewrite(equivalences, path), &rest[end..]))
            });
            match rewritten {
                Some((path, eol)) => {
                    out.extend_from_slice(b"SF:");
                    out.extend_from_slice(path.as_bytes());
                    out.extend_from_slice(eol);
                }
                None => out.extend_from_slice(line),
            }
        }
        Cow::Owned(out)
    }
}

fn with_separator(mut path: String) -> String {
    if !path.is_empty() && !path.ends_with('/') {
        path.push('/');
    }
    path
}

/// LLVM's `sys::path::remove_dots(path, remove_dot_dot = true)`: `.`
/// dropped, `..` removes the folder before it (above the root it is
/// dropped; at the start of a relative path it stays), separators single.
fn normalize(path: &str) -> String {
    let root = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            ".." if root => {}
            _ => parts.push(part),
        }
    }
    let joined = parts.join("/");
    if root {
        format!("/{joined}")
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_equivalence_is_llvm_covs() {
        let eq = |s: &str| PathEquivalence::parse(s).unwrap();
        let e = [eq("/build/src,/home/me/src"), eq("/build,/other")];
        assert_eq!(PathEquivalence::rewrite(&e, "/build/src/a.c"), "/home/me/src/a.c");
        assert_eq!(PathEquivalence::rewrite(&e, "/build/./src//b/../a.c"), "/home/me/src/a.c");
        assert_eq!(PathEquivalence::rewrite(&e, "/build/lib/x.c"), "/other/lib/x.c");
        // Folders, not text: /build/srcs is not under /build/src.
        assert_eq!(PathEquivalence::rewrite(&e, "/build/srcs/a.c"), "/other/srcs/a.c");
        assert_eq!(PathEquivalence::rewrite(&e, "/elsewhere/./a.c"), "/elsewhere/./a.c");
        assert_eq!(PathEquivalence::rewrite(&[eq("/build/,src")], "/build/a.c"), "src/a.c");
        for bad in ["/build", ",/x", "/x,", ""] {
            assert!(PathEquivalence::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(normalize("a/../../b"), "../b");
        assert_eq!(normalize("/../a"), "/a");
    }

    #[test]
    fn lcov_text_has_its_source_files_rewritten_and_nothing_else() {
        let e = [PathEquivalence::parse("/build/src,/home/me/src").unwrap()];
        let lcov = b"TN:t\nSF:/build/src/a.c\nFN:1,SF:/build/src/x\nDA:1,1\nLF:1\nend_of_record\r\nSF:/other/b.c\r\nend_of_record\nSF:/build/src/\xff.c\n";
        let want = b"TN:t\nSF:/home/me/src/a.c\nFN:1,SF:/build/src/x\nDA:1,1\nLF:1\nend_of_record\r\nSF:/other/b.c\r\nend_of_record\nSF:/build/src/\xff.c\n";
        assert_eq!(PathEquivalence::rewrite_lcov(&e, lcov).as_ref(), want.as_slice());
        assert_eq!(PathEquivalence::rewrite_lcov(&e, b"SF:/build/src/a.c").as_ref(), b"SF:/home/me/src/a.c".as_slice());
        assert!(matches!(PathEquivalence::rewrite_lcov(&[], lcov), Cow::Borrowed(_)));
    }
}
