//! Decoding of raw profiles (`.profraw`) and of the per-function data
//! records they share with a loaded module's `__llvm_prf_*` sections.
//!
//! Layouts follow LLVM's `InstrProfData.inc` (header, `ProfileData`,
//! `VTableProfileData`, `ValueProfData`), the runtime's writer
//! (`InstrProfilingWriter.c`) and the checks of `RawInstrProfReader`
//! (`InstrProfReader.cpp`) for the versions listed in [`SUPPORTED`].

use std::ops::Range;
use std::sync::Arc;

use super::names::{decode_names_at, NameTable};
use super::{FunctionCounters, RawProfile, RecordLayout, Variant};
use crate::bytes::{Bytes, Endian};
use crate::error::{Error, Result};

/// Magic of a raw profile written by a 64-bit program ("\xfflprofr\x81").
pub(crate) const MAGIC_64: u64 = 0xff6c_7072_6f66_7281;
/// Magic of a raw profile written by a 32-bit program ("\xfflprofR\x81").
pub(crate) const MAGIC_32: u64 = 0xff6c_7072_6f66_5281;
/// Magic of an indexed profile (`.profdata`), as read little-endian.
const INDEXED_MAGIC: u64 = 0x8169_666f_7270_6cff;

/// Raw profile versions this reader understands.
pub(crate) const SUPPORTED: [u32; 5] = [5, 7, 8, 9, 10];

/// Which producers write each supported version, for error messages.
pub(crate) const SUPPORTED_TEXT: &str = "5 (LLVM 11-12), 7 (LLVM 13), 8 (LLVM 14-17), \
     9 (LLVM 18) and 10 (LLVM 19-22: clang 19-22, rustc from 1.82 while it is on LLVM 22 or older)";

/// llvm-profdata treats a counter above 2^56 as corruption and refuses the
/// profile (`RawInstrProfReader::MaxCounterValue`).
const MAX_COUNTER_VALUE: u64 = 1 << 56;

pub(crate) fn supported_version(version: u32) -> Result<()> {
    if SUPPORTED.contains(&version) {
        Ok(())
    } else {
        let hint = if version > 10 {
            " (written by a newer LLVM than 22)"
        } else {
            ""
        };
        Err(Error::Unsupported(format!(
            "raw profile version {version} is not supported{hint}; livecov reads versions {SUPPORTED_TEXT}"
        )))
    }
}

/// Number of value-profile kinds (`IPVK_Last + 1`) in a version's records.
fn value_kinds(version: u32) -> usize {
    if version >= 10 {
        3
    } else {
        2
    }
}

/// Size of one data record, as the 64-bit host tools lay out
/// `RawInstrProf::ProfileData<IntPtrT>` (the struct holds u64 fields, so its
/// size is rounded up to 8 even for 32-bit pointers).
pub(crate) fn record_size(version: u32, is_64: bool) -> usize {
    let ptr = if is_64 { 8 } else { 4 };
    // NameRef, FuncHash, then CounterPtr, [BitmapPtr], FunctionPointer, Values.
    let ptrs = if version >= 9 { 4 } else { 3 };
    let mut size = 16 + ptrs * ptr;
    size += 4; // NumCounters
    size += 2 * value_kinds(version); // NumValueSites
    if version >= 9 {
        size = size.next_multiple_of(4) + 4; // NumBitmapBytes
    }
    size.next_multiple_of(8)
}

fn header_size(version: u32) -> usize {
    match version {
        5 => 80,
        7 | 8 => 88,
        9 => 112,
        _ => 128,
    }
}

/// Padding LLVM puts after the names (and vtable) sections: to the next
/// multiple of 8.
fn padding(size: u64) -> u64 {
    7 & (8 - size % 8)
}

/// A slice of the input and the offset of its first byte, for errors.
#[derive(Clone, Copy)]
pub(crate) struct Section<'a> {
    pub bytes: &'a [u8],
    pub base: u64,
}

