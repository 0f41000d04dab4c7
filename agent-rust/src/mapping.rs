//! The coverage mapping: which source regions each function's counters stand for.
//!
//! An instrumented object carries it in three sections: `__llvm_covmap`
//! (one header and filename table per compilation unit), `__llvm_covfun`
//! (one record per function: its name and structural hash, and its regions)
//! and `__llvm_prf_names` (the function names the records refer to by MD5).
//! This module decodes them into [`CoverageMapping`], applying the same
//! de-duplication rules as LLVM's `BinaryCoverageReader`, so that the order
//! and set of functions match what `llvm-cov` loads. Versions 4 to 7 of the
//! format (clang 11 and later, every rustc with `-C instrument-coverage`)
//! are read; see `docs/formats.md`.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::bytes::{Bytes, Endian};
use crate::error::{Error, Result};
use crate::file_pattern::FilePattern;
use crate::profile::{self, NameTable, Names};

/// Stored version numbers are zero-based: 3 is LLVM's "Version4".
const FIRST_SUPPORTED_VERSION: u32 = 3;
const LAST_SUPPORTED_VERSION: u32 = 6;
/// From this stored version on, filename tables start with the compilation
/// directory and relative names are joined to it.
const VERSION6: u32 = 5;
/// No real source file is this long. Rejecting larger line numbers keeps a
/// forged region from making the line walk (one step per line) endless.
const MAX_LINE: u32 = 1 << 24;

/// One interned source file name. Equal names share one id, so filename
/// comparisons across functions are integer comparisons.
pub type FileName = u32;

/// The decoded coverage mapping of one or more objects.
#[derive(Debug, Default)]
pub struct CoverageMapping {
    /// Interned file names; `FileName` indexes this.
    pub files: Vec<String>,
    file_ids: FxHashMap<String, FileName>,
    /// Functions in the order llvm-cov loads them.
    pub functions: Vec<FunctionMapping>,
    /// The lists of files of the functions (see [`Self::filenames`]).
    file_lists: Vec<Box<[FileName]>>,
    /// The names tables the functions' names are in (see [`NameAt`]).
    names: Vec<Arc<Names>>,
    /// How many objects' function records were read.
    objects: u32,
    /// Set when functions are read without their regions (see
    /// [`without_regions`](Self::without_regions)).
    released: bool,
    /// Files whose functions are not read (see [`leaving_out`](Self::leaving_out)),
    /// and per file of `files`, whether they match.
    leave_out: Vec<FilePattern>,
    left_out: Vec<bool>,
}

/// One function's mapping record.
#[derive(Debug, Clone)]
pub struct FunctionMapping {
    /// Where its name is: see [`CoverageMapping::name`].
    pub(crate) name: NameAt,
    /// MD5-based reference the profile uses for this name.
    pub name_ref: u64,
    /// Structural hash; the profile's counters only apply when it matches.
    pub hash: u64,
    /// Its files (see [`CoverageMapping::filenames`]): a list in the
    /// mapping's, shared by the functions with the same files (most of a
    /// unit's have its file alone, or it and the headers of the same
    /// macros). A list each was a block of the allocator for every function
    /// of the program (200 KiB of redis's), and a shared one a pointer of
    /// 16 bytes in each.
    files: u32,
    /// Its expressions and regions, `None` while released (see
    /// [`CoverageMapping::release`]): boxed, a released function takes a
    /// word for them in the table of every function of the program, which
    /// stays from report to report (48 bytes a function, 144 with the
    /// three vectors inline; redis has 6290 functions).
    body: Option<Box<Body>>,
    /// Where its body was decoded from.
    pub stored: Stored,
}

/// A function's expressions and regions (with the MC/DC parameters of its
/// MC/DC regions), which follow its file ids in its record.
#[derive(Debug, Clone, Default)]
pub struct Body {
    pub expressions: Vec<Expression>,
    /// Regions in stored order: file id 0 first, then 1, ...
    pub regions: Vec<Region>,
    /// The MC/DC parameters of its MC/DC regions, in region order; empty
    /// unless built with `-fcoverage-mcdc` (kept apart so that a region
    /// stays small).
    pub mcdc: Vec<McdcParameters>,
    /// How many of the regions are branches, and the file id of the body
    /// (see [`main_file_id`]): found once, where every live dump counted
    /// its changed functions' regions three times to find them.
    branches: u32,
    main_file: Option<u32>,
}

impl Body {
    /// The body of a function of `num_files` files.
    pub fn new(expressions: Vec<Expression>, regions: Vec<Region>, mcdc: Vec<McdcParameters>, num_files: usize) -> Body {
        let branches = regions.iter().filter(|r| r.is_branch()).count() as u32;
        let main_file = main_file_id(num_files, &regions);
        Body { expressions, regions, mcdc, branches, main_file }
    }
}

/// What counting a function reads of its body: its expressions, and the
/// counter of each region that is neither a branch nor an MC/DC decision,
/// then the two of each branch, each in region order (the order of a
/// counted function's `regions` and `branches`). A live agent keeps these
/// of the functions that run from one dump to the next, not their decoded
/// regions: 4 bytes a region, where a decoded one, with its place and kind,
/// is 36.
#[derive(Debug, Clone)]
pub struct CountingBody {
    pub expressions: Box<[Expression]>,
    pub counters: Box<[Counter]>,
    /// How many of `counters` are the regions'.
    pub regions: u32,
    /// What llvm-cov reads of the regions to leave the function out: it
    /// has none, or it is a stub of one region of the constant zero (see
    /// `coverage::Tallies`).
    pub empty: bool,
    pub stub: bool,
}

impl CountingBody {
    /// The bytes it takes.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<CountingBody>()
            + std::mem::size_of_val(&*self.expressions)
            + std::mem::size_of_val(&*self.counters)
    }
}

impl FunctionMapping {
    pub fn expressions(&self) -> &[Expression] {
        self.body.as_ref().map_or(&[], |b| &b.expressions)
    }

    /// Its regions (none while released).
    pub fn regions(&self) -> &[Region] {
        self.body.as_ref().map_or(&[], |b| &b.regions)
    }

    pub fn mcdc(&self) -> &[McdcParameters] {
        self.body.as_ref().map_or(&[], |b| &b.mcdc)
    }

