//! Exact fleet merge: what a collector needs to compute, over many
//! processes of one build, the LCOV that `llvm-cov export` prints over
//! their profiles merged by `llvm-profdata merge`, without the binary.
//!
//! An agent serves two documents, both gzip-compressed:
//!
//! - the *build mapping* (`GET /coverage?format=mapping`): per instrumented
//!   module, what never changes while it is loaded (the record layout, the
//!   data records, the names, the coverage mapping sections), and the
//!   agent's report options (ignored files, demangling, path rewrites), so
//!   that the collector writes the report the agent would. Its id, sent as
//!   `Livecov-Mapping`, is the MD5 of the uncompressed document: processes
//!   of one build, with the same modules loaded and the same options, have
//!   the same id, and a collector fetches the document once per id;
//! - the *counters* (`GET /coverage?format=counters`): per module, the
//!   counter section and MC/DC bitmap bytes since start or the last reset.
//!   Most counters of a replica are zero: compressed, this is a few KiB
//!   where a raw profile (names and data records included) is a MiB.
//!
//! Together they are a raw profile per module, split: [`BuildMapping::add`]
//! decodes the records from them with the same checks as a `.profraw`
//! file and merges them into [`Counters`] as llvm-profdata does.
//!
//! Layout of both documents (little-endian): an 8-byte magic, then fields;
//! a blob is a u64 length and that many bytes, a string a UTF-8 blob.
//!
//! - mapping: `LVCMAP01`, u8 demangle, u32 n + n ignore patterns (strings),
//!   u32 n + n path rewrites (two strings), u32 n + n modules: path
//!   (string), build id (blob), u64 version word, u8 64-bit, u8 big-endian,
//!   u64 counters delta, u64 bitmap delta, then blobs: data, names, covmap,
//!   covfun;
//! - counters: `LVCCNT01`, u32 n + n modules: counters (blob), bitmap (blob).

use std::io::{Read, Write};
use std::sync::Arc;

use md5::{Digest, Md5};
use rustc_hash::FxHashSet;
use regex_lite::Regex;

use crate::coverage::Coverage;
use crate::error::{Error, Result};
use crate::lcov;
use crate::mapping::CoverageMapping;
use crate::profile::{self, Counters, NameTable, RawProfile, RecordLayout};
use crate::Endian;

/// The name of build mapping `id`'s file in a coverage folder's
/// `reports/`, beside the counters files that name it: the gzip document
/// `?format=mapping` answers, written by the first process of the build
/// that writes its counters there, so that processes that all exited are
/// merged exactly too.
pub fn mapping_file_name(id: &str) -> String {
    format!("{id}.mapping")
}

const MAPPING_MAGIC: &[u8; 8] = b"LVCMAP01";
const COUNTERS_MAGIC: &[u8; 8] = b"LVCCNT01";

/// No real program has more instrumented modules (a bound on what a
/// forged document can make a collector allocate per module).
const MAX_MODULES: u32 = 1 << 16;

/// One instrumented module, as the agent sees it.
pub struct ModuleParts<'a> {
    pub path: &'a str,
    pub build_id: Option<&'a [u8]>,
    pub layout: &'a RecordLayout,
    /// `__llvm_prf_data`, as in memory.
    pub data: &'a [u8],
    /// `__llvm_prf_names`, raw.
    pub names: &'a [u8],
    /// The module's file, for its (not loaded) coverage mapping sections.
    pub object: &'a [u8],
}

/// The report options a build mapping carries.
pub struct ReportSettings<'a> {
    pub ignore: &'a [Regex],
    pub demangle: bool,
    pub path_map: &'a [(String, String)],
}

