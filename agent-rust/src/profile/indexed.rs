//! Indexed profiles (`.profdata`), as `llvm-profdata merge` writes them:
//! what CI scripts and cargo-llvm-cov keep, and what `llvm-cov
//! -instr-profile` reads.
//!
//! Only the function records are read: the header, the profile summaries
//! (to find where the records start) and the on-disk hash table of names
//! (`OnDiskHashTable.h`) with, per name, each structural hash's counters and
//! MC/DC bitmap (`InstrProfLookupTrait::ReadData` in `InstrProfReader.cpp`).
//! Value profiles are checked for size and skipped; memory profiles,
//! temporal traces, binary ids and vtable names live at the header's other
//! offsets and are not touched. Every field is little-endian whatever the
//! host that wrote the file.

use super::{name_ref_bytes, FunctionCounters, Variant};
use crate::bytes::{Bytes, Endian};
use crate::error::{Error, Result};

/// Magic of an indexed profile, as read little-endian ("\xfflprofi\x81").
const MAGIC: u64 = 0x8169_666f_7270_6cff;

/// Indexed versions read: 4 (the first with a summary, LLVM 3.9) to 13
/// (LLVM 22). LLVM 13 and 14 write 7, 19 writes 12, 22 writes 13, whose
/// layout is 12's in all that is read here.
const OLDEST: u32 = 4;
const NEWEST: u32 = 13;

/// Variant bit 57: a context-sensitive summary follows the first one.
const CONTEXT_SENSITIVE: u64 = 1 << 57;
/// Variant bit 62: a memory profile is present (at its own offset).
const MEMPROF: u64 = 1 << 62;

/// One indexed profile: its records, in the order of its hash table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexedProfile {
    /// Indexed format version (low 32 bits of the version word).
    pub version: u32,
    /// The variant flags of the version word (what kind of profile was
    /// merged: byte coverage, function entry only, ...).
    pub variant: Variant,
    /// One entry per (name, structural hash).
    pub records: Vec<IndexedRecord>,
}

/// A function's counters under its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexedRecord {
    /// The function's PGO name, empty for the records llvm-profdata could not
    /// name (their raw profile had no name for their `NameRef`).
    pub name: String,
    /// `name_ref` is [`name_ref`](super::name_ref) of the name, as the file's
    /// hash table stores it (checked).
    pub counters: FunctionCounters,
}

/// Whether `data` starts with the indexed profile magic.
pub fn is_indexed_profile(data: &[u8]) -> bool {
    data.get(..8).and_then(|m| <[u8; 8]>::try_from(m).ok()).map(u64::from_le_bytes) == Some(MAGIC)
}

/// Reads an indexed profile (`.profdata`).
pub fn read_indexed_profile(data: &[u8]) -> Result<IndexedProfile> {
    let mut cur = Bytes::new(data, 0, Endian::Little, "indexed profile header");
    if !is_indexed_profile(data) {
        return Err(cur.error("no indexed profile magic: not a .profdata file written by llvm-profdata merge"));
    }
    cur.skip(8)?;
    let version_at = cur.offset();
    let word = cur.u64()?;
    let version = word as u32;
    if version < OLDEST {
        return Err(Error::Unsupported(format!(
            "indexed profile version {version} was written by an LLVM older than 3.9, which \
             livecov does not read; merge it again with a newer llvm-profdata \
             (`llvm-profdata merge -o new.profdata old.profdata`)"
        )));
    }
    if version > NEWEST {
        return Err(Error::Unsupported(format!(
            "indexed profile version {version} is not supported (written by a newer LLVM than 22); \
             livecov reads versions {OLDEST} to {NEWEST}, or give it the raw profiles (.profraw)"
        )));
    }
    // Memory profiles sit apart from the records; every other flag is one a
    // raw profile can carry too.
    let variant = Variant::from_version_word(word & !MEMPROF)
        .map_err(|e| e.context(&format!("indexed profile header at offset {version_at:#x}")))?;
    let _unused = cur.u64()?;
    let hash_type_at = cur.offset();
    let hash_type = cur.u64()?;
    if hash_type != 0 {
        return Err(Error::malformed(
            "indexed profile header",
            hash_type_at,
            format!("hash type {hash_type} is unknown (0, MD5, is the only one)"),
        ));
    }
    let hash_offset = cur.u64()?;
    // Then MemProfOffset (8), BinaryIdOffset (9), TemporalProfTracesOffset
    // (10) and VTableNamesOffset (12): none is needed here.
    let later_fields = match version {
        ..=7 => 0,
        8 => 1,
        9 => 2,
        10 | 11 => 3,
        _ => 4,
    };
    cur.skip(later_fields * 8)?;

    skip_summary(&mut cur)?;
    if word & CONTEXT_SENSITIVE != 0 {
        skip_summary(&mut cur)?;
    }
    let payload = cur.position();

    let entries = table_entries(data, payload, hash_offset)?;
    let records = read_payload(data, payload, hash_offset as usize, entries, version)?;
    Ok(IndexedProfile { version, variant, records })
}