    /// How many of its regions are branches.
    pub fn branches(&self) -> usize {
        self.body.as_ref().map_or(0, |b| b.branches as usize)
    }

    /// The file id of its own body: the first one no expansion region
    /// expands to (none while released).
    pub fn main_file(&self) -> Option<u32> {
        self.body.as_ref().and_then(|b| b.main_file)
    }

    /// What counting it reads of its body (decoded: see
    /// [`CoverageMapping::restore`]).
    pub fn counting_body(&self) -> CountingBody {
        let regions = self.regions();
        let counted = || regions.iter().filter(|r| r.kind != RegionKind::McdcDecision);
        let branch_counters = counted().filter(|r| r.is_branch()).flat_map(|r| [r.count, r.false_count]);
        let counters: Box<[Counter]> = counted().filter(|r| !r.is_branch()).map(|r| r.count).chain(branch_counters).collect();
        CountingBody {
            expressions: self.expressions().into(),
            regions: counted().filter(|r| !r.is_branch()).count() as u32,
            counters,
            empty: regions.is_empty(),
            stub: self.is_stub() == Some(true),
        }
    }

    /// Whether it is a stub of one region of the constant zero, which
    /// llvm-cov loads only when the profile has no counts for it (`None`
    /// while released).
    pub fn is_stub(&self) -> Option<bool> {
        let regions = &self.body.as_ref()?.regions;
        Some(regions.len() == 1 && regions[0].count == Counter::ZERO)
    }

    /// A function of one file, decoded, for tests of what reads it.
    #[cfg(test)]
    pub(crate) fn decoded(body: Body) -> FunctionMapping {
        let (name, name_ref, hash, stored) = (NameAt::default(), 0, 0, Stored::default());
        FunctionMapping { name, name_ref, hash, files: 0, body: Some(Box::new(body)), stored }
    }

    #[cfg(test)]
    pub(crate) fn body_mut(&mut self) -> &mut Body {
        self.body.get_or_insert_with(Box::default)
    }
}

/// Where a function's name is: the `index`-th of the mapping's names table
/// `table`. A program has tens of thousands of long names; the tables the
/// names sections decode to hold them already.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NameAt {
    table: u32,
    index: u32,
}

/// Where a function's record is in its object's `__llvm_covfun`. A reader
/// that keeps the objects mapped can drop what it decoded from them (a
/// decoded mapping is several times the size of the section) and decode a
/// function again when it needs it: see [`CoverageMapping::release`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stored {
    /// The object, numbered in the order the mapping read them.
    pub object: u32,
    /// The record's mapping data: its offset in the section and its length.
    at: u32,
    len: u32,
}

/// A reference to a counter value, as mapping regions and expressions use:
/// see [`CounterRef`]. In 32 bits, what it refers to in the low two and
/// its index above them, much as LLVM encodes it (an expression's kind is
/// the expression's own): a region holds two, and the regions decoded stay
/// from dump to dump (an enum took twice the room).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Counter(u32);

/// What a [`Counter`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterRef {
    Zero,
    /// Index into the function's counters.
    Counter(u32),
    /// Index into the function's expressions.
    Expression(u32),
}

impl Counter {
    pub const ZERO: Counter = Counter(0);
    /// The largest index a reference holds.
    pub const MAX_INDEX: u32 = u32::MAX >> 2;

    /// Counter `index` of the function (at most [`Self::MAX_INDEX`]).
    // Named as its pair `expression` and as LLVM's `Counter::getCounter`.
    #[allow(clippy::self_named_constructors)]
    pub fn counter(index: u32) -> Counter {
        Counter(index.min(Self::MAX_INDEX) << 2 | 1)
    }

    /// Expression `index` of the function (at most [`Self::MAX_INDEX`]).
    pub fn expression(index: u32) -> Counter {
        Counter(index.min(Self::MAX_INDEX) << 2 | 2)
    }

    pub fn get(self) -> CounterRef {
        match self.0 & 3 {
            0 => CounterRef::Zero,
            1 => CounterRef::Counter(self.0 >> 2),
            _ => CounterRef::Expression(self.0 >> 2),
        }
    }
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpressionKind {
    Subtract,
    Add,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expression {
    pub kind: ExpressionKind,
    pub lhs: Counter,
    pub rhs: Counter,
}

/// Region kinds, in LLVM's numbering (the order matters when regions with
/// the same extent are combined: code before expansion before skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RegionKind {
    Code = 0,
    Expansion = 1,
    Skipped = 2,
    Gap = 3,
    Branch = 4,
    McdcDecision = 5,
    McdcBranch = 6,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub kind: RegionKind,
    pub count: Counter,
    /// The "false" counter of a branch region; `Zero` otherwise.
    pub false_count: Counter,
    pub file_id: u32,
    /// For expansion regions: the file id whose regions this expands to.
    pub expanded_file_id: u32,
    pub line_start: u32,
    pub column_start: u32,
    pub line_end: u32,
    pub column_end: u32,
}

impl Region {
    pub fn start(&self) -> (u32, u32) {
        (self.line_start, self.column_start)
    }

    pub fn end(&self) -> (u32, u32) {
        (self.line_end, self.column_end)
    }

    pub fn is_branch(&self) -> bool {
        matches!(self.kind, RegionKind::Branch | RegionKind::McdcBranch)
    }
}

/// The MC/DC parameters of one region (of kind `McdcDecision` or
/// `McdcBranch`): `region` indexes the function's regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McdcParameters {
    pub region: u32,
    pub kind: McdcKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McdcKind {
    /// A decision: where its test vectors' bits end in the function's
    /// bitmap (clang 19 on), and how many conditions it has.
    Decision { bitmap_index: u32, num_conditions: u16 },
    /// A condition: its id (0 is the decision's first) and the condition
    /// evaluated next when it is false and when it is true (`-1`: none, the
    /// decision is made).
    Branch { id: i16, next: [i16; 2] },
}

/// The list of files of function `f` among a mapping's `lists` (see
/// [`CoverageMapping::filenames`]): a free function, for where the
/// mapping's functions are borrowed apart from its lists.
fn list_of<'a>(lists: &'a [Box<[FileName]>], f: &FunctionMapping) -> &'a [FileName] {
    lists.get(f.files as usize).map_or(&[], |list| list)
}