/// The uncompressed build mapping of `modules` and its id.
pub fn encode_mapping(modules: &[ModuleParts<'_>], settings: &ReportSettings<'_>) -> Result<(Vec<u8>, String)> {
    use object::{Object, ObjectSection};
    let mut out = MAPPING_MAGIC.to_vec();
    out.push(u8::from(settings.demangle));
    put_u32(&mut out, settings.ignore.len());
    for re in settings.ignore {
        put_blob(&mut out, re.as_str().as_bytes());
    }
    put_u32(&mut out, settings.path_map.len());
    for (from, to) in settings.path_map {
        put_blob(&mut out, from.as_bytes());
        put_blob(&mut out, to.as_bytes());
    }
    put_u32(&mut out, modules.len());
    for m in modules {
        let file = object::File::parse(m.object)
            .map_err(|e| Error::malformed(m.path, 0, format!("not a readable object file: {e}")))?;
        let section = |name: &str| -> Result<Vec<u8>> {
            match file.section_by_name(name) {
                None => Ok(Vec::new()),
                Some(s) => s
                    .uncompressed_data()
                    .map(|d| d.into_owned())
                    .map_err(|e| Error::malformed(format!("{}: section {name}", m.path), 0, format!("cannot read: {e}"))),
            }
        };
        put_blob(&mut out, m.path.as_bytes());
        put_blob(&mut out, m.build_id.unwrap_or(&[]));
        out.extend_from_slice(&(u64::from(m.layout.version) | m.layout.variant.to_flags()).to_le_bytes());
        out.push(u8::from(m.layout.is_64));
        out.push(u8::from(m.layout.endian == Endian::Big));
        out.extend_from_slice(&m.layout.counters_delta.to_le_bytes());
        out.extend_from_slice(&m.layout.bitmap_delta.to_le_bytes());
        put_blob(&mut out, &without_addresses(m.layout, m.data));
        put_blob(&mut out, m.names);
        put_blob(&mut out, &section("__llvm_covmap")?);
        put_blob(&mut out, &section("__llvm_covfun")?);
    }
    let id = mapping_id(&out);
    Ok((out, id))
}

/// The data records with their function and value-data addresses zeroed:
/// they differ from process to process (address space layout
/// randomisation) and mean nothing to a coverage report, so processes of
/// one build share one mapping. Counter and bitmap pointers are relative
/// from raw version 8 on; older (and 32-bit) records are left as they are,
/// and each process is a build of its own.
fn without_addresses(layout: &RecordLayout, data: &[u8]) -> Vec<u8> {
    let mut data = data.to_vec();
    let fields = match layout.version {
        8 => 24..40,
        9 | 10 => 32..48,
        _ => return data,
    };
    if !layout.is_64 {
        return data;
    }
    for record in data.chunks_exact_mut(layout.record_size()) {
        record[fields.clone()].fill(0);
    }
    data
}

/// The uncompressed counters document: per module, (counters, bitmap).
pub fn encode_counters<'a>(modules: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>) -> Vec<u8> {
    let mut out = COUNTERS_MAGIC.to_vec();
    put_u32(&mut out, modules.len());
    for (counters, bitmap) in modules {
        put_blob(&mut out, counters);
        put_blob(&mut out, bitmap);
    }
    out
}

/// The id of an uncompressed build mapping: its MD5, hex.
pub fn mapping_id(document: &[u8]) -> String {
    Md5::digest(document).iter().map(|b| format!("{b:02x}")).collect()
}

/// gzip, fast: counters are mostly zero and compress well at any level.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(bytes.len() / 16 + 64), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = e.write_all(bytes);
    e.finish().unwrap_or_default()
}

/// Decompresses `bytes` (gzip), refusing more than `max` bytes of output.
pub fn gunzip(what: &str, bytes: &[u8], max: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::malformed(what, 0, format!("not gzip data: {e}")))?;
    if out.len() > max {
        return Err(Error::malformed(what, 0, format!("larger than {max} bytes once decompressed")));
    }
    Ok(out)
}

/// A module of a build mapping: a raw profile without its counters.
struct ModuleTemplate {
    layout: RecordLayout,
    binary_ids: Vec<Vec<u8>>,
    data: Vec<u8>,
    names: Arc<NameTable>,
    /// `__llvm_prf_names` as the agent read it, for writing raw profiles.
    names_raw: Vec<u8>,
}

/// A decoded build mapping: turns counters of the build's processes into
/// merged counts and those into LCOV.
pub struct BuildMapping {
    id: String,
    mapping: CoverageMapping,
    modules: Vec<ModuleTemplate>,
    options: lcov::Options,
    path_map: Vec<(String, String)>,
    /// The modules' paths, for messages.
    paths: Vec<String>,
    /// The name references of the functions kept in `mapping`: the only
    /// records whose counters the report reads.
    reported: FxHashSet<u64>,
}

