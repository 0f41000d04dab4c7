//! Fuzzes the raw profile reader, the merge of what it reads and the
//! lookups `llvm-cov` makes. `seed-corpus.py` seeds it with the fixtures'
//! real profiles and those of the unit tests.
#![no_main]

use libfuzzer_sys::fuzz_target;
use livecov::profile::{read_raw_profiles, Counters};

fuzz_target!(|data: &[u8]| {
    let Ok(profiles) = read_raw_profiles(data) else {
        return;
    };
    let mut counters = Counters::new();
    // Each profile twice: the second time through the merge of equal records.
    for p in profiles.iter().chain(&profiles) {
        let _ = counters.add(p.clone());
    }
    for p in &profiles {
        for r in &p.records {
            let _ = counters.lookup(r.name_ref, r.hash);
            let _ = counters.lookup(r.name_ref, r.hash ^ (1 << 60));
            let _ = counters.lookup(r.name_ref.wrapping_add(1), r.hash);
        }
    }
    let _ = counters.warnings();
});
