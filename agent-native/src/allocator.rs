//! The allocator of the agent's own memory in a C or C++ program.
//!
//! Small blocks come from the C library's `malloc`, as before. Blocks of
//! [`LARGE`] bytes or more are mapped from the kernel, one mapping each,
//! and unmapped when freed: a dump's large buffers (a file's record, the
//! counts of a batch, a growing vector of regions) then give their pages
//! back as soon as they are dropped. From `malloc` they would not: glibc
//! raises its mapping threshold to the largest block freed, serves the
//! next ones from the agent thread's arena, and an arena only shrinks from
//! its top, so the holes of one dump's buffers stay resident in the
//! program (8.3 MiB of redis's 21 MiB with the agent, after 100 dumps).
//! `malloc_trim` would give them back, but it takes the lock of every
//! arena of the program in turn, and the agent must not stall the
//! program's own allocations.
//!
//! Small blocks of the engine's passing work come from scratch memory
//! instead, while it is on (see `crate::scratch`).
//!
//! Written here because no allocator crate does just this: the general
//! ones (jemalloc, mimalloc) replace small blocks too, and bring a C build.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::scratch;

/// Blocks this large or larger are mapped on their own. glibc's initial
/// mapping threshold is 128 KiB, but most of the agent's records are
/// smaller; on redis after 100 dumps, 64 KiB left the arena at 12.5 MiB
/// and 16 KiB at 9.4 MiB, at no cost measured in the dumps' time.
pub const LARGE: usize = 16 * 1024;

pub struct AgentAllocator;

static PAGE: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn page() -> usize {
    match PAGE.load(Ordering::Relaxed) {
        0 => {
            // Safety: sysconf has no preconditions.
            let size = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(4096);
            PAGE.store(size, Ordering::Relaxed);
            size
        }
        size => size,
    }
}

/// Whether a block of `layout` is mapped on its own. `dealloc` and
/// `realloc` are given the layout it was allocated with, so they tell the
/// same.
fn mapped(layout: Layout) -> bool {
    layout.size() >= LARGE && layout.align() <= page()
}

/// The length of the mapping of a block of `size` bytes.
fn mapping_len(size: usize) -> usize {
    let page = page();
    size.div_ceil(page) * page
}

/// Freed mappings kept for the next blocks, up to [`KEPT_BYTES`] in all,
/// until the engine's work is done ([`release_kept`]): a warm dump frees
/// the last records of the files it computes again as it maps their next
/// ones, about as large; mapped afresh, each page would be faulted in and
/// zeroed, and each unmapping flush the other threads' TLBs (on redis
/// under traffic, 278 page faults a dump against 179, and a tenth of the
/// agent's time). The largest, up to [`KEPT_BETWEEN`], stay for the next
/// dump: its first records would otherwise map theirs afresh (on redis
/// under traffic, 100 page faults a dump against 79, and 8% of the agent's
/// time, for 0.4 MiB more resident).
struct Kept {
    blocks: [(usize, usize); KEPT_BLOCKS],
    bytes: usize,
}

const KEPT_BLOCKS: usize = 64;
const KEPT_BYTES: usize = 4 << 20;
const KEPT_BETWEEN: usize = 256 << 10;

/// Taken with `try_lock` only: a block is then mapped or unmapped as
/// without the list. Two of the agent's threads seldom free large blocks
/// at once, and the child of a fork made while one held the lock (the
/// program forks whenever it likes) would wait for it forever.
static KEPT: Mutex<Kept> = Mutex::new(Kept { blocks: [(0, 0); KEPT_BLOCKS], bytes: 0 });

