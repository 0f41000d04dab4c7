//! livecov's C ABI: `liblivecov.so` and `liblivecov.a`, declared in
//! `include/livecov.h`.
//!
//! The same agent as the Rust crate's (`livecov::agent`), behind plain C
//! functions that return status codes and never unwind into the caller:
//! every entry point runs under `catch_unwind`, and a panic becomes
//! `LIVECOV_INTERNAL` with a message in `livecov_last_error()`.
//!
//! Loaded as a shared object (`LD_PRELOAD=liblivecov.so`, or linked with
//! `-llivecov`), an ELF constructor starts the agent from the `LIVECOV_*`
//! environment before `main`, in any LLVM-instrumented program; a program
//! without instrumented module gets one line on stderr and nothing else.
//! Linked statically, the program starts the agent itself.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use engine::agent::stderr::say;
use engine::agent::{self, Agent, Config};

mod allocator;
mod close;
mod exit;
mod own_module;
mod scratch;

#[global_allocator]
static ALLOCATOR: allocator::AgentAllocator = allocator::AgentAllocator;

/// Status codes, as `enum livecov_status` in `livecov.h`.
pub mod status {
    use std::ffi::c_int;
    pub const OK: c_int = 0;
    pub const NOT_STARTED: c_int = 1;
    pub const BAD_CONFIG: c_int = 2;
    pub const IO: c_int = 3;
    pub const NO_COVERAGE: c_int = 4;
    pub const ALREADY_STARTED: c_int = 5;
    pub const DISABLED: c_int = 6;
    pub const INVALID_ARGUMENT: c_int = 7;
    pub const BAD_COVERAGE: c_int = 8;
    pub const INTERNAL: c_int = 9;
}

/// Makes `config` that of an agent started by the shim: its runtime name,
/// and the hooks of the allocator the shim brings.
fn as_native(config: &mut Config) {
    config.runtime = "native";
    config.after_engine_work = Some(after_engine_work);
    config.after_answers = Some(own_module::release_code_pages);
    config.at_rest = Some(at_rest);
    config.scratch = Some(scratch::set);
}

// ------------------------------------------------------------ errors

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

struct Failure {
    code: c_int,
    message: String,
}

fn fail<T>(code: c_int, message: impl Into<String>) -> Result<T, Failure> {
    Err(Failure { code, message: message.into() })
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = text);
}

/// Runs an entry point: clears the thread's last error, catches panics,
/// turns failures into a code and a message.
fn guard(f: impl FnOnce() -> Result<(), Failure>) -> c_int {
    set_last_error("");
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => status::OK,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failure.code
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_last_error(&format!("internal error: {what} (please report it)"));
            status::INTERNAL
        }
    }
}

/// A coverage error of the engine, as a status.
fn coverage_failure(e: engine::Error) -> Failure {
    let code = match &e {
        engine::Error::Unsupported(m) if m.starts_with("no instrumented module") => status::NO_COVERAGE,
        engine::Error::Io { .. } => status::IO,
        _ => status::BAD_COVERAGE,
    };
    Failure { code, message: e.to_string() }
}

fn running(function: &str) -> Result<&'static Agent, Failure> {
    agent::current().ok_or_else(|| Failure {
        code: status::NOT_STARTED,
        message: format!("{function}: the agent is not running: call livecov_start first"),
    })
}

/// A C string argument; `None` for NULL.
unsafe fn text<'a>(function: &str, what: &str, s: *const c_char) -> Result<Option<&'a str>, Failure> {
    if s.is_null() {
        return Ok(None);
    }
    // Safety: the caller passes a NUL-terminated string.
    match unsafe { CStr::from_ptr(s) }.to_str() {
        Ok(s) => Ok(Some(s)),
        Err(_) => fail(status::INVALID_ARGUMENT, format!("{function}: {what} is not UTF-8")),
    }
}

// ------------------------------------------------------------ the API

