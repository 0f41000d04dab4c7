//! The instrumented modules of this process, and their live counters.
//!
//! Every executable and shared object built with coverage carries its own
//! copy of the profile runtime and its own `__llvm_prf_*` sections. They are
//! found with `dl_iterate_phdr` (the module's load bias) and the section
//! headers of the module's file; no runtime symbol is needed, so this works
//! for any LLVM-instrumented module. What never changes (the data records,
//! the names, the coverage mapping) is read once per module; a snapshot only
//! copies the counters, with relaxed atomic loads because the program's
//! threads keep counting meanwhile.

use std::ffi::CStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, Ordering};

use crate::error::{Error, Result};
use crate::profile::{self, FunctionCounters, NameTable, RecordLayout};
use crate::Endian;

/// Where a loaded module is and what its file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleId {
    /// The file the module was loaded from (`/proc/self/exe` resolved for
    /// the executable).
    pub path: PathBuf,
    /// Load bias: run-time address minus link-time address.
    pub bias: usize,
}

/// An instrumented module: its static facts, read from its file once.
#[derive(Debug)]
pub struct Module {
    pub id: ModuleId,
    pub build_id: Option<Vec<u8>>,
    pub layout: RecordLayout,
    /// Run-time address and size of `__llvm_prf_cnts`.
    counters: (usize, usize),
    /// Run-time address and size of `__llvm_prf_bits` (empty before v9).
    bitmap: (usize, usize),
    /// Run-time address and size of `__llvm_prf_data`.
    data: (usize, usize),
    /// Where `__llvm_prf_data` is in the module's file, when its bytes
    /// there are those in memory: from version 8, its pointers are
    /// distances, fixed at link time (see [`Module::snapshot`]).
    data_in_file: Option<std::ops::Range<usize>>,
    /// The module's function names, decoded from its `__llvm_prf_names`
    /// (which raw profiles carry as it is), with their index by name
    /// reference: the coverage mapping and the merge of its counters share
    /// it, so that the names are decoded and hashed once. Once they have
    /// named the mapping, the engine keeps the table's
    /// [`references_only`](NameTable::references_only).
    pub names: std::sync::Arc<NameTable>,
}

/// Counter values of one module at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The counter section's bytes, as the program would write them.
    pub counters: Vec<u8>,
    pub bitmap: Vec<u8>,
    /// The data section's bytes (constant for version 8 and later).
    pub data: Vec<u8>,
}

/// Lists the modules loaded now, executable first, in load order.
pub fn loaded_modules() -> Vec<ModuleId> {
    let mut out: Vec<ModuleId> = Vec::new();
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        // Safety: dl_iterate_phdr passes a valid info for the call and our
        // own pointer back as `data`.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<ModuleId>)) };
        let name = if info.dlpi_name.is_null() {
            ""
        } else {
            // Safety: a NUL-terminated string owned by the dynamic loader.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_str().unwrap_or("")
        };
        let path = if out.is_empty() && name.is_empty() {
            executable_path()
        } else if name.is_empty() || name.starts_with("linux-vdso") {
            return 0;
        } else {
            PathBuf::from(name)
        };
        out.push(ModuleId { path, bias: info.dlpi_addr as usize });
        0
    }
    // Safety: the callback only reads what the loader hands it.
    unsafe {
        libc::dl_iterate_phdr(Some(visit), &mut out as *mut Vec<ModuleId> as *mut libc::c_void);
    }
    out
}

/// The executable's path (`/proc/self/exe` resolved), read once: a
/// process's executable changes only with `exec`, which starts it anew,
/// and after a `chroot` the link leads nowhere.
pub(crate) fn executable_path() -> PathBuf {
    static PATH: AtomicPtr<PathBuf> = AtomicPtr::new(std::ptr::null_mut());
    if let Some(path) = published(&PATH) {
        return path.clone();
    }
    match std::fs::read_link("/proc/self/exe") {
        Ok(path) => {
            let _ = publish(&PATH, path.clone());
            path
        }
        Err(_) => PathBuf::from("/proc/self/exe"),
    }
}