/// Facts about an object file that go with its mapping.
#[derive(Debug, Clone, Default)]
pub struct ObjectInfo {
    /// The GNU build id, when the object has one.
    pub build_id: Option<Vec<u8>>,
}

impl CoverageMapping {
    pub fn new() -> Self {
        Self::default()
    }

    /// A mapping whose functions are read released (see
    /// [`release`](Self::release)): their regions are decoded by
    /// [`restore`](Self::restore) alone, so that a reader that needs a few
    /// at a time never holds them all.
    pub fn without_regions() -> Self {
        CoverageMapping { released: true, ..Self::default() }
    }

    /// A mapping that does not read the functions whose every file
    /// `ignore` matches (none when it is empty): reports leave them out
    /// (the standard library's, a dependency's, what LIVECOV_IGNORE
    /// matches), and they are most of a Rust service's mapping. Reading
    /// them all first would make a peak of memory that the process keeps.
    pub fn leaving_out(self, ignore: &[regex_lite::Regex]) -> Self {
        CoverageMapping { leave_out: ignore.iter().map(FilePattern::new).collect(), ..self }
    }

    /// Whether a function with these files is left out (see
    /// [`leaving_out`](Self::leaving_out)).
    fn is_left_out(&self, filenames: &[FileName]) -> bool {
        !self.leave_out.is_empty() && filenames.iter().all(|&f| self.left_out.get(f as usize) == Some(&true))
    }

    /// Per file (by `FileName`), whether it matches the patterns the
    /// mapping was read [`leaving_out`](Self::leaving_out), if they are
    /// `ignore`: each name was matched once, as it was interned.
    pub fn files_matching(&self, ignore: &[regex_lite::Regex]) -> Option<&[bool]> {
        let same = self.leave_out.iter().map(FilePattern::as_str).eq(ignore.iter().map(regex_lite::Regex::as_str));
        same.then_some(&self.left_out[..])
    }

    /// How many objects' function records were read.
    pub fn objects(&self) -> u32 {
        self.objects
    }

    /// The files of function `f` (one of this mapping's), indexed by a
    /// region's `file_id`.
    pub fn filenames(&self, f: &FunctionMapping) -> &[FileName] {
        list_of(&self.file_lists, f)
    }

    /// Keeps the functions some of whose files `keep` says to.
    pub fn retain_functions(&mut self, keep: impl Fn(&[FileName]) -> bool) {
        let lists = &self.file_lists;
        self.functions.retain(|f| keep(list_of(lists, f)));
    }

    /// The name of function `f` (one of this mapping's) as the compiler
    /// recorded it: mangled; C statics carry a `file:` prefix.
    pub fn name(&self, f: &FunctionMapping) -> &str {
        self.names.get(f.name.table as usize).and_then(|t| t.get(f.name.index as usize)).unwrap_or_default()
    }

    /// Keeps of the names tables only the names of the functions left (a
    /// reader that drops functions from `functions`, as a live agent drops
    /// those no report shows). The tables are whole names sections: a Rust
    /// program's has tens of thousands of names of the standard library and
    /// its dependencies, megabytes, for the hundreds of functions of its own.
    pub fn keep_names_of_functions(&mut self) {
        let names: Names = self.functions.iter().map(|f| self.name(f)).collect();
        for (index, f) in self.functions.iter_mut().enumerate() {
            // A mapping of 2^32 functions or more (a section of hundreds of
            // gigabytes) would show the last ones nameless, not fail.
            f.name = NameAt { table: 0, index: u32::try_from(index).unwrap_or(u32::MAX) };
        }
        self.names = vec![Arc::new(names)];
    }

    pub fn file_name(&self, id: FileName) -> &str {
        &self.files[id as usize]
    }

    fn intern(&mut self, name: String) -> FileName {
        if let Some(&id) = self.file_ids.get(&name) {
            return id;
        }
        let id = self.files.len() as FileName;
        self.left_out.push(self.leave_out.iter().any(|re| re.is_match(&name)));
        self.files.push(name.clone());
        self.file_ids.insert(name, id);
        id
    }

    /// Reads the coverage mapping of an ELF (or other `object`-supported)
    /// file image and appends its functions. Returns `Ok(None)` when the
    /// object carries no coverage mapping at all.
    pub fn add_object(&mut self, image: &[u8]) -> Result<Option<ObjectInfo>> {
        self.add_object_with_names(image, |section| NameTable::decode(section).map(Arc::new))
    }

