//! Where the counters come from: raw profiles (`.profraw`), or the
//! `__llvm_prf_*` sections of a loaded module, merged as `llvm-profdata
//! merge` does and looked up as `llvm-cov` looks them up.
//!
//! # Reading
//!
//! [`read_raw_profiles`] reads every profile of a `.profraw` file (the
//! runtime may append several, zero-padded to 8 bytes). Versions 5, 7, 8, 9
//! and 10 are read, in either byte order and from 32- or 64-bit programs;
//! a profile's [`FunctionCounters`] carry the `NameRef` (see [`name_ref`])
//! and structural hash that the coverage mapping uses to refer to a
//! function. Value-profile data, vtable records and timestamps (temporal
//! profiles) are checked and skipped; byte-coverage counters are turned
//! into counts (a cleared byte is 1, anything else 0).
//!
//! [`read_indexed_profile`] reads an indexed profile (`.profdata`, what
//! `llvm-profdata merge` writes; [`is_indexed_profile`] tells one by its
//! magic) and [`Counters::add_indexed`] merges it with raw profiles.
//!
//! The layout facts live in [`RecordLayout`], and [`decode_records`] decodes
//! data records from any byte slices: this is the seam for an in-process
//! agent that reads a loaded module's `__llvm_prf_data`, `__llvm_prf_cnts`
//! and `__llvm_prf_bits` from memory instead of a file (with the names from
//! `__llvm_prf_names` through [`decode_names`]).
//!
//! # Merging and lookup
//!
//! [`Counters`] merges the records of many profiles exactly as
//! `llvm-profdata merge` (LLVM 22) builds an indexed profile, and
//! [`Counters::lookup`] answers as `llvm-cov`'s indexed-profile lookup does.
//! See those items for the details that show in a report.
//!
//! Every malformed input is an [`Error::Malformed`] naming the structure and
//! byte offset; the readers never panic and allocate in proportion to their
//! input.

mod indexed;
mod name_refs;
mod names;
mod raw;
mod write;
#[cfg(test)]
mod real_profiles;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::HashSet;

use rustc_hash::FxHashMap;
use std::sync::Arc;

pub use crate::bytes::Endian;
use crate::error::{Error, Result};
pub use indexed::{is_indexed_profile, read_indexed_profile, IndexedProfile, IndexedRecord};
pub use names::{decode_names, name_ref, name_ref_bytes, NameTable, Names};
pub use write::{write_raw_profile, ModuleImage};

/// One raw profile: what one instrumented module (executable or shared
/// object) wrote when it exited or dumped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawProfile {
    /// Raw format version (5, 7, 8, 9 or 10).
    pub version: u32,
    /// The variant flags of the version word.
    pub variant: Variant,
    /// Whether counters are single bytes (same as `variant.byte_coverage`).
    pub byte_coverage: bool,
    /// Build ids of the module (version 7 and later; usually one, from the
    /// ELF `NT_GNU_BUILD_ID` note; none if the module was linked without).
    pub binary_ids: Vec<Vec<u8>>,
    /// One entry per data record, in section order.
    pub records: Vec<FunctionCounters>,
    /// The function names of the module's names section, in order.
    pub names: Arc<Names>,
}

/// The counters of one function (one data record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionCounters {
    /// `NameRef`: [`name_ref`] of the function's PGO name.
    pub name_ref: u64,
    /// Structural hash; the coverage mapping record must carry the same one.
    pub hash: u64,
    /// Counter values, in counter-id order (the timestamp slot of temporal
    /// profiles removed; byte-coverage bytes turned into 1 = executed or 0).
    pub counters: Vec<u64>,
    /// MC/DC test-vector bitmap bytes (version 9 and later; usually empty).
    pub bitmap: Vec<u8>,
}

/// Variant flags: the high 32 bits of a raw profile's version word
/// (`VARIANT_MASK_*` in `InstrProfData.inc`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Variant {
    /// Bit 56: IR-level instrumentation (PGO); 0 for clang and rustc coverage.
    pub ir: bool,
    /// Bit 57: context-sensitive IR instrumentation.
    pub context_sensitive: bool,
    /// Bit 58: the entry block is always instrumented (IR PGO).
    pub instr_entry: bool,
    /// Bit 55: loop entries are always instrumented (IR PGO).
    pub loop_entries: bool,
    /// Bit 60: counters are single bytes, cleared (0) when executed.
    pub byte_coverage: bool,
    /// Bit 61: only function entries are instrumented.
    pub function_entry_only: bool,
    /// Bit 63: the first counter slot of each function is a timestamp.
    pub temporal: bool,
}