/// Starts the agent. `config`: NULL reads the `LIVECOV_*` environment;
/// otherwise a configuration string (`dir=/tmp/cov;listen=127.0.0.1:0;...`,
/// see `Config::from_config_string`).
///
/// # Safety
/// `config` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn livecov_start(config: *const c_char) -> c_int {
    guard(|| {
        let given = unsafe { text("livecov_start", "the configuration", config) }?;
        let config = match given {
            None => {
                if agent::current().is_some() {
                    return Ok(());
                }
                match Config::from_env() {
                    Ok(Some(config)) => config,
                    Ok(None) => {
                        return fail(
                            status::DISABLED,
                            "livecov_start: LIVECOV_DIR and LIVECOV_LISTEN are unset: the agent stays off \
                             (livecov_start(\"\") starts it for the API only)",
                        )
                    }
                    Err(e) => return fail(status::BAD_CONFIG, format!("livecov_start: {e}")),
                }
            }
            Some(text) => Config::from_config_string(text)
                .map_err(|e| Failure { code: status::BAD_CONFIG, message: format!("livecov_start: {e}") })?,
        };
        if let Some(running) = agent::current() {
            return fail(
                status::ALREADY_STARTED,
                format!(
                    "livecov_start: the agent already runs (instance {}) with its own configuration; \
                     livecov_stop() first to start it with another",
                    running.instance()
                ),
            );
        }
        start(config).map(|_| ())
    })
}

fn start(mut config: Config) -> Result<&'static Agent, Failure> {
    as_native(&mut config);
    agent::start_with(config).map_err(|e| {
        let code = if e.starts_with("internal error") {
            status::INTERNAL
        } else if e.starts_with("another livecov agent") {
            status::ALREADY_STARTED
        } else {
            status::IO
        };
        Failure { code, message: format!("livecov_start: {e}") }
    })
}

/// The LCOV report of the counts since start or the last reset, in a
/// buffer from `malloc` (NUL-terminated; `*len` without the NUL).
///
/// # Safety
/// `test_name` is NULL or a NUL-terminated string; `out` points to a
/// `char *`; `len` is NULL or points to a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn livecov_dump(
    test_name: *const c_char,
    reset: c_int,
    out: *mut *mut c_char,
    len: *mut usize,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return fail(status::INVALID_ARGUMENT, "livecov_dump: out is NULL");
        }
        // Safety: `out` and `len` point to writable variables.
        unsafe {
            *out = std::ptr::null_mut();
            if !len.is_null() {
                *len = 0;
            }
        }
        let name = unsafe { text("livecov_dump", "the test name", test_name) }?.filter(|n| !n.is_empty());
        if name.is_some_and(|n| n.chars().any(char::is_control)) {
            return fail(status::INVALID_ARGUMENT, "livecov_dump: the test name has control characters");
        }
        let agent = running("livecov_dump")?;
        let report = agent.lcov(name, reset != 0).map_err(coverage_failure)?;
        // Safety: a fresh allocation of len + 1 bytes, filled below.
        let buffer = unsafe { libc::malloc(report.len() + 1) } as *mut u8;
        if buffer.is_null() {
            return fail(status::INTERNAL, "livecov_dump: out of memory");
        }
        unsafe {
            std::ptr::copy_nonoverlapping(report.as_ptr(), buffer, report.len());
            *buffer.add(report.len()) = 0;
            *out = buffer as *mut c_char;
            if !len.is_null() {
                *len = report.len();
            }
        }
        Ok(())
    })
}

/// Frees a buffer of `livecov_dump`. NULL is allowed.
///
/// # Safety
/// `buffer` is NULL or a buffer from `livecov_dump`, not freed yet.
#[no_mangle]
pub unsafe extern "C" fn livecov_free(buffer: *mut c_void) {
    // Safety: allocated with malloc by livecov_dump.
    unsafe { libc::free(buffer) }
}

/// Makes the current counts the zero of later reports.
#[no_mangle]
pub extern "C" fn livecov_reset() -> c_int {
    guard(|| running("livecov_reset")?.reset().map_err(coverage_failure))
}