    /// As [`add_object`](Self::add_object), with the table of the object's
    /// `__llvm_prf_names` from `names`, given the section's bytes (after the
    /// other sections' headers are read): the profiles of a binary carry the
    /// same section, and a caller that decoded it for them can hand that
    /// table over (see [`NameTable::is_section`]) instead of having it
    /// decoded again.
    pub fn add_object_with_names(
        &mut self,
        image: &[u8],
        names: impl FnOnce(&[u8]) -> Result<Arc<NameTable>>,
    ) -> Result<Option<ObjectInfo>> {
        use object::{Object, ObjectSection};

        let file = object::File::parse(image).map_err(|e| {
            Error::malformed("object file", 0, format!("not a readable object file: {e}"))
        })?;
        let endian = if file.is_little_endian() { Endian::Little } else { Endian::Big };
        let section = |name: &str| -> Result<Option<std::borrow::Cow<'_, [u8]>>> {
            match file.section_by_name(name) {
                None => Ok(None),
                Some(s) => s.uncompressed_data().map(Some).map_err(|e| {
                    Error::malformed(format!("section {name}"), 0, format!("cannot read: {e}"))
                }),
            }
        };
        let Some(covmap) = section("__llvm_covmap")? else {
            return Ok(None);
        };
        let covfun = section("__llvm_covfun")?.unwrap_or_default();
        let names_section = section("__llvm_prf_names")?.unwrap_or_default();
        let tables = self.read_covmap(&covmap, endian)?;
        // The names last: a reader that takes them from a profile read
        // meanwhile (as `livecov convert` does) gets them while the records
        // are decoded.
        let first = self.read_covfun(&covfun, &tables, endian)?;
        let names = names(&names_section).map_err(|e| e.context("section __llvm_prf_names"))?;
        self.name_functions(first, names.names(), |name_ref| names.index_of(name_ref))?;
        Ok(Some(ObjectInfo { build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec) }))
    }

    /// Where an object file's `__llvm_covfun` section is in `image`, for
    /// [`restore`](Self::restore); `None` when it has none or it is
    /// compressed.
    pub fn covfun_range(image: &[u8]) -> Option<std::ops::Range<usize>> {
        use object::{Object, ObjectSection};
        let file = object::File::parse(image).ok()?;
        let section = file.section_by_name("__llvm_covfun")?;
        let compressed = section.compressed_file_range().ok()?;
        if compressed.format != object::CompressionFormat::None {
            return None;
        }
        let (at, len) = section.file_range()?;
        let range = usize::try_from(at).ok()?..usize::try_from(at.checked_add(len)?).ok()?;
        image.get(range.clone()).map(|_| range)
    }

    /// Appends the functions of one object given as the contents of its
    /// `__llvm_covmap` and `__llvm_covfun` sections and the table of its
    /// `__llvm_prf_names`: what [`add_object`](Self::add_object) reads from
    /// the object file, for a reader that gets the sections alone (a
    /// collector fed by agents, see `crate::fleet`).
    pub fn add_module_sections(&mut self, covmap: &[u8], covfun: &[u8], names: &NameTable, endian: Endian) -> Result<()> {
        let tables = self.read_covmap(covmap, endian)?;
        let first = self.read_covfun(covfun, &tables, endian)?;
        self.name_functions(first, names.names(), |name_ref| names.index_of(name_ref))
    }

    /// Decodes `__llvm_covmap` and `__llvm_covfun` section contents.
    /// `names` maps a name reference to its function name.
    pub fn add_sections<S: BuildHasher>(
        &mut self,
        covmap: &[u8],
        covfun: &[u8],
        names: &HashMap<u64, String, S>,
        endian: Endian,
    ) -> Result<()> {
        let tables = self.read_covmap(covmap, endian)?;
        let first = self.read_covfun(covfun, &tables, endian)?;
        let entries: Vec<(u64, &str)> = names.iter().map(|(&name_ref, name)| (name_ref, name.as_str())).collect();
        let table: Names = entries.iter().map(|&(_, name)| name).collect();
        let index: FxHashMap<u64, usize> = entries.iter().enumerate().map(|(i, &(name_ref, _))| (name_ref, i)).collect();
        self.name_functions(first, &Arc::new(table), |name_ref| index.get(&name_ref).copied())
    }

    /// Gives the functions from `first` on their names, in `names`:
    /// `index_of` gives where a name reference's name is.
    fn name_functions(&mut self, first: usize, names: &Arc<Names>, index_of: impl Fn(u64) -> Option<usize>) -> Result<()> {
        let table = match self.names.iter().position(|t| Arc::ptr_eq(t, names)) {
            Some(known) => known,
            None => {
                self.names.push(names.clone());
                self.names.len() - 1
            }
        };
        let table = u32::try_from(table).map_err(|_| Error::Unsupported("more than 2^32 names tables in one mapping".into()))?;
        for f in &mut self.functions[first..] {
            let Some(index) = index_of(f.name_ref).and_then(|i| u32::try_from(i).ok()) else {
                return Err(Error::malformed(
                    "function record (__llvm_covfun)",
                    (f.stored.at as usize).saturating_sub(RECORD_HEADER) as u64,
                    format!("function name {:#018x} is not in __llvm_prf_names", f.name_ref),
                ));
            };
            f.name = NameAt { table, index };
        }
        Ok(())
    }

    /// Drops the expressions and regions of every function: most of a
    /// decoded mapping, and what only a report of the function needs.
    /// [`restore`](Self::restore) decodes them again.
    pub fn release(&mut self) {
        for f in &mut self.functions {
            f.body = None;
        }
    }

    /// [`release`](Self::release) for the `functions` given (indices).
    pub fn release_some(&mut self, functions: &[usize]) {
        for &i in functions {
            if let Some(f) = self.functions.get_mut(i) {
                f.body = None;
            }
        }
    }

    /// Decodes again the expressions and regions of the `functions` given
    /// (indices) that were released, from `covfun`, the `__llvm_covfun`
    /// section of an object (numbered as [`Stored::object`]).
    pub fn restore<'s>(&mut self, functions: &[usize], covfun: impl Fn(u32) -> Option<&'s [u8]>) -> Result<()> {
        for &i in functions {
            let Some(f) = self.functions.get_mut(i) else { continue };
            if !f.regions().is_empty() {
                continue;
            }
            let Stored { object, at, len } = f.stored;
            let (at, len) = (at as usize, len as usize);
            let section = covfun(object).ok_or_else(|| Error::Mismatch(format!("object {object} of the mapping is gone")))?;
            let Some(record) = section.get(at..at.saturating_add(len)) else {
                return Err(Error::malformed("function coverage mapping", at as u64, "beyond the end of __llvm_covfun"));
            };
            // LEB128 throughout: the byte order does not matter.
            let mut data = Bytes::new(record, at as u64, Endian::Little, "function coverage mapping");
            let num_files = data.uleb_len()?;
            for _ in 0..num_files {
                data.uleb()?;
            }
            if num_files != list_of(&self.file_lists, f).len() {
                return Err(data.error("the record changed since it was read"));
            }
            f.body = Some(Box::new(decode_body(&mut data, num_files)?));
        }
        Ok(())
    }

    /// Reads every compilation unit's header and filename table, keyed by the
    /// hash of the table's bytes (how function records refer to it).
    fn read_covmap(&mut self, covmap: &[u8], endian: Endian) -> Result<FilenameTables> {
        let mut tables = FilenameTables::default();
        let mut bytes = Bytes::new(covmap, 0, endian, "coverage mapping header (__llvm_covmap)");
        let mut version = None;
        let mut inflater = Inflater::default();
        while !bytes.is_empty() {
            let header_at = bytes.position();
            let _n_records = bytes.u32()?;
            let filenames_size = bytes.u32()?;
            let coverage_size = bytes.u32()?;
            let this_version = bytes.u32()?;
            check_version(this_version).map_err(|e| match e {
                Error::Unsupported(m) => Error::Unsupported(format!("{m} (header at offset {header_at:#x} of __llvm_covmap)")),
                other => other,
            })?;
            if *version.get_or_insert(this_version) != this_version {
                return Err(bytes.error_at(
                    header_at,
                    "compilation units of one object use different coverage mapping versions",
                ));
            }
            if coverage_size != 0 {
                return Err(bytes.error_at(header_at, "coverage size must be 0 from Version4 on"));
            }
            let mut table = bytes.split(filenames_size as usize, "coverage mapping filenames")?;
            let hash = profile::name_ref_bytes(table_bytes(covmap, &table));
            let filenames = read_filenames(&mut table, this_version, &mut inflater)?;
            let ids: Vec<FileName> = filenames.into_iter().map(|f| self.intern(f)).collect();
            tables.insert(hash, ids);
            bytes.align(8).or_else(|_| bytes.skip(bytes.remaining()))?;
        }
        Ok(tables)
    }

    /// Reads the function records, without their names; returns the index
    /// of the first function it added.
    fn read_covfun(&mut self, covfun: &[u8], tables: &FilenameTables, endian: Endian) -> Result<usize> {
        let first = self.functions.len();
        // Where each name reference's record is among this object's
        // functions: LLVM keeps the first record of a name, except that a
        // dummy record is replaced by a later real one.
        let records = count_records(covfun, endian);
        let mut by_name: FxHashMap<u64, (Slot, bool)> = FxHashMap::with_capacity_and_hasher(records, Default::default());
        // Grown by doubling, the functions of a large program would be
        // copied over and over into memory first touched for the copy.
        self.functions.reserve(records);
        let mut lists: FxHashMap<Box<[FileName]>, u32> = FxHashMap::default();
        let object = self.objects;
        self.objects += 1;
        let mut bytes = Bytes::new(covfun, 0, endian, "function record (__llvm_covfun)");
        while bytes.remaining() > 0 {
            let record_at = bytes.position();
            if bytes.remaining() < RECORD_HEADER && covfun[record_at..].iter().all(|&b| b == 0) {
                break; // Trailing alignment padding.
            }
            let name_ref = bytes.u64()?;
            let data_len = bytes.u32()?;
            let hash = bytes.u64()?;
            let filenames_ref = bytes.u64()?;
            let mut data = bytes.split(data_len as usize, "function coverage mapping")?;
            let at = u32::try_from(data.offset())
                .map_err(|_| Error::Unsupported("a __llvm_covfun section of 4 GiB or more".into()))?;
            let stored = Stored { object, at, len: data_len };
            bytes.align(8).or_else(|_| bytes.skip(bytes.remaining()))?;

            let filenames = match tables.get(filenames_ref) {
                Some(Some(ids)) => ids,
                // Two different tables with one hash: LLVM ignores both.
                Some(None) => continue,
                None => {
                    return Err(bytes.error_at(
                        record_at,
                        format!("no filename table with hash {filenames_ref:#018x} in __llvm_covmap"),
                    ))
                }
            };

            let is_dummy = hash == 0 && is_dummy_mapping(data.clone());
            let mut function = |mapping: DecodedFunction, file_lists: &mut Vec<Box<[FileName]>>| FunctionMapping {
                name: NameAt::default(),
                name_ref,
                hash,
                files: match lists.get(&mapping.filenames[..]) {
                    Some(&list) => list,
                    None => {
                        let list: Box<[FileName]> = mapping.filenames.into();
                        file_lists.push(list.clone());
                        lists.insert(list, file_lists.len() as u32 - 1);
                        file_lists.len() as u32 - 1
                    }
                },
                body: mapping.body.map(Box::new),
                stored,
            };
            match by_name.get(&name_ref) {
                None => {
                    let mapping = decode_function(&mut data, filenames, !self.released)?;
                    let at = self.functions.len();
                    if self.is_left_out(&mapping.filenames) {
                        by_name.insert(name_ref, (Slot::LeftOut { at }, is_dummy));
                    } else {
                        by_name.insert(name_ref, (Slot::Kept(at), is_dummy));
                        self.functions.push(function(mapping, &mut self.file_lists));
                    }
                }
                Some(&(slot, old_is_dummy)) => {
                    if is_dummy || !old_is_dummy {
                        continue;
                    }
                    let mapping = decode_function(&mut data, filenames, !self.released)?;
                    match slot {
                        Slot::Kept(index) => {
                            by_name.insert(name_ref, (Slot::Kept(index), false));
                            self.functions[index] = function(mapping, &mut self.file_lists);
                        }
                        Slot::LeftOut { .. } if self.is_left_out(&mapping.filenames) => {
                            by_name.insert(name_ref, (slot, false));
                        }
                        Slot::LeftOut { at } => {
                            // A left-out dummy record's real one has a file
                            // to report: it takes the dummy's place.
                            self.functions.insert(at, function(mapping, &mut self.file_lists));
                            for (s, _) in by_name.values_mut() {
                                match s {
                                    Slot::Kept(i) | Slot::LeftOut { at: i } if *i >= at => *i += 1,
                                    _ => {}
                                }
                            }
                            by_name.insert(name_ref, (Slot::Kept(at), false));
                        }
                    }
                }
            }
        }
        Ok(first)
    }
}