/// The data records of one module or profile, decoded into flat buffers:
/// a profile has tens of thousands of records of a few counters each, and a
/// vector per record would cost more than decoding it. The buffers are
/// reused from one profile to the next.
#[derive(Debug, Default)]
pub(crate) struct Records {
    pub list: Vec<Record>,
    /// The counter values of every record, one record after the other.
    pub counters: Vec<u64>,
    /// The bitmap bytes of every record, one record after the other.
    pub bitmap: Vec<u8>,
}

/// One data record of [`Records`].
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub name_ref: u64,
    pub hash: u64,
    /// Its values in [`Records::counters`].
    pub counters: Range<usize>,
    /// Its bytes in [`Records::bitmap`].
    pub bitmap: Range<usize>,
    /// Whether a value-profile blob follows for it.
    pub has_value_data: bool,
    /// Where its counters are in the counters section.
    pub counters_span: Range<usize>,
}

impl Records {
    fn clear(&mut self) {
        self.list.clear();
        self.counters.clear();
        self.bitmap.clear();
    }

    pub fn counters_of(&self, r: &Record) -> &[u64] {
        &self.counters[r.counters.clone()]
    }

    pub fn bitmap_of(&self, r: &Record) -> &[u8] {
        &self.bitmap[r.bitmap.clone()]
    }

    /// The records as [`FunctionCounters`], in order.
    pub fn to_function_counters(&self) -> impl Iterator<Item = FunctionCounters> + '_ {
        self.list.iter().map(|r| self.function_counters(r))
    }

    pub fn function_counters(&self, r: &Record) -> FunctionCounters {
        FunctionCounters {
            name_ref: r.name_ref,
            hash: r.hash,
            counters: self.counters_of(r).to_vec(),
            bitmap: self.bitmap_of(r).to_vec(),
        }
    }
}

/// Decodes the data records of one module or profile into `out` (cleared
/// first). See [`super::decode_records`] for the meaning of the layout fields.
pub(crate) fn decode_records_in(
    layout: &RecordLayout,
    data: Section<'_>,
    counters: Section<'_>,
    bitmap: Section<'_>,
    out: &mut Records,
) -> Result<()> {
    out.clear();
    supported_version(layout.version)?;
    let size = record_size(layout.version, layout.is_64);
    if data.bytes.len() % size != 0 {
        return Err(Error::malformed(
            "raw profile data records",
            data.base,
            format!(
                "{} bytes is not a whole number of {size}-byte version {} records",
                data.bytes.len(),
                layout.version
            ),
        ));
    }
    let count = data.bytes.len() / size;
    out.list.reserve(count);
    let mut cur = Bytes::new(
        data.bytes,
        data.base,
        layout.endian,
        "raw profile data record",
    );
    for index in 0..count {
        let record_offset = cur.offset();
        let mut rec = cur.split(size, "raw profile data record")?;
        let name_ref = rec.u64()?;
        let hash = rec.u64()?;
        let counter_ptr_at = rec.offset();
        let counter_ptr = rec.pointer(layout.is_64)?;
        let bitmap_ptr_at = rec.offset();
        let bitmap_ptr = if layout.version >= 9 {
            rec.pointer(layout.is_64)?
        } else {
            0
        };
        let _function_pointer = rec.pointer(layout.is_64)?;
        let _values = rec.pointer(layout.is_64)?;
        let num_counters_at = rec.offset();
        let num_counters = rec.u32()?;
        let mut has_value_data = false;
        for _ in 0..value_kinds(layout.version) {
            has_value_data |= rec.u16()? != 0;
        }
        let num_bitmap_bytes = if layout.version >= 9 {
            // NumBitmapBytes is 4-aligned within the record (v10: after 2
            // bytes of padding).
            rec.skip((4 - rec.position() % 4) % 4)?;
            rec.u32()?
        } else {
            0
        };

        let ctx = RecordContext {
            layout,
            index,
            size,
            name_ref,
            record_offset,
        };
        let counters_start = out.counters.len();
        let counters_span = read_counters(
            &ctx,
            counters,
            counter_ptr,
            counter_ptr_at,
            num_counters,
            num_counters_at,
            &mut out.counters,
        )?;
        let bitmap_start = out.bitmap.len();
        if num_bitmap_bytes != 0 {
            let bytes = read_bitmap(&ctx, bitmap, bitmap_ptr, bitmap_ptr_at, num_bitmap_bytes)?;
            out.bitmap.extend_from_slice(bytes);
        }
        out.list.push(Record {
            name_ref,
            hash,
            counters: counters_start..out.counters.len(),
            bitmap: bitmap_start..out.bitmap.len(),
            has_value_data,
            counters_span,
        });
    }
    Ok(())
}

