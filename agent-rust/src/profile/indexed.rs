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
pub(crate) const MAGIC: u64 = 0x8169_666f_7270_6cff;

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
