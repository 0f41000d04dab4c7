//! A real OCI registry on loopback for the tests of `livecov push`:
//! Debian's docker-registry (the CNCF distribution registry).

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::http::{exchange, Response};

const REGISTRY: &str = "/usr/bin/docker-registry";

/// How the registry asks for a login.
pub enum Auth<'a> {
    None,
    /// Basic authentication, with the logins of an htpasswd file (bcrypt).
    Htpasswd(&'a Path),
    /// Bearer tokens from `realm`: JWTs issued by `issuer` for `service`,
    /// signed by a certificate of the PEM file `roots`.
    Token {
        realm: &'a str,
        service: &'a str,
        issuer: &'a str,
        roots: &'a Path,
    },
}

/// A docker-registry on a free loopback port, ended on drop.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub address: String,
}

impl Registry {
    /// `tls` is a certificate and its key (PEM).
    pub fn start(dir: &Path, auth: Auth, tls: Option<(&Path, &Path)>) -> Registry {
        assert!(Path::new(REGISTRY).exists(), "{REGISTRY} is missing: tests/scripts/install-deps.sh installs docker-registry");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:0\n",
            dir.join("storage").display()
        );
        if let Some((cert, key)) = tls {
            config.push_str(&format!("  tls:\n    certificate: {}\n    key: {}\n", cert.display(), key.display()));
        }
        match auth {
            Auth::None => {}
            Auth::Htpasswd(htpasswd) => {
                config.push_str(&format!("auth:\n  htpasswd:\n    realm: livecov-test\n    path: {}\n", htpasswd.display()))
            }
            Auth::Token { realm, service, issuer, roots } => config.push_str(&format!(
                "auth:\n  token:\n    realm: {realm}\n    service: {service}\n    issuer: {issuer}\n    rootcertbundle: {}\n",
                roots.display()
            )),
        }
        let config_file = dir.join("registry.yml");
        std::fs::write(&config_file, config).expect("write the registry's config");
        let log = dir.join("registry.log");
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(&config_file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the registry's log"))
            .spawn()
            .expect("start docker-registry");
        let mut registry = Registry { child, address: String::new() };
        // Port 0: the registry logs the address it listens on.
        registry.address = crate::wait_for("the registry to listen", Duration::from_millis(50), || {
            let text = std::fs::read_to_string(&log).ok()?;
            let rest = &text[text.find("listening on ")? + "listening on ".len()..];
            Some(rest[..rest.find(['"', ','])?].to_owned())
        });
        registry
    }

    /// `GET PATH` over plain HTTP, with `headers` (`name: value`).
    pub fn get(&self, path: &str, headers: &[&str]) -> Response {
        let stream = TcpStream::connect(&self.address).expect("connect to the registry");
        exchange(stream, "GET", path, headers)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