const LOOP_ENTRIES: u64 = 1 << 55;
const IR: u64 = 1 << 56;
const CONTEXT_SENSITIVE: u64 = 1 << 57;
const INSTR_ENTRY: u64 = 1 << 58;
const DEBUG_INFO_CORRELATE: u64 = 1 << 59;
const BYTE_COVERAGE: u64 = 1 << 60;
const FUNCTION_ENTRY_ONLY: u64 = 1 << 61;
const TEMPORAL: u64 = 1 << 63;

impl Variant {
    /// The variant of a version word (a raw profile's second header field,
    /// or a module's `__llvm_profile_raw_version`). Refuses flags that change
    /// how the profile must be read and that livecov does not handle:
    /// debug-info correlation (bit 59: the data records are not in the
    /// profile), memory profiles (bit 62) and any unassigned bit.
    pub fn from_version_word(word: u64) -> Result<Variant> {
        let flags = word & 0xffff_ffff_0000_0000;
        if flags & DEBUG_INFO_CORRELATE != 0 {
            return Err(Error::Unsupported(
                "the profile was written for debug-info or binary correlation \
                 (-profile-correlate): its function records are in the binary, not in the \
                 profile, which livecov does not support"
                    .into(),
            ));
        }
        let known = LOOP_ENTRIES
            | IR
            | CONTEXT_SENSITIVE
            | INSTR_ENTRY
            | BYTE_COVERAGE
            | FUNCTION_ENTRY_ONLY
            | TEMPORAL;
        let unknown = flags & !known;
        if unknown != 0 {
            return Err(Error::Unsupported(format!(
                "unknown raw profile variant flags {unknown:#x} in version word {word:#x}"
            )));
        }
        Ok(Variant {
            ir: flags & IR != 0,
            context_sensitive: flags & CONTEXT_SENSITIVE != 0,
            instr_entry: flags & INSTR_ENTRY != 0,
            loop_entries: flags & LOOP_ENTRIES != 0,
            byte_coverage: flags & BYTE_COVERAGE != 0,
            function_entry_only: flags & FUNCTION_ENTRY_ONLY != 0,
            temporal: flags & TEMPORAL != 0,
        })
    }

    /// The flag bits of a version word with this variant.
    pub fn to_flags(self) -> u64 {
        [
            (self.ir, IR),
            (self.context_sensitive, CONTEXT_SENSITIVE),
            (self.instr_entry, INSTR_ENTRY),
            (self.loop_entries, LOOP_ENTRIES),
            (self.byte_coverage, BYTE_COVERAGE),
            (self.function_entry_only, FUNCTION_ENTRY_ONLY),
            (self.temporal, TEMPORAL),
        ]
        .iter()
        .filter(|(set, _)| *set)
        .fold(0, |flags, (_, bit)| flags | bit)
    }

    fn union(self, other: Variant) -> Variant {
        Variant {
            ir: self.ir | other.ir,
            context_sensitive: self.context_sensitive | other.context_sensitive,
            instr_entry: self.instr_entry | other.instr_entry,
            loop_entries: self.loop_entries | other.loop_entries,
            byte_coverage: self.byte_coverage | other.byte_coverage,
            function_entry_only: self.function_entry_only | other.function_entry_only,
            temporal: self.temporal | other.temporal,
        }
    }
}

/// What is needed to decode data records besides the bytes themselves: the
/// facts a raw profile header gives, or that an in-process agent knows
/// about a loaded module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLayout {
    /// Raw format version (low 32 bits of the version word).
    pub version: u32,
    /// Variant flags (high 32 bits of the version word).
    pub variant: Variant,
    /// Pointer-sized fields are u64 (true) or u32.
    pub is_64: bool,
    /// Byte order of every multi-byte field and counter.
    pub endian: Endian,
    /// Version 8 and later: address of the first counter minus address of
    /// the first data record (the header's `CountersDelta`). Versions 5 and
    /// 7: address of the first counter (data records hold absolute
    /// addresses).
    pub counters_delta: u64,
    /// As `counters_delta`, for the MC/DC bitmap (version 9 and later).
    pub bitmap_delta: u64,
}

