//! Fuzzes the indexed profile (`.profdata`) reader, the merge of what it
//! reads, with itself, and the lookups `llvm-cov` makes. `seed-corpus.py`
//! seeds it with the `.profdata` files of llvm-profdata 22, 19, 14 and 13
//! that the profdata tests leave in the fixtures' runs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use livecov::profile::{read_indexed_profile, Counters};

fuzz_target!(|data: &[u8]| {
    let Ok(profile) = read_indexed_profile(data) else {
        return;
    };
    let mut counters = Counters::new();
    // Twice: the second time through the merge of equal records.
    let _ = counters.add_indexed(profile.clone());
    let _ = counters.add_indexed(profile.clone());
    for r in &profile.records {
        let c = &r.counters;
        let _ = counters.lookup(c.name_ref, c.hash);
        let _ = counters.lookup(c.name_ref, c.hash ^ (1 << 60));
        let _ = counters.lookup(c.name_ref.wrapping_add(1), c.hash);
    }
    let _ = counters.warnings();
});
