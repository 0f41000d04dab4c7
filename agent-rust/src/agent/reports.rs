//! An instance's files in `reports/` (its metadata, its LCOV report and the
//! counters the report was computed from, for an exact merge), and how they
//! stay writable after the process gives up the rights it started
//! with.
//!
//! Files are written to a temporary name beside them and renamed, so that
//! readers never see a torn file. But a worker forked by a server started as
//! root (nginx, apache, many pre-fork daemons) switches to an unprivileged
//! user soon after the fork: from then on the `reports/` folder, root's, lets
//! it create no file, and its final report would be lost. So an instance
//! that starts as root opens both of its files while it still can and keeps
//! the descriptors; when the rename is refused, the file is rewritten in
//! place through its descriptor. (While such a rewrite runs, a reader may
//! see a partial file; the sidecar reads a report again whenever its size or
//! time changes.) Processes that do not start as root hold no descriptor.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::stderr::say;

/// `reports/<instance>.json`, `reports/<instance>.lcov` and
/// `reports/<instance>.counters`.
pub struct InstanceFiles {
    pub metadata: InstanceFile,
    pub report: InstanceFile,
    /// The build mapping id, a newline, then the counters document (gzip,
    /// see `crate::fleet`): what `?format=counters` answers.
    pub counters: InstanceFile,
}

impl InstanceFiles {
    pub fn new(dir: &Path, instance: &str) -> InstanceFiles {
        let reports = dir.join("reports");
        InstanceFiles {
            metadata: InstanceFile::new(reports.join(format!("{instance}.json"))),
            report: InstanceFile::new(reports.join(format!("{instance}.lcov"))),
            counters: InstanceFile::new(reports.join(format!("{instance}.counters"))),
        }
    }

    /// Prepares the files when the process runs as root, the one that
    /// changes its user after a fork. Once the metadata is written: the
    /// report is then made empty, as sidecars read it before it has content
    /// (an empty counters file is one a collector leaves aside).
    pub fn prepare_if_privileged(&self) {
        // Safety: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        for file in [&self.metadata, &self.report, &self.counters] {
            if let Err(e) = file.prepare() {
                say(format_args!(
                    "cannot open {}: {e} (if the process changes its user, its reports may be lost)",
                    file.path().display()
                ));
            }
        }
    }

    pub fn close_in_child(&self) {
        self.metadata.close_in_child();
        self.report.close_in_child();
        self.counters.close_in_child();
    }
}

/// Ends the instances of this process that an earlier program of it left
/// `running` in `dir`: a forked child that ran another program (`exec`)
/// lost its agent without a final report, and its socket stayed, where
/// nothing answers. Run by the next program of the process, which the
/// preloaded C shim reaches whether it is instrumented or not (a forked
/// child of a server that runs a helper is most often the one).
///
/// Its metadata then says `exited`, with `exec` the program that took its
/// place, and its socket goes; its report stays as it was (what it ran
/// since its last report, at most what ran between its fork and the
/// `exec`, is not in it). An instance that wrote no report (most: a child
/// runs its helper at once) leaves no file at all: a server that runs a
/// helper for each request left three files for each in `reports/`, which
/// every collection read. Its pid is this process's, and it started after
/// this process did: the pid of a process that ended without a final
/// report and was given to this one is left alone.
pub fn end_replaced_instances(dir: &Path) {
    let pid = std::process::id();
    let Ok(sockets) = std::fs::read_dir(dir.join("sockets")) else { return };
    let earlier = sockets.flatten().filter_map(|e| {
        let name = e.file_name().into_string().ok()?;
        let instance = name.strip_suffix(".sock")?;
        let (_, rest) = instance.split_once('-')?;
        (rest.split_once('-')?.0 == pid.to_string()).then(|| instance.to_owned())
    });
    let mut started_at = None;
    for instance in earlier.collect::<Vec<_>>() {
        let metadata = dir.join("reports").join(format!("{instance}.json"));
        let Some(mut meta) = std::fs::read(&metadata).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok()) else {
            continue;
        };
        let agent_started = meta["start_time"].as_u64();
        let process_started = *started_at.get_or_insert_with(process_start_secs);
        let ours = meta["pid"].as_u64() == Some(u64::from(pid))
            && meta["state"] == "running"
            && agent_started.zip(process_started).is_some_and(|(agent, process)| process <= agent);
        if !ours {
            continue;
        }
        meta["state"] = "exited".into();
        meta["exec"] = super::modules::executable_path().display().to_string().into();
        let json = meta.to_string();
        if write_atomically(&metadata, &[json.as_bytes()]).is_err() {
            continue;
        }
        let _ = std::fs::remove_file(dir.join("sockets").join(format!("{instance}.sock")));
        // Removed last, the metadata: a collection meanwhile sees an
        // instance that exited, without a report.
        let files = InstanceFiles::new(dir, &instance);
        let empty = |file: &InstanceFile| std::fs::metadata(file.path()).map_or(true, |m| m.len() == 0);
        if empty(&files.report) && empty(&files.counters) {
            for file in [&files.report, &files.counters, &files.metadata] {
                let _ = std::fs::remove_file(file.path());
            }
        }
    }
}