struct RecordContext<'l> {
    layout: &'l RecordLayout,
    index: usize,
    size: usize,
    name_ref: u64,
    record_offset: u64,
}

impl RecordContext<'_> {
    fn error(&self, at: u64, detail: impl std::fmt::Display) -> Error {
        Error::malformed(
            "raw profile data record",
            at,
            format!(
                "record {} (NameRef {:#018x}, at {:#x}): {detail}",
                self.index, self.name_ref, self.record_offset
            ),
        )
    }

    /// Where a section's contents for this record start, in bytes from the
    /// start of the section, or `None` if that lies before the section.
    ///
    /// From version 8 a pointer field holds the distance from this record
    /// to its counters (or bitmap) and `delta` is the distance from the
    /// first record to the section, so the offset is
    /// `ptr - (delta - index * record_size)`. Before version 8 the field is
    /// an absolute address and `delta` the section's address; those readers
    /// counted in whole 8-byte counters, rounding down.
    fn section_offset(&self, ptr: u64, delta: u64) -> Option<u64> {
        let relative = self.layout.version >= 8;
        let step = if relative {
            (self.index as u64).wrapping_mul(self.size as u64)
        } else {
            0
        };
        let raw: i64 = if self.layout.is_64 {
            ptr.wrapping_sub(delta.wrapping_sub(step)) as i64
        } else {
            // Pointer-sized arithmetic of the 32-bit program that wrote it.
            (ptr as u32).wrapping_sub((delta as u32).wrapping_sub(step as u32)) as i32 as i64
        };
        let offset = u64::try_from(raw).ok()?;
        Some(if relative { offset } else { offset / 8 * 8 })
    }
}

fn read_counters(
    ctx: &RecordContext<'_>,
    counters: Section<'_>,
    counter_ptr: u64,
    counter_ptr_at: u64,
    num_counters: u32,
    num_counters_at: u64,
    out: &mut Vec<u64>,
) -> Result<Range<usize>> {
    let layout = ctx.layout;
    if num_counters == 0 {
        return Err(ctx.error(num_counters_at, "number of counters is zero"));
    }
    let width: u64 = if layout.variant.byte_coverage { 1 } else { 8 };
    let section_len = counters.bytes.len() as u64;
    let offset = ctx
        .section_offset(counter_ptr, layout.counters_delta)
        .ok_or_else(|| ctx.error(counter_ptr_at, "counter offset is negative"))?;
    if offset >= section_len {
        return Err(ctx.error(
            counter_ptr_at,
            format!("counter offset {offset} is outside the {section_len}-byte counters section"),
        ));
    }
    let max = (section_len - offset) / width;
    if u64::from(num_counters) > max {
        return Err(ctx.error(
            num_counters_at,
            format!("{num_counters} counters from offset {offset} run past the counters section (room for {max})"),
        ));
    }
    // Both fit the section, so they fit usize.
    let start = offset as usize;
    let len = (u64::from(num_counters) * width) as usize;
    let slots = counters.bytes.get(start..start + len).unwrap_or(&[]);
    if layout.variant.temporal && slots.len() < 8 {
        return Err(ctx.error(
            num_counters_at,
            "too few counter bytes for the temporal timestamp",
        ));
    }
    push_counter_values(layout, slots, counters.base + offset, ctx.index, out)?;
    Ok(start..start + len)
}

/// The values of one record's counters from their bytes (`slots`, found at
/// `base` of the input; `index` is the record's, for messages).
pub(crate) fn counter_values(layout: &RecordLayout, slots: &[u8], base: u64, index: usize) -> Result<Vec<u64>> {
    let mut values = Vec::new();
    push_counter_values(layout, slots, base, index, &mut values)?;
    Ok(values)
}