/// Writes the report to `path` (NULL: `reports/<instance>.lcov` in the
/// agent's directory), atomically.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn livecov_write_report(path: *const c_char) -> c_int {
    guard(|| {
        let path = unsafe { text("livecov_write_report", "the path", path) }?;
        let agent = running("livecov_write_report")?;
        let path = match path {
            Some("") => return fail(status::INVALID_ARGUMENT, "livecov_write_report: the path is empty"),
            Some(p) => Path::new(p).to_path_buf(),
            None => agent.report_file().ok_or_else(|| Failure {
                code: status::INVALID_ARGUMENT,
                message: "livecov_write_report: the agent has no directory (dir=): give a path".into(),
            })?,
        };
        agent.write_report_to(&path).map_err(|e| {
            let mut f = coverage_failure(e);
            f.message = format!("livecov_write_report: {}", f.message);
            f
        })
    })
}

/// Stops the agent: final report, socket removed, signals restored.
#[no_mangle]
pub extern "C" fn livecov_stop() -> c_int {
    guard(|| {
        if agent::stop() {
            Ok(())
        } else {
            fail(status::NOT_STARTED, "livecov_stop: the agent is not running")
        }
    })
}

/// The message of this thread's last failed call ("" after a success).
#[no_mangle]
pub extern "C" fn livecov_last_error() -> *const c_char {
    static EMPTY: &CStr = c"";
    LAST_ERROR.try_with(|e| e.borrow().as_ptr()).unwrap_or(EMPTY.as_ptr())
}

/// The running agent's instance id, or NULL. The string stays valid for
/// the life of the process.
#[no_mangle]
pub extern "C" fn livecov_instance() -> *const c_char {
    static SEEN: Mutex<Vec<&'static CStr>> = Mutex::new(Vec::new());
    catch_unwind(|| {
        let Some(agent) = agent::current() else { return std::ptr::null() };
        let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = seen.iter().find(|s| s.to_bytes() == agent.instance().as_bytes()) {
            return s.as_ptr();
        }
        let Ok(s) = CString::new(agent.instance()) else { return std::ptr::null() };
        let s: &'static CStr = Box::leak(s.into_boxed_c_str());
        seen.push(s);
        s.as_ptr()
    })
    .unwrap_or(std::ptr::null())
}

/// The name of a status code (`"LIVECOV_IO"`), or `"LIVECOV_UNKNOWN"`.
#[no_mangle]
pub extern "C" fn livecov_status_name(code: c_int) -> *const c_char {
    let name: &'static CStr = match code {
        status::OK => c"LIVECOV_OK",
        status::NOT_STARTED => c"LIVECOV_NOT_STARTED",
        status::BAD_CONFIG => c"LIVECOV_BAD_CONFIG",
        status::IO => c"LIVECOV_IO",
        status::NO_COVERAGE => c"LIVECOV_NO_COVERAGE",
        status::ALREADY_STARTED => c"LIVECOV_ALREADY_STARTED",
        status::DISABLED => c"LIVECOV_DISABLED",
        status::INVALID_ARGUMENT => c"LIVECOV_INVALID_ARGUMENT",
        status::BAD_COVERAGE => c"LIVECOV_BAD_COVERAGE",
        status::INTERNAL => c"LIVECOV_INTERNAL",
        _ => c"LIVECOV_UNKNOWN",
    };
    name.as_ptr()
}

/// The library's version, e.g. `"0.1.0"`.
#[no_mangle]
pub extern "C" fn livecov_version() -> *const c_char {
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    VERSION.as_ptr() as *const c_char
}

// ------------------------------------------------------------ preloading

/// Runs when the dynamic loader initializes liblivecov.so (before `main`
/// for `LD_PRELOAD` and `-llivecov`).
#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;

