//! The agent's configuration: the `LIVECOV_*` environment, or code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use regex_lite::Regex;

/// Sources no report wants: toolchain and package-registry code.
pub const DEFAULT_IGNORE: &str =
    r"/rustc/|/\.cargo/registry/|/\.cargo/git/|^/usr/include/|^/usr/lib/|/node_modules/|/site-packages/";

/// The packages the agent is built from. Their code runs inside the
/// program (instrumented along with it) but never belongs in its report,
/// whatever `LIVECOV_IGNORE` says. A test checks this list against
/// `cargo tree`.
pub(crate) const AGENT_PACKAGES: &[&str] = &[
    "adler2", "atomic-waker", "block-buffer", "bytes", "cfg-if", "cpp_demangle",
    "crc32fast", "crypto-common", "digest", "flate2", "futures-core", "generic-array", "http",
    "http-body", "http-body-util", "httparse", "httpdate", "hyper", "hyper-util", "itoa", "libc",
    "md-5", "memchr", "memmap2", "miniz_oxide", "mio", "object", "pin-project-lite", "proc-macro2",
    "quote", "regex-lite", "rustc-demangle", "rustc-hash", "serde_core", "serde_json",
    "simd-adler32", "smallvec", "socket2", "subtle", "syn", "tokio", "tokio-macros", "typenum",
    "unicode-ident", "zmij",
];

/// What reports leave out: the configured pattern (or the default) and
/// the agent's own sources. Compiled at an agent's first dump (compiling
/// costs more than the rest of the start), by each agent: kept once per
/// process, they were left half made in a child forked while a thread of
/// its parent compiled them, and the child's first report (its final one,
/// at its exit) waited for them forever.
pub(crate) fn ignore_patterns(configured: Option<&Regex>) -> Vec<Regex> {
    let configured = configured
        .cloned()
        .unwrap_or_else(|| Regex::new(DEFAULT_IGNORE).expect("the default ignore pattern is valid"));
    vec![configured, agent_sources()]
}

/// Matches the agent's own sources and those of the packages it uses.
pub(crate) fn agent_sources() -> Regex {
    let packages = AGENT_PACKAGES.iter().map(|p| regex_lite::escape(p)).collect::<Vec<_>>().join("|");
    let own = regex_lite::escape(concat!(env!("CARGO_MANIFEST_DIR"), "/src/"));
    Regex::new(&format!(r"^{own}|/(registry/src/[^/]+|git/checkouts/[^/]+/[^/]+)/({packages})-[0-9][^/]*/"))
        .expect("the agent's source pattern is valid")
}

/// How the agent runs. [`Config::from_env`] reads the environment;
/// programs that configure livecov in code fill it in themselves.
#[derive(Debug, Clone)]
pub struct Config {
    /// The coverage directory: `sockets/` and `reports/` are made in it.
    pub dir: Option<PathBuf>,
    /// A TCP address for the same API (`LIVECOV_LISTEN`).
    pub listen: Option<SocketAddr>,
    /// Bearer token required on TCP.
    pub token: Option<String>,
    /// Serve TCP on an address other than loopback without a token
    /// (`LIVECOV_LISTEN_WITHOUT_TOKEN=1`): refused otherwise, see
    /// [`Config::tcp_refusal`].
    pub listen_without_token: bool,
    /// Files left out of reports (`LIVECOV_IGNORE`); `None`: the default,
    /// [`DEFAULT_IGNORE`] (compiled at the first dump, not at start).
    pub ignore: Option<Regex>,
    /// Function names demangled (`LIVECOV_DEMANGLE=0` turns it off).
    pub demangle: bool,
    /// Period of report writes (`LIVECOV_FLUSH_SECS`); none when `None`.
    pub flush_every: Option<Duration>,
    /// `SF:` path prefix rewrites (`LIVECOV_PATH_MAP=from=to,...`).
    pub path_map: Vec<(String, String)>,
    /// Mode of the socket file (`LIVECOV_SOCKET_MODE`, octal; 0600).
    pub socket_mode: u32,
    /// The runtime named in instance ids (`<runtime>-<pid>-<hex>`) and in
    /// the metadata: `rust` for this crate, `native` for the C-ABI shim.
    pub runtime: &'static str,
    /// Called after each piece of work of the engine (a report, a reset,
    /// a snapshot of the counters), by the thread that did it, or, for a
    /// warm dump, by the server's thread once its answer is sent (see
    /// `Service::answer_sent`): the C agent's allocator gives back the
    /// freed memory it kept for the work's own use.
    pub after_engine_work: Option<fn()>,
    /// Called by the server's thread when it goes idle, no connection
    /// open, after answers to `/coverage` (see `Service::after_answers`):
    /// the C agent gives back the pages of its code that they ran.
    pub after_answers: Option<fn()>,
    /// Called by the agent's flush thread once the engine has done no work
    /// for [`super::REST_AFTER`] since it last worked: the C agent gives
    /// back what it keeps for the speed of dumps that follow each other
    /// (the pages of its code, its freed mappings).
    pub at_rest: Option<fn()>,
    /// Called by the engine's thread with `true` before passing work whose
    /// small blocks are all freed when it ends (a batch's decoded and
    /// counted functions), and `false` after: the C agent's allocator then
    /// takes them from memory of their own, given back whole, not from the
    /// arena the records that stay are in.
    pub scratch: Option<fn(bool)>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dir: None,
            listen: None,
            token: None,
            listen_without_token: false,
            ignore: None,
            demangle: true,
            flush_every: None,
            path_map: Vec::new(),
            socket_mode: 0o600,
            runtime: "rust",
            after_engine_work: None,
            after_answers: None,
            at_rest: None,
            scratch: None,
        }
    }
}