/// Where a name's record is among the functions being read.
#[derive(Clone, Copy)]
enum Slot {
    Kept(usize),
    /// Not read (see [`CoverageMapping::leaving_out`]); it would have been
    /// at this index.
    LeftOut { at: usize },
}

/// The bytes of a function record before its mapping data: name
/// reference, data length, hash, filename table reference.
const RECORD_HEADER: usize = 28;

/// How many function records `covfun` holds, from their headers alone: a
/// capacity to reserve, so a malformed section only ends the count (the
/// decoding reports it).
fn count_records(covfun: &[u8], endian: Endian) -> usize {
    let mut bytes = Bytes::new(covfun, 0, endian, "function record (__llvm_covfun)");
    let mut records = 0;
    while bytes.remaining() >= RECORD_HEADER {
        let Ok(data_len) = bytes.skip(8).and_then(|()| bytes.u32()) else { break };
        if bytes.skip(16).and_then(|()| bytes.skip(data_len as usize)).is_err() {
            break;
        }
        records += 1;
        if bytes.align(8).is_err() {
            break;
        }
    }
    records
}

/// The bytes a cursor covers, for hashing a filename table as stored.
fn table_bytes<'a>(covmap: &'a [u8], table: &Bytes<'a>) -> &'a [u8] {
    let start = table.offset() as usize;
    &covmap[start..start + table.remaining()]
}

