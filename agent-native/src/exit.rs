//! `_exit` and `_Exit`, answered here in the C library's place, so that a
//! process that ends with them leaves its final report as one that calls
//! `exit` does (see `engine::agent::finish_before_exit`): a daemon's first
//! processes, which `_exit` after each fork of its start, a signal handler
//! that ends the program, a forked worker.
//!
//! The C library's own calls (`exit` after its `atexit` hooks, a failed
//! `posix_spawn`) do not come here. The process then ends as the C
//! library's `_exit` ends it, by the kernel's `exit_group` (not looked up
//! with `dlsym`, which a forked child of a threaded program may not do).

use std::ffi::c_int;

/// # Safety
/// As the C library's `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    // A panic may not unwind out of a function that cannot return.
    let _ = std::panic::catch_unwind(engine::agent::finish_before_exit);
    loop {
        // Safety: ends the process.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// # Safety
/// As the C library's `_Exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // Safety: as the caller's call.
    unsafe { _exit(status) }
}