/// The modules loaded at the agent's start, in a process that starts as
/// root, each with its file kept open when it is instrumented (see
/// [`keep_module_files`]).
static KEPT_FILES: AtomicPtr<Vec<(PathBuf, Option<File>)>> = AtomicPtr::new(std::ptr::null_mut());

/// Keeps the files of the instrumented modules loaded now open, in a
/// process that runs as root: such a process may make another folder its
/// root (`chroot`, as daemons confine the workers they fork), out of which
/// the modules' paths, and `/proc`, lead nowhere, while a dump reads the
/// coverage mapping from those files. Forked children inherit them (they
/// are closed on `exec`).
pub fn keep_module_files() {
    // Safety: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 || published(&KEPT_FILES).is_some() {
        return;
    }
    let mut kept = Vec::new();
    for (i, id) in loaded_modules().into_iter().enumerate() {
        // std opens with O_CLOEXEC.
        let Ok(file) = File::open(open_path(&id, i == 0)).map(super::descriptors::moved_up) else { continue };
        // Safety: read-only private mapping of the module's own file.
        if unsafe { memmap2::Mmap::map(&file) }.is_ok_and(|image| counts(&image)) {
            super::descriptors::keep(file.as_raw_fd());
            kept.push((id.path, Some(file)));
        } else {
            kept.push((id.path, None));
        }
    }
    for (_, file) in publish(&KEPT_FILES, kept).into_iter().flatten() {
        if let Some(file) = file {
            super::descriptors::forget(file.as_raw_fd());
        }
    }
}

/// Where module `id`'s file is opened: `/proc/self/exe` for the executable
/// (the first module), which stays right when its path was replaced on
/// disk.
fn open_path(id: &ModuleId, is_main: bool) -> &Path {
    if is_main {
        Path::new("/proc/self/exe")
    } else {
        id.path.as_path()
    }
}

/// Module `id`'s file, mapped read-only: through the descriptor kept for
/// it (see [`keep_module_files`]), or opened now.
pub fn map_module(id: &ModuleId, is_main: bool) -> std::io::Result<memmap2::Mmap> {
    let kept = published(&KEPT_FILES).and_then(|kept| kept.iter().find_map(|(p, file)| file.as_ref().filter(|_| *p == id.path)));
    let file = match kept {
        Some(file) => file.try_clone()?,
        None => File::open(open_path(id, is_main))?,
    };
    // Safety: read-only private mapping of the module's own file.
    unsafe { memmap2::Mmap::map(&file) }
}

/// Whether the module at `path` was found without counters when its
/// files were kept (see [`keep_module_files`]): it need not be read
/// again, nor can it be after a `chroot`.
pub fn known_without_counters(path: &Path) -> bool {
    published(&KEPT_FILES).is_some_and(|kept| kept.iter().any(|(p, file)| file.is_none() && p == path))
}

/// Sets `slot` once, for the process's life; gives `value` back when it
/// was set already. Not a lock nor a `OnceLock`: a forked child of a
/// program whose thread held one at the fork would wait for it forever.
fn publish<T>(slot: &AtomicPtr<T>, value: T) -> Option<T> {
    let new = Box::into_raw(Box::new(value));
    match slot.compare_exchange(std::ptr::null_mut(), new, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => None,
        // Safety: ours, never shared.
        Err(_) => Some(*unsafe { Box::from_raw(new) }),
    }
}

fn published<T>(slot: &AtomicPtr<T>) -> Option<&'static T> {
    let value = slot.load(Ordering::Acquire);
    // Safety: set only by `publish`, leaked, never freed.
    (!value.is_null()).then(|| unsafe { &*value })
}

