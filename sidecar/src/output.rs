//! Where a command's result goes: a file, written atomically, standard
//! output, or a device or pipe named as the output.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Writes `bytes` to `path` through a temporary file in the same folder
/// and a rename, so that a reader never sees a torn file; or to standard
/// output when `path` is `None` or `-`.
pub fn write_output(path: Option<&Path>, bytes: &[u8]) -> Result<()> {
    Output::open(path)?.commit(bytes)
}

/// Writes several files as [`write_output`] writes one, with one flush to
/// disk for all of them (`syncfs`) instead of one `fsync` per file: a
/// collection from many instances writes many small files, and a flush per
/// file made it wait on the disk once per instance.
pub fn write_outputs(files: &[(PathBuf, &[u8])]) -> Result<()> {
    let Some((first, _)) = files.first() else { return Ok(()) };
    let mut written = Vec::with_capacity(files.len());
    for (path, bytes) in files {
        // Flushed all at once below.
        let mut file = AtomicFile::create(path, Flush::ToDisk)?;
        let mut f = file.file.take().expect("an uncommitted file");
        f.write_all(bytes).with_context(|| format!("cannot write {}", file.tmp.display()))?;
        // Closed now (no descriptor per instance held open), still removed
        // on drop until renamed.
        written.push(file);
    }
    let folder = first.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = fs::File::open(folder).with_context(|| format!("cannot open {}", folder.display()))?;
    // Safety: `dir` is an open descriptor of ours.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("cannot flush {} to disk", folder.display()));
    }
    for file in &written {
        fs::rename(&file.tmp, &file.path)
            .with_context(|| format!("cannot rename {} to {}", file.tmp.display(), file.path.display()))?;
    }
    Ok(())
}

/// Room kept on a disk: `len` bytes allocated to a temporary file in
/// `folder`, given back when dropped. A command that does what it cannot
/// undo (a collection that resets its targets) keeps room for its result
/// first, and fails before it on a disk without that room.
pub struct Reserved {
    _file: AtomicFile,
}

/// At least this much room is kept (see [`reserve`]).
const MIN_RESERVED: u64 = 64 << 10;

/// Keeps `len` bytes (at least [`MIN_RESERVED`]) in `folder`.
pub fn reserve(folder: &Path, len: u64) -> Result<Reserved> {
    let len = len.max(MIN_RESERVED);
    let file = AtomicFile::create(&folder.join("reserved"), Flush::ToKernel)?;
    let f = file.file.as_ref().expect("an uncommitted file");
    let len = libc::off_t::try_from(len).unwrap_or(libc::off_t::MAX);
    // Safety: `f` is an open descriptor of ours. The call returns the
    // error, it does not set errno.
    match unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(f), 0, len) } {
        0 => Ok(Reserved { _file: file }),
        e => Err(std::io::Error::from_raw_os_error(e))
            .with_context(|| format!("cannot keep {len} bytes in {} for the result", folder.display())),
    }
}

/// An output opened before its content is known, so that a command that
/// cannot write its result fails before doing anything it cannot undo
/// (such as resetting a target's counters).
pub enum Output {
    Stdout,
    File(AtomicFile),
    /// A path that is neither a file nor a folder: `/dev/null`, a named
    /// pipe, `/dev/fd/N` of a shell's `>(...)`. Written as it is: a file
    /// renamed over it would replace it (as root, `/dev/null` itself).
    Special(PathBuf, fs::File),
}

impl Output {
    /// Standard output for `None` or `-`, else a temporary file beside
    /// `path` (or `path` itself when it is a device or a pipe), flushed to
    /// disk before it is renamed into place: for what cannot be made again,
    /// such as the counters a dump took from a live process.
    pub fn open(path: Option<&Path>) -> Result<Output> {
        Output::open_as(path, Flush::ToDisk)
    }

    /// As [`open`](Output::open), for a result derived from files that stay
    /// where they are (a conversion, a merge, a report): renamed into place
    /// atomically, but not flushed to disk first, as compilers and llvm-cov
    /// do not flush theirs. A crash then loses only what the same command
    /// makes again, and the command does not wait on the disk (`livecov
    /// convert` of a 3.7 MB report waited 3-7 ms in `fsync`).
    pub fn open_derived(path: Option<&Path>) -> Result<Output> {
        Output::open_as(path, Flush::ToKernel)
    }