impl std::fmt::Debug for BuildMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildMapping").field("id", &self.id).field("modules", &self.paths).finish()
    }
}

impl BuildMapping {
    /// Decodes an uncompressed build mapping. Anything malformed is an
    /// error, never a panic: the document comes from another process.
    pub fn decode(document: &[u8]) -> Result<BuildMapping> {
        let mut r = Reader { bytes: document, at: 0, what: "build mapping" };
        if r.take(8)? != MAPPING_MAGIC {
            return Err(r.error(0, "not a livecov build mapping (bad magic)"));
        }
        let demangle = r.u8()? != 0;
        let mut ignore = Vec::new();
        for _ in 0..r.count(u32::MAX)? {
            let at = r.at;
            let pattern = r.string()?;
            ignore.push(Regex::new(pattern).map_err(|e| r.error(at, format!("ignore pattern {pattern:?}: {e}")))?);
        }
        let mut path_map = Vec::new();
        for _ in 0..r.count(u32::MAX)? {
            path_map.push((r.string()?.to_owned(), r.string()?.to_owned()));
        }
        let mut mapping = CoverageMapping::new();
        let mut modules = Vec::new();
        let mut paths = Vec::new();
        for _ in 0..r.count(MAX_MODULES)? {
            let at = r.at;
            let path = r.string()?.to_owned();
            let build_id = r.blob()?.to_vec();
            let version_word = r.u64()?;
            let is_64 = r.u8()? != 0;
            let endian = if r.u8()? != 0 { Endian::Big } else { Endian::Little };
            let (counters_delta, bitmap_delta) = (r.u64()?, r.u64()?);
            // Deltas are what `for_module` computes from addresses: with a
            // data address of 0 it gives them back as they are.
            let layout = RecordLayout::for_module(version_word, is_64, endian, 0, counters_delta, bitmap_delta)
                .map_err(|e| e.context(&format!("build mapping, module {path} at offset {at}")))?;
            let data = r.blob()?.to_vec();
            let names_raw = r.blob()?.to_vec();
            let names = Arc::new(NameTable::decode(&names_raw).map_err(|e| e.context(&format!("{path}: __llvm_prf_names")))?);
            let (covmap, covfun) = (r.blob()?, r.blob()?);
            mapping
                .add_module_sections(covmap, covfun, &names, endian)
                .map_err(|e| e.context(&format!("{path}: coverage mapping")))?;
            modules.push(ModuleTemplate {
                layout,
                binary_ids: if build_id.is_empty() { Vec::new() } else { vec![build_id] },
                data,
                names,
                names_raw,
            });
            paths.push(path);
        }
        if r.at != document.len() {
            return Err(r.error(r.at, "bytes after the last module"));
        }
        // Only functions with a file in the report are kept, as the agent
        // keeps them for its own: a Rust service's dependencies (filtered by
        // the ignore patterns) are most of its mapping, and neither their
        // regions nor their counters change a byte of the report.
        let ignored = crate::file_pattern::matching(&ignore, mapping.files.iter().map(String::as_str));
        mapping.retain_functions(|files| files.iter().any(|&file| !ignored[file as usize]));
        mapping.functions.shrink_to_fit();
        // By name, not by (name, hash): a record of a kept name with another
        // hash is a hash mismatch to the report, which is not the same as
        // no record at all.
        let reported = mapping.functions.iter().map(|f| f.name_ref).collect();
        let options = lcov::Options {
            ignore_filename_regex: ignore,
            no_demangle: !demangle,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            ..lcov::Options::default()
        };
        Ok(BuildMapping { id: mapping_id(document), mapping, modules, options, path_map, paths, reported })
    }

    /// The id (MD5 of the document), as `Livecov-Mapping`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Lines spanned by all regions together: what a report's line walk
    /// costs (a fuzzer bounds it).
    pub fn total_lines(&self) -> u64 {
        let regions = self.mapping.functions.iter().flat_map(|f| f.regions());
        regions.map(|r| u64::from(r.line_end.saturating_sub(r.line_start)) + 1).sum()
    }