/// How many objects the dynamic loader has loaded and unloaded since the
/// program started (`dlpi_adds`, `dlpi_subs`): while neither moves, the
/// modules [`loaded_modules`] lists are the same, and it need not look
/// again (each time it reads the link `/proc/self/exe`, a path lookup in
/// procfs: 5% of a warm dump's work on mini-redis). `None` when the loader
/// does not count them.
pub fn load_events() -> Option<(u64, u64)> {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, size: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        // A loader older than the fields passes a smaller struct.
        if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + std::mem::size_of::<libc::c_ulonglong>() {
            // Safety: dl_iterate_phdr passes an info of `size` bytes valid
            // for the call, and our own pointer back as `data`.
            unsafe { *(data as *mut Option<(u64, u64)>) = Some(((*info).dlpi_adds, (*info).dlpi_subs)) };
        }
        // Every object tells the same counts: the first is enough.
        1
    }
    let mut out = None;
    // Safety: the callback only reads what the loader hands it.
    unsafe {
        libc::dl_iterate_phdr(Some(first), &mut out as *mut Option<(u64, u64)> as *mut libc::c_void);
    }
    out
}

/// Whether the module's file has a coverage counter section, from its
/// section headers only (nothing else of the file is read). The executable
/// (`is_main`) is read through `/proc/self/exe`.
pub fn has_counters(id: &ModuleId, is_main: bool) -> bool {
    map_module(id, is_main).is_ok_and(|image| counts(&image))
}

/// Whether a module's file has a coverage counter section.
fn counts(image: &[u8]) -> bool {
    use object::Object;
    object::File::parse(image).is_ok_and(|f| f.section_by_name("__llvm_prf_cnts").is_some())
}

/// The sections of an instrumented module, found in its file. `Ok(None)`
/// for a module without coverage counters (not instrumented).
pub fn open_module(id: &ModuleId, image: &[u8]) -> Result<Option<Module>> {
    use object::{Object, ObjectSection};

    let file = object::File::parse(image)
        .map_err(|e| Error::malformed(id.path.display().to_string(), 0, format!("not a readable object file: {e}")))?;
    let section = |name: &str| file.section_by_name(name);
    let Some(cnts) = section("__llvm_prf_cnts") else { return Ok(None) };
    let Some(data) = section("__llvm_prf_data") else { return Ok(None) };
    if section("__llvm_covmap").is_none() {
        // Counters without a mapping: the sections the program does not
        // load were removed (llvm-strip does that), or it was built for PGO.
        return Err(Error::Unsupported(format!(
            "{} has coverage counters but no coverage mapping (__llvm_covmap): it was stripped with \
             llvm-strip, or built without -fcoverage-mapping; keep the mapping (GNU strip, or \
             llvm-strip --strip-debug) or do not strip coverage builds",
            id.path.display()
        )));
    }
    let names_raw = names_in(&file);
    let bits = section("__llvm_prf_bits");
    let at = |address: u64| id.bias.wrapping_add(address as usize);
    let endian = if file.is_little_endian() { Endian::Little } else { Endian::Big };
    let is_64 = file.is_64();

    let data_address = at(data.address());
    let counters_address = at(cnts.address());
    let bitmap_address = bits.as_ref().map_or(0, |b| at(b.address()));
    let version_word = raw_version(&file, endian).unwrap_or_else(|| guess_version(&file));
    let layout = RecordLayout::for_module(
        version_word,
        is_64,
        endian,
        data_address as u64,
        counters_address as u64,
        bitmap_address as u64,
    )
    .map_err(|e| e.context(&id.path.display().to_string()))?;
    let names = NameTable::decode(&names_raw)
        .map_err(|e| e.context(&format!("{}: __llvm_prf_names", id.path.display())))?
        .into();
    Ok(Some(Module {
        id: id.clone(),
        build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
        layout,
        counters: (counters_address, cnts.size() as usize),
        bitmap: (bitmap_address, bits.map_or(0, |b| b.size() as usize)),
        data: (data_address, data.size() as usize),
        data_in_file: data
            .file_range()
            .filter(|&(_, len)| layout.version >= 8 && len == data.size())
            .and_then(|(at, len)| Some(usize::try_from(at).ok()?..usize::try_from(at.checked_add(len)?).ok()?)),
        names,
    }))
}