    fn open_as(path: Option<&Path>, flush: Flush) -> Result<Output> {
        match path {
            Some(path) if path != Path::new("-") => {
                if fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
                    let file = fs::OpenOptions::new()
                        .write(true)
                        .open(path)
                        .with_context(|| format!("cannot open {} for writing", path.display()))?;
                    return Ok(Output::Special(path.to_owned(), file));
                }
                Ok(Output::File(AtomicFile::create(path, flush)?))
            }
            _ => Ok(Output::Stdout),
        }
    }

    /// Keeps room on the disk for a result as long as the last one at
    /// this path (see [`reserve`]), for a file; nothing for a device. For
    /// standard output, fails when it is a pipe whose reader is gone.
    pub fn reserve(&self) -> Result<Option<Reserved>> {
        if self.is_stdout() && stdout_closed() {
            bail!("{StdoutClosed}: nothing reset");
        }
        let Output::File(file) = self else { return Ok(None) };
        let folder = file.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        reserve(folder, fs::metadata(&file.path).map_or(0, |m| m.len())).map(Some)
    }

    pub fn is_stdout(&self) -> bool {
        matches!(self, Output::Stdout)
    }

    /// Writes what `write` writes (through a buffer) and, for a file,
    /// renames it into place.
    pub fn commit_with(self, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<()> {
        match self {
            Output::Stdout => {
                let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
                to_stdout(write(&mut out).and_then(|()| out.flush()))
            }
            Output::File(mut file) => {
                let f = file.file.as_mut().expect("an uncommitted file");
                let mut out = std::io::BufWriter::with_capacity(1 << 16, f);
                let written = write(&mut out).and_then(|()| out.flush());
                drop(out);
                written.with_context(|| format!("cannot write {}", file.tmp.display()))?;
                file.commit(&[])
            }
            Output::Special(path, file) => {
                let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
                write(&mut out).and_then(|()| out.flush()).with_context(|| format!("cannot write {}", path.display()))
            }
        }
    }

    pub fn commit(self, bytes: &[u8]) -> Result<()> {
        match self {
            Output::Stdout => {
                let mut out = std::io::stdout().lock();
                to_stdout(out.write_all(bytes).and_then(|()| out.flush()))
            }
            Output::File(file) => file.commit(bytes),
            Output::Special(path, mut file) => file.write_all(bytes).with_context(|| format!("cannot write {}", path.display())),
        }
    }
}

/// Standard output closed by its reader (`livecov merge ... | head`): the
/// command ends quietly and successfully, as a filter whose reader has what
/// it wanted.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output closed by its reader")
    }
}

impl std::error::Error for StdoutClosed {}

/// Whether standard output is a pipe whose reader is gone (the kernel
/// says so as an error condition of its write end).
fn stdout_closed() -> bool {
    let mut out = libc::pollfd { fd: 1, events: libc::POLLOUT, revents: 0 };
    // Safety: one pollfd of ours; a zero timeout never waits.
    unsafe { libc::poll(&mut out, 1, 0) == 1 && out.revents & libc::POLLERR != 0 }
}

fn to_stdout(written: std::io::Result<()>) -> Result<()> {
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        other => other.context("writing to standard output"),
    }
}

/// How far a file is flushed before it is renamed into place.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flush {
    /// To disk (`fsync`): after a crash, the new file or the old one.
    ToDisk,
    /// To the kernel, which writes it back in its own time.
    ToKernel,
}

/// A temporary file beside its destination, renamed over it on
/// [`commit`](AtomicFile::commit) and removed if dropped before.
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<fs::File>,
    flush: Flush,
}

impl AtomicFile {
    fn create(path: &Path, flush: Flush) -> Result<AtomicFile> {
        let name = path.file_name().with_context(|| format!("{} is not a file name", path.display()))?;
        let tmp = path.with_file_name(format!(".{}.tmp.{}", name.to_string_lossy(), std::process::id()));
        let file = fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        Ok(AtomicFile { path: path.to_owned(), tmp, file: Some(file), flush })
    }

    pub fn commit(mut self, bytes: &[u8]) -> Result<()> {
        let mut file = self.file.take().expect("an uncommitted file");
        file.write_all(bytes)
            .and_then(|()| if self.flush == Flush::ToDisk { file.sync_all() } else { Ok(()) })
            .with_context(|| format!("cannot write {}", self.tmp.display()))?;
        drop(file);
        fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("cannot rename {} to {}", self.tmp.display(), self.path.display()))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        // Not committed, or the commit failed: leave nothing behind.
        if self.file.is_some() || self.tmp.exists() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_the_file_and_leave_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.lcov");
        write_output(Some(&out), b"one").unwrap();
        write_output(Some(&out), b"two").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        // A derived output (not flushed to disk) is replaced the same way.
        Output::open_derived(Some(&out)).unwrap().commit_with(|w| w.write_all(b"three")).unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"three");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        let e = write_output(Some(&dir.path().join("missing/out.lcov")), b"x").unwrap_err();
        assert!(format!("{e:#}").contains("cannot create"), "{e:#}");
        // Opened and dropped: nothing left.
        drop(Output::open(Some(&dir.path().join("other.lcov"))).unwrap());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn several_files_are_written_with_one_flush() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.lcov"), dir.path().join("b.lcov"));
        write_outputs(&[(a.clone(), b"one"), (b.clone(), b"two")]).unwrap();
        write_outputs(&[(a.clone(), b"three")]).unwrap();
        assert_eq!((fs::read(&a).unwrap(), fs::read(&b).unwrap()), (b"three".to_vec(), b"two".to_vec()));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2, "no temporary file left");
        // One that cannot be created: an error naming it, and nothing of the batch renamed or left.
        let c = dir.path().join("c.lcov");
        let e = write_outputs(&[(c.clone(), b"x"), (dir.path().join("missing/d.lcov"), b"y")]).unwrap_err();
        assert!(format!("{e:#}").contains("cannot create"), "{e:#}");
        assert!(!c.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
