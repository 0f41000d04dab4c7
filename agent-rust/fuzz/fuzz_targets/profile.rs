//! Fuzzes the raw profile reader and the merge of what it reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use livecov::profile::{read_raw_profiles, Counters};

fuzz_target!(|data: &[u8]| {
    if let Ok(profiles) = read_raw_profiles(data) {
        let mut counters = Counters::new();
        for p in profiles {
            counters.add(p);
        }
    }
});