    /// The paths of the build's instrumented modules.
    pub fn modules(&self) -> &[String] {
        &self.paths
    }

    /// Each module's (counters, bitmap) in an uncompressed counters
    /// document of a process of this build.
    fn blobs<'d>(&self, document: &'d [u8]) -> Result<Vec<(&'d [u8], &'d [u8])>> {
        let mut r = Reader { bytes: document, at: 0, what: "counters" };
        if r.take(8)? != COUNTERS_MAGIC {
            return Err(r.error(0, "not livecov counters (bad magic)"));
        }
        let n = r.count(MAX_MODULES)?;
        if n != self.modules.len() {
            return Err(r.error(8, format!("counters of {n} modules for a build of {}", self.modules.len())));
        }
        let blobs = (0..n).map(|_| Ok((r.blob()?, r.blob()?))).collect::<Result<Vec<_>>>()?;
        if r.at != document.len() {
            return Err(r.error(r.at, "bytes after the last module"));
        }
        Ok(blobs)
    }

    /// Decodes a process's counters (uncompressed) into a raw profile per
    /// module, with the checks of a `.profraw` file's reader.
    pub fn profiles(&self, document: &[u8]) -> Result<Vec<RawProfile>> {
        let blobs = self.blobs(document)?;
        let mut out = Vec::with_capacity(blobs.len());
        for ((m, path), (counters, bitmap)) in self.modules.iter().zip(&self.paths).zip(blobs) {
            let records = profile::decode_records(&m.layout, &m.data, counters, bitmap)
                .map_err(|e| e.context(&format!("counters of {path}")))?;
            out.push(RawProfile {
                version: m.layout.version,
                variant: m.layout.variant,
                byte_coverage: m.layout.variant.byte_coverage,
                binary_ids: m.binary_ids.clone(),
                records,
                names: m.names.names().clone(),
            });
        }
        Ok(out)
    }

    /// Merges a process's counters (uncompressed) into `into`, as
    /// llvm-profdata merges its raw profiles. Changes nothing on error.
    pub fn add(&self, into: &mut Counters, document: &[u8]) -> Result<()> {
        for mut p in self.profiles(document)? {
            p.records.retain(|r| self.reported.contains(&r.name_ref));
            into.add(p)?;
        }
        Ok(())
    }

    /// The counters of several processes of this build (uncompressed
    /// documents) as one document: each module's counters added element by
    /// element, saturating as llvm-profdata adds them, and its MC/DC bitmaps
    /// or-ed. The processes share every record, so this is what merging
    /// their profiles gives, and a collector above this one merges it as one
    /// process. `None` for a build with single-byte counters: a merged count
    /// (one per process that covered the region) does not fit in a byte.
    pub fn sum(&self, documents: &[&[u8]]) -> Result<Option<Vec<u8>>> {
        if self.modules.iter().any(|m| m.layout.variant.byte_coverage) {
            return Ok(None);
        }
        let mut sums: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for (i, document) in documents.iter().enumerate() {
            let blobs = self.blobs(document)?;
            if i == 0 {
                sums = blobs.iter().map(|(c, b)| (c.to_vec(), b.to_vec())).collect();
                continue;
            }
            for (((sum_c, sum_b), (c, b)), (m, path)) in sums.iter_mut().zip(&blobs).zip(self.modules.iter().zip(&self.paths)) {
                if sum_c.len() != c.len() || sum_b.len() != b.len() || c.len() % 8 != 0 {
                    return Err(Error::malformed(
                        "counters",
                        0,
                        format!("{path}: counter sections of different sizes ({} and {} bytes) in one build", sum_c.len(), c.len()),
                    ));
                }
                let big = m.layout.endian == Endian::Big;
                for (s, x) in sum_c.chunks_exact_mut(8).zip(c.chunks_exact(8)) {
                    let (a, b): ([u8; 8], [u8; 8]) = (s[..].try_into().unwrap_or_default(), x.try_into().unwrap_or_default());
                    let sum = if big {
                        u64::from_be_bytes(a).saturating_add(u64::from_be_bytes(b)).to_be_bytes()
                    } else {
                        u64::from_le_bytes(a).saturating_add(u64::from_le_bytes(b)).to_le_bytes()
                    };
                    s.copy_from_slice(&sum);
                }
                for (s, x) in sum_b.iter_mut().zip(*b) {
                    *s |= x;
                }
            }
        }
        Ok(Some(encode_counters(sums.iter().map(|(c, b)| (&c[..], &b[..])))))
    }

    /// The raw profile a process's counters stand for: what its
    /// `?format=profraw` would have been (64-bit little-endian modules of
    /// raw version 8 and later only, as there).
    pub fn profraw(&self, document: &[u8]) -> Result<Vec<u8>> {
        self.profiles(document)?;
        let mut out = Vec::new();
        for ((m, path), (counters, bitmap)) in self.modules.iter().zip(&self.paths).zip(self.blobs(document)?) {
            if !m.layout.is_64 || m.layout.endian != Endian::Little || m.layout.version < 8 {
                return Err(Error::Unsupported(format!(
                    "{path}: raw profile version {} modules are not written as profraw by livecov",
                    m.layout.version
                )));
            }
            let image = profile::ModuleImage {
                layout: &m.layout,
                binary_ids: &m.binary_ids,
                data: &m.data,
                counters,
                bitmap,
                names: &m.names_raw,
            };
            profile::write_raw_profile(&image, &mut out);
        }
        Ok(out)
    }

    /// The LCOV report of merged counters, as the build's agents write
    /// theirs (their ignore patterns, demangling and path rewrites), with
    /// `TN:test` when given.
    pub fn report(&self, counters: &Counters, test: Option<&str>) -> String {
        let options = lcov::Options { test_name: test.map(str::to_owned), ..self.options.clone() };
        let coverage = Coverage::for_lcov(&self.mapping, counters);
        lcov::map_paths(lcov::write(&coverage, &options), &self.path_map)
    }
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