extern "C" fn constructor() {
    let _ = catch_unwind(|| {
        // This library's own std (the program has none, or its own): the
        // default hook would print a panic as the program's own, in lines
        // that never name livecov.
        std::panic::set_hook(Box::new(|panic| {
            let message = panic.payload().downcast_ref::<&str>().copied();
            let message = message.or_else(|| panic.payload().downcast_ref::<String>().map(String::as_str));
            let place = panic.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            say(format_args!(
                "internal error{place}: {} (please report it; the program goes on)",
                message.unwrap_or("a panic")
            ));
        }));
        let Some(own) = own_module::find().filter(|m| m.index != 0) else {
            // Linked statically into the program (the module holding this
            // code is the executable): it calls livecov_start.
            return;
        };
        own_module::keep_code_pages(&own);
        autostart();
    });
}

/// Starts from the environment, if it asks for it and the program has
/// something to cover. Messages go to stderr: there is no caller.
fn autostart() {
    let clock = Instant::now();
    let mut config = match Config::from_env() {
        Ok(Some(config)) => config,
        Ok(None) => return,
        Err(e) => {
            say(format_args!("not started: {e}"));
            return;
        }
    };
    if agent::current().is_some() {
        return;
    }
    agent::end_replaced_instances(&config);
    if !agent::has_instrumented_module() {
        let program = std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or_default();
        say(format_args!(
            "not started in {program} (pid {}): no LLVM-instrumented module is loaded (build with \
             -fprofile-instr-generate -fcoverage-mapping, or -C instrument-coverage)",
            std::process::id()
        ));
        return;
    }
    as_native(&mut config);
    // The runtime's descriptors here, before `main`, past the numbers
    // programs use (see `agent::server::prebuild_runtime`).
    agent::server::prebuild_runtime();
    // In the background: the socket and the metadata are made on the
    // agent's thread, not before `main`.
    match agent::start_in_background(config) {
        Ok(agent) => {
            if std::env::var_os("LIVECOV_VERBOSE").is_some_and(|v| v != "0") {
                say(format_args!("started {} in {} us", agent.instance(), clock.elapsed().as_micros()));
            }
        }
        Err(e) => say(format_args!("not started: {e}")),
    }
}

/// What the engine's work left resident and no longer uses, given back:
/// the mappings the allocator kept for it (but those kept for the next
/// dump) and its free scratch memory; for a warm dump, once its answer is
/// sent (`Config::after_engine_work`). The pages of the agent's code go once
/// the answer's connection is closed too (`Config::after_answers`):
/// sending a report runs most of the code a dump ran.
fn after_engine_work() {
    allocator::release_kept(false);
    scratch::release();
}

/// Once no dump came for a while: what was kept for the next dump's
/// speed, given back (the pages of the agent's code, every freed mapping).
fn at_rest() {
    allocator::release_kept(true);
    own_module::release_code_pages();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by each test of the crate: scratch memory, while one test has
    /// it on, serves every thread's small blocks, and a block whose chunk
    /// another thread is cutting falls back to `malloc`.
    pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
        static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn last_error() -> String {
        // Safety: a NUL-terminated string of this thread.
        unsafe { CStr::from_ptr(livecov_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_is_a_status_and_a_message() {
        let _serial = serial();
        assert_eq!(guard(|| panic!("boom")), status::INTERNAL);
        assert!(last_error().contains("internal error: boom"), "{}", last_error());
        assert_eq!(guard(|| Ok(())), status::OK);
        assert_eq!(last_error(), "");
    }

    #[test]
    fn status_names_match_the_header() {
        let _serial = serial();
        let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/livecov.h")).unwrap();
        for code in 0..=status::INTERNAL {
            // Safety: static strings.
            let name = unsafe { CStr::from_ptr(livecov_status_name(code)) }.to_str().unwrap();
            let entry = format!("{name} = {code}");
            let at = header.find(&entry).unwrap_or_else(|| panic!("{entry} is not in livecov.h"));
            assert!(!header[at + entry.len()..].starts_with(|c: char| c.is_ascii_digit()), "{entry}");
        }
    }

    #[test]
    fn the_version_is_the_crate_version() {
        let _serial = serial();
        // Safety: a static string.
        let v = unsafe { CStr::from_ptr(livecov_version()) }.to_str().unwrap();
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
    }
}