fn check_version(stored: u32) -> Result<()> {
    if stored < FIRST_SUPPORTED_VERSION {
        return Err(Error::Unsupported(format!(
            "coverage mapping Version{} is too old: livecov reads Version4 to Version7 \
             (clang 11 or later, rustc with -C instrument-coverage); rebuild with a newer compiler",
            u64::from(stored) + 1
        )));
    }
    if stored > LAST_SUPPORTED_VERSION {
        return Err(Error::Unsupported(format!(
            "coverage mapping Version{} is newer than this livecov understands (Version4 to Version7); \
             upgrade livecov",
            u64::from(stored) + 1
        )));
    }
    Ok(())
}

/// Filename tables of an object, keyed by the hash function records use.
/// `None` marks a hash shared by two different tables.
#[derive(Default)]
struct FilenameTables {
    by_hash: FxHashMap<u64, Option<Vec<FileName>>>,
}

impl FilenameTables {
    fn insert(&mut self, hash: u64, ids: Vec<FileName>) {
        match self.by_hash.get_mut(&hash) {
            None => {
                self.by_hash.insert(hash, Some(ids));
            }
            Some(Some(existing)) if *existing == ids => {}
            Some(slot) => *slot = None,
        }
    }

    fn get(&self, hash: u64) -> Option<Option<&Vec<FileName>>> {
        self.by_hash.get(&hash).map(Option::as_ref)
    }
}

/// Decodes a filename table: count, then (possibly zlib-compressed) names.
fn read_filenames<'a>(bytes: &mut Bytes<'a>, version: u32, inflater: &mut Inflater<'a>) -> Result<Vec<String>> {
    let count = bytes.uleb()?;
    if count == 0 {
        return Err(bytes.error("filename table is empty"));
    }
    let uncompressed_len = bytes.uleb()?;
    let compressed_at = bytes.position();
    let compressed_len = bytes.uleb_len()?;
    if compressed_len == 0 {
        return read_filename_list(bytes, count, version);
    }
    let compressed = bytes.take(compressed_len)?;
    let plain = inflater
        .inflate(compressed, uncompressed_len)
        .map_err(|detail| bytes.error_at(compressed_at, format!("filename table: {detail}")))?;
    let mut inner = Bytes::new(&plain, 0, bytes.endian(), "decompressed filename table");
    read_filename_list(&mut inner, count, version)
}

fn read_filename_list(bytes: &mut Bytes<'_>, count: u64, version: u32) -> Result<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for i in 0..count {
        let len = bytes.uleb_len()?;
        let at = bytes.position();
        let raw = bytes.take(len)?;
        let name = std::str::from_utf8(raw)
            .map_err(|_| bytes.error_at(at, "file name is not UTF-8"))?
            .to_owned();
        if version >= VERSION6 && i > 0 && !name.starts_with('/') {
            let dir = &names[0];
            names.push(join_and_normalize(dir, &name));
        } else {
            names.push(name);
        }
    }
    Ok(names)
}

/// Inflates the zlib data of filename tables. One decoder serves every
/// table of an object: setting one up costs more than inflating a table
/// (there is one per compilation unit).
#[derive(Default)]
struct Inflater<'a> {
    decoder: Option<flate2::bufread::ZlibDecoder<&'a [u8]>>,
}

impl<'a> Inflater<'a> {
    /// Inflates `compressed`, whose uncompressed length the format states
    /// up front.
    fn inflate(&mut self, compressed: &'a [u8], expected_len: u64) -> Result<Vec<u8>, String> {
        use std::io::Read;
        let decoder = match &mut self.decoder {
            Some(decoder) => {
                decoder.reset(compressed);
                decoder
            }
            None => self.decoder.insert(flate2::bufread::ZlibDecoder::new(compressed)),
        };
        // Cap the allocation by what zlib can expand to (about 1032:1), so a
        // forged length cannot reserve gigabytes.
        let cap = (compressed.len() as u64).saturating_mul(1032).min(expected_len);
        let mut out = Vec::with_capacity(cap as usize);
        decoder
            .take(expected_len)
            .read_to_end(&mut out)
            .map_err(|e| format!("zlib data does not inflate: {e}"))?;
        if out.len() as u64 != expected_len {
            return Err(format!(
                "zlib data inflates to {} bytes, header says {expected_len}",
                out.len()
            ));
        }
        Ok(out)
    }
}

/// Joins a relative file name to the compilation directory and removes `.`
/// and `..` segments, as llvm-cov does for Version6 tables (so `SF:` paths
/// match its output byte for byte).
fn join_and_normalize(dir: &str, name: &str) -> String {
    let joined = if dir.is_empty() {
        name.to_owned()
    } else if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    };
    let absolute = joined.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => match parts.last() {
                Some(&last) if last != ".." => {
                    parts.pop();
                }
                _ if absolute => {}
                _ => parts.push(part),
            },
            _ => parts.push(part),
        }
    }
    let body = parts.join("/");
    if absolute {
        format!("/{body}")
    } else {
        body
    }
}

/// A record that only says "this function exists, never ran here": hash 0,
/// one file, no expressions, one region with a zero counter. LLVM replaces
/// such a record with a later real one of the same name.
fn is_dummy_mapping(mut data: Bytes<'_>) -> bool {
    let mut check = || -> Result<bool> {
        if data.uleb()? != 1 {
            return Ok(false);
        }
        data.uleb()?;
        if data.uleb()? != 0 {
            return Ok(false);
        }
        if data.uleb()? != 1 {
            return Ok(false);
        }
        Ok(data.uleb()? & 3 == 0)
    };
    check().unwrap_or(false)
}

struct DecodedFunction {
    filenames: Vec<FileName>,
    body: Option<Body>,
}

/// Decodes one function's mapping data: its file ids, expressions and
/// regions (all LEB128).
/// A function record; its expressions and regions left empty unless `body`.
fn decode_function(data: &mut Bytes<'_>, table: &[FileName], body: bool) -> Result<DecodedFunction> {
    let num_files = data.uleb_len()?;
    let mut filenames = Vec::with_capacity(num_files);
    for _ in 0..num_files {
        let at = data.position();
        let index = data.uleb()?;
        let id = usize::try_from(index).ok().and_then(|i| table.get(i)).ok_or_else(|| {
            data.error_at(at, format!("file index {index} is beyond the {} files of its table", table.len()))
        })?;
        filenames.push(*id);
    }
    let body = if body { Some(decode_body(data, num_files)?) } else { None };
    Ok(DecodedFunction { filenames, body })
}

