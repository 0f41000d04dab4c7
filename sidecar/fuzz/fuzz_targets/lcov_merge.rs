//! Fuzzes the LCOV merge: `livecov merge` reads files anyone may have
//! written, and a sidecar merges the answers of whatever listens where it
//! looks. The input is two reports, split at the first NUL byte: the first
//! read as a stream in small reads (`Merger::add_reader`, whose lines cross
//! its reads), the second as text. Whatever they merge to must be LCOV that
//! merges to itself again, unless a function's name begins with a number
//! and a comma: `FN:9,0,f` is the function `0,f` at line 9, or `f` at lines
//! 9 to 0, and LCOV has no way to tell.
//! `seed-lcov.sh` seeds it with reports of every kind of line.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use livecov_cli::merge::Merger;

/// A reader that hands out at most a few bytes at a time.
struct Trickle<'a>(&'a [u8]);

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.0.len()).min(7);
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let cut = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let (first, second) = (&data[..cut], data.get(cut + 1..).unwrap_or_default());
    let mut merger = Merger::new();
    let _ = merger.add_reader("first", Trickle(first));
    let _ = merger.add("second", &String::from_utf8_lossy(second));
    let merged = merger.finish();
    let mut again = Merger::new();
    if let Err(e) = again.add("merged", &merged) {
        panic!("a merge's output is not LCOV: {e}\n{merged}");
    }
    let ambiguous = |name: &str| name.split_once(',').is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let names = merged.lines().filter_map(|l| Some(l.strip_prefix("FNDA:")?.split_once(',')?.1));
    if !names.clone().any(ambiguous) {
        assert_eq!(again.finish(), merged, "a merge's output does not merge to itself");
    }
});
