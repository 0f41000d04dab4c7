//! Hints to the CPU to fetch memory ahead of its use.
//!
//! Between two dumps of a busy program, the program evicts the agent's
//! records from the caches. A dump reads a little of each of hundreds of
//! them, and read one after the other, each read waited for memory. Asked
//! for all at once first, they come in side by side.

/// The most of one block asked for: the first lines are what is read at
/// once, and the caches hold a dump's worth of them.
const MOST: usize = 1024;

/// Asks for the first bytes of `values`.
pub fn slice<T>(values: &[T]) {
    bytes(values.as_ptr().cast(), std::mem::size_of_val(values));
}

/// Asks for the first of `len` bytes from `from`, [`MOST`] at most.
pub fn bytes(from: *const u8, len: usize) {
    for at in (0..len.min(MOST)).step_by(64) {
        line(from.wrapping_add(at));
    }
}

/// Asks for the cache line of `at`, without waiting for it.
fn line(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // Safety: a prefetch reads nothing and faults on no address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}
