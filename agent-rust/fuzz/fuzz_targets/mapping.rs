//! Fuzzes the coverage-mapping decoder: the input is split into a
//! `__llvm_covmap` part and a `__llvm_covfun` part, decoded, and (when that
//! succeeds) turned into LCOV with all-zero counters.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use livecov::coverage::{CounterSource, Coverage};
use livecov::mapping::CoverageMapping;
use livecov::profile::Lookup;
use livecov::Endian;

struct NoCounters;

impl CounterSource for NoCounters {
    fn lookup(&self, _: u64, _: u64) -> Lookup<'_> {
        Lookup::Unknown
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let split = (usize::from(data[0]) << 4).min(data.len() - 1).max(1);
    let (covmap, covfun) = data[1..].split_at(split - 1);
    // Any name reference resolves, so decoding goes past the name lookup.
    let names: HashMap<u64, String> = covfun
        .chunks(8)
        .filter(|c| c.len() == 8)
        .map(|c| (u64::from_le_bytes(c.try_into().unwrap()), "f".to_owned()))
        .collect();
    let mut mapping = CoverageMapping::new();
    if mapping.add_sections(covmap, covfun, &names, Endian::Little).is_ok() {
        let coverage = Coverage::new(&mapping, &NoCounters);
        let _ = livecov::lcov::write(&coverage, &Default::default());
    }
    // Whole object files too.
    let _ = CoverageMapping::new().add_object(data);
});
