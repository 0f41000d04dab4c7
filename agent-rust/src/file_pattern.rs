//! A pattern of file names (`LIVECOV_IGNORE`, llvm-cov's
//! `-ignore-filename-regex`) as a mapping matches it against each of its
//! files, once, when it reads them.
//!
//! regex-lite's engine (kept small on purpose: see `Cargo.toml`) takes
//! microseconds a name: on redis, 1.2 ms of a first dump's 65 for the
//! default pattern over 300 files. A pattern that is only literal
//! alternatives, as the default is (`/rustc/|^/usr/include/|...`), is
//! matched here as the strings it names, in tens of nanoseconds; any other
//! by the regex. Written here because regex-lite finds no literals itself.

use regex_lite::Regex;

#[derive(Debug)]
pub(crate) struct FilePattern {
    regex: Regex,
    /// Its alternatives, when each is a literal.
    literals: Option<Vec<Literal>>,
}

/// A literal alternative, and whether it is anchored at the start (`^`)
/// and at the end (`$`) of the name.
#[derive(Debug, Default, PartialEq, Eq)]
struct Literal {
    text: String,
    start: bool,
    end: bool,
}

impl FilePattern {
    pub fn new(regex: &Regex) -> FilePattern {
        FilePattern { regex: regex.clone(), literals: literals(regex.as_str()) }
    }

    pub fn as_str(&self) -> &str {
        self.regex.as_str()
    }

    /// Whether the pattern matches somewhere in `name`, as
    /// [`Regex::is_match`].
    pub fn is_match(&self, name: &str) -> bool {
        match &self.literals {
            Some(literals) => literals.iter().any(|literal| literal.matches(name)),
            None => self.regex.is_match(name),
        }
    }
}

/// Per name, whether one of `patterns` matches it.
pub(crate) fn matching<'a>(patterns: &[Regex], names: impl Iterator<Item = &'a str>) -> Vec<bool> {
    let patterns: Vec<FilePattern> = patterns.iter().map(FilePattern::new).collect();
    names.map(|name| patterns.iter().any(|pattern| pattern.is_match(name))).collect()
}

impl Literal {
    fn matches(&self, name: &str) -> bool {
        match (self.start, self.end) {
            (true, true) => name == self.text,
            (true, false) => name.starts_with(&self.text),
            (false, true) => name.ends_with(&self.text),
            (false, false) => name.contains(&self.text),
        }
    }
}

/// The alternatives of `pattern` (a valid regex) when each is a literal:
/// `^` only at its start, `$` only at its end, and otherwise characters
/// that stand for themselves or escaped punctuation. None for any other
/// pattern (a class, a repetition, a group, a flag, an escape such as
/// `\d` or `\<`).
fn literals(pattern: &str) -> Option<Vec<Literal>> {
    let mut alternatives = Vec::new();
    let mut current = Literal::default();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '|' => alternatives.push(std::mem::take(&mut current)),
            '^' if current == Literal::default() => current.start = true,
            '$' if chars.peek().is_none_or(|&next| next == '|') => current.end = true,
            '\\' => match chars.next() {
                Some(e) if e.is_ascii_punctuation() && !matches!(e, '<' | '>') => current.text.push(e),
                _ => return None,
            },
            '^' | '$' | '.' | '[' | ']' | '(' | ')' | '{' | '}' | '*' | '+' | '?' => return None,
            c => current.text.push(c),
        }
    }
    alternatives.push(current);
    Some(alternatives)
}

#[cfg(test)]
mod tests {
    use super::{literals, FilePattern, Literal};
    use regex_lite::Regex;

    #[cfg(feature = "agent")]
    #[test]
    fn the_default_ignore_pattern_is_literal_alternatives() {
        let found = literals(crate::agent::DEFAULT_IGNORE).expect("the default pattern is literal");
        let literal = |text: &str, start| Literal { text: text.into(), start, end: false };
        assert_eq!(found[1], literal("/.cargo/registry/", false));
        assert_eq!(found[3], literal("/usr/include/", true));
        assert_eq!(found.len(), 7);
        assert!(literals(r"^/src/[a-z]+\.c$").is_none());
        assert!(literals(r"\bvendor\b").is_none());
        assert!(literals(r"(?i)/Vendor/").is_none());
    }

    /// Every pattern matches as its regex does, on names made to hit the
    /// edges (anchors, escapes, empty alternatives, non-ASCII).
    #[test]
    fn a_pattern_matches_as_its_regex() {
        let atoms = ["/", "a", "b", ".", r"\.", "^", "$", "|", r"\|", "é", r"\-", "*", "[a]", r"\d", "(", ")", r"\<", "-"];
        let names = ["", "/", "a", "ab", "/a/b", "a.b", "a|b", "é/a", "b$", "^a", "a-b", "aab/", "/.", "x.y.", "1"];
        // Every pattern of up to four atoms, from a fixed sequence (a
        // linear congruential generator: the same cases on every run).
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut literal = 0;
        for _ in 0..20_000 {
            let mut pattern = String::new();
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            for k in 0..(state >> 60) % 5 {
                pattern.push_str(atoms[((state >> (8 * k)) % atoms.len() as u64) as usize]);
            }
            let Ok(regex) = Regex::new(&pattern) else { continue };
            let compiled = FilePattern::new(&regex);
            literal += usize::from(compiled.literals.is_some());
            for name in names {
                assert_eq!(compiled.is_match(name), regex.is_match(name), "pattern {pattern:?} on {name:?}");
            }
        }
        assert!(literal > 1_000, "only {literal} patterns were literal");
    }
}