/// The `__llvm_prf_names` section of a module's file (`image`), as raw
/// profiles carry it: read again when one is written, rather than kept (a
/// Rust program's is hundreds of kilobytes, nearly all of it the names of
/// the standard library and dependencies).
pub fn names_section(image: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>> {
    let file = object::File::parse(image)
        .map_err(|e| Error::malformed("a module's file", 0, format!("not a readable object file: {e}")))?;
    Ok(names_in(&file))
}

fn names_in<'a>(file: &object::File<'a>) -> std::borrow::Cow<'a, [u8]> {
    use object::{Object, ObjectSection};
    file.section_by_name("__llvm_prf_names").and_then(|s| s.uncompressed_data().ok()).unwrap_or_default()
}

/// The module's `__llvm_profile_raw_version`, read from its file: the
/// symbol is hidden, but the static symbol table still names it unless the
/// module was stripped.
fn raw_version(file: &object::File<'_>, endian: Endian) -> Option<u64> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let symbol = file.symbols().find(|s| s.name() == Ok("__llvm_profile_raw_version"))?;
    let section = file.section_by_index(symbol.section_index()?).ok()?;
    let bytes = section.data_range(symbol.address(), 8).ok()??;
    let bytes: [u8; 8] = bytes.try_into().ok()?;
    Some(match endian {
        Endian::Little => u64::from_le_bytes(bytes),
        Endian::Big => u64::from_be_bytes(bytes),
    })
}

/// Without symbols, the coverage mapping version tells which LLVM built
/// the module, and so its raw profile version.
fn guess_version(file: &object::File<'_>) -> u64 {
    use object::{Object, ObjectSection};
    let mapping_version = file
        .section_by_name("__llvm_covmap")
        .and_then(|s| s.data().ok().and_then(|d| d.get(12..16).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))));
    match mapping_version {
        Some(v) if v >= 6 => 10,
        Some(5) => 8,
        _ => 5,
    }
}

/// Where [`Module::snapshot`] reads the data section from.
pub enum DataFrom<'a> {
    /// Nowhere: the counters alone are wanted (a reset, `format=counters`).
    Nowhere,
    /// The module's file, mapped: when its bytes there are those in memory
    /// (see `data_in_file`), else memory. The program itself reads its data
    /// section only to write its profile at exit: read in memory, the
    /// section's pages (64 bytes a function: 282 KiB of redis's) would stay
    /// resident in the program for good, where those of a mapping of the
    /// file go with it.
    File(&'a [u8]),
    /// Memory, as the program has it: a raw profile carries it so.
    Memory,
}

impl Module {
    /// Copies the counters (and bitmap) now, and the data section (see
    /// [`DataFrom`]).
    ///
    /// Safety: the module must stay loaded while this runs (the caller pins
    /// shared objects with `dlopen(RTLD_NOLOAD)`).
    pub unsafe fn snapshot(&self, data: DataFrom<'_>) -> Snapshot {
        let data = match data {
            DataFrom::Nowhere => Vec::new(),
            DataFrom::File(file) => match self.data_in_file.clone().and_then(|range| file.get(range)) {
                Some(bytes) => bytes.to_vec(),
                None => unsafe { read_live(self.data, false) },
            },
            DataFrom::Memory => unsafe { read_live(self.data, false) },
        };
        Snapshot {
            counters: unsafe { read_live(self.counters, self.layout.variant.byte_coverage) },
            bitmap: unsafe { read_live(self.bitmap, true) },
            data,
        }
    }

    /// Copies the counters at `span` (a byte range of the counter section)
    /// into `out`, replacing its contents: a dump that only needs some
    /// functions' counters reads only those.
    ///
    /// Safety: as [`Module::snapshot`]; `span` within the section.
    pub unsafe fn read_counters(&self, span: std::ops::Range<usize>, out: &mut Vec<u8>) {
        out.clear();
        let span = span.start.min(self.counters.1)..span.end.min(self.counters.1);
        let byte_mode = self.layout.variant.byte_coverage;
        unsafe { read_live_into(self.counters.0 + span.start, span.len(), byte_mode, out) };
    }