fn decode_body(data: &mut Bytes<'_>, num_files: usize) -> Result<Body> {
    let num_expressions = data.uleb_len()?;
    // An expression's kind is given by the tag of the counters that refer
    // to it; until one does, LLVM treats it as a subtraction.
    let mut expressions = vec![
        Expression { kind: ExpressionKind::Subtract, lhs: Counter::ZERO, rhs: Counter::ZERO };
        num_expressions
    ];
    for i in 0..num_expressions {
        let lhs = read_counter(data, &mut expressions)?;
        let rhs = read_counter(data, &mut expressions)?;
        expressions[i].lhs = lhs;
        expressions[i].rhs = rhs;
    }

    let mut regions = Vec::new();
    let mut mcdc = Vec::new();
    for file_id in 0..num_files as u32 {
        read_regions(data, &mut expressions, file_id, num_files as u32, &mut regions, &mut mcdc)?;
    }
    propagate_expansion_counters(&mut regions, num_files);
    // The mapping of a large program holds hundreds of thousands of
    // regions: no slack.
    regions.shrink_to_fit();
    Ok(Body::new(expressions, regions, mcdc, num_files))
}

/// The file id of a function's own body: the first one no expansion
/// region expands to.
fn main_file_id(num_files: usize, regions: &[Region]) -> Option<u32> {
    let expansions = || regions.iter().filter(|r| r.kind == RegionKind::Expansion);
    if num_files <= 64 {
        // Most functions have a few files: a bit per file, no allocation.
        let expanded = expansions().fold(0u64, |bits, r| bits | 1u64.checked_shl(r.expanded_file_id).unwrap_or(0));
        let first = (!expanded).trailing_zeros() as usize;
        return (first < num_files).then_some(first as u32);
    }
    let mut expanded = vec![false; num_files];
    for r in expansions() {
        if let Some(slot) = expanded.get_mut(r.expanded_file_id as usize) {
            *slot = true;
        }
    }
    expanded.iter().position(|e| !e).map(|i| i as u32)
}

fn decode_counter(raw: u64, at: usize, data: &Bytes<'_>, expressions: &mut [Expression]) -> Result<Counter> {
    let index = raw >> 2;
    let index32 = u32::try_from(index)
        .ok()
        .filter(|&i| i <= Counter::MAX_INDEX)
        .ok_or_else(|| data.error_at(at, format!("counter index {index} is over {}", Counter::MAX_INDEX)))?;
    match raw & 3 {
        0 => Ok(Counter::ZERO),
        1 => Ok(Counter::counter(index32)),
        tag => {
            let Some(e) = expressions.get_mut(index32 as usize) else {
                return Err(data.error_at(
                    at,
                    format!("expression {index} does not exist (the function has {})", expressions.len()),
                ));
            };
            e.kind = if tag == 2 { ExpressionKind::Subtract } else { ExpressionKind::Add };
            Ok(Counter::expression(index32))
        }
    }
}

fn read_counter(data: &mut Bytes<'_>, expressions: &mut [Expression]) -> Result<Counter> {
    let at = data.position();
    let raw = data.uleb()?;
    decode_counter(raw, at, data, expressions)
}

fn read_regions(
    data: &mut Bytes<'_>,
    expressions: &mut [Expression],
    file_id: u32,
    num_files: u32,
    regions: &mut Vec<Region>,
    mcdc: &mut Vec<McdcParameters>,
) -> Result<()> {
    let num_regions = data.uleb_len()?;
    // (The count is at most the bytes that remain.) Grown by doubling
    // across the file ids, not to each one's end exactly: a C function that
    // expands tens of macros has as many, and its vector was moved for
    // each (a system call each, past the agent allocator's small blocks).
    // `decode_body` leaves no slack.
    regions.reserve(num_regions);
    let mut line_start = 0u32;
    for _ in 0..num_regions {
        let at = data.position();
        let header = data.uleb32()? as u64;
        let mut kind = RegionKind::Code;
        let mut count = Counter::ZERO;
        let mut false_count = Counter::ZERO;
        let mut expanded_file_id = 0;
        let mut mcdc_kind = None;
        if header & 3 != 0 {
            count = decode_counter(header, at, data, expressions)?;
        } else if header & 4 != 0 {
            kind = RegionKind::Expansion;
            expanded_file_id = (header >> 3) as u32;
            if expanded_file_id >= num_files {
                return Err(data.error_at(
                    at,
                    format!("expansion into file id {expanded_file_id}, but the function has {num_files}"),
                ));
            }
        } else {
            match header >> 3 {
                0 => {}
                2 => kind = RegionKind::Skipped,
                4 => {
                    kind = RegionKind::Branch;
                    count = read_counter(data, expressions)?;
                    false_count = read_counter(data, expressions)?;
                }
                5 => {
                    kind = RegionKind::McdcDecision;
                    let bitmap_index = data.uleb32()?;
                    let num_conditions = read_condition_id(data)? as u16;
                    mcdc_kind = Some(McdcKind::Decision { bitmap_index, num_conditions });
                }
                6 => {
                    kind = RegionKind::McdcBranch;
                    count = read_counter(data, expressions)?;
                    false_count = read_counter(data, expressions)?;
                    let id_at = data.position();
                    let id = read_condition_id(data)?;
                    if id == 0 {
                        return Err(data.error_at(id_at, "MC/DC condition id must not be zero"));
                    }
                    // Stored one-based, 0 for "none"; true's before false's.
                    let true_id = read_condition_id(data)?;
                    let false_id = read_condition_id(data)?;
                    let id0 = |v: u64| v as i16 - 1;
                    mcdc_kind = Some(McdcKind::Branch { id: id0(id), next: [id0(false_id), id0(true_id)] });
                }
                other => {
                    return Err(data.error_at(at, format!("unknown region kind {other}")));
                }
            }
        }

        let line_delta = data.uleb32()?;
        let column_at = data.position();
        let mut column_start = data.uleb32()?;
        let num_lines = data.uleb32()?;
        let mut column_end = data.uleb32()?;
        line_start = line_start
            .checked_add(line_delta)
            .ok_or_else(|| data.error_at(column_at, "line number overflows"))?;
        if column_end & (1 << 31) != 0 {
            kind = RegionKind::Gap;
            column_end &= !(1 << 31);
        }
        // Whole-line regions are stored as columns 0..0 to save bytes.
        if column_start == 0 && column_end == 0 {
            column_start = 1;
            column_end = u32::MAX;
        }
        let line_end = line_start
            .checked_add(num_lines)
            .ok_or_else(|| data.error_at(column_at, "line number overflows"))?;
        if line_end > MAX_LINE {
            return Err(data.error_at(
                column_at,
                format!("line {line_end} is beyond any real source file (at most {MAX_LINE} lines)"),
            ));
        }
        let region = Region {
            kind,
            count,
            false_count,
            file_id,
            expanded_file_id,
            line_start,
            column_start,
            line_end,
            column_end,
        };
        if region.start() > region.end() {
            return Err(data.error_at(
                at,
                format!(
                    "region ends ({line_end}:{column_end}) before it starts ({line_start}:{column_start})"
                ),
            ));
        }
        if let Some(kind) = mcdc_kind {
            // A region is at most a byte of the record: its index fits.
            mcdc.push(McdcParameters { region: regions.len() as u32, kind });
        }
        regions.push(region);
    }
    Ok(())
}