impl RecordLayout {
    /// The layout of a loaded module's sections, from its version word
    /// (`__llvm_profile_raw_version`, which the runtime also writes into
    /// profiles) and the run-time start addresses of its `__llvm_prf_data`,
    /// `__llvm_prf_cnts` and `__llvm_prf_bits` sections (0 when absent).
    ///
    /// This is for reading the sections in place. It does not hold when the
    /// runtime has moved the counters (continuous mode, `%c`).
    pub fn for_module(
        version_word: u64,
        is_64: bool,
        endian: Endian,
        data_address: u64,
        counters_address: u64,
        bitmap_address: u64,
    ) -> Result<RecordLayout> {
        let version = version_word as u32;
        raw::supported_version(version)?;
        let variant = Variant::from_version_word(version_word)?;
        let delta = |address: u64| {
            let d = if version >= 8 {
                address.wrapping_sub(data_address)
            } else {
                address
            };
            if is_64 {
                d
            } else {
                u64::from(d as u32)
            }
        };
        Ok(RecordLayout {
            version,
            variant,
            is_64,
            endian,
            counters_delta: delta(counters_address),
            bitmap_delta: delta(bitmap_address),
        })
    }

    /// Size in bytes of one data record in this layout.
    pub fn record_size(&self) -> usize {
        raw::record_size(self.version, self.is_64)
    }
}

/// Reads all raw profiles in `data` (a `.profraw` file's contents).
///
/// An empty input gives no profiles (llvm-profdata skips empty raw profiles
/// silently). Anything else must start with a raw profile magic; after each
/// profile only zero bytes or another 8-aligned profile of the same magic
/// may follow. A counter above 2^56 is an error, as llvm-profdata refuses
/// such a profile as corrupted.
pub fn read_raw_profiles(data: &[u8]) -> Result<Vec<RawProfile>> {
    ProfileReader::new().read(data)
}

/// Reads many raw profile files of one binary, decoding their (identical)
/// names sections once.
#[derive(Debug, Default)]
pub struct ProfileReader {
    names: raw::NamesCache,
    records: raw::Records,
}

impl ProfileReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// As [`read_raw_profiles`].
    pub fn read(&mut self, data: &[u8]) -> Result<Vec<RawProfile>> {
        raw::read_all(data, &mut self.names)
    }

    /// Reads the raw profiles in `data` and merges each into `counters`, as
    /// [`read`](Self::read) and then [`Counters::add`] for each profile
    /// would, without a vector per record on the way. Returns the binary ids
    /// of each profile.
    ///
    /// Each profile's names table goes to `names` before the merge indexes
    /// it (hashing every name, a large part of the read): the coverage
    /// mapping of the binary that wrote the profiles has the same section,
    /// and [`CoverageMapping::add_object_with_names`](crate::mapping::CoverageMapping::add_object_with_names)
    /// on another thread can take the table instead of decoding the
    /// section again, and share the index.
    ///
    /// Each profile is merged once it has been read and checked whole; on an
    /// error the profiles before the bad one are merged already. A refused
    /// merge is an [`Error::Mismatch`], as from [`Counters::add`].
    pub fn read_into(
        &mut self,
        data: &[u8],
        counters: &mut Counters,
        mut names: impl FnMut(&Arc<NameTable>),
    ) -> Result<Vec<Vec<Vec<u8>>>> {
        let mut ids = Vec::new();
        raw::for_each_profile(data, &mut self.names, &mut self.records, |meta, records| {
            ids.push(meta.binary_ids);
            names(&meta.names);
            let merged = records.list.iter().map(|r| {
                (r.name_ref, r.hash, Cow::Borrowed(records.counters_of(r)), Cow::Borrowed(records.bitmap_of(r)))
            });
            counters.add_records(meta.variant, meta.names, merged)
        })?;
        Ok(ids)
    }
}

/// Decodes data records from the byte images of a module's `__llvm_prf_data`
/// (`data`: whole records only), `__llvm_prf_cnts` (`counters`) and
/// `__llvm_prf_bits` (`bitmap`, empty before version 9), with the same
/// checks as [`read_raw_profiles`]. Error offsets are relative to the start
/// of the slice they concern.
///
/// Records are returned in section order. Names come separately: decode the
/// module's `__llvm_prf_names` with [`decode_names`].
pub fn decode_records(
    layout: &RecordLayout,
    data: &[u8],
    counters: &[u8],
    bitmap: &[u8],
) -> Result<Vec<FunctionCounters>> {
    let section = |bytes| raw::Section { bytes, base: 0 };
    let mut records = raw::Records::default();
    raw::decode_records_in(layout, section(data), section(counters), section(bitmap), &mut records)?;
    Ok(records.to_function_counters().collect())
}

