//! Scratch memory: the small blocks of the engine's passing work (the
//! decoded regions of a batch of functions, and their counts), taken apart
//! from `malloc` while the engine says so (see [`set`]).
//!
//! A first report reads every function of the program, a batch at a time,
//! and builds each file's record as it goes. From `malloc`, the batches'
//! blocks and the records' ended up side by side in the agent thread's
//! arena: when a batch was dropped, its pages stayed resident around the
//! records' blocks (on redis, 2.2 MiB that only `malloc_trim` gave back,
//! and it takes the lock of every arena of the program). Here they are cut
//! from chunks of their own, in order, each chunk counting its live
//! blocks: when the last one is freed, the chunk is free and serves the
//! next batch; when the engine's work is done, the free chunks' pages go
//! back to the kernel ([`release`]).
//!
//! A block freed early leaves its room unused until its chunk's last block
//! is freed: good for the work of one batch, not for memory that lives on.
//!
//! Written here because no allocator crate does just this: arena crates
//! (bumpalo) hand out their own references, where this must serve the
//! `Vec`s of code that allocates through the global allocator.

use std::alloc::Layout;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The size of a chunk: some hundred blocks of a batch, given back
/// together.
const CHUNK: usize = 256 << 10;
/// How many chunks the reserved range holds (64 MiB of addresses, of
/// which only the pages in use are resident): a batch's blocks take a few
/// MiB. Past it, blocks come from `malloc` again.
const CHUNKS: usize = 256;

/// Whether small blocks come from here now.
static ON: AtomicBool = AtomicBool::new(false);

/// The start of the reserved range: 0 before its first use, 1 when it
/// could not be reserved.
static BASE: AtomicUsize = AtomicUsize::new(0);

/// Per chunk, its live blocks, and one more while blocks are cut from it.
static LIVE: [AtomicU32; CHUNKS] = [const { AtomicU32::new(0) }; CHUNKS];

/// A bit per chunk, set when it is free: in `FREE` never used or given
/// back, in `USED` with pages still resident.
static FREE: [AtomicU64; CHUNKS / 64] = [const { AtomicU64::new(u64::MAX) }; CHUNKS / 64];
static USED: [AtomicU64; CHUNKS / 64] = [const { AtomicU64::new(0) }; CHUNKS / 64];

/// The chunk blocks are cut from, and where its free room starts. Taken
/// with `try_lock` only, as the allocator's other lock (a fork made while
/// another thread held it must not leave the child waiting): a block is
/// then taken from `malloc`.
static FILLING: Mutex<Option<(usize, usize)>> = Mutex::new(None);

/// Small blocks come from scratch memory from now on (`true`), or no
/// longer (`false`: the chunk being cut is let go, free once its blocks
/// are).
pub fn set(on: bool) {
    ON.store(on, Ordering::Relaxed);
    if !on {
        if let Ok(mut filling) = FILLING.try_lock() {
            if let Some((chunk, _)) = filling.take() {
                unref(chunk);
            }
        }
    }
}

/// A block of `layout` from scratch memory, if it is on and has room. Its
/// bytes are not zeroed.
pub fn alloc(layout: Layout) -> Option<*mut u8> {
    if !ON.load(Ordering::Relaxed) || layout.size() > CHUNK / 4 || layout.align() > 4096 {
        return None;
    }
    let base = base()?;
    let mut filling = FILLING.try_lock().ok()?;
    let fits = |at: usize| {
        let start = at.next_multiple_of(layout.align());
        (start + layout.size() <= CHUNK).then_some(start)
    };
    let (chunk, start) = match filling.and_then(|(chunk, at)| Some((chunk, fits(at)?))) {
        Some(room) => room,
        None => {
            if let Some((full, _)) = filling.take() {
                unref(full);
            }
            let chunk = claim(&USED).or_else(|| claim(&FREE))?;
            // One for the filling, one for the block.
            LIVE[chunk].store(1, Ordering::Relaxed);
            (chunk, fits(0)?)
        }
    };
    LIVE[chunk].fetch_add(1, Ordering::Relaxed);
    *filling = Some((chunk, start + layout.size()));
    Some((base + chunk * CHUNK + start) as *mut u8)
}

/// Grows the block at `ptr` from `size` to `new_size` bytes where it is,
/// if it is the last one cut and its chunk has the room: a vector pushed
/// to while nothing else is allocated grows without a copy.
pub fn grow(ptr: *mut u8, size: usize, new_size: usize) -> bool {
    let Ok(mut filling) = FILLING.try_lock() else { return false };
    let Some((chunk, at)) = filling.as_mut() else { return false };
    // Not in the chunk being cut: the difference wraps, and is no offset in it.
    let start = (ptr as usize).wrapping_sub(BASE.load(Ordering::Relaxed) + *chunk * CHUNK);
    if start >= CHUNK || start + size != *at || start + new_size > CHUNK {
        return false;
    }
    *at = start + new_size;
    true
}