fn read_condition_id(data: &mut Bytes<'_>) -> Result<u64> {
    let at = data.position();
    let v = data.uleb()?;
    if v > i16::MAX as u64 {
        return Err(data.error_at(at, format!("MC/DC value {v} is out of range")));
    }
    Ok(v)
}

/// An expansion region counts as often as the first region of the file it
/// expands. Nested expansions need one pass per level, as in LLVM, which
/// makes as many passes as there are files; a pass that changes nothing
/// leaves the next one nothing to change, so the passes stop there (a
/// function of a macro-heavy C file has dozens of files, nested once).
fn propagate_expansion_counters(regions: &mut [Region], num_files: usize) {
    let mut pending: Vec<Option<usize>> = vec![None; num_files];
    for _pass in 1..num_files {
        for (i, r) in regions.iter().enumerate() {
            if r.kind == RegionKind::Expansion {
                pending[r.expanded_file_id as usize] = Some(i);
            }
        }
        let mut changed = false;
        for i in 0..regions.len() {
            let file = regions[i].file_id as usize;
            if let Some(expansion) = pending[file].take() {
                changed |= regions[expansion].count != regions[i].count;
                regions[expansion].count = regions[i].count;
            }
        }
        if !changed {
            break;
        }
        pending.fill(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_like_llvm() {
        assert_eq!(join_and_normalize("/src/app", "main.c"), "/src/app/main.c");
        assert_eq!(join_and_normalize("/src/app", "./x/../y.c"), "/src/app/y.c");
        assert_eq!(join_and_normalize("/src/app/", "../lib/z.rs"), "/src/lib/z.rs");
        assert_eq!(join_and_normalize("/", "../../a.c"), "/a.c");
        assert_eq!(join_and_normalize("", "a//b.c"), "a/b.c");
    }

    #[test]
    fn counter_references_are_packed_in_32_bits() {
        // The decoded regions of the functions that ran stay from dump to
        // dump: a region is 36 bytes, an expression 12 (44 and 20 with an
        // enum of a tag and an index).
        assert_eq!(std::mem::size_of::<Counter>(), 4);
        assert!(std::mem::size_of::<Region>() <= 36);
        assert!(std::mem::size_of::<Expression>() <= 12);
        assert_eq!(Counter::ZERO.get(), CounterRef::Zero);
        assert_eq!(Counter::counter(7).get(), CounterRef::Counter(7));
        let last = Counter::MAX_INDEX;
        assert_eq!(Counter::expression(last).get(), CounterRef::Expression(last));
        // An index past what a reference holds is an error, not cut.
        let data = Bytes::new(&[], 0, Endian::Little, "test");
        let zero = Counter::ZERO;
        let mut expressions = vec![Expression { kind: ExpressionKind::Add, lhs: zero, rhs: zero }];
        let raw = |index: u64, tag: u64| index << 2 | tag;
        let decoded = decode_counter(raw(u64::from(last), 1), 0, &data, &mut expressions).unwrap();
        assert_eq!(decoded, Counter::counter(last));
        let err = decode_counter(raw(u64::from(last) + 1, 1), 0, &data, &mut expressions).unwrap_err();
        assert!(err.to_string().contains("is over"), "{err}");
        assert_eq!(decode_counter(raw(0, 3), 0, &data, &mut expressions).unwrap().get(), CounterRef::Expression(0));
    }

    #[test]
    fn nested_expansions_take_the_count_of_what_they_expand() {
        let region = |file_id, kind, count, expanded_file_id| Region {
            kind,
            count,
            false_count: Counter::ZERO,
            file_id,
            expanded_file_id,
            line_start: 1,
            column_start: 1,
            line_end: 1,
            column_end: 2,
        };
        // File 0 expands file 1, whose first region expands file 2, whose
        // first region expands file 3: the outer ones are set in later
        // passes, after the inner ones.
        let mut regions = vec![
            region(0, RegionKind::Code, Counter::counter(0), 0),
            region(0, RegionKind::Expansion, Counter::ZERO, 1),
            region(1, RegionKind::Expansion, Counter::ZERO, 2),
            region(2, RegionKind::Expansion, Counter::ZERO, 3),
            region(3, RegionKind::Code, Counter::counter(7), 0),
            region(3, RegionKind::Code, Counter::counter(8), 0),
        ];
        propagate_expansion_counters(&mut regions, 5);
        let counts: Vec<Counter> = regions.iter().map(|r| r.count).collect();
        assert_eq!(counts[1..4], [Counter::counter(7); 3]);
    }

    #[test]
    fn versions_outside_the_range_are_refused() {
        assert!(check_version(2).unwrap_err().to_string().contains("too old"));
        assert!(check_version(7).unwrap_err().to_string().contains("upgrade livecov"));
        assert!(check_version(6).is_ok());
    }

    #[test]
    fn a_function_not_decoded_is_small() {
        // Every function of the program has one, from report to report.
        assert!(std::mem::size_of::<FunctionMapping>() <= 64, "{}", std::mem::size_of::<FunctionMapping>());
    }
}