/// Skips an `IndexedInstrProf::Summary`: two counts, then that many fields
/// (u64) and cutoff entries (three u64 each).
fn skip_summary(cur: &mut Bytes<'_>) -> Result<()> {
    let at = cur.offset();
    let fields = cur.u64()?;
    let entries = cur.u64()?;
    let size = entries
        .checked_mul(3)
        .and_then(|n| n.checked_add(fields))
        .and_then(|n| n.checked_mul(8))
        .filter(|&n| n <= cur.remaining() as u64)
        .ok_or_else(|| {
            Error::malformed(
                "indexed profile summary",
                at,
                format!("{fields} fields and {entries} cutoff entries do not fit in the file (truncated?)"),
            )
        })?;
    cur.skip(size as usize)
}

/// Checks the hash table's header at `hash_offset` (bucket and entry counts,
/// the bucket offsets) and returns the number of entries.
fn table_entries(data: &[u8], payload: usize, hash_offset: u64) -> Result<u64> {
    const TABLE: &str = "indexed profile hash table";
    let at = usize::try_from(hash_offset)
        .ok()
        .filter(|&at| at >= payload && at <= data.len())
        .ok_or_else(|| {
            Error::malformed(
                "indexed profile header",
                32,
                format!(
                    "hash table offset {hash_offset:#x} is outside the records ({payload:#x} to {:#x})",
                    data.len()
                ),
            )
        })?;
    let mut table = Bytes::new(&data[at..], at as u64, Endian::Little, TABLE);
    let buckets = table.u64()?;
    let entries = table.u64()?;
    if buckets == 0 || !buckets.is_power_of_two() {
        return Err(table.error_at(0, format!("{buckets} buckets: not a power of two")));
    }
    let bucket_bytes = buckets
        .checked_mul(8)
        .filter(|&n| n <= table.remaining() as u64)
        .ok_or_else(|| table.error(format!("{buckets} buckets do not fit in the file (truncated?)")))?;
    table.skip(bucket_bytes as usize)?;
    Ok(entries)
}

/// Reads the `entries` items of the table's payload, bucket after bucket
/// (as `llvm-profdata` iterates them): per bucket a u16 item count, per item
/// the key's hash, the key and data lengths (u64 each), the key (the
/// function name) and the data.
fn read_payload(data: &[u8], payload: usize, end: usize, entries: u64, version: u32) -> Result<Vec<IndexedRecord>> {
    const ITEM: &str = "indexed profile record";
    let mut cur = Bytes::new(&data[payload..end], payload as u64, Endian::Little, ITEM);
    // Each entry takes at least 26 bytes: no more records than that allows.
    let mut records = Vec::with_capacity((entries as usize).min(cur.remaining() / 26));
    let mut left_in_bucket = 0u16;
    for _ in 0..entries {
        if left_in_bucket == 0 {
            let at = cur.offset();
            left_in_bucket = cur.u16()?;
            if left_in_bucket == 0 {
                return Err(Error::malformed(ITEM, at, "a bucket of the hash table has no items"));
            }
        }
        left_in_bucket -= 1;
        let item_at = cur.offset();
        let key_hash = cur.u64()?;
        let key_len = cur.u64()?;
        let data_len = cur.u64()?;
        let key_bytes = take(&mut cur, key_len, "name")?;
        let name_ref = name_ref_bytes(key_bytes);
        if name_ref != key_hash {
            return Err(Error::malformed(
                ITEM,
                item_at,
                format!("the hash {key_hash:#018x} of a name is not its MD5 ({name_ref:#018x})"),
            ));
        }
        let name = String::from_utf8_lossy(key_bytes).into_owned();
        let data_at = cur.offset();
        let mut item = Bytes::new(take(&mut cur, data_len, "data")?, data_at, Endian::Little, ITEM);
        if data_len == 0 || data_len % 8 != 0 {
            return Err(item.error(format!("{data_len} bytes of data for {name:?}: not a positive multiple of 8")));
        }
        while !item.is_empty() {
            let hash = item.u64()?;
            let counters = item.u64()?;
            let counters = (0..bounded(&item, counters, 8, "counters")?)
                .map(|_| item.u64())
                .collect::<Result<Vec<u64>>>()?;
            let bitmap = if version >= 11 {
                let bytes = item.u64()?;
                // One byte of bitmap per u64, its low byte.
                (0..bounded(&item, bytes, 8, "bitmap bytes")?)
                    .map(|_| item.u64().map(|b| b as u8))
                    .collect::<Result<Vec<u8>>>()?
            } else {
                Vec::new()
            };
            skip_value_data(&mut item)?;
            records.push(IndexedRecord {
                name: name.clone(),
                counters: FunctionCounters { name_ref, hash, counters, bitmap },
            });
        }
    }
    Ok(records)
}

