//! nginx, a real pre-fork daemon, under `LD_PRELOAD=liblivecov.so`: nginx
//! from Debian's source package built with clang-19 and coverage
//! (tests/scripts/deps-nginx.sh, which `make test` runs), started as root
//! with a master and two workers that drop root for nobody
//! (fixtures/nginx/nginx.conf). It serves, and the master's signals work
//! as without the agent: graceful stop (SIGQUIT), reload (SIGHUP), log
//! reopening (SIGUSR1). Every process leaves its final report, the workers
//! too after they changed user, and a worker killed without one is `lost`.
//! The merge (`livecov collect --dir`) counts nginx's request handling.
//! Each scenario runs 5 times; every wait has a deadline, and nginx runs in
//! a process group of its own, killed whole when a test ends.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::fs;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use livecov_tests::http::{exchange, unix_request, Response};
use livecov_tests::lcov::{file_ending, parse_lcov};
use livecov_tests::{free_port, livecov_bin};
use livecov_tests::native::{clean_command, debian_build, liblivecov};
use livecov_tests::service::find_instance;
use livecov_tests::workspace_root;

/// Runs of each scenario.
const RUNS: usize = 5;
/// How long a graceful stop may take: nginx's own is immediate when no
/// connection is open.
const STOP_WITHIN: Duration = Duration::from_secs(5);
/// Longest wait for nginx to get where a test wants it.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// Longest a request or a collection may take.
const REQUEST_WITHIN: Duration = Duration::from_secs(5);
const COLLECT_WITHIN: Duration = Duration::from_secs(60);

const INDEX: &str = "hello from nginx\n";
/// The function that serves files, once per request of a path.
const STATIC_HANDLER: &str = "ngx_http_static_module.c:ngx_http_static_handler";

/// nginx as deps-nginx.sh built it (target/nginx/current).
fn nginx_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = debian_build("nginx", "src/objs/nginx");
        // Its profile is nobody's: not written into the test's folder.
        let version = clean_command(&bin).env("LLVM_PROFILE_FILE", "/dev/null").arg("-V").output().expect("nginx -V");
        let text = String::from_utf8_lossy(&version.stderr);
        assert!(text.contains("-fcoverage-mapping"), "{} is not the coverage build: {text}", bin.display());
        bin
    })
}

/// The user nginx's workers become, and its group.
struct Nobody {
    uid: u32,
    group: String,
}

fn nobody() -> &'static Nobody {
    static NOBODY: OnceLock<Nobody> = OnceLock::new();
    NOBODY.get_or_init(|| {
        // Safety: getpwnam and getgrgid return static records (or NULL),
        // read at once and only once (this OnceLock).
        unsafe {
            let pw = libc::getpwnam(c"nobody".as_ptr());
            assert!(!pw.is_null(), "no user nobody in /etc/passwd");
            let gr = libc::getgrgid((*pw).pw_gid);
            assert!(!gr.is_null(), "no group of gid {} for nobody", (*pw).pw_gid);
            Nobody { uid: (*pw).pw_uid, group: CStr::from_ptr((*gr).gr_name).to_string_lossy().into_owned() }
        }
    })
}

/// The real, effective, saved and file-system uids of a process.
fn uids(pid: u32) -> Option<Vec<u32>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    Some(line.split_whitespace().map(|u| u.parse().expect("a uid")).collect())
}

/// The parent of a process, from /proc/PID/stat (after the name, which
/// may hold spaces and parentheses).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split(' ').nth(1)?.parse().ok()
}

/// A folder for one nginx, in the system's temporary folder: the workers
/// (nobody) read the static root there, so it and every folder above it
/// must be open to others whatever the umask.
fn site_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("livecov-nginx-{}-{name}", std::process::id()));
    for ancestor in dir.ancestors().skip(1) {
        let mode = fs::metadata(ancestor).map(|m| m.permissions().mode()).unwrap_or(0);
        assert!(mode & 0o001 != 0, "{} is not traversable by nobody (mode {mode:o}): set TMPDIR elsewhere", ancestor.display());
    }
    let _ = fs::remove_dir_all(&dir);
    for sub in ["", "html", "logs"] {
        let d = dir.join(sub);
        fs::create_dir_all(&d).expect("create the site's folders");
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).expect("chmod 755");
    }
    let index = dir.join("html/index.html");
    fs::write(&index, INDEX).expect("write index.html");
    fs::set_permissions(&index, fs::Permissions::from_mode(0o644)).expect("chmod 644");
    dir
}

