//! Polling until something holds, for at most the 30 s the end-to-end tests allow.

use std::time::{Duration, Instant};

/// Calls `f` every `every` until it returns `Some`; panics after 30 s.
pub fn wait_for<T>(what: &str, every: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(every);
    }
}