/// As [`decode_records`], of the records whose name reference `keep` takes,
/// each with its index among all and where its counters are in `counters`.
/// An agent that keeps a module's records compares those byte ranges
/// between snapshots and decodes again, with [`decode_counters`], only the
/// records whose counters changed; it needs the records of the functions
/// it reports, a few of a Rust program's thousands.
pub fn decode_records_with_spans(
    layout: &RecordLayout,
    data: &[u8],
    counters: &[u8],
    bitmap: &[u8],
    keep: impl Fn(u64) -> bool,
) -> Result<Vec<(usize, FunctionCounters, std::ops::Range<usize>)>> {
    let section = |bytes| raw::Section { bytes, base: 0 };
    let mut records = raw::Records::default();
    raw::decode_records_in(layout, section(data), section(counters), section(bitmap), &mut records)?;
    let kept = records.list.iter().enumerate().filter(|(_, r)| keep(r.name_ref));
    Ok(kept.map(|(index, r)| (index, records.function_counters(r), r.counters_span.clone())).collect())
}

/// The counter values of record `index` from its bytes in the counters
/// section (a span of [`decode_records_with_spans`]).
pub fn decode_counters(layout: &RecordLayout, bytes: &[u8], index: usize) -> Result<Vec<u64>> {
    raw::counter_values(layout, bytes, 0, index)
}

/// As [`decode_counters`], appending to `values`.
pub fn decode_counters_into(layout: &RecordLayout, bytes: &[u8], index: usize, values: &mut Vec<u64>) -> Result<()> {
    raw::push_counter_values(layout, bytes, 0, index, values)
}

/// Bit of a function hash that marks context-sensitive IR records
/// (`NamedInstrProfRecord::CS_FLAG_IN_FUNC_HASH`).
pub(crate) const CS_FLAG_IN_HASH: u32 = 60;
/// Largest count a merge produces (`getInstrMaxCountValue`); the two values
/// above it mark pseudo counts.
const MAX_COUNT: u64 = u64::MAX - 2;
const PSEUDO_HOT: u64 = u64::MAX;
const PSEUDO_WARM: u64 = u64::MAX - 1;

#[derive(Clone, Debug)]
struct Entry {
    hash: u64,
    counters: Vec<u64>,
    bitmap: Vec<u8>,
}

/// Counters of any number of profiles of one program, merged as
/// `llvm-profdata merge` does and looked up as `llvm-cov` does.
///
/// Merging, per (function name, hash) — `InstrProfWriter::addRecord` and
/// `InstrProfRecord::merge`:
/// - the first record is kept as it is;
/// - a later one with the same number of counters is added counter by
///   counter, saturating at 2^64 - 3 (a count-overflow warning); byte
///   coverage counts are summed too, so merged byte-coverage counts can
///   exceed 1;
/// - a later one with a different number of counters is dropped with a
///   warning (`count_mismatch`): the first one stays;
/// - bitmaps are ORed; if their lengths differ the counters are still
///   summed but the bitmap stays as it was (`bitmap_mismatch`);
/// - a first counter of 2^64 - 1 or 2^64 - 2 is a "pseudo count" and
///   follows LLVM's pseudo-count rules.
///
/// A record whose `NameRef` is not among its profile's names gets the empty
/// name, as in llvm-profdata; such records are merged together under it, and
/// [`lookup`](Counters::lookup) falls back to them for names it does not
/// know (see there).
///
/// When several profiles disagree, "first" means first added. llvm-profdata
/// loads its inputs in order with one thread, but with three or more inputs
/// it may use several threads, and which record is first is then up to its
/// scheduling.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    by_name: FxHashMap<u64, Vec<Entry>>,
    /// Name sections seen so far, indexed by name reference: hashing every
    /// name is most of the work of adding a profile, and the profiles of one
    /// module (one per dump, for the agent) share their names.
    names: Vec<Arc<NameTable>>,
    unnamed: Vec<Entry>,
    variant: Option<Variant>,
    profiles: usize,
    warnings: Vec<String>,
    suppressed: usize,
    /// Looked up as a profile `llvm-profdata merge -sparse` wrote (see
    /// [`set_sparse`](Counters::set_sparse)).
    sparse: bool,
}

