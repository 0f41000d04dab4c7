//! A disk that fills up: a small tmpfs mounted at a folder of the test
//! while it lives (the tests run as root), for what livecov does when
//! nothing more can be written.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct SmallDisk(PathBuf);

impl SmallDisk {
    /// A tmpfs of `size` (`mount -o size=`) at `at`, created if need be.
    pub fn mount(at: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(at).expect("create the mount point");
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(at).output();
        let out = out.expect("run mount");
        assert!(out.status.success(), "mount a tmpfs at {}: {}", at.display(), String::from_utf8_lossy(&out.stderr));
        SmallDisk(at.to_owned())
    }

    /// Writes a file (`filler`) until no byte more fits.
    pub fn fill(&self) {
        use std::io::Write;
        let mut filler = std::fs::File::create(self.0.join("filler")).expect("create the filler");
        let block = [0u8; 4096];
        let full = loop {
            if let Err(e) = filler.write_all(&block) {
                break e;
            }
        };
        // ENOSPC (28 on Linux).
        assert_eq!(full.raw_os_error(), Some(28), "{full}");
    }
}

impl SmallDisk {
    /// Room again: the filler removed.
    pub fn empty(&self) {
        std::fs::remove_file(self.0.join("filler")).expect("remove the filler");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