/// As [`counter_values`], appending to `values`.
pub(crate) fn push_counter_values(
    layout: &RecordLayout,
    slots: &[u8],
    base: u64,
    index: usize,
    values: &mut Vec<u64>,
) -> Result<()> {
    let width: u64 = if layout.variant.byte_coverage { 1 } else { 8 };
    let mut cur = Bytes::new(slots, base, layout.endian, "raw profile counters");
    if layout.variant.temporal {
        // The first slot is a u64 timestamp, also in byte-coverage mode.
        cur.skip(8)?;
    }
    values.reserve(cur.remaining() / width as usize);
    while !cur.is_empty() {
        if layout.variant.byte_coverage {
            // A cleared byte (0) means the block ran; the reset value is 0xff.
            values.push(u64::from(cur.u8()? == 0));
        } else {
            let at = cur.offset();
            let value = cur.u64()?;
            if value > MAX_COUNTER_VALUE {
                return Err(counter_too_large(at, value, index));
            }
            values.push(value);
        }
    }
    Ok(())
}

#[cold]
fn counter_too_large(at: u64, value: u64, index: usize) -> Error {
    Error::malformed(
        "raw profile counters",
        at,
        format!(
            "counter value {value} of record {index} exceeds 2^56; llvm-profdata refuses the \
             profile as corrupted"
        ),
    )
}

fn read_bitmap<'a>(
    ctx: &RecordContext<'_>,
    bitmap: Section<'a>,
    bitmap_ptr: u64,
    bitmap_ptr_at: u64,
    num_bytes: u32,
) -> Result<&'a [u8]> {
    let section_len = bitmap.bytes.len() as u64;
    let offset = ctx
        .section_offset(bitmap_ptr, ctx.layout.bitmap_delta)
        .ok_or_else(|| ctx.error(bitmap_ptr_at, "bitmap offset is negative"))?;
    if offset >= section_len {
        return Err(ctx.error(
            bitmap_ptr_at,
            format!("bitmap offset {offset} is outside the {section_len}-byte bitmap section"),
        ));
    }
    if u64::from(num_bytes) > section_len - offset {
        return Err(ctx.error(
            bitmap_ptr_at,
            format!("{num_bytes} bitmap bytes from offset {offset} run past the bitmap section"),
        ));
    }
    let start = offset as usize;
    Ok(bitmap.bytes.get(start..start + num_bytes as usize).unwrap_or(&[]))
}

/// Reads every profile in `data` (several may be concatenated).
pub(crate) fn read_all(data: &[u8], names_cache: &mut NamesCache) -> Result<Vec<RawProfile>> {
    let mut profiles = Vec::new();
    for_each_profile(data, names_cache, &mut Records::default(), |meta, records| {
        profiles.push(RawProfile {
            version: meta.version,
            variant: meta.variant,
            byte_coverage: meta.variant.byte_coverage,
            binary_ids: meta.binary_ids,
            records: records.to_function_counters().collect(),
            names: meta.names.names().clone(),
        });
        Ok(())
    })?;
    Ok(profiles)
}

/// A raw profile as read, but for its records, which are in a [`Records`].
pub(crate) struct ProfileMeta {
    pub version: u32,
    pub variant: Variant,
    pub binary_ids: Vec<Vec<u8>>,
    pub names: Arc<NameTable>,
}

/// Reads the profiles in `data` one after the other, each into `records`,
/// and hands each to `f` once it has been read and checked whole.
pub(crate) fn for_each_profile(
    data: &[u8],
    names_cache: &mut NamesCache,
    records: &mut Records,
    mut f: impl FnMut(ProfileMeta, &Records) -> Result<()>,
) -> Result<()> {
    if data.is_empty() {
        // llvm-profdata skips empty raw profiles silently.
        return Ok(());
    }
    let (is_64, endian) = detect(data)?;
    let first_magic = data.get(..8).unwrap_or(&[]);
    let mut pos = 0usize;
    loop {
        let (meta, end) = read_one(data, pos, is_64, endian, names_cache, records)?;
        f(meta, records)?;
        pos = end;
        while data.get(pos) == Some(&0) {
            pos += 1;
        }
        if pos == data.len() {
            return Ok(());
        }
        let at = pos as u64;
        if pos % 8 != 0 {
            return Err(Error::malformed(
                "raw profile",
                at,
                "data after the end of a profile is neither zero padding nor an 8-aligned profile",
            ));
        }
        if data.get(pos..pos + 8) != Some(first_magic) {
            return Err(Error::malformed(
                "raw profile header",
                at,
                "data after the end of a profile does not start with the magic of the first profile",
            ));
        }
    }
}

