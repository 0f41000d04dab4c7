//! The loaded module that holds the agent's code: whether it is a shared
//! object of its own (the constructor starts the agent only then), and the
//! pages of its code, given back after a first dump.
//!
//! A first dump runs most of liblivecov.so once (2.9 MiB of it stayed
//! resident in redis), the next ones a part of it, and between dumps the
//! program runs none of it. Those pages are the file's, read-only and
//! shared with the page cache: dropped from the program's mapping, the
//! next dump maps again those it runs from the page cache (a minor fault
//! maps a run of them), as the engine does with the objects'
//! `__llvm_covfun`. Only when the agent is its own shared object: linked
//! into a program or into another library, the pages around its code are
//! theirs, and their code would be faulted in again while it runs.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

/// The module holding this code, as `dl_iterate_phdr` reports it.
pub struct OwnModule {
    /// Its place in the loader's list: 0 is the executable.
    pub index: usize,
    /// Its segments that are not writable: (start, length), whole pages.
    read_only: Vec<(usize, usize)>,
    /// Whether it is the agent library itself (`liblivecov*.so*`).
    is_agent_library: bool,
}

/// The module holding this code (`None` only if the loader lists no
/// module holding it).
pub fn find() -> Option<OwnModule> {
    struct Search {
        address: usize,
        index: usize,
        found: Option<OwnModule>,
    }
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> c_int {
        // Safety: the loader passes a valid info; `data` is our Search.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        let index = search.index;
        search.index += 1;
        // Safety: dlpi_phdr has dlpi_phnum entries.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let base = info.dlpi_addr as usize;
        let holds = |ph: &libc::Elf64_Phdr| {
            let start = base.wrapping_add(ph.p_vaddr as usize);
            ph.p_type == libc::PT_LOAD && (start..start + ph.p_memsz as usize).contains(&search.address)
        };
        if !headers.iter().any(holds) {
            return 0;
        }
        // Safety: the loader's name of the module, NUL-terminated (empty
        // for the executable).
        let name = (!info.dlpi_name.is_null()).then(|| unsafe { CStr::from_ptr(info.dlpi_name) });
        let file = name.map(|n| n.to_bytes().rsplit(|&b| b == b'/').next().unwrap_or_default());
        let is_agent_library = file.is_some_and(|f| f.starts_with(b"liblivecov") && f.windows(3).any(|w| w == b".so"));
        let page = crate::allocator::page();
        let read_only = headers
            .iter()
            .filter(|ph| ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_W == 0)
            .filter_map(|ph| {
                let start = base.wrapping_add(ph.p_vaddr as usize);
                // Whole pages of the segment only.
                let (from, to) = (start.next_multiple_of(page), (start + ph.p_memsz as usize) / page * page);
                (to > from).then_some((from, to - from))
            })
            .collect();
        search.found = Some(OwnModule { index, read_only, is_agent_library });
        1
    }
    let mut search = Search { address: find as *const () as usize, index: 0, found: None };
    // Safety: the callback only reads what the loader hands it.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut c_void) };
    search.found
}

/// The agent library's segments that [`release_code_pages`] gives back,
/// kept by the library's constructor, before `main`: found later, by a
/// thread of a program that forked meanwhile, they were left half made in
/// the child, which waited for them forever.
static SEGMENTS: OnceLock<Vec<(usize, usize)>> = OnceLock::new();

/// Keeps the segments of `module` for [`release_code_pages`], if it is the
/// agent library itself.
pub fn keep_code_pages(module: &OwnModule) {
    if module.is_agent_library {
        let _ = SEGMENTS.set(module.read_only.clone());
    }
}

/// Gives the pages of the agent library's code and read-only data back to
/// the kernel (they stay mapped: a page touched again is read again); none
/// when the agent is not a library of its own.
pub fn release_code_pages() {
    for &(start, len) in SEGMENTS.get().map_or(&[][..], Vec::as_slice) {
        // Safety: a read-only private mapping of the library's file, which
        // nothing writes (no text relocations: the library is built as
        // position-independent code, and the segments with relocations to
        // apply, the RELRO one included, are writable in the program
        // headers and left out). A dropped page reads the same when touched
        // again, from the file.
        unsafe { libc::madvise(start as *mut c_void, len, libc::MADV_DONTNEED) };
    }
}