impl Config {
    /// The configuration the environment asks for, `Ok(None)` when neither
    /// `LIVECOV_DIR` nor `LIVECOV_LISTEN` is set (the agent then stays off).
    pub fn from_env() -> Result<Option<Config>, String> {
        Self::from_vars(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Config>, String> {
        let env = |key: &str| var(&format!("LIVECOV_{}", key.to_ascii_uppercase()));
        let name = |key: &str| format!("LIVECOV_{}", key.to_ascii_uppercase());
        let dir = env("dir").map(PathBuf::from);
        let listen = parse_listen(env("listen"), &name)?;
        if dir.is_none() && listen.is_none() {
            return Ok(None);
        }
        let mut config = Config { dir, listen, ..Config::default() };
        config.fill(env, name)?;
        Ok(Some(config))
    }

    /// A configuration string, as the C-ABI shim's `livecov_start` takes it:
    /// `key=value` entries separated by `;` (a literal `;` in a value is
    /// written `;;`), with the keys of the environment variables in lower
    /// case and without `LIVECOV_`: `dir`, `listen`, `token`, `token_file`,
    /// `listen_without_token`, `ignore`, `demangle`, `flush_secs`,
    /// `path_map`, `socket_mode`. Spaces
    /// around keys and values are ignored; an empty string is the default
    /// configuration (no socket, no TCP: the program dumps through the API).
    ///
    /// `dir=/tmp/cov;listen=127.0.0.1:0;token=x;flush_secs=1;demangle=0;path_map=/build=/src`
    pub fn from_config_string(text: &str) -> Result<Config, String> {
        const KEYS: &[&str] =
            &["dir", "listen", "token", "token_file", "listen_without_token", "ignore", "demangle", "flush_secs", "path_map", "socket_mode"];
        let mut values: Vec<(String, String)> = Vec::new();
        for entry in split_entries(text) {
            if entry.trim().is_empty() {
                continue;
            }
            let (key, value) = entry
                .split_once('=')
                .ok_or_else(|| format!("configuration entry {:?} is not key=value", entry.trim()))?;
            let key = key.trim();
            if !KEYS.contains(&key) {
                return Err(format!("unknown configuration key {key:?} (known keys: {})", KEYS.join(", ")));
            }
            if values.iter().any(|(k, _)| k == key) {
                return Err(format!("configuration key {key:?} is given twice"));
            }
            values.push((key.to_owned(), value.trim().to_owned()));
        }
        let var = |key: &str| values.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()).filter(|v| !v.is_empty());
        let name = |key: &str| key.to_owned();
        let mut config = Config {
            dir: var("dir").map(PathBuf::from),
            listen: parse_listen(var("listen"), &name)?,
            ..Config::default()
        };
        config.fill(var, name)?;
        Ok(config)
    }

    /// Everything but `dir` and `listen`, from `var(key)` (lower-case keys);
    /// `name(key)` is how messages call a key.
    fn fill(&mut self, var: impl Fn(&str) -> Option<String>, name: impl Fn(&str) -> String) -> Result<(), String> {
        self.token = match (var("token"), var("token_file")) {
            (Some(t), _) => Some(t),
            (None, Some(path)) => Some(
                std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}={path}: {e}", name("token_file")))?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        self.listen_without_token = var("listen_without_token").is_some_and(|v| v != "0");
        if let Some(re) = var("ignore") {
            self.ignore = Some(
                Regex::new(&re).map_err(|e| format!("{} is not a valid regular expression: {e}", name("ignore")))?,
            );
        }
        self.demangle = var("demangle").is_none_or(|v| v != "0");
        if let Some(secs) = var("flush_secs") {
            let secs: f64 = secs
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s > 0.0)
                .ok_or_else(|| format!("{}={secs:?} is not a positive number of seconds", name("flush_secs")))?;
            self.flush_every = Some(Duration::from_secs_f64(secs));
        }
        if let Some(map) = var("path_map") {
            for pair in map.split(',').filter(|p| !p.is_empty()) {
                let (from, to) = pair
                    .split_once('=')
                    .ok_or_else(|| format!("{} entry {pair:?} is not from=to", name("path_map")))?;
                self.path_map.push((from.to_owned(), to.to_owned()));
            }
        }
        if let Some(mode) = var("socket_mode") {
            self.socket_mode = u32::from_str_radix(mode.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o777)
                .ok_or_else(|| format!("{}={mode:?} is not an octal file mode such as 0600", name("socket_mode")))?;
        }
        Ok(())
    }
}

impl Config {
    /// Why the TCP address is not served, if it is not: an address other
    /// than loopback without a token would give the coverage, the raw
    /// profile and `POST /reset` to anyone who reaches the port, so it takes
    /// a token or an explicit opt-in. The Unix socket serves either way.
    pub fn tcp_refusal(&self) -> Option<String> {
        let addr = self.listen?;
        let open = !addr.ip().is_loopback() && self.token.as_deref().is_none_or(str::is_empty);
        (open && !self.listen_without_token).then(|| {
            format!(
                "not listening on {addr}: it is reachable from other hosts and no token is set; \
                 set LIVECOV_TOKEN (or LIVECOV_TOKEN_FILE) to require one, listen on 127.0.0.1, \
                 or set LIVECOV_LISTEN_WITHOUT_TOKEN=1 to serve it to anyone who reaches the port"
            )
        })
    }
}

fn parse_listen(value: Option<String>, name: &impl Fn(&str) -> String) -> Result<Option<SocketAddr>, String> {
    match value {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            format!("{}={v:?} is not an address such as 0.0.0.0:9464 or 127.0.0.1:9464", name("listen"))
        }),
    }
}