/// An instance's metadata in reports/.
#[derive(Debug)]
struct Meta {
    instance: String,
    state: String,
}

/// What `livecov collect --dir` wrote.
struct Collected {
    manifest: serde_json::Value,
    merged: String,
}

impl Collected {
    /// The manifest's target of `instance`.
    fn target(&self, instance: &str) -> &serde_json::Value {
        let targets = self.manifest["targets"].as_array().expect("targets");
        targets
            .iter()
            .find(|t| t["instance"] == instance || t["address"].as_str().is_some_and(|a| a.contains(instance)))
            .unwrap_or_else(|| panic!("no target of {instance} in {:#}", self.manifest))
    }
}

fn static_count(lcov: &str) -> u64 {
    let files = parse_lcov(lcov);
    *file_ending(&files, "ngx_http_static_module.c").functions.get(STATIC_HANDLER).expect("the static handler in the LCOV")
}

/// nginx's master (the test's child) and its workers, all killed when dropped.
struct Nginx {
    master: Child,
    dir: PathBuf,
    port: u16,
}

impl Nginx {
    /// nginx with the agent, its master and two workers up, each with its
    /// agent's socket.
    fn start(name: &str) -> Nginx {
        // Safety: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "the nginx tests start nginx as root, as CI runs them, for its workers to drop root");
        let dir = site_dir(name);
        let port = free_port();
        let template = fs::read_to_string(workspace_root().join("fixtures/nginx/nginx.conf")).expect("the nginx.conf template");
        let conf = dir.join("nginx.conf");
        fs::write(
            &conf,
            template
                .replace("@DIR@", &dir.display().to_string())
                .replace("@GROUP@", &nobody().group)
                .replace("@PORT@", &port.to_string()),
        )
        .expect("write nginx.conf");
        let mut command = clean_command(nginx_bin());
        command
            .arg("-p")
            .arg(format!("{}/", dir.display()))
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.join("logs/error.log"))
            .current_dir(&dir)
            .env("LD_PRELOAD", liblivecov())
            .env("LIVECOV_DIR", dir.join("cov"))
            // Exit profiles are not what is tested, and the workers (nobody)
            // could not write them where the master (root) would.
            .env("LLVM_PROFILE_FILE", "/dev/null")
            .stdin(Stdio::null())
            .stdout(fs::File::create(dir.join("stdout")).expect("stdout file"))
            .stderr(fs::File::create(dir.join("stderr")).expect("stderr file"))
            // Its own group: the master and every worker are killed together.
            .process_group(0);
        let master = command.spawn().expect("start nginx");
        let mut nginx = Nginx { master, dir, port };
        nginx.workers_up(&[]);
        let master = nginx.pid();
        assert_eq!(uids(master), Some(vec![0; 4]), "the master runs as root");
        nginx.until("the master's agent", |n| find_instance(&n.cov(), "native", master).map(drop));
        nginx.until("nginx accepting connections", |n| TcpStream::connect(("127.0.0.1", n.port)).ok().map(drop));
        nginx
    }

    fn pid(&self) -> u32 {
        self.master.id()
    }

    fn cov(&self) -> PathBuf {
        self.dir.join("cov")
    }

    fn log(&self, name: &str) -> String {
        fs::read_to_string(self.dir.join("logs").join(name)).unwrap_or_default()
    }

    /// Why a wait failed: nginx's own words and the agent's (which nginx
    /// sends to its error log).
    fn context(&self) -> String {
        let stderr = fs::read_to_string(self.dir.join("stderr")).unwrap_or_default();
        format!("--- error.log ---\n{}\n--- stderr ---\n{stderr}", self.log("error.log"))
    }

    /// Polls `f` until it returns something, for at most [`READY_WITHIN`],
    /// failing at once if the master ends.
    fn until<T>(&mut self, what: &str, mut f: impl FnMut(&Self) -> Option<T>) -> T {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            if let Some(status) = self.master.try_wait().expect("wait") {
                panic!("nginx's master ended ({status}) while the test waited for {what}\n{}", self.context());
            }
            assert!(Instant::now() < deadline, "no {what} within {READY_WITHIN:?}\n{}", self.context());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The master's children.
    fn children(&self) -> Vec<u32> {
        let master = self.pid();
        let mut children: Vec<u32> = fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| parent_of(pid) == Some(master))
            .collect();
        children.sort();
        children
    }

    /// Waits for two workers that are none of `not`, running as nobody,
    /// their agents up; returns them.
    fn workers_up(&mut self, not: &[u32]) -> Vec<u32> {
        let nobody = nobody().uid;
        self.until("two workers running as nobody, with their agents", |n| {
            let workers: Vec<u32> = n.children().into_iter().filter(|p| !not.contains(p)).collect();
            let ready = workers.len() == 2
                && workers.iter().all(|&w| {
                    uids(w) == Some(vec![nobody; 4]) && find_instance(&n.cov(), "native", w).is_some()
                });
            ready.then_some(workers)
        })
    }

    /// Waits until none of `pids` is a child of the master any more.
    fn gone(&mut self, pids: &[u32]) {
        self.until("the retired workers' exit", |n| {
            let children = n.children();
            pids.iter().all(|p| !children.contains(p)).then_some(())
        });
    }

    fn get(&self, path: &str) -> Response {
        let address = (std::net::Ipv4Addr::LOCALHOST, self.port).into();
        let stream = TcpStream::connect_timeout(&address, REQUEST_WITHIN).expect("connect to nginx");
        stream.set_read_timeout(Some(REQUEST_WITHIN)).expect("read timeout");
        stream.set_write_timeout(Some(REQUEST_WITHIN)).expect("write timeout");
        exchange(stream, "GET", path, &[])
    }

    /// `n` requests of files: all but the last one the index, the last one
    /// a missing file (each one call of the static handler).
    fn serve(&self, n: usize) {
        for _ in 1..n {
            let r = self.get("/index.html");
            assert_eq!((r.status, r.text().as_str()), (200, INDEX), "GET /index.html");
        }
        assert_eq!(self.get("/missing").status, 404, "GET /missing");
    }

    fn signal(&self, signal: i32) {
        // Safety: a signal to our own child, not yet waited for.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, signal) }, 0, "kill {signal}");
    }

    /// SIGQUIT: the master ends within [`STOP_WITHIN`], successfully.
    fn stop(&mut self) {
        self.signal(libc::SIGQUIT);
        let deadline = Instant::now() + STOP_WITHIN;
        let status: ExitStatus = loop {
            if let Some(status) = self.master.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "nginx hung: its master still runs {STOP_WITHIN:?} after SIGQUIT\n{}", self.context());
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "nginx's master ended with {status}\n{}", self.context());
    }

    /// reports/*.json by pid.
    fn reports(&self) -> BTreeMap<u32, Meta> {
        let reports = self.cov().join("reports");
        fs::read_dir(&reports)
            .unwrap_or_else(|e| panic!("{}: {e}", reports.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .map(|p| {
                let meta: serde_json::Value =
                    serde_json::from_str(&fs::read_to_string(&p).expect("read metadata")).expect("JSON metadata");
                let pid = meta["pid"].as_u64().expect("pid") as u32;
                let text = |k: &str| meta[k].as_str().unwrap_or_else(|| panic!("{k} in {meta}")).to_owned();
                (pid, Meta { instance: text("instance"), state: text("state") })
            })
            .collect()
    }

    /// After the stop: one report per process of `pids`, each final
    /// (`exited`) with its LCOV.
    fn assert_final_reports(&self, pids: &BTreeSet<u32>) -> BTreeMap<u32, Meta> {
        let reports = self.reports();
        let exited: BTreeSet<u32> = reports.iter().filter(|(_, m)| m.state == "exited").map(|(p, _)| *p).collect();
        assert_eq!(
            &exited,
            pids,
            "final reports (state exited) of {} of {} processes: {reports:?}\n{}",
            exited.intersection(pids).count(),
            pids.len(),
            self.context()
        );
        for meta in pids.iter().map(|p| &reports[p]) {
            let lcov = self.cov().join("reports").join(format!("{}.lcov", meta.instance));
            assert!(fs::metadata(&lcov).is_ok_and(|m| m.len() > 0), "no LCOV {}", lcov.display());
        }
        reports
    }

    /// `livecov collect --dir cov`, within [`COLLECT_WITHIN`].
    fn collect(&self, allow_partial: bool) -> Collected {
        let out = self.dir.join("collected");
        let mut command = Command::new(livecov_bin());
        command.args(["collect", "--dir"]).arg(self.cov()).arg("-o").arg(&out);
        if allow_partial {
            command.arg("--allow-partial");
        }
        let log = self.dir.join("collect.log");
        let file = fs::File::create(&log).expect("collect.log");
        let mut child =
            command.stdout(file.try_clone().expect("dup")).stderr(file).spawn().expect("start livecov collect");
        let deadline = Instant::now() + COLLECT_WITHIN;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("livecov collect ran longer than {COLLECT_WITHIN:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let said = fs::read_to_string(&log).unwrap_or_default();
        assert!(status.success(), "livecov collect ended with {status}: {said}");
        let manifest = serde_json::from_str(&fs::read_to_string(out.join("manifest.json")).expect("manifest.json"))
            .expect("JSON manifest");
        let merged = fs::read_to_string(out.join("merged.lcov")).expect("merged.lcov");
        Collected { manifest, merged }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // Safety: the process group nginx's master leads (process_group(0)).
        unsafe { libc::kill(-(self.pid() as i32), libc::SIGKILL) };
        let _ = self.master.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn pids(groups: &[&[u32]]) -> BTreeSet<u32> {
    groups.iter().flat_map(|g| g.iter().copied()).collect()
}

/// Of the pages wholly inside nginx's `__llvm_prf_data` in process `pid`
/// (its ends share pages with the sections around it), how many are
/// resident, and how many there are: from the process's page map.
fn resident_data_pages(pid: u32) -> (usize, usize) {
    use object::{Object, ObjectSection};
    use std::os::unix::fs::FileExt;
    let image = fs::read(nginx_bin()).expect("read nginx");
    let file = object::File::parse(&*image).expect("nginx is an object file");
    let data = file.section_by_name("__llvm_prf_data").expect("nginx's __llvm_prf_data");
    // nginx is position independent: its first mapping, at offset 0, is
    // where its addresses start.
    let path = nginx_bin().canonicalize().expect("nginx's path");
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("the worker's maps");
    let base = maps
        .lines()
        .find(|l| l.ends_with(&*path.to_string_lossy()) && l.split_whitespace().nth(2) == Some("00000000"))
        .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
        .unwrap_or_else(|| panic!("no mapping of {} at offset 0 in:\n{maps}", path.display()));
    let page = 4096;
    let (start, end) = ((base + data.address()).div_ceil(page), (base + data.address() + data.size()) / page);
    let pagemap = fs::File::open(format!("/proc/{pid}/pagemap")).expect("the worker's pagemap");
    let mut entries = vec![0u8; (end - start) as usize * 8];
    pagemap.read_exact_at(&mut entries, start * 8).expect("read the pagemap");
    // Bit 63: present; bit 62: swapped out.
    let resident = entries.chunks_exact(8).filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) >> 62 != 0).count();
    (resident, entries.len() / 8)
}

#[test]
fn dumps_leave_the_programs_data_section_unread() {
    // The program reads its `__llvm_prf_data` only to write its profile at
    // exit; the agent reads it from the file, whose mapping it lets go.
    let mut n = Nginx::start("data-pages");
    let worker = n.workers_up(&[])[0];
    // Reading a page of a file maps the pages around it in the page cache
    // too (64 KiB), so some of the section is resident from the start.
    let (before, pages) = resident_data_pages(worker);
    assert!(pages >= 16 && before < pages, "{before} of {pages} whole pages of nginx's __llvm_prf_data resident: too few left to tell");
    let instance = find_instance(&n.cov(), "native", worker).expect("the worker's agent");
    let socket = n.cov().join("sockets").join(format!("{instance}.sock"));
    for round in 0..3 {
        n.serve(2);
        let r = unix_request(&socket, "GET", "/coverage", &[]);
        assert_eq!(r.status, 200, "dump {round}: {}", r.text());
        assert!(static_count(&r.text()) > 0, "dump {round} counts no request");
    }
    let (after, _) = resident_data_pages(worker);
    eprintln!("nginx's __llvm_prf_data: {before} of {pages} pages resident before 3 dumps, {after} after");
    // Read in memory, the whole section was (21 of 21 pages, 12 before).
    assert!(after < pages, "dumps made the {pages} pages of nginx's __llvm_prf_data resident ({before} before)");
}

#[test]
fn graceful_stop_leaves_the_final_report_of_every_process() {
    for run in 0..RUNS {
        let mut n = Nginx::start(&format!("stop-{run}"));
        let workers = n.workers_up(&[]);
        n.serve(6);
        n.stop();
        n.assert_final_reports(&pids(&[&[n.pid()], &workers]));
        let c = n.collect(false);
        assert_eq!(c.manifest["instances"], 3, "{:#}", c.manifest);
        assert_eq!(static_count(&c.merged), 6, "the merge counts every request");
    }
}

#[test]
fn reload_then_stop_leaves_the_reports_of_the_retired_and_the_new_workers() {
    for run in 0..RUNS {
        let mut n = Nginx::start(&format!("reload-{run}"));
        let retired = n.workers_up(&[]);
        n.serve(3);
        n.signal(libc::SIGHUP);
        let new = n.workers_up(&retired);
        n.gone(&retired);
        n.serve(4);
        n.stop();
        let reports = n.assert_final_reports(&pids(&[&[n.pid()], &retired, &new]));
        let c = n.collect(false);
        assert_eq!(c.manifest["instances"], 5, "{:#}", c.manifest);
        // All exited, merged exactly: the master (root) wrote the build's
        // mapping, which the workers (nobody) could not.
        let groups = c.manifest["groups"].as_array().expect("groups");
        assert!(groups.len() == 1 && groups[0]["instances"].as_array().map(Vec::len) == Some(5), "{:#}", c.manifest);
        let report = |w: &u32| n.cov().join("reports").join(format!("{}.lcov", reports[w].instance));
        let served = |workers: &[u32]| workers.iter().map(|w| static_count(&fs::read_to_string(report(w)).expect("a final report"))).sum::<u64>();
        assert_eq!((served(&retired), served(&new)), (3, 4), "requests served before and after the reload");
        assert_eq!(static_count(&c.merged), 7);
    }
}

#[test]
fn reopening_the_logs_works_and_nginx_still_serves() {
    for run in 0..RUNS {
        let mut n = Nginx::start(&format!("reopen-{run}"));
        let workers = n.workers_up(&[]);
        n.serve(2);
        let logs = n.dir.join("logs");
        for log in ["access.log", "error.log"] {
            fs::rename(logs.join(log), logs.join(format!("{log}.1"))).expect("move a log away");
        }
        n.signal(libc::SIGUSR1);
        // The master says so in the log it then closes, and opens new ones.
        n.until("the logs reopened", |n| {
            let reopened = n.log("error.log.1").contains("reopening logs")
                && ["access.log", "error.log"].iter().all(|log| logs.join(log).exists());
            reopened.then_some(())
        });
        // Each worker reopens after the master, on its own: until it has,
        // the requests it serves still go to the old log. Every worker
        // writes the new one in the end.
        n.until("every worker logging in the new access log", |n| {
            assert_eq!(n.get("/after-reopen").status, 404);
            let log = n.log("access.log");
            workers.iter().all(|pid| log.lines().any(|l| l.starts_with(&format!("{pid} \"GET /after-reopen ")))).then_some(())
        });
        for _ in 0..4 {
            assert_eq!(n.get("/settled").status, 404);
        }
        assert!(!n.log("access.log.1").contains("/settled"), "a request logged in the old access log");
        n.serve(2);
        assert_eq!(n.children(), workers, "reopening restarted the workers");
        n.stop();
        n.assert_final_reports(&pids(&[&[n.pid()], &workers]));
        let c = n.collect(false);
        assert!(static_count(&c.merged) >= 5, "the merge counts the requests");
    }
}

#[test]
fn a_killed_worker_is_lost_and_its_replacement_reports() {
    for run in 0..RUNS {
        let mut n = Nginx::start(&format!("killed-{run}"));
        let workers = n.workers_up(&[]);
        let killed = workers[0];
        let killed_instance = find_instance(&n.cov(), "native", killed).expect("the worker's instance");
        n.serve(2);
        // Safety: a worker of our nginx, as root.
        assert_eq!(unsafe { libc::kill(killed as i32, libc::SIGKILL) }, 0);
        let now = n.workers_up(&[killed]);
        assert!(now.contains(&workers[1]), "the other worker is the same: {workers:?} then {now:?}");
        n.serve(2);
        n.stop();
        n.assert_final_reports(&pids(&[&[n.pid()], &now]));
        let c = n.collect(true);
        assert_eq!(c.target(&killed_instance)["state"], "lost", "{:#}", c.manifest);
        // At least the requests after the kill; those before it may have
        // been the killed worker's.
        assert!((2..=4).contains(&static_count(&c.merged)), "{}", static_count(&c.merged));
    }
}