/// Name sections whose index is kept (one per loaded module, usually few).
const MAX_NAME_SECTIONS: usize = 64;

/// Warnings kept before further ones are only counted.
const MAX_WARNINGS: usize = 1000;

/// What `llvm-cov` gets when it asks the merged profile for a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// A record of that name with that hash.
    Found {
        counters: &'a [u64],
        bitmap: &'a [u8],
    },
    /// Records of that name exist, none with that hash (and at least one
    /// with the same context-sensitivity bit 60 of the hash): llvm-cov
    /// skips the function and counts a hash mismatch.
    HashMismatch,
    /// No record of that name: llvm-cov shows the function with all
    /// counters zero.
    Unknown,
}

impl Counters {
    /// No profiles yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every profile added, but keeps the name indices (and
    /// whether it is sparse), for a new merge of profiles of the same modules.
    pub fn clear(&mut self) {
        let names = std::mem::take(&mut self.names);
        *self = Counters { names, sparse: self.sparse, ..Counters::default() };
    }

    /// Merges one profile in.
    ///
    /// Fails, changing nothing, when llvm-profdata would refuse the merge:
    /// a function-entry-only profile (variant bit 61) with a profile that
    /// instruments entry blocks (bit 58). A byte-coverage profile merged
    /// with a counting one is accepted as llvm-profdata 22 accepts it
    /// (later releases refuse it), with a warning.
    pub fn add(&mut self, profile: RawProfile) -> Result<()> {
        let records = profile
            .records
            .into_iter()
            .map(|r| (r.name_ref, r.hash, Cow::Owned(r.counters), Cow::Owned(r.bitmap)));
        let names = match self.names.iter().find(|t| Arc::ptr_eq(t.names(), &profile.names)) {
            Some(table) => table.clone(),
            None => Arc::new(NameTable::from_names(profile.names)),
        };
        self.add_records(profile.variant, names, records)
    }

    /// [`add`](Self::add) of a module's records with the table of its
    /// names, which may be a table of
    /// [`references_only`](NameTable::references_only): a live agent merges
    /// its modules' records so.
    pub fn add_module(&mut self, variant: Variant, names: Arc<NameTable>, records: Vec<FunctionCounters>) -> Result<()> {
        let records = records.into_iter().map(|r| (r.name_ref, r.hash, Cow::Owned(r.counters), Cow::Owned(r.bitmap)));
        self.add_records(variant, names, records)
    }