    /// Whether the counters at `span` are `last` (less `base`, the reset
    /// baseline's bytes there), read in place: between two dumps of a
    /// service most functions did not run, and comparing costs less than
    /// copying them out first.
    ///
    /// Safety: as [`Module::read_counters`].
    pub unsafe fn counters_are(&self, span: std::ops::Range<usize>, last: &[u8], base: Option<&[u8]>) -> bool {
        if span.end > self.counters.1 || last.len() != span.len() {
            return false;
        }
        let address = self.counters.0 + span.start;
        if self.layout.variant.byte_coverage || address % 8 != 0 {
            // Byte counters have no baseline (a reset clears them in place).
            return base.is_none()
                && last.iter().enumerate().all(|(i, &byte)| {
                    // Safety: inside the section, one byte at a time.
                    unsafe { (*((address + i) as *const AtomicU8)).load(Ordering::Relaxed) == byte }
                });
        }
        // Whole words, without a bounds check each: a dump compares every
        // counter of the program (on redis, 248 KB).
        fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
            bytes.chunks_exact(8).map(|w| w.try_into().map_or(0, u64::from_ne_bytes))
        }
        // Safety: inside the section (`last` is as long as the span),
        // aligned u64 counters.
        let live = (0..span.len() / 8).map(|w| unsafe { (*((address + w * 8) as *const AtomicU64)).load(Ordering::Relaxed) });
        match base {
            None => live.zip(words(last)).all(|(live, last)| live == last),
            // A base shorter than the span (it cannot be) counts from zero.
            Some(base) => {
                let base = words(base).chain(std::iter::repeat(0));
                live.zip(base).zip(words(last)).all(|((live, base), last)| live.wrapping_sub(base) == last)
            }
        }
    }

    /// Decodes a snapshot into per-function counters, of the records whose
    /// name reference `keep` takes: each with its index among all and its
    /// byte range in the snapshot's counters.
    pub fn records_with_spans(
        &self,
        snapshot: &Snapshot,
        keep: impl Fn(u64) -> bool,
    ) -> Result<Vec<(usize, FunctionCounters, std::ops::Range<usize>)>> {
        profile::decode_records_with_spans(&self.layout, &snapshot.data, &snapshot.counters, &snapshot.bitmap, keep)
            .map_err(|e| e.context(&self.id.path.display().to_string()))
    }

    /// Sets every counter to its initial value (0, or 0xff for byte
    /// coverage), as the runtime's own reset does.
    ///
    /// Safety: as [`Module::snapshot`].
    pub unsafe fn zero(&self) {
        unsafe { zero_range(self.counters.0, self.counters.1, self.layout.variant.byte_coverage) }
    }

    pub fn counter_range(&self) -> CounterRange {
        CounterRange { start: self.counters.0, len: self.counters.1, byte_coverage: self.layout.variant.byte_coverage }
    }
}

/// Copies `len` bytes at `address` with atomic loads: 8 bytes at a time
/// where aligned (counters are u64), single bytes otherwise.
unsafe fn read_live((address, len): (usize, usize), bytes_only: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    unsafe { read_live_into(address, len, bytes_only, &mut out) };
    out
}

/// As [`read_live`], appending to `out`.
unsafe fn read_live_into(address: usize, len: usize, bytes_only: bool, out: &mut Vec<u8>) {
    let mut i = 0;
    if !bytes_only && address % 8 == 0 {
        while i + 8 <= len {
            // Safety: inside a mapped section of a loaded module; counters
            // are naturally aligned u64s that other threads update.
            let v = unsafe { (*((address + i) as *const AtomicU64)).load(Ordering::Relaxed) };
            out.extend_from_slice(&v.to_ne_bytes());
            i += 8;
        }
    }
    while i < len {
        // Safety: as above, one byte at a time.
        out.push(unsafe { (*((address + i) as *const AtomicU8)).load(Ordering::Relaxed) });
        i += 1;
    }
}