/// Pointer width and byte order from the magic at the start of `data`.
fn detect(data: &[u8]) -> Result<(bool, Endian)> {
    let Some(first) = data.get(..8) else {
        return Err(Error::malformed(
            "raw profile header",
            0,
            format!("{} bytes is too short for a raw profile magic", data.len()),
        ));
    };
    let mut word = [0u8; 8];
    word.copy_from_slice(first);
    let le = u64::from_le_bytes(word);
    let be = u64::from_be_bytes(word);
    match (le, be) {
        (MAGIC_64, _) => Ok((true, Endian::Little)),
        (_, MAGIC_64) => Ok((true, Endian::Big)),
        (MAGIC_32, _) => Ok((false, Endian::Little)),
        (_, MAGIC_32) => Ok((false, Endian::Big)),
        (INDEXED_MAGIC, _) => Err(Error::malformed(
            "raw profile header",
            0,
            "this is an indexed profile (.profdata), not a raw profile (.profraw)",
        )),
        _ if first
            .iter()
            .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace()) =>
        {
            Err(Error::malformed(
                "raw profile header",
                0,
                "this is text (a text profile?), not a raw profile (.profraw)",
            ))
        }
        _ => Err(Error::malformed(
            "raw profile header",
            0,
            format!("bad magic {le:#018x}: not a raw LLVM profile"),
        )),
    }
}

/// Header fields, widened to u64, with absent ones zero.
#[derive(Default)]
struct Header {
    binary_ids_size: u64,
    num_data: u64,
    padding_before_counters: u64,
    num_counters: u64,
    padding_after_counters: u64,
    num_bitmap_bytes: u64,
    padding_after_bitmap: u64,
    names_size: u64,
    counters_delta: u64,
    bitmap_delta: u64,
    num_vtables: u64,
    vnames_size: u64,
}

