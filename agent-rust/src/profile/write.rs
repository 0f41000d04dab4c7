//! Writing a raw profile from a module's sections, as the runtime does.
//!
//! The in-process agent serves `?format=profraw` with this: the same bytes
//! `__llvm_profile_write_file` would produce for the module at that moment
//! (minus value-profile data, which coverage builds do not collect), so the
//! module's own LLVM's `llvm-profdata` reads it.

use super::raw::MAGIC_64;
use super::RecordLayout;

/// A module's sections, as copied from memory.
pub struct ModuleImage<'a> {
    pub layout: &'a RecordLayout,
    pub binary_ids: &'a [Vec<u8>],
    pub data: &'a [u8],
    pub counters: &'a [u8],
    pub bitmap: &'a [u8],
    pub names: &'a [u8],
}

fn padding(len: usize) -> usize {
    (8 - len % 8) % 8
}

/// Appends one raw profile for `image` to `out`. Only 64-bit little-endian
/// modules are written (what the agent runs on); versions 8 to 10.
pub fn write_raw_profile(image: &ModuleImage<'_>, out: &mut Vec<u8>) {
    let layout = image.layout;
    let version = layout.version;
    let record_size = layout.record_size();
    let num_data = image.data.len() / record_size;
    let counter_size = if layout.variant.byte_coverage { 1 } else { 8 };
    let binary_ids_size: usize = image.binary_ids.iter().map(|id| 8 + id.len() + padding(id.len())).sum();

    let u64s = |out: &mut Vec<u8>, values: &[u64]| {
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
    };
    let version_word = u64::from(version) | layout.variant.to_flags();
    u64s(out, &[MAGIC_64, version_word, binary_ids_size as u64, num_data as u64, 0]);
    u64s(out, &[(image.counters.len() / counter_size) as u64, padding(image.counters.len()) as u64]);
    if version >= 9 {
        u64s(out, &[image.bitmap.len() as u64, padding(image.bitmap.len()) as u64]);
    }
    u64s(out, &[image.names.len() as u64, layout.counters_delta]);
    if version >= 9 {
        u64s(out, &[layout.bitmap_delta]);
    }
    // NamesDelta: only used to find names in memory, never in a file.
    u64s(out, &[0]);
    if version >= 10 {
        u64s(out, &[0, 0]); // no vtables, no vtable names
    }
    // ValueKindLast: the number of value kinds minus one, per version.
    u64s(out, &[if version >= 10 { 2 } else { 1 }]);

    for id in image.binary_ids {
        u64s(out, &[id.len() as u64]);
        out.extend_from_slice(id);
        out.resize(out.len() + padding(id.len()), 0);
    }
    // Data records as in memory, but without value sites: their values are
    // not collected by coverage builds and would otherwise be expected.
    let sites = value_sites_range(version);
    for record in image.data.chunks_exact(record_size) {
        let start = out.len();
        out.extend_from_slice(record);
        out[start + sites.start..start + sites.end].fill(0);
    }
    for section in [image.counters, image.bitmap, image.names] {
        out.extend_from_slice(section);
        out.resize(out.len() + padding(section.len()), 0);
    }
}

/// Where a 64-bit data record keeps its `NumValueSites` array.
fn value_sites_range(version: u32) -> std::ops::Range<usize> {
    match version {
        ..=8 => 44..48,
        9 => 52..56,
        _ => 52..58,
    }
}