/// Splits at `;`, where `;;` stands for a literal `;`.
fn split_entries(text: &str) -> Vec<String> {
    let mut entries = vec![String::new()];
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ';' {
            if chars.peek() == Some(&';') {
                chars.next();
                entries.last_mut().expect("never empty").push(';');
            } else {
                entries.push(String::new());
            }
        } else {
            entries.last_mut().expect("never empty").push(c);
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Option<Config>, String> {
        let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_vars(|n| vars.get(n).cloned())
    }

    #[test]
    fn agent_packages_are_what_cargo_tree_says() {
        let out = std::process::Command::new(env!("CARGO"))
            .args(["tree", "-p", "livecov", "-e", "normal", "--prefix", "none", "--format", "{p}"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run cargo tree");
        let mut packages: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .filter(|p| p != "livecov")
            .collect();
        packages.sort();
        packages.dedup();
        assert!(!packages.is_empty(), "cargo tree printed nothing: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(packages, AGENT_PACKAGES, "update AGENT_PACKAGES to the agent's dependency tree");
        let re = agent_sources();
        assert!(re.is_match("/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/tokio-1.48.0/src/net/mod.rs"));
        assert!(!re.is_match("/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/tokio-util-0.7.0/src/lib.rs"));
        assert!(re.is_match(concat!(env!("CARGO_MANIFEST_DIR"), "/src/agent/mod.rs")));
        assert!(!re.is_match("/src/app/main.rs"));
    }

    #[test]
    fn off_without_dir_or_listen() {
        assert!(config(&[("LIVECOV_TOKEN", "x")]).unwrap().is_none());
    }

    #[test]
    fn reads_every_variable() {
        let c = config(&[
            ("LIVECOV_DIR", "/cov"),
            ("LIVECOV_LISTEN", "127.0.0.1:9464"),
            ("LIVECOV_TOKEN", "s3cret"),
            ("LIVECOV_IGNORE", "vendor/"),
            ("LIVECOV_DEMANGLE", "0"),
            ("LIVECOV_FLUSH_SECS", "2.5"),
            ("LIVECOV_PATH_MAP", "/build=/src,/a=/b"),
            ("LIVECOV_SOCKET_MODE", "0660"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.dir, Some(PathBuf::from("/cov")));
        assert_eq!(c.listen, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(c.token.as_deref(), Some("s3cret"));
        assert!(c.ignore.unwrap().is_match("x/vendor/y.rs"));
        assert!(!c.demangle);
        assert_eq!(c.flush_every, Some(Duration::from_millis(2500)));
        assert_eq!(c.path_map, vec![("/build".into(), "/src".into()), ("/a".into(), "/b".into())]);
        assert_eq!(c.socket_mode, 0o660);
    }

    #[test]
    fn bad_values_say_what_to_write() {
        let err = config(&[("LIVECOV_DIR", "/c"), ("LIVECOV_FLUSH_SECS", "soon")]).unwrap_err();
        assert!(err.contains("positive number of seconds"), "{err}");
        let err = config(&[("LIVECOV_LISTEN", "9464")]).unwrap_err();
        assert!(err.contains("0.0.0.0:9464"), "{err}");
        let err = config(&[("LIVECOV_DIR", "/c"), ("LIVECOV_SOCKET_MODE", "rw")]).unwrap_err();
        assert!(err.contains("octal"), "{err}");
    }

    #[test]
    fn tcp_beyond_loopback_takes_a_token_or_an_explicit_opt_in() {
        let refusal = |vars: &[(&str, &str)]| config(vars).unwrap().unwrap().tcp_refusal();
        let err = refusal(&[("LIVECOV_LISTEN", "0.0.0.0:9464")]).expect("refused");
        assert!(err.contains("LIVECOV_TOKEN") && err.contains("LIVECOV_LISTEN_WITHOUT_TOKEN=1"), "{err}");
        assert!(refusal(&[("LIVECOV_LISTEN", "[::]:9464"), ("LIVECOV_TOKEN", "")]).is_some());
        assert!(refusal(&[("LIVECOV_LISTEN", "10.1.2.3:9464"), ("LIVECOV_LISTEN_WITHOUT_TOKEN", "0")]).is_some());
        assert!(refusal(&[("LIVECOV_LISTEN", "0.0.0.0:9464"), ("LIVECOV_TOKEN", "s3cret")]).is_none());
        assert!(refusal(&[("LIVECOV_LISTEN", "0.0.0.0:9464"), ("LIVECOV_LISTEN_WITHOUT_TOKEN", "1")]).is_none());
        assert!(refusal(&[("LIVECOV_LISTEN", "127.0.0.1:9464")]).is_none());
        assert!(refusal(&[("LIVECOV_LISTEN", "[::1]:9464")]).is_none());
        assert!(refusal(&[("LIVECOV_DIR", "/cov")]).is_none());
        let c = Config::from_config_string("listen=0.0.0.0:0;listen_without_token=1").unwrap();
        assert!(c.tcp_refusal().is_none());
    }

    #[test]
    fn reads_a_configuration_string() {
        let c = Config::from_config_string(
            "dir=/tmp/cov; listen=127.0.0.1:0;token=x;flush_secs=1;demangle=0;ignore=a;;b;path_map=/a=/b,/c=/d;socket_mode=0660;",
        )
        .unwrap();
        assert_eq!(c.dir, Some(PathBuf::from("/tmp/cov")));
        assert_eq!(c.listen, Some("127.0.0.1:0".parse().unwrap()));
        assert_eq!(c.token.as_deref(), Some("x"));
        assert_eq!(c.flush_every, Some(Duration::from_secs(1)));
        assert!(!c.demangle);
        assert_eq!(c.ignore.as_ref().map(Regex::as_str), Some("a;b"));
        assert_eq!(c.path_map, vec![("/a".into(), "/b".into()), ("/c".into(), "/d".into())]);
        assert_eq!(c.socket_mode, 0o660);
        assert_eq!(c.runtime, "rust");
        let empty = Config::from_config_string("").unwrap();
        assert!(empty.dir.is_none() && empty.listen.is_none() && empty.demangle);
    }

    #[test]
    fn bad_configuration_strings_say_what_is_wrong() {
        let err = Config::from_config_string("dir").unwrap_err();
        assert!(err.contains("not key=value"), "{err}");
        let err = Config::from_config_string("colour=red").unwrap_err();
        assert!(err.contains("unknown configuration key \"colour\"") && err.contains("flush_secs"), "{err}");
        let err = Config::from_config_string("dir=/a;dir=/b").unwrap_err();
        assert!(err.contains("twice"), "{err}");
        let err = Config::from_config_string("flush_secs=soon").unwrap_err();
        assert!(err.starts_with("flush_secs=\"soon\""), "{err}");
        let err = Config::from_config_string("listen=9464").unwrap_err();
        assert!(err.starts_with("listen=") && err.contains("0.0.0.0:9464"), "{err}");
        let err = Config::from_config_string("ignore=(").unwrap_err();
        assert!(err.contains("ignore is not a valid regular expression"), "{err}");
    }
}
