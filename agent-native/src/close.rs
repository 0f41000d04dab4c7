//! `close`, `close_range` and `closefrom`, answered here in the C
//! library's place, so that a program that closes every descriptor leaves
//! the agent's open (see `engine::agent::descriptors`): to the program
//! they are as closed (`EBADF`), as without the agent.
//!
//! Each calls the kernel itself, as the C library's do (it does not look
//! the C library's up with `dlsym`, which a forked child of a threaded
//! program may not do): only `close` being a point where a thread can be
//! cancelled (`pthread_cancel`) is lost.

use std::ffi::{c_int, c_uint};

use engine::agent::descriptors::{self, SLOTS};

fn set_errno(e: c_int) {
    // Safety: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// # Safety
/// As the C library's `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if !descriptors::may_close(fd) {
        set_errno(libc::EBADF);
        return -1;
    }
    // Safety: the caller's call, passed on.
    unsafe { libc::syscall(libc::SYS_close, fd) as c_int }
}

/// # Safety
/// As the C library's `close_range`.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    descriptors::wait_for_start();
    if descriptors::on_agent_thread() || first > last {
        // Safety: the caller's call, passed on.
        return unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) as c_int };
    }
    // The range in pieces, around the agent's descriptors.
    let (first_fd, last_fd) = (first.min(c_int::MAX as c_uint) as c_int, last.min(c_int::MAX as c_uint) as c_int);
    let mut own = [0; SLOTS];
    let n = descriptors::own_in(first_fd, last_fd, &mut own);
    let mut from = first;
    for &fd in &own[..n] {
        let fd = fd as c_uint;
        if fd > from {
            // Safety: a part of the caller's range.
            if unsafe { libc::syscall(libc::SYS_close_range, from, fd - 1, flags) } != 0 {
                return -1;
            }
        }
        from = fd + 1;
    }
    if from > last {
        return 0;
    }
    // Safety: the rest of the caller's range.
    unsafe { libc::syscall(libc::SYS_close_range, from, last, flags) as c_int }
}

/// # Safety
/// As the C library's `closefrom`.
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowest: c_int) {
    let lowest = lowest.max(0) as c_uint;
    // Safety: as the caller's call.
    if unsafe { close_range(lowest, c_uint::MAX, 0) } == 0 {
        return;
    }
    // A kernel without close_range (before Linux 5.9): one by one.
    // Safety: sysconf has no preconditions.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) }.clamp(0, 1 << 20) as c_int;
    for fd in lowest as c_int..max {
        // Safety: as the caller's call, a descriptor at a time.
        unsafe { close(fd) };
    }
}