fn put_blob(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Bounds-checked reads of a document.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn error(&self, at: usize, detail: impl Into<String>) -> Error {
        Error::malformed(self.what, at as u64, detail)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(self.error(self.at, format!("truncated: {n} more bytes expected, {} left", self.bytes.len() - self.at)));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    fn count(&mut self, max: u32) -> Result<usize> {
        let at = self.at;
        let b = self.take(4)?;
        let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if n > max {
            return Err(self.error(at, format!("{n} entries, more than {max}")));
        }
        Ok(n as usize)
    }

    fn blob(&mut self) -> Result<&'a [u8]> {
        let n = self.u64()?;
        self.take(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn string(&mut self) -> Result<&'a str> {
        let at = self.at;
        std::str::from_utf8(self.blob()?).map_err(|_| self.error(at, "a string that is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_documents_are_errors() {
        assert!(BuildMapping::decode(b"").is_err());
        assert!(BuildMapping::decode(b"LVCMAP01").err().unwrap().to_string().contains("truncated"));
        let mut doc = MAPPING_MAGIC.to_vec();
        doc.push(1);
        put_u32(&mut doc, 1);
        put_blob(&mut doc, b"(");
        assert!(BuildMapping::decode(&doc).err().unwrap().to_string().contains("ignore pattern"));
        let mut doc = MAPPING_MAGIC.to_vec();
        doc.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0]);
        doc.extend_from_slice(&0u32.to_le_bytes());
        let empty = BuildMapping::decode(&doc).expect("a mapping of no module");
        assert!(empty.add(&mut Counters::new(), &encode_counters([(&[1u8][..], &[][..])].into_iter())).is_err());
        assert!(empty.add(&mut Counters::new(), &encode_counters(std::iter::empty())).is_ok());
        assert!(empty.add(&mut Counters::new(), b"LVCCNT01\xff\xff\xff\xff").unwrap_err().to_string().contains("more than"));
        assert!(gunzip("x", &gzip(&[0; 100]), 99).unwrap_err().to_string().contains("larger than"));
        assert_eq!(gunzip("x", &gzip(b"abc"), 3).unwrap(), b"abc");
        assert!(gunzip("x", b"plain", 100).is_err());
    }
}
