//! Function-name strings (`__llvm_prf_names` and the names section of a raw
//! profile) and the MD5-based `NameRef` that data and coverage records use to
//! refer to them.

use std::sync::{Arc, OnceLock};

use flate2::{Decompress, FlushDecompress, Status};
use md5::{Digest, Md5};
use rustc_hash::FxHashMap;

use crate::bytes::{Bytes, Endian};
use crate::error::{Error, Result};

/// Byte that separates names inside one chunk.
const NAME_SEPARATOR: u8 = 0x01;

/// The `NameRef` of a function name: the first 8 bytes of the MD5 digest of
/// the name, read as a little-endian integer (LLVM's
/// `IndexedInstrProf::ComputeHash`).
pub fn name_ref(name: &str) -> u64 {
    name_ref_bytes(name.as_bytes())
}

/// [`name_ref`] of arbitrary bytes: the low 64 bits (little-endian) of their
/// MD5 digest. The coverage mapping uses the same hash for its filenames
/// blobs (`FilenamesRef`).
pub fn name_ref_bytes(bytes: &[u8]) -> u64 {
    let digest = Md5::digest(bytes);
    let mut low = [0u8; 8];
    low.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(low)
}

/// Function names in order, kept one after the other in one string: a
/// names section has tens of thousands, which as many `String`s would
/// cost an allocation and its overhead each.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Names {
    text: String,
    /// Where each name ends in `text`.
    ends: Vec<usize>,
}

impl Names {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The `i`-th name.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..end)
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    fn push(&mut self, name: &str) {
        self.text.push_str(name);
        self.ends.push(self.text.len());
    }
}

impl<'a> FromIterator<&'a str> for Names {
    fn from_iter<I: IntoIterator<Item = &'a str>>(names: I) -> Self {
        let mut all = Names::default();
        for name in names {
            all.push(name);
        }
        all
    }
}

impl<const N: usize> PartialEq<[&str; N]> for Names {
    fn eq(&self, other: &[&str; N]) -> bool {
        self.iter().eq(other.iter().copied())
    }
}

/// The names of a names section and the `NameRef` of each.
///
/// A module's coverage mapping and its profiles carry the same names
/// section, and decoding it and hashing every name is a large part of
/// reading either: a table decoded for one can serve the other (see
/// [`is_section`](Self::is_section)).
#[derive(Debug)]
pub struct NameTable {
    /// The section the table was decoded from, when it was.
    section: Option<Vec<u8>>,
    /// Empty in a table of [`references_only`](Self::references_only).
    names: Arc<Names>,
    /// Index in `names` of each name reference, made at the first lookup:
    /// reading a profile does not always need it.
    by_ref: OnceLock<FxHashMap<u64, usize>>,
    /// In a table of [`references_only`](Self::references_only), instead:
    /// the references, sorted (a map of them is several times their size).
    refs: Vec<u64>,
}

impl NameTable {
    /// Decodes a names section (see [`decode_names`]).
    pub fn decode(section: &[u8]) -> Result<NameTable> {
        Self::decode_at(section, 0, "names section")
    }

    /// [`decode`](Self::decode) with error offsets relative to `base`.
    pub(crate) fn decode_at(section: &[u8], base: u64, what: &'static str) -> Result<NameTable> {
        let names = decode_names_at(section, base, what)?;
        Ok(NameTable { section: Some(section.to_vec()), names: Arc::new(names), by_ref: OnceLock::new(), refs: Vec::new() })
    }

    /// The table of names decoded elsewhere.
    pub fn from_names(names: Arc<Names>) -> NameTable {
        NameTable { section: None, names, by_ref: OnceLock::new(), refs: Vec::new() }
    }

    /// The same table without its names nor its section: what tells which
    /// name references are the section's, without the names themselves,
    /// most of the table's memory (a Rust service's section has tens of
    /// thousands, some hundred bytes each, of the standard library and its
    /// dependencies). A live agent keeps this for merging its modules'
    /// records once the names have named the coverage mapping.
    pub fn references_only(&self) -> NameTable {
        let mut refs: Vec<u64> = self.by_ref().keys().copied().collect();
        refs.sort_unstable();
        NameTable { section: None, names: Arc::default(), by_ref: OnceLock::new(), refs }
    }

    /// False for a table of [`references_only`](Self::references_only)
    /// (or of a section with no names): it finds no name.
    pub fn has_names(&self) -> bool {
        !self.names.is_empty()
    }

    /// The names, in section order (none in a table of
    /// [`references_only`](Self::references_only)).
    pub fn names(&self) -> &Arc<Names> {
        &self.names
    }

    /// Whether the table was decoded from exactly these section bytes.
    pub fn is_section(&self, section: &[u8]) -> bool {
        self.section.as_deref() == Some(section)
    }

    /// The index in [`names`](Self::names) of the name with this
    /// reference (the last one, should two names share it). In a table of
    /// [`references_only`](Self::references_only), whether it is one of
    /// the section's: an index among the references, not of a name.
    pub fn index_of(&self, name_ref: u64) -> Option<usize> {
        if !self.refs.is_empty() {
            return self.refs.binary_search(&name_ref).ok();
        }
        self.by_ref().get(&name_ref).copied()
    }

    fn by_ref(&self) -> &FxHashMap<u64, usize> {
        self.by_ref.get_or_init(|| {
            let refs = super::name_refs::name_refs(self.names.iter().map(str::as_bytes));
            refs.into_iter().enumerate().map(|(i, r)| (r, i)).collect()
        })
    }

    /// The name with this reference.
    pub fn get(&self, name_ref: u64) -> Option<&str> {
        self.index_of(name_ref).and_then(|i| self.names.get(i))
    }
}

