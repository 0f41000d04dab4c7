//! Fuzzes the exact merge's documents (`livecov::fleet`), which a collector
//! reads from other processes: a build mapping, then counters checked
//! against it, summed with itself, merged, turned into a raw profile and
//! into LCOV.
//!
//! Input: `mapping_len: u32 LE`, the uncompressed build mapping, then the
//! uncompressed counters document (lengths clamped to what is there).
#![no_main]

use libfuzzer_sys::fuzz_target;
use livecov::fleet::BuildMapping;
use livecov::profile::Counters;

/// As in the mapping target: past this many lines in all regions the
/// report is skipped (llvm-cov's line walk takes one step per line).
const MAX_TOTAL_LINES: u64 = 1 << 22;

fuzz_target!(|data: &[u8]| {
    let len = data.get(..4).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()) as usize);
    let body = data.get(4..).unwrap_or(&[]);
    let (mapping, counters) = body.split_at(len.min(body.len()));
    let Ok(build) = BuildMapping::decode(mapping) else { return };
    let _ = build.profraw(counters);
    let _ = build.sum(&[counters, counters]);
    let mut sum = Counters::new();
    if build.add(&mut sum, counters).is_ok() && build.total_lines() <= MAX_TOTAL_LINES {
        let _ = build.report(&sum, Some("t"));
    }
});
