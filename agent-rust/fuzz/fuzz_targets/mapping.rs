//! Fuzzes the coverage-mapping decoder and everything after it.
//!
//! Input: `covmap_len: u32 LE`, `covfun_len: u32 LE`, then the contents
//! of `__llvm_covmap`, `__llvm_covfun` and `__llvm_prf_names` end to end
//! (lengths are clamped to what is there). `seed-corpus.py` writes real
//! fixture sections in this layout. The names section is decoded as
//! `add_object` does; besides, every 8-byte word of `__llvm_covfun`
//! resolves to a name, so that mutated name references still get past
//! the name lookup. When the mapping decodes it is turned into LCOV with
//! counters made up from the input: unknown, mismatched, or found with
//! values that are small, huge or too few.
//!
//! The whole input is also given to `add_object` as an object file.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use livecov::coverage::{CounterSource, Coverage};
use livecov::mapping::CoverageMapping;
use livecov::profile::{decode_names, name_ref, Lookup};
use livecov::Endian;

/// Counters keyed by the low bits of the function hash.
struct MadeUp {
    values: Vec<u64>,
}

impl CounterSource for MadeUp {
    fn lookup(&self, _: u64, hash: u64) -> Lookup<'_> {
        match hash % 4 {
            0 => Lookup::Unknown,
            1 => Lookup::HashMismatch,
            _ => {
                let n = ((hash >> 2) as usize % 32).min(self.values.len());
                Lookup::Found {
                    counters: &self.values[..n],
                    bitmap: &[],
                }
            }
        }
    }
}

/// Beyond this many lines in all regions together the report is skipped:
/// llvm-cov's line walk (which livecov follows) takes one step per line
/// and function, and a fuzzer finds 2^24-line regions quickly.
const MAX_TOTAL_LINES: u64 = 1 << 22;

fn u32_at(data: &[u8], at: usize) -> usize {
    data.get(at..at + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
}

fuzz_target!(|data: &[u8]| {
    let body = data.get(8..).unwrap_or(&[]);
    let covmap_len = u32_at(data, 0).min(body.len());
    let (covmap, rest) = body.split_at(covmap_len);
    let covfun_len = u32_at(data, 4).min(rest.len());
    let (covfun, names_section) = rest.split_at(covfun_len);

    let mut names: HashMap<u64, String> = covfun
        .chunks_exact(8)
        .map(|c| (u64::from_le_bytes(c.try_into().unwrap()), "f".to_owned()))
        .collect();
    if let Ok(decoded) = decode_names(names_section) {
        names.extend(decoded.iter().map(|n| (name_ref(n), n.to_owned())));
    }
    let mut mapping = CoverageMapping::new();
    if mapping
        .add_sections(covmap, covfun, &names, Endian::Little)
        .is_ok()
    {
        let total_lines: u64 = mapping
            .functions
            .iter()
            .flat_map(|f| &f.regions)
            .map(|r| u64::from(r.line_end.saturating_sub(r.line_start)) + 1)
            .sum();
        if total_lines <= MAX_TOTAL_LINES {
            let mut values: Vec<u64> = covfun
                .chunks_exact(8)
                .take(32)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            values.extend([0, 1, 2, u64::MAX, 1 << 63, 7]);
            let counters = MadeUp { values };
            let coverage = Coverage::new(&mapping, &counters);
            let _ = livecov::lcov::write(&coverage, &Default::default());
            let options = livecov::lcov::Options {
                summary_only: true,
                no_demangle: true,
                ..Default::default()
            };
            let _ = livecov::lcov::write(&coverage, &options);
        }
    }
    // Whole object files too.
    let _ = CoverageMapping::new().add_object(data);
});
