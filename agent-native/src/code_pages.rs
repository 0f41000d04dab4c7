//! The pages of the agent's own code, given back after a first dump.
//!
//! A first dump runs most of liblivecov.so once (2.9 MiB of it stayed
//! resident in redis), the next ones a part of it, and between dumps the
//! program runs none of it. Those pages are the file's, read-only and
//! shared with the page cache: dropped from the program's mapping, the
//! next dump maps again those it runs from the page cache (a minor fault
//! maps a run of them), as the engine does with the objects'
//! `__llvm_covfun`.
//!
//! Only when the agent is its own shared object: linked into a program or
//! into another library, the pages around its code are theirs, and their
//! code would be faulted in again while it runs.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

/// The agent library's read-only segments: (start, length), whole pages.
static SEGMENTS: OnceLock<Vec<(usize, usize)>> = OnceLock::new();

/// Gives the pages of the agent library's code and read-only data back to
/// the kernel (they stay mapped: a page touched again is read again).
pub fn release() {
    for &(start, len) in SEGMENTS.get_or_init(own_segments) {
        // Safety: a read-only private mapping of the library's file, which
        // nothing writes (no text relocations: the library is built as
        // position-independent code, and the segments with relocations to
        // apply, the RELRO one included, are writable in the program
        // headers and left out). A dropped page reads the same when touched
        // again, from the file.
        unsafe { libc::madvise(start as *mut c_void, len, libc::MADV_DONTNEED) };
    }
}

/// The segments that are not writable, of the module holding this code if
/// it is the agent library (`liblivecov*.so*`); none otherwise.
fn own_segments() -> Vec<(usize, usize)> {
    struct Search {
        address: usize,
        segments: Vec<(usize, usize)>,
    }
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> c_int {
        // Safety: the loader passes a valid info; `data` is our Search.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
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
        let file = name.map(|n| n.to_bytes().rsplit(|&b| b == b'/').next().unwrap_or_default().to_vec());
        if file.is_some_and(|f| f.starts_with(b"liblivecov") && f.windows(3).any(|w| w == b".so")) {
            let page = crate::allocator::page();
            for ph in headers.iter().filter(|ph| ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_W == 0) {
                let start = base.wrapping_add(ph.p_vaddr as usize);
                // Whole pages of the segment only.
                let (from, to) = (start.next_multiple_of(page), (start + ph.p_memsz as usize) / page * page);
                if to > from {
                    search.segments.push((from, to - from));
                }
            }
        }
        1
    }
    let mut search = Search { address: release as *const () as usize, segments: Vec::new() };
    // Safety: the callback only reads what the loader hands it.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut c_void) };
    search.segments
}