/// When this process started (seconds since the epoch, rounded down), as
/// the kernel counts it: a process keeps it across `exec`.
fn process_start_secs() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Field 22, counted after the command name (field 2), which may hold
    // spaces and parentheses.
    let ticks: u64 = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat").ok()?.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    // Safety: sysconf has no preconditions.
    let per_sec = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&t| t > 0)?;
    Some(boot + ticks / per_sec)
}

/// One of an instance's files.
pub struct InstanceFile {
    path: PathBuf,
    /// Open on the file now at `path`, once [`InstanceFile::prepare`]d.
    prepared: Mutex<Option<Prepared>>,
}

struct Prepared {
    /// Closed on drop only while it still is that file (see `id`).
    file: std::mem::ManuallyDrop<File>,
    /// (device, inode) when opened: the descriptor is only written through
    /// or closed while it still is that file (a daemon that closes every
    /// descriptor may have reused its number for one of its own).
    id: (u64, u64),
}

impl InstanceFile {
    pub fn new(path: PathBuf) -> InstanceFile {
        InstanceFile { path, prepared: Mutex::new(None) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the file for later rewrites in place (creating it empty if it
    /// does not exist yet), for a process that may lose the right to create
    /// files in its folder.
    pub fn prepare(&self) -> io::Result<()> {
        let prepared = Prepared::open(&self.path)?;
        *super::lock(&self.prepared) = Some(prepared);
        Ok(())
    }

    /// Replaces the file's content: atomically where the folder allows it,
    /// else in place through the prepared descriptor.
    pub fn write(&self, bytes: &[&[u8]]) -> io::Result<()> {
        let mut prepared = super::lock(&self.prepared);
        match write_atomically(&self.path, bytes) {
            Ok(()) => {
                // The rename put a new file at the path: follow it.
                if prepared.is_some() {
                    *prepared = Prepared::open(&self.path).ok();
                }
                Ok(())
            }
            // Refused, or out of sight after a `chroot`.
            Err(e) if matches!(e.kind(), io::ErrorKind::PermissionDenied | io::ErrorKind::NotFound) => match prepared.as_ref() {
                Some(p) => p.rewrite(&self.path, bytes),
                None if e.kind() == io::ErrorKind::PermissionDenied => Err(denied(e, &self.path)),
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// In a forked child: the descriptor is the parent's instance's, which
    /// this process no longer writes; closed so that it does not leak into
    /// every worker. (If a parent thread held the lock at the fork, the lock
    /// is never released in the child: then it is left open.)
    pub fn close_in_child(&self) {
        if let Ok(mut prepared) = self.prepared.try_lock() {
            prepared.take();
        }
    }
}

impl Prepared {
    fn open(path: &Path) -> io::Result<Prepared> {
        // std opens with O_CLOEXEC: the program's exec'd children do not
        // inherit it.
        let file = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(path)?;
        let file = super::descriptors::moved_up(file);
        let meta = file.metadata()?;
        super::descriptors::keep(file.as_raw_fd());
        Ok(Prepared { file: std::mem::ManuallyDrop::new(file), id: (meta.dev(), meta.ino()) })
    }

    fn rewrite(&self, path: &Path, bytes: &[&[u8]]) -> io::Result<()> {
        let current = self.file.metadata()?;
        // After a `chroot` the name leads nowhere: the descriptor is still
        // the file it opened.
        let named = match std::fs::metadata(path) {
            Ok(named) => Some((named.dev(), named.ino())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if (current.dev(), current.ino()) != self.id || named.is_some_and(|named| named != self.id) {
            return Err(io::Error::other(format!(
                "{} was replaced or its descriptor closed since the process started; \
                 nothing written",
                path.display()
            )));
        }
        // Room for all of it first: on a full disk the rewrite is refused
        // before a byte of the last content is overwritten.
        let len: u64 = bytes.iter().map(|chunk| chunk.len() as u64).sum();
        if len > current.len() {
            let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
            // Safety: fallocate on a descriptor this value owns; it returns
            // the error number rather than setting errno.
            match unsafe { libc::posix_fallocate(self.file.as_raw_fd(), 0, len) } {
                0 => {}
                e => return Err(io::Error::from_raw_os_error(e)),
            }
        }
        // Content first, then the length: a reader sees old or new bytes,
        // never a file cut short of what was written.
        let mut at = 0;
        for chunk in bytes {
            self.file.write_all_at(chunk, at)?;
            at += chunk.len() as u64;
        }
        self.file.set_len(at)
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        super::descriptors::forget(self.file.as_raw_fd());
        if self.file.metadata().is_ok_and(|now| (now.dev(), now.ino()) == self.id) {
            // Safety: dropped once, here, and not used after.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.file) };
        }
    }
}

/// Permission denied, with who was denied and what would help.
fn denied(e: io::Error, path: &Path) -> io::Error {
    // Safety: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let folder = path.parent().unwrap_or(Path::new(".")).display();
    io::Error::new(
        e.kind(),
        format!("{e} (the process runs as uid {uid}, gid {gid}, and cannot create files in {folder}: make that folder writable for it)"),
    )
}

/// Writes to a temporary name beside `path`, then renames: readers never
/// see a torn file.
/// `bytes` are written one after the other (a report in its chunks).
pub fn write_atomically(path: &Path, bytes: &[&[u8]]) -> io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let write = || -> io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        for chunk in bytes {
            file.write_all(chunk)?;
        }
        Ok(())
    };
    write().and_then(|()| std::fs::rename(&tmp, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("livecov-reports-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_prepared_file_follows_renames_and_is_rewritten_in_place() {
        let dir = scratch("prepared");
        let f = InstanceFile::new(dir.join("i.json"));
        f.write(&[b"first, long enough"]).unwrap();
        f.prepare().unwrap();
        f.write(&[b"second, ", b"renamed"]).unwrap();
        // What a write does once the folder refuses the rename (the process
        // changed its user; a test run as root cannot be refused it).
        let guard = super::super::lock(&f.prepared);
        guard.as_ref().expect("still prepared").rewrite(f.path(), &[b"th", b"ird"]).unwrap();
        drop(guard);
        assert_eq!(std::fs::read(f.path()).unwrap(), b"third");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// On a full disk (a tmpfs filled up; the tests run as root), a longer
    /// rewrite is refused whole: the last content stays.
    #[test]
    fn a_rewrite_in_place_that_does_not_fit_leaves_the_last_content() {
        use std::io::Write;
        use std::process::Command;
        let dir = scratch("full");
        let disk = dir.join("disk");
        std::fs::create_dir_all(&disk).unwrap();
        let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=16k", "tmpfs"]).arg(&disk).status();
        assert!(mounted.is_ok_and(|s| s.success()), "mount a tmpfs at {}", disk.display());
        let f = InstanceFile::new(disk.join("i.lcov"));
        f.write(&[b"the last report"]).unwrap();
        f.prepare().unwrap();
        let mut filler = File::create(disk.join("filler")).unwrap();
        while filler.write_all(&[0; 1024]).is_ok() {}
        let guard = super::super::lock(&f.prepared);
        let rewritten = guard.as_ref().expect("prepared").rewrite(f.path(), &[&[b'x'; 64 << 10]]);
        drop(guard);
        let left = std::fs::read(f.path());
        // Unmounted before any assertion: a failing one leaves no mount.
        let _ = Command::new("umount").arg("-l").arg(&disk).status();
        let (err, left) = (rewritten.unwrap_err(), left.unwrap());
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        assert_eq!(String::from_utf8_lossy(&left), "the last report");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_replaced_file_is_not_written_through_a_stale_descriptor() {
        let dir = scratch("replaced");
        let f = InstanceFile::new(dir.join("i.lcov"));
        f.prepare().unwrap();
        std::fs::remove_file(f.path()).unwrap();
        std::fs::write(f.path(), b"someone else's").unwrap();
        let guard = super::super::lock(&f.prepared);
        let err = guard.as_ref().unwrap().rewrite(f.path(), &[b"ours"]).unwrap_err();
        assert!(err.to_string().contains("replaced"), "{err}");
        drop(guard);
        assert_eq!(std::fs::read(f.path()).unwrap(), b"someone else's");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