    /// [`add`](Self::add) of a profile given as its variant, its names and
    /// its records: (name reference, hash, counters, bitmap).
    fn add_records<'a>(
        &mut self,
        new: Variant,
        names: Arc<NameTable>,
        records: impl Iterator<Item = (u64, u64, Cow<'a, [u64]>, Cow<'a, [u8]>)>,
    ) -> Result<()> {
        self.add_variant(new)?;
        let known = self.names.iter().position(|t| {
            Arc::ptr_eq(t, &names)
                || (t.has_names() && names.has_names() && (Arc::ptr_eq(t.names(), names.names()) || t.names() == names.names()))
        });
        let index = known.unwrap_or_else(|| {
            if self.names.len() == MAX_NAME_SECTIONS {
                self.names.remove(0);
            }
            self.names.push(names);
            self.names.len() - 1
        });
        let names = &self.names[index];
        let mut unresolved = HashSet::new();
        let mut pending = Vec::new();
        for (name_ref, hash, counters, bitmap) in records {
            let (group, name) = match names.index_of(name_ref) {
                Some(i) => {
                    let name = names.names().get(i).map_or(Name::Reference(name_ref), Name::Named);
                    (self.by_name.entry(name_ref).or_default(), name)
                }
                None => {
                    unresolved.insert(name_ref);
                    (&mut self.unnamed, Name::Unresolved)
                }
            };
            if let Some(warning) = file(group, name, hash, counters, bitmap, self.profiles) {
                pending.push(warning);
            }
        }
        for warning in pending {
            self.warn(warning);
        }
        if !unresolved.is_empty() {
            self.warn(format!(
                "profile {}: {} NameRef(s) not found among the profile's names; their records were \
                 filed under the empty name, as llvm-profdata does",
                self.profiles,
                unresolved.len()
            ));
        }
        Ok(())
    }

    /// Merges an indexed profile in, as `llvm-profdata merge` merges one
    /// given among its inputs; the same refusals as [`add`](Self::add).
    /// Records under the empty name are those llvm-profdata could not name,
    /// and join the ones a raw profile could not name.
    pub fn add_indexed(&mut self, profile: IndexedProfile) -> Result<()> {
        self.add_variant(profile.variant)?;
        let mut pending = Vec::new();
        for r in profile.records {
            let c = r.counters;
            let group = if r.name.is_empty() {
                &mut self.unnamed
            } else {
                self.by_name.entry(c.name_ref).or_default()
            };
            let name = if r.name.is_empty() { Name::Unresolved } else { Name::Named(&r.name) };
            let warning = file(group, name, c.hash, Cow::Owned(c.counters), Cow::Owned(c.bitmap), self.profiles);
            pending.extend(warning);
        }
        for warning in pending {
            self.warn(warning);
        }
        Ok(())
    }

    /// Counts one more profile of variant `new`, or refuses it (see
    /// [`add`](Self::add)).
    fn add_variant(&mut self, new: Variant) -> Result<()> {
        if let Some(old) = self.variant {
            if (old.function_entry_only && new.instr_entry)
                || (old.instr_entry && new.function_entry_only)
            {
                return Err(Error::Mismatch(
                    "cannot merge FunctionEntryOnly profiles and BB profiles together".into(),
                ));
            }
            if old.byte_coverage != new.byte_coverage {
                self.warn(format!(
                    "profile {} has {} counters but earlier ones have {}: merged anyway, as llvm-profdata 22 does",
                    self.profiles + 1,
                    if new.byte_coverage { "byte-coverage" } else { "8-byte" },
                    if old.byte_coverage { "byte-coverage" } else { "8-byte" },
                ));
            }
        }
        self.variant = Some(self.variant.map_or(new, |old| old.union(new)));
        self.profiles += 1;
        Ok(())
    }

    /// The record of function `name_ref` (see [`name_ref`]) with structural
    /// hash `hash`, as `IndexedInstrProfReader::getInstrProfRecord` finds it
    /// in the indexed profile llvm-profdata would write.
    ///
    /// A name with no records falls back to the records filed under the
    /// empty name (those whose NameRef was unknown to their profile), as
    /// llvm-cov's lookup retries with its empty "deprecated name". Among a
    /// name's records, a missing hash is [`Lookup::HashMismatch`] only if
    /// some record shares the hash's bit 60, else [`Lookup::Unknown`].
    pub fn lookup(&self, name_ref: u64, hash: u64) -> Lookup<'_> {
        // `-sparse` writes a name only when one of its records counted
        // something (`InstrProfWriter::shouldEncodeData`).
        let written = |group: &&Vec<Entry>| {
            !self.sparse || group.iter().any(|e| e.counters.iter().any(|&c| c != 0) || e.bitmap.iter().any(|&b| b != 0))
        };
        let group = match self.by_name.get(&name_ref).filter(written) {
            Some(group) => group,
            None if Some(&self.unnamed).filter(written).is_some_and(|u| !u.is_empty()) => &self.unnamed,
            None => return Lookup::Unknown,
        };
        if let Some(e) = group.iter().find(|e| e.hash == hash) {
            return Lookup::Found {
                counters: &e.counters,
                bitmap: &e.bitmap,
            };
        }
        let cs = |h: u64| (h >> CS_FLAG_IN_HASH) & 1;
        if group.iter().any(|e| cs(e.hash) == cs(hash)) {
            Lookup::HashMismatch
        } else {
            Lookup::Unknown
        }
    }

    /// Looks functions up as in a profile written by `llvm-profdata merge
    /// -sparse` (what clang's documentation and cargo-llvm-cov use): the
    /// names whose records count nothing are left out of it. A function's
    /// report is the same either way, but not whether llvm-cov takes a
    /// function's record from one object or from another when several
    /// objects have it (`-object`): a record of an object where the
    /// function is unused (hash 0) is a hash mismatch beside the zero
    /// counts of another object's, and an unknown function without them.
    pub fn set_sparse(&mut self, sparse: bool) {
        self.sparse = sparse;
    }

    /// Warnings from merging (count and bitmap mismatches, overflow,
    /// unresolved names, mixed counter kinds), in order. After 1000, further
    /// warnings are only counted, in one last line.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    fn warn(&mut self, warning: String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(warning);
            return;
        }
        self.suppressed += 1;
        let line = format!("{} more warnings not shown", self.suppressed);
        if self.suppressed == 1 {
            self.warnings.push(line);
        } else if let Some(last) = self.warnings.last_mut() {
            *last = line;
        }
    }

    /// Whether any merged profile had byte-coverage counters; llvm-cov then
    /// treats the merged profile as single-byte coverage.
    pub fn byte_coverage(&self) -> bool {
        self.variant.is_some_and(|v| v.byte_coverage)
    }

    /// The union of the merged profiles' variant flags.
    pub fn variant(&self) -> Variant {
        self.variant.unwrap_or_default()
    }

    /// Number of profiles merged so far.
    pub fn profiles(&self) -> usize {
        self.profiles
    }
}