/// Frees `ptr` if it is a block of scratch memory; `false` if it is not.
pub fn free(ptr: *mut u8) -> bool {
    if !contains(ptr) {
        return false;
    }
    unref((ptr as usize - BASE.load(Ordering::Relaxed)) / CHUNK);
    true
}

/// Whether `ptr` is a block of scratch memory.
pub fn contains(ptr: *mut u8) -> bool {
    let base = BASE.load(Ordering::Relaxed);
    base > 1 && (ptr as usize).wrapping_sub(base) < CHUNKS * CHUNK
}

/// One block (or the filling) of `chunk` less; the last one frees it.
fn unref(chunk: usize) {
    if LIVE[chunk].fetch_sub(1, Ordering::AcqRel) == 1 {
        USED[chunk / 64].fetch_or(1 << (chunk % 64), Ordering::Release);
    }
}

/// Gives the pages of the free chunks back: called when the engine's work
/// is done, so that what it freed is not resident between dumps.
pub fn release() {
    let base = BASE.load(Ordering::Relaxed);
    while let Some(chunk) = claim(&USED) {
        // Safety: a chunk of the reserved range with no block in it, taken
        // from the free ones by this thread alone.
        unsafe { libc::madvise((base + chunk * CHUNK) as *mut libc::c_void, CHUNK, libc::MADV_DONTNEED) };
        FREE[chunk / 64].fetch_or(1 << (chunk % 64), Ordering::Release);
    }
}

/// A chunk of those whose bit is set in `set`, taken (its bit cleared).
fn claim(set: &[AtomicU64; CHUNKS / 64]) -> Option<usize> {
    for (word, bits) in set.iter().enumerate() {
        let mut current = bits.load(Ordering::Acquire);
        while current != 0 {
            let bit = current.trailing_zeros() as usize;
            match bits.compare_exchange(current, current & !(1 << bit), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(word * 64 + bit),
                Err(now) => current = now,
            }
        }
    }
    None
}

/// The reserved range's start, reserved at the first call.
fn base() -> Option<usize> {
    match BASE.load(Ordering::Relaxed) {
        1 => None,
        0 => {
            // Safety: a new anonymous private mapping, shared with no one;
            // with MAP_NORESERVE, only the pages written count.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    CHUNKS * CHUNK,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            let base = if p == libc::MAP_FAILED { 1 } else { p as usize };
            // Of two threads here at once, the second unmaps its range.
            match BASE.compare_exchange(0, base, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => (base > 1).then_some(base),
                Err(other) => {
                    if base > 1 {
                        // Safety: the mapping made above, unused.
                        unsafe { libc::munmap(base as *mut libc::c_void, CHUNKS * CHUNK) };
                    }
                    (other > 1).then_some(other)
                }
            }
        }
        base => Some(base),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks cut from scratch memory (the crate's global allocator serves
    /// them while it is on) keep their bytes as they grow; a zeroed one is
    /// zeroed in a chunk used before; the free chunks' pages go back.
    #[test]
    fn blocks_keep_their_bytes_and_free_chunks_go_back() {
        let _serial = crate::tests::serial();
        for round in 0..2 {
            set(true);
            let mut blocks: Vec<Vec<u32>> = Vec::new();
            for i in 0..3000u32 {
                blocks.push((0..i % 200).map(|k| k ^ i).collect());
            }
            let mut grown: Vec<u64> = Vec::new();
            for i in 0..1000u64 {
                grown.push(i * 3);
            }
            let zeroed = vec![0u64; 500];
            set(false);
            // The test harness's other threads allocate through the same
            // allocator, and a block whose turn finds the lock taken comes
            // from `malloc`: most blocks, not each, are scratch memory.
            let cut = blocks.iter().filter(|block| contains(block.as_ptr() as *mut u8)).count();
            assert!(cut > blocks.len() / 2, "{cut} of {} blocks from scratch memory, round {round}", blocks.len());
            for (i, block) in blocks.iter().enumerate() {
                assert!(block.iter().enumerate().all(|(k, &v)| v == k as u32 ^ i as u32), "block {i}, round {round}");
            }
            assert!(grown.iter().enumerate().all(|(i, &v)| v == 3 * i as u64), "round {round}");
            assert!(zeroed.iter().all(|&v| v == 0), "round {round}");
            // The next round's blocks are cut from these chunks.
            for block in &mut blocks {
                block.fill(u32::MAX);
            }
        }
        release();
        let base = BASE.load(Ordering::Relaxed);
        let mut resident = vec![0u8; CHUNK / 4096];
        for (chunk, live) in LIVE.iter().enumerate() {
            if live.load(Ordering::Acquire) > 0 {
                continue;
            }
            // Safety: a range of the reservation, and a vector of a byte per
            // page of it.
            let ok = unsafe {
                libc::mincore((base + chunk * CHUNK) as *mut libc::c_void, CHUNK, resident.as_mut_ptr())
            };
            assert_eq!(ok, 0);
            assert!(resident.iter().all(|&page| page & 1 == 0), "free chunk {chunk} is still resident");
        }
    }
}