/// Reads the profile starting at `start`; returns it and where it ends.
fn read_one(
    data: &[u8],
    start: usize,
    is_64: bool,
    endian: Endian,
    names_cache: &mut NamesCache,
    records: &mut Records,
) -> Result<(ProfileMeta, usize)> {
    let rest = data.get(start..).unwrap_or(&[]);
    let mut cur = Bytes::new(rest, start as u64, endian, "raw profile header");
    let _magic = cur.u64()?;
    let version_at = cur.offset();
    let version_word = cur.u64()?;
    let version = version_word as u32;
    supported_version(version)?;
    let variant = Variant::from_version_word(version_word)
        .map_err(|e| e.context(&format!("raw profile header at offset {version_at:#x}")))?;
    let needed = header_size(version) - 16;
    if cur.remaining() < needed {
        return Err(cur.error(format!(
            "truncated: a version {version} header needs {} bytes, {} remain",
            header_size(version),
            cur.remaining() + 16
        )));
    }
    let mut h = Header::default();
    if version >= 7 {
        h.binary_ids_size = cur.u64()?;
    }
    h.num_data = cur.u64()?;
    h.padding_before_counters = cur.u64()?;
    h.num_counters = cur.u64()?;
    h.padding_after_counters = cur.u64()?;
    if version >= 9 {
        h.num_bitmap_bytes = cur.u64()?;
        h.padding_after_bitmap = cur.u64()?;
    }
    h.names_size = cur.u64()?;
    h.counters_delta = cur.u64()?;
    if version >= 9 {
        h.bitmap_delta = cur.u64()?;
    }
    let _names_delta = cur.u64()?;
    if version >= 10 {
        h.num_vtables = cur.u64()?;
        h.vnames_size = cur.u64()?;
    }
    let _value_kind_last = cur.u64()?;

    if h.binary_ids_size % 8 != 0 {
        return Err(Error::malformed(
            "raw profile header",
            start as u64 + 16,
            format!(
                "binary ids size {} is not a multiple of 8",
                h.binary_ids_size
            ),
        ));
    }
    let ids = take_section(&mut cur, h.binary_ids_size, 1, "raw profile binary ids")?;
    let binary_ids = read_binary_ids(ids, endian)?;

    let record = record_size(version, is_64) as u64;
    let data_records = take_section(&mut cur, h.num_data, record, "raw profile data records")?;
    skip_section(
        &mut cur,
        h.padding_before_counters,
        "raw profile padding before counters",
    )?;
    let width = if variant.byte_coverage { 1 } else { 8 };
    let counters = take_section(&mut cur, h.num_counters, width, "raw profile counters")?;
    skip_section(
        &mut cur,
        h.padding_after_counters,
        "raw profile padding after counters",
    )?;
    let bitmap = take_section(&mut cur, h.num_bitmap_bytes, 1, "raw profile bitmap")?;
    skip_section(
        &mut cur,
        h.padding_after_bitmap,
        "raw profile padding after bitmap",
    )?;
    let names = take_section(&mut cur, h.names_size, 1, "raw profile names")?;
    skip_section(
        &mut cur,
        padding(h.names_size),
        "raw profile padding after names",
    )?;
    // Version 10 vtable records (VTableNameHash u64, VTablePointer, VTableSize
    // u32, rounded up to 8) and vtable names: only used for value profiling.
    let vtable_size = if is_64 { 24 } else { 16 };
    let vtables = take_section(
        &mut cur,
        h.num_vtables,
        vtable_size,
        "raw profile vtable records",
    )?;
    skip_section(
        &mut cur,
        padding(vtables.bytes.len() as u64),
        "raw profile padding after vtables",
    )?;
    let vnames = take_section(&mut cur, h.vnames_size, 1, "raw profile vtable names")?;
    skip_section(
        &mut cur,
        padding(h.vnames_size),
        "raw profile padding after vtable names",
    )?;

    let names = names_cache.decode(names.bytes, names.base)?;
    // llvm-profdata decodes the vtable names too, and refuses bad ones.
    decode_names_at(vnames.bytes, vnames.base, "raw profile vtable names")?;

    let layout = RecordLayout {
        version,
        variant,
        is_64,
        endian,
        counters_delta: h.counters_delta,
        bitmap_delta: h.bitmap_delta,
    };
    decode_records_in(&layout, data_records, counters, bitmap, records)?;

    // Value-profile blobs follow, one per record that has value sites.
    let mut value_pos = start + cur.position();
    for r in &records.list {
        if r.has_value_data {
            value_pos += value_data_size(data, value_pos, endian, value_kinds(version))?;
        }
    }
    Ok((ProfileMeta { version, variant, binary_ids, names }, value_pos))
}

/// Takes `count` items of `width` bytes as a section.
fn take_section<'a>(
    cur: &mut Bytes<'a>,
    count: u64,
    width: u64,
    what: &'static str,
) -> Result<Section<'a>> {
    let base = cur.offset();
    let len = count
        .checked_mul(width)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= cur.remaining())
        .ok_or_else(|| {
            Error::malformed(
                what,
                base,
                format!(
                    "{count} x {width} bytes (from the header) exceed the {} bytes that remain",
                    cur.remaining()
                ),
            )
        })?;
    let bytes = cur.take(len)?;
    Ok(Section { bytes, base })
}

fn skip_section(cur: &mut Bytes<'_>, len: u64, what: &'static str) -> Result<()> {
    take_section(cur, len, 1, what).map(|_| ())
}