/// A module's counter section, for zeroing it in a forked child.
#[derive(Debug, Clone, Copy)]
pub struct CounterRange {
    pub start: usize,
    pub len: usize,
    pub byte_coverage: bool,
}

unsafe fn zero_range(start: usize, len: usize, byte_coverage: bool) {
    let value = if byte_coverage { 0xff } else { 0 };
    if !byte_coverage && start % 8 == 0 {
        for i in (0..len / 8 * 8).step_by(8) {
            // Safety: inside the counter section of a loaded module.
            unsafe { (*((start + i) as *const AtomicU64)).store(0, Ordering::Relaxed) };
        }
        for i in len / 8 * 8..len {
            unsafe { (*((start + i) as *const AtomicU8)).store(0, Ordering::Relaxed) };
        }
    } else {
        for i in 0..len {
            unsafe { (*((start + i) as *const AtomicU8)).store(value, Ordering::Relaxed) };
        }
    }
}

/// Counter sections known so far, readable from a fork handler without a
/// lock: replaced whole when the set of modules changes (the old list is
/// leaked, a few bytes per change, so a reader never sees it freed).
static COUNTER_RANGES: AtomicPtr<Vec<CounterRange>> = AtomicPtr::new(std::ptr::null_mut());

/// The loaded modules the published ranges were found in.
static RANGES_OF: std::sync::Mutex<Vec<ModuleId>> = std::sync::Mutex::new(Vec::new());

/// Publishes the counter sections of the instrumented modules among `ids`
/// (every module loaded at the time).
pub fn publish_counter_ranges(ids: &[ModuleId], ranges: Vec<CounterRange>) {
    let mut of = RANGES_OF.lock().unwrap_or_else(|e| e.into_inner());
    let new = Box::into_raw(Box::new(ranges));
    COUNTER_RANGES.swap(new, Ordering::AcqRel);
    *of = ids.to_vec();
}

/// Looks the counter sections up again when the loaded modules changed
/// since they were last published (before a fork: a child must zero the
/// modules loaded at the fork, and only those). Reads section headers,
/// symbols and names of new modules, never their coverage mapping.
pub fn refresh_counter_ranges() {
    let ids = loaded_modules();
    let mut of = RANGES_OF.lock().unwrap_or_else(|e| e.into_inner());
    if *of == ids && !COUNTER_RANGES.load(Ordering::Acquire).is_null() {
        return;
    }
    let mut ranges = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let Ok(image) = map_module(id, i == 0) else { continue };
        if let Ok(Some(module)) = open_module(id, &image) {
            ranges.push(module.counter_range());
        }
    }
    let new = Box::into_raw(Box::new(ranges));
    COUNTER_RANGES.swap(new, Ordering::AcqRel);
    *of = ids;
}

/// Zeroes every known counter section: run in a forked child so that parent
/// and child together count what ran exactly once.
///
/// Safety: only in a child right after fork, when the modules are the
/// parent's and no other thread runs.
pub unsafe fn zero_all_known() {
    let ranges = COUNTER_RANGES.load(Ordering::Acquire);
    if ranges.is_null() {
        return;
    }
    // Safety: published lists are never freed.
    for r in unsafe { &*ranges } {
        unsafe { zero_range(r.start, r.len, r.byte_coverage) };
    }
}

/// Keeps a shared object loaded while its sections are read.
pub struct Pin(*mut libc::c_void);

impl Pin {
    /// `None` when the module is no longer loaded.
    pub fn new(id: &ModuleId, is_main: bool) -> Option<Pin> {
        if is_main {
            return Some(Pin(std::ptr::null_mut()));
        }
        let path = std::ffi::CString::new(id.path.as_os_str().as_encoded_bytes()).ok()?;
        // Safety: RTLD_NOLOAD only takes a reference to an already loaded object.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        (!handle.is_null()).then_some(Pin(handle))
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // Safety: a handle from dlopen above.
            unsafe { libc::dlclose(self.0) };
        }
    }
}