/// A kept mapping of `len` bytes, cut down from the smallest one at
/// least that long.
fn take_kept(len: usize) -> Option<*mut u8> {
    let mut kept = KEPT.try_lock().ok()?;
    let (slot, &(at, have)) =
        kept.blocks.iter().enumerate().filter(|(_, b)| b.1 >= len).min_by_key(|(_, b)| b.1)?;
    // The tail stays kept, in the same slot: unmapping it would cost as
    // much as unmapping the whole (the other threads' TLBs flushed).
    kept.blocks[slot] = if have > len { (at + len, have - len) } else { (0, 0) };
    kept.bytes -= len;
    Some(at as *mut u8)
}

/// Unmaps the kept mappings but the largest (see [`Kept`]), or all of them
/// `at_rest`: called when the engine's work is done, so that what a dump
/// freed is not resident between dumps.
pub fn release_kept(at_rest: bool) {
    let between = if at_rest { 0 } else { KEPT_BETWEEN };
    let blocks = match KEPT.try_lock() {
        Ok(mut kept) => {
            let mut blocks = std::mem::replace(&mut kept.blocks, [(0, 0); KEPT_BLOCKS]);
            blocks.sort_unstable_by_key(|&(_, len)| std::cmp::Reverse(len));
            kept.bytes = 0;
            let mut stay = 0;
            while stay < KEPT_BLOCKS && blocks[stay].1 > 0 && kept.bytes + blocks[stay].1 <= between {
                kept.bytes += blocks[stay].1;
                kept.blocks[stay] = std::mem::take(&mut blocks[stay]);
                stay += 1;
            }
            blocks
        }
        Err(_) => return,
    };
    let mut blocks = blocks;
    // By address: the pieces of one mapping (a block's tail kept, and the
    // block itself freed later) next to each other, unmapped by one call.
    blocks.sort_unstable_by_key(|&(at, len)| (len == 0, at));
    let unmap = |(at, len): (usize, usize)| {
        // Safety: mappings this allocator owns and no block uses.
        unsafe { libc::munmap(at as *mut libc::c_void, len) };
    };
    let mut run = (0, 0);
    for (at, len) in blocks.into_iter().take_while(|b| b.1 > 0) {
        if run.1 > 0 && run.0 + run.1 == at {
            run.1 += len;
        } else {
            if run.1 > 0 {
                unmap(run);
            }
            run = (at, len);
        }
    }
    if run.1 > 0 {
        unmap(run);
    }
}

/// Keeps a freed mapping for a later block, if there is room; unmaps it
/// otherwise.
unsafe fn release(ptr: *mut u8, len: usize) {
    if let Ok(mut kept) = KEPT.try_lock() {
        if kept.bytes + len <= KEPT_BYTES {
            if let Some(slot) = kept.blocks.iter().position(|b| b.1 == 0) {
                kept.blocks[slot] = (ptr as usize, len);
                kept.bytes += len;
                return;
            }
        }
    }
    // Safety: the caller's mapping, of this length, which no block uses.
    unsafe { libc::munmap(ptr.cast(), len) };
}

/// A block of `size` bytes: a kept mapping, or a new one.
unsafe fn map(size: usize) -> *mut u8 {
    match take_kept(mapping_len(size)) {
        Some(p) => p,
        // Safety: see `map_new`.
        None => unsafe { map_new(size) },
    }
}

