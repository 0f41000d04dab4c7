//! What a process learns from its forked children: whether one of them
//! went on running the program (it made a report) rather than running
//! another program at once (`exec`).
//!
//! The agent makes records for the children to start from only then (see
//! `Agent::prepare_for_children`). Made at the program's first fork, they
//! cost a program that forks only to run other programs (a shell, a
//! server that runs a helper for each request, a master whose workers it
//! never replaces) a whole report's work and its records' memory, for
//! nothing: on redis, 70 ms of CPU and 3.4 MiB resident.
//!
//! A child tells its parent through one word of a page they share
//! (`MAP_SHARED`, mapped at the program's first fork): no descriptor, no
//! signal, and nothing for the program to see but the mapping.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// The word this process's children write, once mapped.
static OWN: AtomicPtr<AtomicU32> = AtomicPtr::new(std::ptr::null_mut());
/// In a forked child: its parent's word.
static PARENT: AtomicPtr<AtomicU32> = AtomicPtr::new(std::ptr::null_mut());

/// Before a fork, on the program's thread: maps the page the child writes,
/// at the first fork only.
pub fn share_before_fork() {
    if !OWN.load(Ordering::Acquire).is_null() {
        return;
    }
    // Safety: a new anonymous mapping of one page (the smallest there is),
    // readable and writable, which nothing else refers to; zeroed by the
    // kernel, so its word reads 0 (no child reported).
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            std::mem::size_of::<AtomicU32>(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page != libc::MAP_FAILED {
        OWN.store(page.cast(), Ordering::Release);
    }
}

/// In a forked child, before its agent starts: its parent's word is the one
/// it writes; its own children get a page of their own.
pub fn in_child() {
    PARENT.store(OWN.swap(std::ptr::null_mut(), Ordering::AcqRel), Ordering::Release);
}

/// A report was made: tells the parent, in a forked child.
pub fn note_report() {
    let word = PARENT.load(Ordering::Acquire);
    // Safety: a page mapped by `share_before_fork` in the parent, inherited
    // at the fork and never unmapped (`exec` takes it away with the rest).
    if let Some(word) = unsafe { word.as_ref() } {
        word.store(1, Ordering::Relaxed);
    }
}

/// Whether a child of this process reported; true when the page could not
/// be mapped (the children may have: the agent prepares as it did).
pub fn one_reported() -> bool {
    let word = OWN.load(Ordering::Acquire);
    // Safety: as in `note_report`, this process's own page.
    unsafe { word.as_ref() }.is_none_or(|word| word.load(Ordering::Relaxed) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forks a child that runs `then` and `_exit`s, and waits for it.
    fn fork_and_wait(then: fn()) {
        share_before_fork();
        // Safety: the child calls only atomics and `_exit`, which are
        // async-signal-safe, before it ends.
        match unsafe { libc::fork() } {
            0 => {
                in_child();
                then();
                // Safety: ends the child without running the test harness.
                unsafe { libc::_exit(0) }
            }
            child => {
                assert!(child > 0, "fork: {}", std::io::Error::last_os_error());
                let mut status = 0;
                // Safety: waits for the child just forked.
                assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status}");
            }
        }
    }

    #[test]
    fn a_parent_learns_that_a_child_reported_and_only_that() {
        assert!(PARENT.load(Ordering::Acquire).is_null(), "the test process is nobody's forked child");
        fork_and_wait(|| {});
        assert!(!one_reported(), "a child that ran another program (here: none) reported nothing");
        fork_and_wait(note_report);
        assert!(one_reported(), "the second child's report is seen by its parent");
    }
}
