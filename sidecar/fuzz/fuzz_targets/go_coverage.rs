//! Fuzzes the reader of Go coverage data (`livecov convert --go-coverdir`):
//! a meta-data file and a counter data file, decoded and turned into LCOV.
//! The input is a u32 LE length, that many bytes of meta-data, then the
//! counter file; the counter file is given the meta-data's hash, so that
//! the report over both is computed and not refused at the first check.
//! `seed-corpus.sh` seeds it with a snapshot of the Go fixture service.
#![no_main]

use libfuzzer_sys::fuzz_target;
use livecov_cli::go_coverage::{decode_counters, decode_meta, lcov_from_files, Options};

/// Where the hash is in each file's header.
const META_HASH: std::ops::Range<usize> = 24..40;
const COUNTERS_HASH: std::ops::Range<usize> = 8..24;

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<4>() else { return };
    let len = (u32::from_le_bytes(*len) as usize).min(rest.len());
    let (meta, counters) = rest.split_at(len);
    let _ = decode_meta(meta);
    let _ = decode_counters(counters);
    let mut counters = counters.to_vec();
    if let (Some(hash), Some(slot)) = (meta.get(META_HASH), counters.get_mut(COUNTERS_HASH)) {
        slot.copy_from_slice(hash);
    }
    let files = [("covmeta.fuzz".to_owned(), meta.to_vec()), ("covcounters.fuzz.1.1".to_owned(), counters)];
    let _ = lcov_from_files(&files, &Options::default());
});