/// A record's function as warnings name it.
#[derive(Clone, Copy)]
enum Name<'a> {
    Named(&'a str),
    /// Its name reference, in a table of
    /// [`references_only`](NameTable::references_only).
    Reference(u64),
    /// A name reference that the profile's names do not have.
    Unresolved,
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Name::Named(name) => f.write_str(name),
            Name::Reference(name_ref) => write!(f, "with NameRef {name_ref:#018x}"),
            Name::Unresolved => f.write_str("<unnamed>"),
        }
    }
}

/// Files one record of profile number `profile` under its name's `group`:
/// a new entry for a new hash, else merged into the entry of that hash.
/// Returns the merge's warning, if any.
fn file(
    group: &mut Vec<Entry>,
    name: Name<'_>,
    hash: u64,
    counters: Cow<'_, [u64]>,
    bitmap: Cow<'_, [u8]>,
    profile: usize,
) -> Option<String> {
    match group.iter_mut().find(|e| e.hash == hash) {
        None => {
            // Most names have one record: no room for four.
            group.reserve_exact(1);
            group.push(Entry { hash, counters: counters.into_owned(), bitmap: bitmap.into_owned() });
            None
        }
        Some(entry) => merge(entry, &counters, &bitmap)
            .map(|warning| format!("function {name} (hash {hash:#018x}) in profile {profile}: {warning}")),
    }
}

/// Merges a record's counters and bitmap into `dest` as
/// `InstrProfRecord::merge` does (weight 1). Returns a warning when LLVM
/// would report one.
fn merge(dest: &mut Entry, counters: &[u64], bitmap: &[u8]) -> Option<String> {
    if dest.counters.len() != counters.len() {
        return Some(format!(
            "{} counters here, {} in the first record; kept the first (llvm-profdata: count_mismatch)",
            counters.len(),
            dest.counters.len()
        ));
    }
    let pseudo = |c: &[u64]| match c.first() {
        Some(&PSEUDO_HOT) => Some(PSEUDO_HOT),
        Some(&PSEUDO_WARM) => Some(PSEUDO_WARM),
        _ => None,
    };
    match (pseudo(&dest.counters), pseudo(counters)) {
        (None, None) => {}
        (Some(a), Some(b)) => {
            if let Some(first) = dest.counters.first_mut() {
                *first = if a == PSEUDO_HOT || b == PSEUDO_HOT {
                    PSEUDO_HOT
                } else {
                    PSEUDO_WARM
                };
            }
            return None;
        }
        _ => return Some(
            "pseudo counts merged with real counts; kept the first (llvm-profdata: count_mismatch)"
                .into(),
        ),
    }
    let mut overflowed = false;
    for (d, s) in dest.counters.iter_mut().zip(counters) {
        let (sum, carry) = d.overflowing_add(*s);
        *d = if carry || sum > MAX_COUNT {
            overflowed = true;
            MAX_COUNT
        } else {
            sum
        };
    }
    // llvm-profdata reports only the first warning of a record.
    let overflow = overflowed
        .then(|| "counter overflow, saturated (llvm-profdata: counter_overflow)".to_string());
    if dest.bitmap.len() != bitmap.len() {
        return overflow.or_else(|| {
            Some(format!(
                "{} bitmap bytes here, {} in the first record; counters summed, bitmap kept \
                 (llvm-profdata: bitmap_mismatch)",
                bitmap.len(),
                dest.bitmap.len()
            ))
        });
    }
    for (d, s) in dest.bitmap.iter_mut().zip(bitmap) {
        *d |= s;
    }
    overflow
}