/// The next `len` bytes of an item.
fn take<'a>(cur: &mut Bytes<'a>, len: u64, what: &str) -> Result<&'a [u8]> {
    let len = bounded(cur, len, 1, what)?;
    cur.take(len)
}

/// A count of `size`-byte things that must fit in what remains.
fn bounded(cur: &Bytes<'_>, count: u64, size: u64, what: &str) -> Result<usize> {
    match count.checked_mul(size) {
        Some(n) if n <= cur.remaining() as u64 => Ok(count as usize),
        _ => Err(cur.error(format!(
            "{count} {what} do not fit in the {} bytes that remain (truncated?)",
            cur.remaining()
        ))),
    }
}

/// Skips a record's value-profile data: a u32 total size (a multiple of 8,
/// itself included) and the rest, which coverage does not use.
fn skip_value_data(item: &mut Bytes<'_>) -> Result<()> {
    let at = item.position();
    let total = item.u32()?;
    if total < 8 || total % 8 != 0 || total as usize - 4 > item.remaining() {
        return Err(item.error_at(
            at,
            format!("value profile data of {total} bytes: not a multiple of 8 that fits in the record"),
        ));
    }
    item.skip(total as usize - 4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{name_ref, Counters, Lookup};

    /// `llvm-profdata merge` (LLVM 22) of the C fixture run with `classify 5
    /// -3 0 12 -40`, built by clang-19.
    const C_CLANG19_V13: &str = concat!(
        "ff6c70726f6669810d000000000000000000000000000000000000000000000090070000000000000000000000000000",
        "a0080000000000000000000000000000c808000000000000060000000000000010000000000000000700000000000000",
        "1a000000000000000500000000000000050000000000000005000000000000001f000000000000001027000000000000",
        "00000000000000000000000000000000a08601000000000005000000000000000500000000000000400d030000000000",
        "05000000000000000500000000000000e09304000000000005000000000000000500000000000000801a060000000000",
        "0500000000000000050000000000000020a107000000000005000000000000000500000000000000c027090000000000",
        "0500000000000000050000000000000060ae0a00000000000500000000000000050000000000000000350c0000000000",
        "05000000000000000500000000000000a0bb0d000000000002000000000000000700000000000000f07e0e0000000000",
        "02000000000000000700000000000000301b0f000000000001000000000000000900000000000000583e0f0000000000",
        "01000000000000000900000000000000dc410f00000000000100000000000000090000000000000036420f0000000000",
        "010000000000000009000000000000003f420f000000000001000000000000000900000000000000010042b65feb984b",
        "c290100000000000000038000000000000006d61696e2e633a70617273655f616c6c58146192a66c0400030000000000",
        "0000010000000000000005000000000000000000000000000000000000000000000008000000000000000100e6bb6f5e",
        "8f9e8aeb0d0000000000000060000000000000007574696c5f636865636b73756dee1a9ee9d3b6577b08000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000008000000000000000100c75b4d41a7a78ab70d00000000",
        "00000078000000000000007574696c5f636c6173736966795486ade4a4bb9d990b000000000000000500000000000000",
        "000000000000000002000000000000000100000000000000010000000000000001000000000000000100000000000000",
        "020000000000000001000000000000000100000000000000010000000000000000000000000000000800000000000000",
        "0100ab9e04734bbaa3c50c0000000000000038000000000000007574696c2e633a636c616d7044a9bfecc073c5120300",
        "000000000000000000000000000000000000000000000000000000000000000000000000000008000000000000000100",
        "4c91f5fb110aca960e0000000000000038000000000000007574696c2e633a7369676e5f6f665bc33518000000000300",
        "000000000000050000000000000002000000000000000200000000000000000000000000000008000000000000000100",
        "ae4753412e196c030d0000000000000028000000000000006d61696e2e633a68656c7065721b06000000000000010000",
        "000000000001000000000000000000000000000000080000000000000001004f739c97a1fb2ce30b0000000000000038",
        "000000000000007574696c5f756e757365645c834598c429000003000000000000000000000000000000000000000000",
        "00000000000000000000000000000000000008000000000000000100d36f70f0fa3eecc7080000000000000050000000",
        "000000007574696c5f73756ded30798520b88ed306000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000080000000000000001009423",
        "fda88e5307ed100000000000000040000000000000006d61696e2e633a70617273655f696e74588449e0f72800000400",
        "000000000000050000000000000000000000000000000500000000000000050000000000000000000000000000000800",
        "0000000000000100981e8e087c683c550a0000000000000078000000000000007574696c5f67726164656456959a5f9a",
        "aca40b000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "00000000000000000000080000000000000001003908d4131dec0c920d0000000000000028000000000000007574696c",
        "2e633a68656c706572180000000000000001000000000000000000000000000000000000000000000008000000000000",
        "000100fad58de7366495db0400000000000000b0000000000000006d61696e3ed7693908050178120000000000000001",
        "000000000000000000000000000000010000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000010000000000000001000000000000000000000000000000000000000000000000",
        "000000000000000100000000000000050000000000000003000000000000000000000000000000000000000000000000",
        "0000000000000008000000000000000020000000000000000c0000000000000000000000000000000000000000000000",
        "08020000000000000000000000000000000000000000000000000000000000006a02000000000000f102000000000000",
        "0000000000000000000000000000000000000000000000009003000000000000ee030000000000000000000000000000",
        "4e040000000000009d04000000000000000000000000000000000000000000000000000000000000fa04000000000000",
        "6c05000000000000000000000000000000000000000000000000000000000000d6050000000000007206000000000000",
        "c10600000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "2000000000000000140000000000000072a509b71b67c750e5b890291c0fec75af2bcfea000000000000000000000000",
    );

    fn profile() -> Vec<u8> {
        (0..C_CLANG19_V13.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&C_CLANG19_V13[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn reads_names_hashes_and_counters() {
        let data = profile();
        assert!(is_indexed_profile(&data));
        let p = read_indexed_profile(&data).expect("a real profile");
        assert_eq!(p.version, 13);
        assert_eq!(p.variant, Variant::default());
        let classify = p.records.iter().find(|r| r.name == "util_classify").expect("util_classify");
        assert_eq!(classify.counters.hash, 0x999d_bba4_e4ad_8654);
        assert_eq!(classify.counters.counters, [5, 0, 2, 1, 1, 1, 1, 2, 1, 1, 1]);
        assert!(p.records.iter().all(|r| r.counters.name_ref == name_ref(&r.name)));

        let mut counters = Counters::new();
        counters.add_indexed(p.clone()).expect("merge");
        counters.add_indexed(p).expect("merge");
        let Lookup::Found { counters: c, .. } = counters.lookup(name_ref("util_classify"), 0x999d_bba4_e4ad_8654) else {
            panic!("util_classify not found");
        };
        assert_eq!(c, [10, 0, 4, 2, 2, 2, 2, 4, 2, 2, 2]);
        // Another hash with the same bit 60 (context sensitivity) is a mismatch.
        assert_eq!(counters.lookup(name_ref("util_classify"), 0x999d_bba4_e4ad_8655), Lookup::HashMismatch);
    }

    #[test]
    fn truncations_and_bit_flips_are_errors_or_profiles_never_panics() {
        let data = profile();
        let table = u64::from_le_bytes(data[32..40].try_into().expect("8 bytes")) as usize;
        for len in 0..data.len() {
            let read = read_indexed_profile(&data[..len]);
            assert!(len >= table + 16 || read.is_err(), "{len} bytes read");
        }
        let mut flipped = data.clone();
        for bit in 0..data.len() * 8 {
            flipped[bit / 8] ^= 1 << (bit % 8);
            if let Ok(p) = read_indexed_profile(&flipped) {
                let _ = Counters::new().add_indexed(p);
            }
            flipped[bit / 8] ^= 1 << (bit % 8);
        }
    }
}