unsafe fn map_new(size: usize) -> *mut u8 {
    // Safety: a new anonymous private mapping, shared with no one.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapping_len(size),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

// Not inlined: fat LTO would copy each method into every allocation of
// the library (350 KB more of it).
unsafe impl GlobalAlloc for AgentAllocator {
    #[inline(never)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if mapped(layout) {
            // Safety: see `map`.
            unsafe { map(layout.size()) }
        } else if let Some(p) = scratch::alloc(layout) {
            p
        } else {
            // Safety: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
    }

    #[inline(never)]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mapped(layout) {
            match take_kept(mapping_len(layout.size())) {
                // Safety: a kept mapping of at least this size, which
                // holds the bytes of its last block.
                Some(p) => unsafe {
                    p.write_bytes(0, layout.size());
                    p
                },
                // Safety: see `map_new`; anonymous mappings are zeroed.
                None => unsafe { map_new(layout.size()) },
            }
        } else if let Some(p) = scratch::alloc(layout) {
            // Safety: a block of scratch memory of this size.
            unsafe { p.write_bytes(0, layout.size()) };
            p
        } else {
            // Safety: forwarded with the caller's guarantees.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    #[inline(never)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if mapped(layout) {
            // Safety: `ptr` is a mapping of this length, made by `map` or
            // `realloc` for this layout.
            unsafe { release(ptr, mapping_len(layout.size())) };
        } else if !scratch::free(ptr) {
            // Safety: forwarded with the caller's guarantees.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[inline(never)]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Safety: the caller guarantees that this layout is valid.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (mapped(layout), mapped(new_layout)) {
            // A scratch block keeps its place when it shrinks (its room is
            // not cut again: see `scratch`), and when it grows into room
            // no other block has.
            (false, false) if scratch::contains(ptr) && new_size <= layout.size() => ptr,
            (false, false) if scratch::contains(ptr) && scratch::grow(ptr, layout.size(), new_size) => ptr,
            // Safety: forwarded with the caller's guarantees.
            (false, false) if !scratch::contains(ptr) => unsafe { System.realloc(ptr, layout, new_size) },
            (true, true) => {
                // Moves the pages instead of copying them (and leaves the
                // block where it is when it shrinks or the room is free).
                // Safety: `ptr` is a mapping of the old length.
                let p = unsafe {
                    libc::mremap(ptr.cast(), mapping_len(layout.size()), mapping_len(new_size), libc::MREMAP_MAYMOVE)
                };
                if p == libc::MAP_FAILED {
                    std::ptr::null_mut()
                } else {
                    p.cast()
                }
            }
            _ => {
                // Across the threshold, or a scratch block grown: a new
                // block, the bytes copied.
                // Safety: the new layout is valid (see above); both blocks
                // hold at least the smaller size.
                let new = unsafe { self.alloc(new_layout) };
                if !new.is_null() {
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                new
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LARGE;

    /// Blocks grown and shrunk across the threshold and within it keep
    /// their bytes (the crate's global allocator is this one).
    #[test]
    fn blocks_keep_their_bytes_across_the_threshold() {
        let _serial = crate::tests::serial();
        let pattern = |n: usize| (0..n).map(|i| (i * 7 + i / 251) as u8).collect::<Vec<u8>>();
        let mut v: Vec<u8> = Vec::new();
        for size in [100, LARGE - 1, LARGE, LARGE + 1, 5 * LARGE + 3, 40 * LARGE, LARGE + 10, LARGE - 10, 3] {
            let want = pattern(size);
            v.resize(size, 0);
            v.copy_from_slice(&want);
            v.shrink_to_fit();
            assert_eq!(v, want, "after a resize to {size}");
            let zeroed = vec![0u64; size / 8 + 1];
            assert!(zeroed.iter().all(|&x| x == 0));
        }
        // A freed block is kept, and served again zeroed when so asked.
        for size in [3 * LARGE, 2 * LARGE, 3 * LARGE + 5] {
            drop(vec![0xffu8; size]);
            assert!(vec![0u8; size].iter().all(|&x| x == 0), "a zeroed block of {size} from a kept one");
        }
        super::release_kept(false);
        super::release_kept(true);
        assert!(vec![0u8; 2 * LARGE].iter().all(|&x| x == 0));
        let aligned = std::alloc::Layout::from_size_align(LARGE, 1 << 16).unwrap();
        // Safety: a valid layout; the block is freed with it.
        unsafe {
            let p = std::alloc::alloc(aligned);
            assert!(!p.is_null() && p as usize % (1 << 16) == 0);
            p.write_bytes(1, LARGE);
            std::alloc::dealloc(p, aligned);
        }
    }
}