/// Decodes a names section into its names, in order.
///
/// The section is a sequence of chunks, each: ULEB128 length of the names
/// text, ULEB128 length of its zlib-compressed form (0 when stored plain),
/// then the text (or its compressed form). The text is the names joined
/// with `0x01`. Zero bytes may follow a chunk (alignment padding). This is
/// what LLVM's `collectPGOFuncNameStrings` writes and `readAndDecodeStrings`
/// reads.
///
/// Like LLVM's symbol table, an empty name (e.g. a chunk of length 0, or
/// two adjacent separators) is an error, as is a compressed chunk that does
/// not inflate to exactly its declared length or more. Names must be UTF-8.
/// Offsets in errors are relative to the start of `bytes`.
pub fn decode_names(bytes: &[u8]) -> Result<Names> {
    decode_names_at(bytes, 0, "names section")
}

/// [`decode_names`] with error offsets relative to `base`.
pub(crate) fn decode_names_at(bytes: &[u8], base: u64, what: &'static str) -> Result<Names> {
    let mut names = Names::default();
    // LEB128 numbers have no byte order: the cursor's endianness is unused.
    let mut cur = Bytes::new(bytes, base, Endian::Little, what);
    // One inflater for every chunk: setting one up costs more than
    // inflating a typical chunk (one per compilation unit).
    let mut z: Option<Decompress> = None;
    while !cur.is_empty() {
        let chunk_start = cur.offset();
        let plain_len = cur.uleb()?;
        let compressed_len = cur.uleb()?;
        let text_offset = cur.offset();
        if compressed_len == 0 {
            let len = bounded(&cur, plain_len, "names text")?;
            let text = cur.take(len)?;
            split_names(text, text_offset, true, what, &mut names)?;
        } else {
            let len = bounded(&cur, compressed_len, "compressed names")?;
            let packed = cur.take(len)?;
            let z = match &mut z {
                Some(z) => {
                    z.reset(true);
                    z
                }
                None => z.insert(Decompress::new(true)),
            };
            let text = inflate(z, packed, plain_len).map_err(|detail| {
                Error::malformed(
                    what,
                    chunk_start,
                    format!("names chunk does not decompress: {detail}"),
                )
            })?;
            split_names(&text, text_offset, false, what, &mut names)?;
        }
        while bytes.get(cur.position()) == Some(&0) {
            cur.skip(1)?;
        }
    }
    names.text.shrink_to_fit();
    names.ends.shrink_to_fit();
    Ok(names)
}

fn bounded(cur: &Bytes<'_>, len: u64, what: &str) -> Result<usize> {
    match usize::try_from(len) {
        Ok(n) if n <= cur.remaining() => Ok(n),
        _ => Err(cur.error(format!(
            "{what} length {len} exceeds the {} bytes that remain",
            cur.remaining()
        ))),
    }
}

/// Splits `text` on the separator and checks every name. `text_offset` is
/// where the text starts in the input; when the text was decompressed
/// (`in_place` false) errors point at the chunk's text instead.
fn split_names(
    text: &[u8],
    text_offset: u64,
    in_place: bool,
    what: &'static str,
    names: &mut Names,
) -> Result<()> {
    // The separator is ASCII, so the names of a valid UTF-8 text are valid:
    // the text is checked at once, and only a bad one name by name, to
    // point at the bad name.
    let all = std::str::from_utf8(text).ok();
    let mut start = 0usize;
    let ends = memchr::memchr_iter(NAME_SEPARATOR, text).chain(std::iter::once(text.len()));
    for end in ends {
        let at = if in_place {
            text_offset + start as u64
        } else {
            text_offset
        };
        if start == end {
            return Err(Error::malformed(what, at, "empty function name"));
        }
        let name = match all {
            Some(all) => &all[start..end],
            None => std::str::from_utf8(&text[start..end])
                .map_err(|e| Error::malformed(what, at, format!("function name is not UTF-8: {e}")))?,
        };
        names.push(name);
        start = end + 1;
    }
    Ok(())
}

/// Inflates one zlib stream that must produce at most `declared` bytes (as
/// zlib's `uncompress` into a buffer of that size: more output is an error,
/// trailing input after the end of the stream is ignored), with `z` fresh
/// or reset. Output grows with what the stream really produces, never by the
/// declared length alone.
fn inflate(z: &mut Decompress, packed: &[u8], declared: u64) -> Result<Vec<u8>, String> {
    const STEP: usize = 64 * 1024;
    let mut out: Vec<u8> = Vec::new();
    loop {
        if out.len() == out.capacity() {
            // Room for one byte past the declared length, to detect excess.
            let room = declared.saturating_add(1).saturating_sub(out.len() as u64);
            if room == 0 {
                return Err(format!("produces more than the declared {declared} bytes"));
            }
            out.reserve(usize::try_from(room).map_or(STEP, |r| r.min(STEP)));
        }
        let consumed = usize::try_from(z.total_in()).map_err(|e| e.to_string())?;
        let input = packed.get(consumed..).unwrap_or(&[]);
        let before = (z.total_in(), z.total_out());
        let status = z
            .decompress_vec(input, &mut out, FlushDecompress::None)
            .map_err(|e| e.to_string())?;
        if out.len() as u64 > declared {
            return Err(format!("produces more than the declared {declared} bytes"));
        }
        match status {
            Status::StreamEnd => return Ok(out),
            Status::Ok | Status::BufError => {
                let progressed = (z.total_in(), z.total_out()) != before;
                if !progressed && out.len() < out.capacity() {
                    return Err("the zlib stream is truncated".into());
                }
            }
        }
    }
}