/// Binary ids: each a u64 length (in the profile's byte order), that many
/// bytes, then zero padding to a multiple of 8.
fn read_binary_ids(ids: Section<'_>, endian: Endian) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut cur = Bytes::new(ids.bytes, ids.base, endian, "raw profile binary id");
    while !cur.is_empty() {
        let at = cur.offset();
        if cur.remaining() < 8 {
            return Err(cur.error("not enough data for a binary id length"));
        }
        let len = cur.u64()?;
        if len == 0 {
            return Err(Error::malformed(
                "raw profile binary id",
                at,
                "binary id length is 0",
            ));
        }
        let padded = len.checked_add(7).map(|n| n & !7);
        let fits = padded
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= cur.remaining());
        let Some(padded) = fits else {
            return Err(Error::malformed(
                "raw profile binary id",
                at,
                format!(
                    "binary id of {len} bytes exceeds the {} bytes that remain",
                    cur.remaining()
                ),
            ));
        };
        let bytes = cur.take(padded)?;
        out.push(bytes.get(..len as usize).unwrap_or(&[]).to_vec());
    }
    Ok(out)
}

/// Checks the value-profile blob at `pos` as llvm-profdata does
/// (`ValueProfData::getValueProfData` and `checkIntegrity`) and returns its
/// size. Layout: u32 TotalSize, u32 NumValueKinds, then per kind a record
/// { u32 Kind, u32 NumValueSites, u8 per site (values at that site), padded
/// to 8, then 16 bytes per value }.
fn value_data_size(data: &[u8], pos: usize, endian: Endian, kinds: usize) -> Result<usize> {
    const WHAT: &str = "raw profile value data";
    let rest = data.get(pos..).unwrap_or(&[]);
    let mut cur = Bytes::new(rest, pos as u64, endian, WHAT);
    if cur.remaining() < 8 {
        return Err(cur.error("truncated value profile data"));
    }
    let total = cur.u32()? as usize;
    let num_kinds = cur.u32()? as usize;
    if total > rest.len() {
        return Err(Error::malformed(
            WHAT,
            pos as u64,
            format!(
                "value data of {total} bytes exceeds the {} bytes that remain",
                rest.len()
            ),
        ));
    }
    if total < 8 || total % 8 != 0 {
        return Err(Error::malformed(
            WHAT,
            pos as u64,
            format!("value data size {total} is not a positive multiple of 8"),
        ));
    }
    if num_kinds > kinds {
        return Err(Error::malformed(
            WHAT,
            pos as u64 + 4,
            format!("{num_kinds} value kinds, at most {kinds} exist"),
        ));
    }
    let mut blob = Bytes::new(
        rest.get(8..total).unwrap_or(&[]),
        pos as u64 + 8,
        endian,
        WHAT,
    );
    for _ in 0..num_kinds {
        let at = blob.offset();
        let kind = blob.u32()?;
        if kind as usize >= kinds {
            return Err(Error::malformed(
                WHAT,
                at,
                format!("value kind {kind} is invalid"),
            ));
        }
        let sites = blob.u32()? as usize;
        if sites > blob.remaining() {
            return Err(blob.error(format!("{sites} value sites exceed the value data")));
        }
        let mut values = 0usize;
        for &n in blob.take(sites)? {
            values += usize::from(n);
        }
        blob.skip((8 + sites).next_multiple_of(8) - 8 - sites)?;
        let value_bytes = values.saturating_mul(16);
        if value_bytes > blob.remaining() {
            return Err(blob.error("value profile record runs past the value data size"));
        }
        blob.skip(value_bytes)?;
    }
    Ok(total)
}

/// The names section last decoded. The profiles of one binary carry the
/// same names, and inflating them again for every profile would be most of
/// the work of reading it.
#[derive(Debug, Default)]
pub(crate) struct NamesCache {
    pub table: Option<Arc<NameTable>>,
}

impl NamesCache {
    fn decode(&mut self, raw: &[u8], base: u64) -> Result<Arc<NameTable>> {
        if let Some(table) = self.table.as_ref().filter(|t| t.is_section(raw)) {
            return Ok(table.clone());
        }
        let table = Arc::new(NameTable::decode_at(raw, base, "raw profile names")?);
        self.table = Some(table.clone());
        Ok(table)
    }
}
