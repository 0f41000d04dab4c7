//! The Kubernetes manifests (fixtures/k8s), the Containerfile of the
//! `livecov` image and the Tekton Task and Pipeline (fixtures/tekton) agree
//! with each other and with the `livecov` binary.
//!
//! No cluster and no container engine run here, so the test does two things:
//! - a checker reads every YAML document and the Containerfile and follows
//!   every reference (labels and selectors, named ports, volumes and mounts,
//!   Secrets and their keys, the coverage directory, the headless Service
//!   behind `--replicas`, the Task's variables, the Pipeline's params, the
//!   binary's path); `checker_reports_drift` breaks one piece at a time and
//!   shows that the checker notices;
//! - the pods' containers and the Task's step run as real processes, with
//!   the manifests' exact arguments and environment: volumes are folders
//!   (Secrets are files with the template's values), a pod's `0.0.0.0:PORT`
//!   is a loopback port, and dnsmasq stands in for cluster DNS.

mod replicas;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use livecov_tests::service::{service_bin, Service};
use livecov_tests::workspace_root;
use replicas::{function_count, livecov_bin, scratch, test_names, wait_for, Dns, Sidecar, HELLO, FIB};
use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

const K8S: &str = "fixtures/k8s";
const TEKTON: &str = "fixtures/tekton";
/// What a Debian image has on PATH when the Containerfile sets none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// ---------------------------------------------------------------- loading

/// One YAML document of a file.
#[derive(Clone)]
struct Doc {
    /// Relative to the workspace, e.g. `fixtures/k8s/service.yaml`.
    file: String,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or("")
    }

    fn is_k8s(&self) -> bool {
        self.file.starts_with(&format!("{K8S}/"))
    }

    fn at(&self) -> String {
        format!("{}: {} {}", self.file, self.kind(), self.name())
    }
}

/// Everything the checker reads, kept in memory so that a test can break it.
#[derive(Clone)]
struct Bundle {
    docs: Vec<Doc>,
    /// The YAML files of fixtures/k8s, by file name.
    k8s_files: Vec<String>,
    containerfile: String,
}

impl Bundle {
    fn load() -> Bundle {
        let root = workspace_root();
        let mut docs = Vec::new();
        let mut k8s_files = Vec::new();
        for dir in [K8S, TEKTON] {
            let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
                .unwrap_or_else(|e| panic!("read {dir}: {e}"))
                .map(|e| e.expect("a directory entry").path())
                .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                .collect();
            files.sort();
            for path in files {
                let name = path.file_name().unwrap().to_str().expect("a UTF-8 file name").to_owned();
                let file = format!("{dir}/{name}");
                let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {file}: {e}"));
                let yaml = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{file} is not YAML: {e}"));
                for y in yaml {
                    docs.push(Doc { file: file.clone(), value: to_json(&y, &file) });
                }
                if dir == K8S {
                    k8s_files.push(name);
                }
            }
        }
        let containerfile = std::fs::read_to_string(root.join(K8S).join("Containerfile")).expect("read fixtures/k8s/Containerfile");
        Bundle { docs, k8s_files, containerfile }
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Doc> + 'a {
        self.docs.iter().filter(move |d| d.kind() == kind)
    }

    fn find(&self, kind: &str, name: &str) -> Option<&Doc> {
        self.docs.iter().find(|d| d.kind() == kind && d.name() == name)
    }

    fn find_mut(&mut self, kind: &str, name: &str) -> &mut Value {
        &mut self.docs.iter_mut().find(|d| d.kind() == kind && d.name() == name).unwrap_or_else(|| panic!("no {kind} {name}")).value
    }

    /// The keys of Secret `name` (from `data` and `stringData`).
    fn secret_keys(&self, name: &str) -> Option<BTreeSet<String>> {
        let s = self.find("Secret", name).filter(|d| d.is_k8s())?;
        let keys = ["data", "stringData"].iter().filter_map(|f| s.value[*f].as_object()).flat_map(|m| m.keys().cloned());
        Some(keys.collect())
    }
}

/// A YAML document as JSON: the same tree with serde_json's handy API
/// (`v["spec"]["ports"]`, `pointer_mut`). Integers stay integers and quoted
/// scalars strings, so the checker still sees an unquoted `20` in `args`.
fn to_json(y: &Yaml, file: &str) -> Value {
    match y {
        Yaml::Real(s) => s.parse::<f64>().ok().and_then(serde_json::Number::from_f64).map_or_else(|| Value::String(s.clone()), Value::Number),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(a) => Value::Array(a.iter().map(|v| to_json(v, file)).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        other => panic!("{file}: a mapping key that is not a scalar: {other:?}"),
                    };
                    (key, to_json(v, file))
                })
                .collect(),
        ),
        Yaml::Null => Value::Null,
        Yaml::Alias(_) | Yaml::BadValue => panic!("{file}: YAML aliases are not supported by this check; write the value out"),
    }
}

/// The workspace as cargo sees it: member folders and `(package, bin)` targets.
struct Workspace {
    members: Vec<String>,
    bins: Vec<(String, String)>,
}

fn workspace() -> &'static Workspace {
    static WS: OnceLock<Workspace> = OnceLock::new();
    WS.get_or_init(|| {
        let root = workspace_root();
        let out = Command::new(env!("CARGO"))
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(&root)
            .output()
            .expect("run cargo metadata");
        assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
        let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
        let members: BTreeSet<&str> = meta["workspace_members"].as_array().expect("workspace_members").iter().filter_map(Value::as_str).collect();
        let mut ws = Workspace { members: Vec::new(), bins: Vec::new() };
        for p in meta["packages"].as_array().expect("packages") {
            if !members.contains(p["id"].as_str().unwrap_or("")) {
                continue;
            }
            let manifest = Path::new(p["manifest_path"].as_str().expect("manifest_path"));
            let dir = manifest.parent().unwrap().strip_prefix(&root).expect("a member inside the workspace");
            ws.members.push(dir.to_str().expect("UTF-8").to_owned());
            for t in p["targets"].as_array().expect("targets") {
                if t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "bin")) {
                    ws.bins.push((p["name"].as_str().unwrap().to_owned(), t["name"].as_str().unwrap().to_owned()));
                }
            }
        }
        ws
    })
}

// ---------------------------------------------------------------- small readers

fn strs(v: &Value) -> Vec<&str> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// The values of `--flag VALUE` and `--flag=VALUE` in `args`.
fn flag_values<'a>(args: &[&'a str], flag: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if *a == flag {
            if let Some(v) = args.get(i + 1) {
                out.push(*v);
            }
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            out.push(v);
        }
    }
    out
}

/// The port of `HOST:PORT`.
fn port_of(addr: &str) -> Option<i64> {
    addr.rsplit_once(':')?.1.parse().ok()
}

/// `repo` of `repo:tag` (a registry's `host:port/` is not a tag).
fn image_repo(image: &str) -> &str {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    arr(&container["env"]).iter().find(|e| e["name"] == name).and_then(|e| e["value"].as_str())
}

/// Every string in `v`, however deep, with its JSON pointer.
fn all_strings<'a>(v: &'a Value, at: String, out: &mut Vec<(String, &'a str)>) {
    match v {
        Value::String(s) => out.push((at, s)),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| all_strings(x, format!("{at}/{i}"), out)),
        Value::Object(m) => m.iter().for_each(|(k, x)| all_strings(x, format!("{at}/{k}"), out)),
        _ => {}
    }
}

/// Tekton's variables in `s`: every `$(a.b...)`. A shell's `$(command ...)`
/// has no dot right after its first word, so it is not one.
fn tekton_refs(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find("$(") {
        rest = &rest[i + 2..];
        let word = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')).unwrap_or(rest.len());
        if word > 0 && rest[word..].starts_with('.') {
            if let Some(end) = rest.find(')') {
                out.push(&rest[..end]);
            }
        }
    }
    out
}

// ---------------------------------------------------------------- pods

/// A pod template of a Deployment in fixtures/k8s.
struct Pod<'a> {
    at: String,
    labels: BTreeMap<&'a str, &'a str>,
    spec: &'a Value,
}

impl<'a> Pod<'a> {
    fn containers(&self) -> &'a [Value] {
        arr(&self.spec["containers"])
    }

    fn volume(&self, name: &str) -> Option<&'a Value> {
        arr(&self.spec["volumes"]).iter().find(|v| v["name"] == name)
    }

    /// The volume mounted at exactly `path` in `container`.
    fn volume_at(&self, container: &'a Value, path: &str) -> Option<&'a str> {
        arr(&container["volumeMounts"]).iter().find(|m| m["mountPath"] == path).and_then(|m| m["name"].as_str())
    }
}

fn pods(b: &Bundle) -> Vec<Pod<'_>> {
    b.of_kind("Deployment")
        .filter(|d| d.is_k8s())
        .map(|d| {
            let template = &d.value["spec"]["template"];
            let labels = template["metadata"]["labels"].as_object().map(|m| m.iter().filter_map(|(k, v)| Some((k.as_str(), v.as_str()?))).collect()).unwrap_or_default();
            Pod { at: d.at(), labels, spec: &template["spec"] }
        })
        .collect()
}

/// A Service's non-empty selector matches the pod's labels.
fn selects(service: &Value, pod: &Pod) -> bool {
    let selector = service["spec"]["selector"].as_object();
    selector.is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| v.as_str() == pod.labels.get(k.as_str()).copied()))
}

fn container_name(c: &Value) -> &str {
    c["name"].as_str().unwrap_or("?")
}

/// A container running the `livecov` command (by its command or its image).
fn is_livecov(c: &Value) -> bool {
    strs(&c["command"]).first().is_some_and(|p| p.rsplit('/').next() == Some("livecov"))
        || c["image"].as_str().is_some_and(|i| image_repo(i).ends_with("/livecov"))
}

fn args_of(c: &Value) -> Vec<&str> {
    strs(&c["args"])
}

/// The container port named or numbered `port` in `containers`.
fn container_port<'a>(containers: &'a [Value], port: &Value) -> Option<(&'a Value, i64)> {
    containers.iter().find_map(|c| {
        arr(&c["ports"]).iter().find_map(|p| {
            let hit = match port {
                Value::String(name) => p["name"] == name.as_str(),
                Value::Number(n) => p["containerPort"].as_i64() == n.as_i64(),
                _ => false,
            };
            hit.then(|| (c, p["containerPort"].as_i64().unwrap_or(-1)))
        })
    })
}

/// The Secret and key behind a file `path` in `container`: the secret
/// volume mounted over its folder, and the key that file is.
fn secret_file(b: &Bundle, pod: &Pod, container: &Value, path: &str) -> Result<(String, String), String> {
    let (dir, file) = path.rsplit_once('/').ok_or_else(|| format!("{path} is not an absolute path"))?;
    let volume_name = pod.volume_at(container, dir).ok_or_else(|| format!("nothing is mounted at {dir} for {path}"))?;
    let volume = pod.volume(volume_name).ok_or_else(|| format!("volume {volume_name} is not defined"))?;
    let secret = volume["secret"]["secretName"].as_str().ok_or_else(|| format!("{path}: volume {volume_name} is not a Secret"))?;
    let key = match volume["secret"]["items"].as_array() {
        Some(items) => items
            .iter()
            .find(|i| i["path"] == file)
            .and_then(|i| i["key"].as_str())
            .ok_or_else(|| format!("{path}: Secret volume {volume_name} has no item with path {file}"))?,
        None => file,
    };
    let keys = b.secret_keys(secret).ok_or_else(|| format!("{path}: there is no Secret {secret}"))?;
    if !keys.contains(key) {
        return Err(format!("{path}: Secret {secret} has no key {key} (it has {keys:?})"));
    }
    Ok((secret.to_owned(), key.to_owned()))
}

// ---------------------------------------------------------------- the checker

/// Everything that does not fit together, one sentence each.
fn problems(b: &Bundle) -> Vec<String> {
    let mut p = Vec::new();
    let binary = check_containerfile(b, &mut p);
    check_documents(b, &mut p);
    check_selectors_and_ports(b, &mut p);
    check_volumes(b, &mut p);
    let pod_token = check_livecov_containers(b, binary.as_deref(), &mut p);
    check_kustomization(b, &mut p);
    check_task(b, binary.as_deref(), pod_token.as_ref(), &mut p);
    check_pipelines(b, &mut p);
    p
}

/// The Containerfile builds the workspace's `livecov` and installs it where
/// the manifests run it from; returns that path.
fn check_containerfile(b: &Bundle, p: &mut Vec<String>) -> Option<String> {
    let at = "fixtures/k8s/Containerfile";
    let stages = parse_containerfile(&b.containerfile);
    let Some(builder) = stages.iter().find(|s| s.runs().iter().any(|r| r.contains("cargo build"))) else {
        p.push(format!("{at}: no stage runs `cargo build`"));
        return None;
    };
    let build: Vec<&str> = builder.runs().into_iter().find(|r| r.contains("cargo build")).unwrap().split_whitespace().collect();
    let package = flag_values(&build, "-p").into_iter().chain(flag_values(&build, "--package")).next();
    let bin = flag_values(&build, "--bin").into_iter().next();
    for f in ["--release", "--locked"] {
        if !build.contains(&f) {
            p.push(format!("{at}: `cargo build` without {f}"));
        }
    }
    let (Some(package), Some(bin)) = (package, bin) else {
        p.push(format!("{at}: `cargo build` names no -p PACKAGE and --bin NAME"));
        return None;
    };
    let ws = workspace();
    if !ws.bins.iter().any(|(pk, bn)| pk == package && bn == bin) {
        p.push(format!("{at}: the workspace has no binary {bin} in package {package} (it has {:?})", ws.bins));
    }
    // The workspace must be whole in the builder, every COPY source must exist.
    let root = workspace_root();
    let sources: Vec<&str> = builder.copies().into_iter().filter(|c| c.from.is_none()).flat_map(|c| c.sources).collect();
    for s in &sources {
        if !root.join(s).exists() {
            p.push(format!("{at}: COPY {s}: there is no such file in the repository"));
        }
    }
    let covered = |path: &str| sources.iter().any(|s| *s == "." || *s == path || path.starts_with(&format!("{}/", s.trim_end_matches('/'))));
    for needed in ["Cargo.toml", "Cargo.lock"].iter().map(|s| s.to_string()).chain(ws.members.iter().cloned()) {
        if !covered(&needed) {
            p.push(format!("{at}: the builder does not COPY {needed} (cargo loads every workspace member)"));
        }
    }
    let workdir = builder.last("WORKDIR").unwrap_or("/");
    let artifact = format!("{}/target/release/{bin}", workdir.trim_end_matches('/'));
    let runtime = stages.last().unwrap();
    if runtime.from == builder.from || runtime.runs().iter().any(|r| r.contains("cargo")) {
        p.push(format!("{at}: the last stage is not a separate runtime image"));
    }
    let builder_name = builder.name.as_deref().unwrap_or("0");
    let Some(copy) = runtime.copies().into_iter().find(|c| c.from.as_deref() == Some(builder_name)) else {
        p.push(format!("{at}: the runtime stage copies nothing --from={builder_name}"));
        return None;
    };
    if copy.sources != [artifact.as_str()] {
        p.push(format!("{at}: the runtime copies {:?} from the builder, which builds {artifact}", copy.sources));
    }
    let binary = if copy.dest.ends_with('/') { format!("{}{bin}", copy.dest) } else { copy.dest.to_owned() };
    match runtime.last("ENTRYPOINT").map(serde_json::from_str::<Vec<String>>) {
        Some(Ok(e)) if e.first() == Some(&binary) => {}
        other => p.push(format!("{at}: ENTRYPOINT {other:?} is not [\"{binary}\"]")),
    }
    match runtime.last("USER").and_then(|u| u.split(':').next()?.parse::<u32>().ok()) {
        Some(uid) if uid != 0 => {}
        _ => p.push(format!("{at}: the runtime USER is not a numeric, non-root uid (runAsNonRoot needs one)")),
    }
    Some(binary)
}

struct Stage {
    from: String,
    name: Option<String>,
    instructions: Vec<(String, String)>,
}

struct CopyInstr<'a> {
    from: Option<String>,
    sources: Vec<&'a str>,
    dest: &'a str,
}

impl Stage {
    fn runs(&self) -> Vec<&str> {
        self.all("RUN")
    }

    fn all(&self, instruction: &str) -> Vec<&str> {
        self.instructions.iter().filter(|(i, _)| i == instruction).map(|(_, rest)| rest.as_str()).collect()
    }

    fn last(&self, instruction: &str) -> Option<&str> {
        self.all(instruction).pop()
    }

    fn copies(&self) -> Vec<CopyInstr<'_>> {
        self.all("COPY")
            .into_iter()
            .filter_map(|rest| {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let from = words.iter().find_map(|w| w.strip_prefix("--from=")).map(str::to_owned);
                let paths: Vec<&str> = words.into_iter().filter(|w| !w.starts_with("--")).collect();
                let (dest, sources) = paths.split_last()?;
                Some(CopyInstr { from, sources: sources.to_vec(), dest })
            })
            .collect()
    }
}

/// The stages of a Containerfile: `FROM image [AS name]` and the
/// instructions that follow (continuation lines joined, comments dropped).
fn parse_containerfile(text: &str) -> Vec<Stage> {
    let mut stages: Vec<Stage> = Vec::new();
    let mut logical = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && logical.is_empty()) {
            continue;
        }
        if let Some(part) = line.strip_suffix('\\') {
            logical.push_str(part);
            logical.push(' ');
            continue;
        }
        logical.push_str(line);
        let (instruction, rest) = logical.trim().split_once(char::is_whitespace).unwrap_or((logical.trim(), ""));
        let (instruction, rest) = (instruction.to_ascii_uppercase(), rest.trim().to_owned());
        if instruction == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                _ => None,
            };
            stages.push(Stage { from: words.first().unwrap_or(&"").to_string(), name, instructions: Vec::new() });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push((instruction, rest));
        }
        logical.clear();
    }
    stages
}

/// Names, and the types Kubernetes insists on: strings in command, args and env.
fn check_documents(b: &Bundle, p: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    for d in &b.docs {
        if d.value["apiVersion"].as_str().is_none() || d.kind().is_empty() {
            p.push(format!("{}: a document without apiVersion or kind", d.file));
        }
        if d.kind() != "Kustomization" && d.name().is_empty() {
            p.push(format!("{}: {} without metadata.name", d.file, d.kind()));
        }
        if !seen.insert((d.kind().to_owned(), d.name().to_owned())) && d.kind() != "Kustomization" {
            p.push(format!("{}: two of them", d.at()));
        }
        let mut containers: Vec<&Value> = Vec::new();
        for pod in pods(b).iter().filter(|pod| pod.at == d.at()) {
            containers.extend(pod.containers());
        }
        containers.extend(arr(&d.value["spec"]["steps"]));
        for c in containers {
            for field in ["command", "args"] {
                if let Some(bad) = arr(&c[field]).iter().find(|v| !v.is_string()) {
                    p.push(format!("{}, container {}: {field} {bad} is not a string (quote it)", d.at(), container_name(c)));
                }
            }
            for e in arr(&c["env"]) {
                if !e["value"].is_null() && !e["value"].is_string() {
                    p.push(format!("{}, container {}: env {} = {} is not a string (quote it)", d.at(), container_name(c), e["name"], e["value"]));
                }
            }
        }
    }
}

/// Deployments select their own pods; Services select pods and name their ports.
fn check_selectors_and_ports(b: &Bundle, p: &mut Vec<String>) {
    for d in b.of_kind("Deployment").filter(|d| d.is_k8s()) {
        let labels = &d.value["spec"]["template"]["metadata"]["labels"];
        match d.value["spec"]["selector"]["matchLabels"].as_object() {
            Some(m) if !m.is_empty() => {
                for (k, v) in m {
                    if &labels[k] != v {
                        p.push(format!("{}: selector {k}={v} does not match its pod labels {labels}", d.at()));
                    }
                }
            }
            _ => p.push(format!("{}: no spec.selector.matchLabels", d.at())),
        }
    }
    let pods = pods(b);
    for svc in b.of_kind("Service").filter(|d| d.is_k8s()) {
        let selected: Vec<&Pod> = pods.iter().filter(|pod| selects(&svc.value, pod)).collect();
        if selected.is_empty() {
            p.push(format!("{}: its selector {} selects no pod of the Deployments", svc.at(), svc.value["spec"]["selector"]));
        }
        let headless = svc.value["spec"]["clusterIP"] == "None";
        for port in arr(&svc.value["spec"]["ports"]) {
            let name = port["name"].as_str().unwrap_or("");
            if name.is_empty() {
                p.push(format!("{}: a port without a name", svc.at()));
            }
            let target = if port["targetPort"].is_null() { &port["port"] } else { &port["targetPort"] };
            for pod in &selected {
                match container_port(pod.containers(), target) {
                    None => p.push(format!("{}: port {name} targets {target}, which no container of {} has", svc.at(), pod.at)),
                    // A headless Service has no virtual port: clients reach the pod's port.
                    Some((_, n)) if headless && Some(n) != port["port"].as_i64() => {
                        p.push(format!("{}: port {name} is {} but the pods listen on {n}; a headless Service's clients reach the pods' port", svc.at(), port["port"]))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    for pod in &pods {
        for c in pod.containers() {
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                for kind in ["tcpSocket", "httpGet"] {
                    let port = &c[probe][kind]["port"];
                    if !port.is_null() && container_port(std::slice::from_ref(c), port).is_none() {
                        p.push(format!("{}, container {}: {probe} on port {port}, which the container does not have", pod.at, container_name(c)));
                    }
                }
            }
        }
    }
}

/// Mounts name defined volumes, volumes are used, Secrets and keys exist.
fn check_volumes(b: &Bundle, p: &mut Vec<String>) {
    for pod in pods(b) {
        let mut used = BTreeSet::new();
        for c in pod.containers() {
            for m in arr(&c["volumeMounts"]) {
                let name = m["name"].as_str().unwrap_or("");
                used.insert(name);
                if pod.volume(name).is_none() {
                    p.push(format!("{}, container {}: mounts volume {name}, which the pod does not define", pod.at, container_name(c)));
                }
            }
        }
        for v in arr(&pod.spec["volumes"]) {
            let name = v["name"].as_str().unwrap_or("");
            if !used.contains(name) {
                p.push(format!("{}: volume {name} is mounted by no container", pod.at));
            }
            if let Some(secret) = v["secret"]["secretName"].as_str() {
                match b.secret_keys(secret) {
                    None => p.push(format!("{}: volume {name} uses Secret {secret}, which fixtures/k8s does not define", pod.at)),
                    Some(keys) => {
                        for item in arr(&v["secret"]["items"]) {
                            let key = item["key"].as_str().unwrap_or("");
                            if !keys.contains(key) {
                                p.push(format!("{}: volume {name} uses key {key} of Secret {secret}, which has only {keys:?}", pod.at));
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A Secret and one of its keys.
type SecretKey = (String, String);

/// The pod sidecars and the aggregator: the binary's path, their ports,
/// token files, coverage directory and replicas. Returns the Secret key the
/// pod sidecars require from their clients.
fn check_livecov_containers(b: &Bundle, binary: Option<&str>, p: &mut Vec<String>) -> Option<SecretKey> {
    let pods = pods(b);
    let mut images = BTreeSet::new();
    let (mut pod_keys, mut aggregator_keys) = (BTreeSet::new(), BTreeSet::new());
    let (mut pod_sidecars, mut aggregators) = (0, 0);
    // Per pod sidecar: its preStop sleep and the pod's grace period; the aggregators' poll intervals.
    let (mut drains, mut polls) = (Vec::new(), Vec::new());
    for pod in &pods {
        for c in pod.containers().iter().filter(|c| is_livecov(c)) {
            let at = format!("{}, container {}", pod.at, container_name(c));
            images.insert(c["image"].as_str().unwrap_or("").to_owned());
            if let Some(binary) = binary {
                if strs(&c["command"]) != [binary] {
                    p.push(format!("{at}: command {} is not [{binary}], where the Containerfile installs livecov", c["command"]));
                }
            }
            let args = args_of(c);
            if args.first() != Some(&"sidecar") {
                p.push(format!("{at}: args do not start with the subcommand `sidecar`"));
                continue;
            }
            for listen in flag_values(&args, "--listen") {
                if container_port(std::slice::from_ref(c), &Value::from(port_of(listen).unwrap_or(-1))).is_none() {
                    p.push(format!("{at}: --listen {listen} is not one of the container's ports"));
                }
                if flag_values(&args, "--token-file").is_empty() && flag_values(&args, "--token").is_empty() {
                    p.push(format!("{at}: --listen {listen} without --token-file: anyone could read and reset the coverage"));
                }
            }
            let mut key_of = |flag: &str| -> Option<SecretKey> {
                let path = flag_values(&args, flag).into_iter().next()?;
                secret_file(b, pod, c, path).map_err(|e| p.push(format!("{at}: {flag} {e}"))).ok()
            };
            let (own, targets) = (key_of("--token-file"), key_of("--target-token-file"));
            for dir in flag_values(&args, "--dir") {
                pod_sidecars += 1;
                let sleep = strs(&c["lifecycle"]["preStop"]["exec"]["command"]);
                let sleep = sleep.first().filter(|cmd| cmd.ends_with("/sleep")).and_then(|_| sleep.last()?.parse::<i64>().ok());
                drains.push((at.clone(), sleep, pod.spec["terminationGracePeriodSeconds"].as_i64().unwrap_or(30)));
                pod_keys.extend(own.clone());
                check_coverage_dir(pod, c, dir, &at, p);
            }
            polls.extend(flag_values(&args, "--poll-interval").iter().filter_map(|s| s.parse::<i64>().ok()));
            for spec in flag_values(&args, "--replicas") {
                aggregators += 1;
                aggregator_keys.extend(targets.clone());
                if let Err(e) = replicas_target(b, spec) {
                    p.push(format!("{at}: --replicas {spec}: {e}"));
                }
            }
        }
        // Every process that writes coverage has a sidecar that reads it.
        for c in pod.containers() {
            let Some(dir) = env_value(c, "LIVECOV_DIR") else { continue };
            let volume = pod.volume_at(c, dir);
            let read = pod.containers().iter().filter(|s| is_livecov(s)).any(|s| flag_values(&args_of(s), "--dir").iter().any(|d| volume.is_some() && pod.volume_at(s, d) == volume));
            if volume.is_none() {
                p.push(format!("{}, container {}: LIVECOV_DIR={dir} is not a mounted volume (the sidecar cannot see it)", pod.at, container_name(c)));
            } else if !read {
                p.push(format!("{}, container {}: no livecov sidecar of the pod has --dir on the volume at LIVECOV_DIR={dir}", pod.at, container_name(c)));
            }
        }
    }
    if images.len() > 1 {
        p.push(format!("fixtures/k8s: the livecov containers use different images {images:?}"));
    }
    if pod_sidecars == 0 || aggregators == 0 {
        p.push(format!("fixtures/k8s: {pod_sidecars} pod sidecar(s) (sidecar --dir) and {aggregators} aggregator(s) (sidecar --replicas); one of each is the point"));
    }
    // A deleted pod's sidecar outlives its processes' final reports by more
    // than a poll interval, within the grace period.
    let poll = polls.iter().max().copied().unwrap_or(0);
    for (at, sleep, grace) in drains {
        match sleep {
            Some(s) if s > poll && s < grace => {}
            _ => p.push(format!(
                "{at}: preStop sleep {sleep:?} is not longer than the aggregator's --poll-interval {poll} and shorter than the grace period {grace}: \
                 what a deleted pod counted after the last poll would be lost"
            )),
        }
    }
    // What the aggregator sends is what the pods require.
    if pod_keys.len() > 1 || (!aggregator_keys.is_empty() && aggregator_keys != pod_keys) {
        p.push(format!("fixtures/k8s: pod sidecars require the token {pod_keys:?}, the aggregator sends {aggregator_keys:?}"));
    }
    pod_keys.into_iter().next()
}

/// `--dir DIR` of a sidecar is an emptyDir that another container of the pod
/// mounts where its LIVECOV_DIR says.
fn check_coverage_dir(pod: &Pod, sidecar: &Value, dir: &str, at: &str, p: &mut Vec<String>) {
    let Some(volume) = pod.volume_at(sidecar, dir) else {
        p.push(format!("{at}: --dir {dir} is not a mounted volume"));
        return;
    };
    if pod.volume(volume).is_none_or(|v| v["emptyDir"].is_null()) {
        p.push(format!("{at}: --dir {dir} is volume {volume}, not an emptyDir"));
    }
    let writers: Vec<&str> = pod
        .containers()
        .iter()
        .filter(|c| env_value(c, "LIVECOV_DIR").is_some_and(|d| pod.volume_at(c, d) == Some(volume)))
        .map(container_name)
        .collect();
    if writers.is_empty() {
        p.push(format!("{at}: --dir {dir} (volume {volume}) is where no container of the pod has its LIVECOV_DIR"));
    }
    // Agent sockets are mode 0600: the sidecar must be their user.
    let uid = |c: &Value| c["securityContext"]["runAsUser"].as_i64().or(pod.spec["securityContext"]["runAsUser"].as_i64());
    for writer in pod.containers().iter().filter(|c| writers.contains(&container_name(c))) {
        if uid(sidecar).is_none() || uid(sidecar) != uid(writer) {
            p.push(format!("{at}: runs as user {:?}, container {} as {:?}; it could not open the agents' sockets", uid(sidecar), container_name(writer), uid(writer)));
        }
    }
}

/// The headless Service and port that a `--replicas` spec names, checked:
/// the port reaches the pods' livecov sidecar on the port it listens on.
fn replicas_target(b: &Bundle, spec: &str) -> Result<(), String> {
    // SRV records are per port name, A records need the port number.
    let (name, by_name, by_number) = if let Some(name) = spec.strip_prefix("srv:") {
        let rest = name.strip_prefix('_').ok_or("an SRV name starts with _PORTNAME._tcp.")?;
        let (port_name, rest) = rest.split_once("._tcp.").ok_or("an SRV name is _PORTNAME._tcp.SERVICE")?;
        (rest, Some(port_name), None)
    } else if let Some(rest) = spec.strip_prefix("dns:") {
        let (name, port) = rest.rsplit_once(':').ok_or("dns:NAME:PORT")?;
        (name, None, Some(port.parse::<i64>().map_err(|_| "dns:NAME:PORT with a numeric PORT")?))
    } else {
        return Err("neither srv:NAME nor dns:NAME:PORT".into());
    };
    let svc_name = name.split('.').next().unwrap_or("");
    let svc = b.of_kind("Service").find(|d| d.is_k8s() && d.name() == svc_name).ok_or_else(|| format!("there is no Service {svc_name}"))?;
    if svc.value["spec"]["clusterIP"] != "None" {
        return Err(format!("Service {svc_name} is not headless (clusterIP: None): its name would be one virtual IP, not every pod"));
    }
    let port = arr(&svc.value["spec"]["ports"])
        .iter()
        .find(|p| match (by_name, by_number) {
            (Some(n), _) => p["name"] == n && (p["protocol"].is_null() || p["protocol"] == "TCP"),
            (_, number) => p["port"].as_i64() == number,
        })
        .ok_or_else(|| format!("Service {svc_name} has no such port"))?;
    let target = if port["targetPort"].is_null() { &port["port"] } else { &port["targetPort"] };
    let pods = pods(b);
    let pod = pods.iter().find(|pod| selects(&svc.value, pod)).ok_or_else(|| format!("Service {svc_name} selects no pod"))?;
    let (c, n) = container_port(pod.containers(), target).ok_or_else(|| format!("{}: no container port {target}", pod.at))?;
    let args = args_of(c);
    let serves = is_livecov(c) && !flag_values(&args, "--dir").is_empty() && flag_values(&args, "--listen").iter().any(|l| port_of(l) == Some(n));
    if !serves {
        return Err(format!("{}: port {target} is container {}, not a livecov sidecar listening on {n}", pod.at, container_name(c)));
    }
    Ok(())
}

/// The kustomization lists every manifest and every image.
fn check_kustomization(b: &Bundle, p: &mut Vec<String>) {
    let Some(k) = b.of_kind("Kustomization").find(|d| d.is_k8s()) else {
        p.push("fixtures/k8s: no kustomization.yaml".into());
        return;
    };
    let listed: BTreeSet<&str> = strs(&k.value["resources"]).into_iter().collect();
    let files: BTreeSet<&str> = b.k8s_files.iter().map(String::as_str).filter(|f| *f != "kustomization.yaml").collect();
    for f in files.difference(&listed) {
        p.push(format!("{}: resources does not list {f}", k.file));
    }
    for f in listed.difference(&files) {
        p.push(format!("{}: resources lists {f}, which does not exist", k.file));
    }
    let used: BTreeSet<&str> = pods(b).iter().flat_map(|pod| pod.containers()).filter_map(|c| c["image"].as_str()).map(image_repo).collect();
    let named: BTreeSet<&str> = arr(&k.value["images"]).iter().filter_map(|i| i["name"].as_str()).collect();
    for i in used.difference(&named) {
        p.push(format!("{}: images does not name {i}", k.file));
    }
    for i in named.difference(&used) {
        p.push(format!("{}: images names {i}, which no container uses", k.file));
    }
}

/// The declared params (with defaults), results and workspaces of a Task spec.
struct TaskDecl {
    params: BTreeMap<String, Option<String>>,
    results: BTreeSet<String>,
    workspaces: BTreeSet<String>,
    /// Workspaces a run may leave unbound (`optional: true`).
    optional: BTreeSet<String>,
}

fn task_decl(spec: &Value) -> TaskDecl {
    let names = |f: &str| arr(&spec[f]).iter().filter_map(|x| x["name"].as_str().map(str::to_owned)).collect();
    TaskDecl {
        params: arr(&spec["params"]).iter().filter_map(|x| Some((x["name"].as_str()?.to_owned(), x["default"].as_str().map(str::to_owned)))).collect(),
        results: names("results"),
        workspaces: names("workspaces"),
        optional: arr(&spec["workspaces"]).iter().filter(|x| x["optional"] == true).filter_map(|x| x["name"].as_str().map(str::to_owned)).collect(),
    }
}

/// A Task spec's variables name what it declares; its scripts take params
/// from the environment only; what it declares is used.
fn check_task_spec(spec: &Value, at: &str, p: &mut Vec<String>) -> TaskDecl {
    let decl = task_decl(spec);
    let mut strings = Vec::new();
    all_strings(spec, String::new(), &mut strings);
    let mut used = BTreeSet::new();
    for (pointer, s) in &strings {
        for r in tekton_refs(s) {
            let parts: Vec<&str> = r.split('.').collect();
            let ok = match parts.as_slice() {
                ["params", n] => decl.params.contains_key(*n),
                ["workspaces", n, "path"] => decl.workspaces.contains(*n),
                // Only an optional workspace may be unbound.
                ["workspaces", n, "bound"] => decl.optional.contains(*n),
                ["results", n, "path"] => decl.results.contains(*n),
                _ => false,
            };
            if !ok {
                p.push(format!(
                    "{at}: $({r}) at {pointer} is not a declared param, workspace path (or bound, if optional) or result path"
                ));
            }
            used.insert(r.to_owned());
            if parts[0] == "params" && pointer.ends_with("/script") {
                p.push(format!("{at}: the script pastes $({r}); pass params through env instead"));
            }
        }
    }
    for n in decl.params.keys() {
        if !used.contains(&format!("params.{n}")) {
            p.push(format!("{at}: param {n} is used nowhere"));
        }
    }
    for n in &decl.results {
        if !used.contains(&format!("results.{n}.path")) {
            p.push(format!("{at}: result {n} is written nowhere"));
        }
    }
    for n in &decl.workspaces {
        if !used.contains(&format!("workspaces.{n}.path")) {
            p.push(format!("{at}: workspace {n} is used nowhere"));
        }
    }
    let volumes: BTreeSet<&str> = arr(&spec["volumes"]).iter().filter_map(|v| v["name"].as_str()).collect();
    let mut mounted = BTreeSet::new();
    for step in arr(&spec["steps"]) {
        for m in arr(&step["volumeMounts"]) {
            let name = m["name"].as_str().unwrap_or("");
            mounted.insert(name);
            if !volumes.contains(name) {
                p.push(format!("{at}, step {}: mounts volume {name}, which the Task does not define", container_name(step)));
            }
        }
    }
    for v in volumes.difference(&mounted) {
        p.push(format!("{at}: volume {v} is mounted by no step"));
    }
    decl
}

/// `s` with `$(params.NAME)` replaced by `params[NAME]`.
fn with_params(s: &str, params: &BTreeMap<String, String>) -> String {
    params.iter().fold(s.to_owned(), |s, (k, v)| s.replace(&format!("$(params.{k})"), v))
}

/// The livecov-collect Task: its variables, image, binary, and its defaults
/// name the headless Service and the token the pods require.
fn check_task(b: &Bundle, binary: Option<&str>, pod_token: Option<&SecretKey>, p: &mut Vec<String>) {
    let Some(task) = b.find("Task", "livecov-collect") else {
        p.push(format!("{TEKTON}: no Task livecov-collect"));
        return;
    };
    let at = task.at();
    let spec = &task.value["spec"];
    let decl = check_task_spec(spec, &at, p);
    let defaults: BTreeMap<String, String> = decl.params.iter().map(|(k, v)| (k.clone(), v.clone().unwrap_or_default())).collect();
    let livecov_image = pods(b).iter().flat_map(|pod| pod.containers()).find(|c| is_livecov(c)).and_then(|c| c["image"].as_str());
    for step in arr(&spec["steps"]) {
        let step_at = format!("{at}, step {}", container_name(step));
        if step["image"].as_str() != livecov_image {
            p.push(format!("{step_at}: image {} is not the livecov image of fixtures/k8s ({livecov_image:?})", step["image"]));
        }
        let script = step["script"].as_str().unwrap_or("");
        if !script.lines().any(|l| l.trim_start().starts_with("livecov ")) {
            p.push(format!("{step_at}: the script never runs livecov"));
        }
        if binary.is_some_and(|bin| !DEFAULT_PATH.split(':').any(|d| Some(d) == bin.rsplit_once('/').map(|x| x.0))) {
            p.push(format!("{step_at}: the script runs `livecov` from PATH, the image has it elsewhere"));
        }
        // Env values under the token mount are keys of the Secret, with the defaults.
        for e in arr(&step["env"]) {
            let value = with_params(e["value"].as_str().unwrap_or(""), &defaults);
            for m in arr(&step["volumeMounts"]) {
                let Some(file) = m["mountPath"].as_str().and_then(|mp| value.strip_prefix(mp)?.strip_prefix('/')) else { continue };
                let volume = arr(&spec["volumes"]).iter().find(|v| v["name"] == m["name"]);
                let Some(secret) = volume.and_then(|v| v["secret"]["secretName"].as_str()) else { continue };
                let secret = with_params(secret, &defaults);
                match b.secret_keys(&secret) {
                    None => p.push(format!("{step_at}: Secret {secret} (the default) is not in fixtures/k8s")),
                    Some(keys) if !keys.contains(file) => p.push(format!("{step_at}: env {}: Secret {secret} has no key {file}", e["name"])),
                    Some(_) => {
                        let key = (secret.clone(), file.to_owned());
                        if pod_token.is_some_and(|t| *t != key) {
                            p.push(format!("{step_at}: env {} is token {key:?}, the pods require {pod_token:?}", e["name"]));
                        }
                    }
                }
            }
        }
    }
    if let Some(replicas) = defaults.get("replicas").filter(|r| !r.is_empty()) {
        if let Err(e) = replicas_target(b, replicas) {
            p.push(format!("{at}: param replicas defaults to {replicas}: {e}"));
        }
    }
}

/// Pipelines pass declared params, bind the Tasks' workspaces and read
/// results that exist.
fn check_pipelines(b: &Bundle, p: &mut Vec<String>) {
    for pipeline in b.of_kind("Pipeline") {
        let at = pipeline.at();
        let spec = &pipeline.value["spec"];
        let params: BTreeSet<&str> = arr(&spec["params"]).iter().filter_map(|x| x["name"].as_str()).collect();
        let workspaces: BTreeSet<&str> = arr(&spec["workspaces"]).iter().filter_map(|x| x["name"].as_str()).collect();
        let optional: BTreeSet<&str> =
            arr(&spec["workspaces"]).iter().filter(|x| x["optional"] == true).filter_map(|x| x["name"].as_str()).collect();
        let mut decls: BTreeMap<(&str, &str), TaskDecl> = BTreeMap::new();
        let tasks = arr(&spec["tasks"]).iter().map(|t| ("tasks", t));
        let finally = arr(&spec["finally"]).iter().map(|t| ("finally", t));
        let names: BTreeSet<&str> = arr(&spec["tasks"]).iter().filter_map(|t| t["name"].as_str()).collect();
        for (section, t) in tasks.chain(finally) {
            let name = t["name"].as_str().unwrap_or("?");
            let task_at = format!("{at}, task {name}");
            let decl = if let Some(r) = t["taskRef"]["name"].as_str() {
                match b.find("Task", r) {
                    Some(task) => task_decl(&task.value["spec"]),
                    None => {
                        p.push(format!("{task_at}: taskRef {r}, which fixtures/tekton does not define"));
                        continue;
                    }
                }
            } else if t["taskSpec"].is_object() {
                check_task_spec(&t["taskSpec"], &task_at, p)
            } else {
                p.push(format!("{task_at}: neither taskRef nor taskSpec"));
                continue;
            };
            let passed: BTreeSet<&str> = arr(&t["params"]).iter().filter_map(|x| x["name"].as_str()).collect();
            for n in &passed {
                if !decl.params.contains_key(*n) {
                    p.push(format!("{task_at}: passes param {n}, which the Task does not declare"));
                }
            }
            for (n, default) in &decl.params {
                if default.is_none() && !passed.contains(n.as_str()) {
                    p.push(format!("{task_at}: does not pass param {n}, which has no default"));
                }
            }
            let bound: BTreeSet<&str> = arr(&t["workspaces"]).iter().filter_map(|x| x["name"].as_str()).collect();
            let required: BTreeSet<&str> = decl.workspaces.difference(&decl.optional).map(String::as_str).collect();
            if !bound.is_subset(&decl.workspaces.iter().map(String::as_str).collect()) || !required.is_subset(&bound) {
                p.push(format!("{task_at}: binds workspaces {bound:?}, the Task has {:?} ({:?} optional)", decl.workspaces, decl.optional));
            }
            for x in arr(&t["workspaces"]) {
                let (Some(name), Some(w)) = (x["name"].as_str(), x["workspace"].as_str()) else { continue };
                if !workspaces.contains(w) {
                    p.push(format!("{task_at}: binds pipeline workspace {w}, which is not declared"));
                } else if optional.contains(w) && !decl.optional.contains(name) {
                    p.push(format!("{task_at}: binds the optional pipeline workspace {w} to {name}, which the Task requires"));
                }
            }
            for after in strs(&t["runAfter"]) {
                if !names.contains(after) {
                    p.push(format!("{task_at}: runAfter {after}, which is no task of the pipeline"));
                }
            }
            decls.insert((section, name), decl);
        }
        // Variables outside inline task specs: pipeline params and task results.
        let mut outer = spec.clone();
        for section in ["tasks", "finally"] {
            for t in outer[section].as_array_mut().into_iter().flatten() {
                t.as_object_mut().map(|o| o.remove("taskSpec"));
            }
        }
        let mut strings = Vec::new();
        all_strings(&outer, String::new(), &mut strings);
        for (pointer, s) in strings {
            for r in tekton_refs(s) {
                let parts: Vec<&str> = r.split('.').collect();
                let ok = match parts.as_slice() {
                    ["params", n] => params.contains(n),
                    [section @ ("tasks" | "finally"), t, "results", n] => decls.get(&(*section, *t)).is_some_and(|d| d.results.contains(*n)),
                    _ => false,
                };
                if !ok {
                    p.push(format!("{at}: $({r}) at {pointer} names no declared param or task result"));
                }
            }
        }
    }
}

// ---------------------------------------------------------------- the static tests

#[test]
fn manifests_refer_to_each_other() {
    let b = Bundle::load();
    let kinds: BTreeSet<&str> = b.docs.iter().map(Doc::kind).collect();
    for kind in ["Deployment", "Service", "Secret", "Kustomization", "Task", "Pipeline"] {
        assert!(kinds.contains(kind), "no {kind} in fixtures/k8s or fixtures/tekton (found {kinds:?})");
    }
    let problems = problems(&b);
    assert!(problems.is_empty(), "the manifests do not fit together:\n  {}", problems.join("\n  "));
}

/// Each mutation breaks one reference, the way an edit in one file drifts
/// from the others; the checker must name it.
#[test]
fn checker_reports_drift() {
    let original = Bundle::load();
    assert_eq!(problems(&original), Vec::<String>::new(), "the manifests must pass before they are broken");
    type Mutation = (&'static str, &'static str, fn(&mut Bundle));
    let mutations: [Mutation; 16] = [
        ("a pod label", "Service service-coverage: its selector", |b| {
            *b.find_mut("Deployment", "service").pointer_mut("/spec/template/metadata/labels/app.kubernetes.io~1name").unwrap() = "svc".into();
        }),
        ("the sidecar's --dir", "--dir /coverage is not a mounted volume", |b| {
            *b.find_mut("Deployment", "service").pointer_mut("/spec/template/spec/containers/1/args/2").unwrap() = "/coverage".into();
        }),
        ("the service's LIVECOV_DIR", "LIVECOV_DIR=/var/cov is not a mounted volume", |b| {
            *b.find_mut("Deployment", "service").pointer_mut("/spec/template/spec/containers/0/env/0/value").unwrap() = "/var/cov".into();
        }),
        ("the sidecar's user", "it could not open the agents' sockets", |b| {
            *b.find_mut("Deployment", "service").pointer_mut("/spec/template/spec/containers/1/securityContext").unwrap() = serde_json::json!({"runAsUser": 1000});
        }),
        ("a Secret key", "has no key pod-token", |b| {
            b.find_mut("Secret", "livecov-tokens")["stringData"].as_object_mut().unwrap().remove("pod-token");
        }),
        ("the aggregator's token", "the aggregator sends", |b| {
            *b.find_mut("Deployment", "livecov-aggregator").pointer_mut("/spec/template/spec/containers/0/args/4").unwrap() = "/run/secrets/livecov/aggregator-token".into();
        }),
        ("the headless Service's port name", "--replicas srv:_coverage._tcp.service-coverage: Service service-coverage has no such port", |b| {
            *b.find_mut("Service", "service-coverage").pointer_mut("/spec/ports/0/name").unwrap() = "cov".into();
        }),
        ("the aggregator's poll interval", "preStop sleep Some(20) is not longer than the aggregator's --poll-interval 30", |b| {
            *b.find_mut("Deployment", "livecov-aggregator").pointer_mut("/spec/template/spec/containers/0/args/8").unwrap() = "30".into();
        }),
        ("the port of a dns: spec", "--replicas dns:service-coverage:8080: Service service-coverage has no such port", |b| {
            *b.find_mut("Deployment", "livecov-aggregator").pointer_mut("/spec/template/spec/containers/0/args/2").unwrap() = "dns:service-coverage:8080".into();
        }),
        ("an unquoted number in args", "is not a string (quote it)", |b| {
            *b.find_mut("Deployment", "service").pointer_mut("/spec/template/spec/containers/1/args/8").unwrap() = 20.into();
        }),
        ("a result in the Task's script", "$(results.lcov-path.path)", |b| {
            let script = b.find_mut("Task", "livecov-collect").pointer_mut("/spec/steps/0/script").unwrap();
            *script = script.as_str().unwrap().replace("$(results.lcov.path)", "$(results.lcov-path.path)").into();
        }),
        ("the optional workspace the step tests", "$(workspaces.output.bound)", |b| {
            let env = b.find_mut("Task", "livecov-collect").pointer_mut("/spec/steps/0/env").unwrap();
            for e in env.as_array_mut().unwrap() {
                if e["value"] == "$(workspaces.dockerconfig.bound)" {
                    e["value"] = "$(workspaces.output.bound)".into();
                }
            }
        }),
        ("the push login's workspace, made required", "task reset-coverage: binds workspaces", |b| {
            let workspaces = b.find_mut("Task", "livecov-collect").pointer_mut("/spec/workspaces").unwrap();
            for w in workspaces.as_array_mut().unwrap() {
                w.as_object_mut().unwrap().remove("optional");
            }
        }),
        ("a param the Pipeline passes", "passes param allow_partial", |b| {
            *b.find_mut("Pipeline", "e2e-with-coverage").pointer_mut("/spec/tasks/0/params/2/name").unwrap() = "allow_partial".into();
        }),
        ("a file of the kustomization", "resources does not list aggregator.yaml", |b| {
            let k = b.docs.iter_mut().find(|d| d.kind() == "Kustomization").unwrap();
            k.value["resources"].as_array_mut().unwrap().retain(|r| r != "aggregator.yaml");
        }),
        ("the Containerfile's install path", "is not [/opt/livecov]", |b| {
            b.containerfile = b.containerfile.replace("/src/target/release/livecov /usr/local/bin/livecov", "/src/target/release/livecov /opt/livecov");
        }),
    ];
    for (what, needle, mutate) in mutations {
        let mut b = original.clone();
        mutate(&mut b);
        let found = problems(&b);
        assert!(found.iter().any(|p| p.contains(needle)), "after changing {what}, the checker did not say {needle:?}; it said:\n  {}", found.join("\n  "));
    }
    // The same pods by A records and their port, with the namespace: no drift.
    let mut b = original.clone();
    *b.find_mut("Deployment", "livecov-aggregator").pointer_mut("/spec/template/spec/containers/0/args/2").unwrap() =
        "dns:service-coverage.ci.svc.cluster.local:9464".into();
    assert_eq!(problems(&b), Vec::<String>::new());
}

// ---------------------------------------------------------------- running the pieces

/// Volumes as folders, the way the kubelet gives them to containers:
/// emptyDir an empty folder (shared by the pod's containers), a Secret one
/// file per key (or per item) with the template's value.
fn materialize(b: &Bundle, volumes: &[Value], params: &BTreeMap<String, String>, dir: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    for v in volumes {
        let name = v["name"].as_str().expect("a volume name");
        let path = dir.join("volumes").join(name);
        std::fs::create_dir_all(&path).expect("create the volume's folder");
        if let Some(secret) = v["secret"]["secretName"].as_str() {
            let secret = with_params(secret, params);
            let doc = b.find("Secret", &secret).unwrap_or_else(|| panic!("no Secret {secret}"));
            let data = doc.value["stringData"].as_object().expect("the Secret template gives stringData");
            let items: Vec<(String, String)> = match v["secret"]["items"].as_array() {
                Some(items) => items.iter().map(|i| (i["key"].as_str().unwrap().to_owned(), i["path"].as_str().unwrap().to_owned())).collect(),
                None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
            };
            for (key, file) in items {
                std::fs::write(path.join(file), data[&key].as_str().expect("a string value")).expect("write a Secret file");
            }
        }
        out.insert(name.to_owned(), path);
    }
    out
}

/// `value` as the container sees it on this machine: a path under one of
/// its mounts points into that volume's folder, and the pod's `0.0.0.0:PORT`
/// is a loopback port picked by the kernel.
fn localize(value: &str, container: &Value, volumes: &BTreeMap<String, PathBuf>) -> String {
    if value.starts_with("0.0.0.0:") {
        return "127.0.0.1:0".into();
    }
    let mut mounts: Vec<(&str, &Path)> = arr(&container["volumeMounts"])
        .iter()
        .map(|m| (m["mountPath"].as_str().unwrap(), volumes[m["name"].as_str().unwrap()].as_path()))
        .collect();
    mounts.sort_by_key(|(mp, _)| std::cmp::Reverse(mp.len()));
    for (mp, host) in mounts {
        if value == mp {
            return host.to_str().unwrap().to_owned();
        }
        if let Some(rest) = value.strip_prefix(mp).and_then(|r| r.strip_prefix('/')) {
            return host.join(rest).to_str().unwrap().to_owned();
        }
    }
    value.to_owned()
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    arr(&pod["containers"]).iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no container {name}"))
}

fn secret_value(b: &Bundle, secret: &str, key: &str) -> String {
    b.find("Secret", secret).and_then(|s| s.value["stringData"][key].as_str()).unwrap_or_else(|| panic!("no key {key} in Secret {secret}")).to_owned()
}

/// A pod of the service and the aggregator, run from the manifests: the
/// service with its container's args and env (LIVECOV_DIR, the flush
/// period), the pod's sidecar and the aggregator with their exact args.
/// The aggregator finds the pod through the SRV record its --replicas
/// names, sends the pod token, and keeps the pod's coverage after the pod
/// is gone.
#[test]
fn pod_sidecar_and_aggregator_run_as_the_manifests_say() {
    let b = Bundle::load();
    let dir = scratch("manifests", "pod");
    let params = BTreeMap::new();

    // The service's pod: the instrumented service and its sidecar on one volume.
    let pod = &b.find("Deployment", "service").expect("Deployment service").value["spec"]["template"]["spec"];
    let volumes = materialize(&b, arr(&pod["volumes"]), &params, &dir.join("pod"));
    let app = container(pod, "service");
    let mut cmd = Command::new(service_bin());
    cmd.env_clear().args(args_of(app).iter().map(|a| localize(a, app, &volumes)));
    for e in arr(&app["env"]) {
        cmd.env(e["name"].as_str().unwrap(), localize(e["value"].as_str().unwrap(), app, &volumes));
    }
    let cov = PathBuf::from(localize(env_value(app, "LIVECOV_DIR").expect("LIVECOV_DIR"), app, &volumes));
    let mut service = Service::spawn(cmd, cov);
    let instance = service.instance();

    let side = container(pod, "livecov");
    let side_args: Vec<String> = args_of(side).iter().map(|a| localize(a, side, &volumes)).collect();
    let side_args: Vec<&str> = side_args.iter().map(String::as_str).collect();
    assert_eq!(side_args[0], "sidecar");
    let mut sidecar = Sidecar::start(&side_args[1..], None);
    let pod_token = secret_value(&b, "livecov-tokens", "pod-token");
    assert_eq!(sidecar.get("/coverage").status, 401, "the pod sidecar answers without the token");
    sidecar.token = Some(pod_token.clone());

    service.get("/hello?name=k8s");
    let pod_lcov = sidecar.coverage("");
    assert!(function_count(&pod_lcov, "handlers::hello") >= 1, "the pod sidecar does not see the service's /hello:\n{pod_lcov}");
    let targets = sidecar.targets();
    assert_eq!(targets.len(), 1, "{targets:?}");
    assert_eq!(targets[0]["instance"], instance.as_str());

    // The aggregator, its --replicas answered by a stand-in for cluster DNS.
    let agg_doc = &b.find("Deployment", "livecov-aggregator").expect("Deployment livecov-aggregator").value["spec"]["template"]["spec"];
    let agg_volumes = materialize(&b, arr(&agg_doc["volumes"]), &params, &dir.join("aggregator"));
    let agg = container(agg_doc, "livecov");
    let spec = flag_values(&args_of(agg), "--replicas")[0].to_owned();
    let srv = spec.strip_prefix("srv:").expect("the aggregator names the SRV records");
    let svc = srv.split("._tcp.").nth(1).unwrap();
    let host = format!("pod-0.{svc}");
    let records = [format!("--host-record={host},127.0.0.1"), format!("--srv-host={srv},{host},{}", sidecar.addr.unwrap().port())];
    let dns = Dns::with_records(&dir, &records, &host, &["127.0.0.1"]);
    let mut agg_args: Vec<String> = args_of(agg).iter().map(|a| localize(a, agg, &agg_volumes)).collect();
    agg_args.extend(["--dns-server".to_owned(), dns.addr.to_string()]);
    let agg_args: Vec<&str> = agg_args.iter().map(String::as_str).collect();
    let mut aggregator = Sidecar::start(&agg_args[1..], None);
    aggregator.token = Some(pod_token.clone());
    assert_eq!(aggregator.get("/coverage").status, 401, "the aggregator takes the pod token, not its own");
    aggregator.token = Some(secret_value(&b, "livecov-tokens", "aggregator-token"));

    let merged = wait_for("the aggregator to merge the pod", || {
        let r = aggregator.get("/coverage");
        (r.status == 200 && r.header("livecov-instances") == Some("1")).then(|| r.text())
    });
    assert!(function_count(&merged, "handlers::hello") >= 1, "the aggregator's merge lacks /hello:\n{merged}");
    let row = aggregator.targets().into_iter().find(|t| t["source"] == spec.as_str()).expect("a target from --replicas");
    assert_eq!((row["instance"].as_str(), row["state"].as_str()), (Some(sidecar.instance.as_str()), Some("running")), "{row}");

    // The pod is deleted: the kubelet sends SIGTERM to the service, whose
    // agent writes a final report, while the sidecar sleeps in preStop; the
    // aggregator's next round takes that report (with /fib, never polled
    // before), and keeps it after the sidecar is gone too.
    service.get("/fib?n=12");
    unsafe { libc::kill(service.child.id() as i32, libc::SIGTERM) };
    let status = service.child.wait().expect("wait for the service");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGTERM), "{status}");
    let last = aggregator.coverage("");
    let fib = function_count(&last, "handlers::fib");
    assert!(fib >= 1, "the aggregator missed the final report of the terminated service:\n{last}");
    drop(sidecar);
    let after = aggregator.coverage("");
    assert_eq!(function_count(&after, "handlers::fib"), fib, "the gone pod's coverage changed:\n{after}");
    let row = aggregator.targets().into_iter().find(|t| t["source"] == spec.as_str()).expect("the gone pod's row");
    assert_ne!(row["state"], "running", "{row}");
    assert_eq!(row["in_merge"], true, "{row}");
    assert!(aggregator.alive());
}

/// The Task's step as Tekton runs it: variables substituted, the script
/// written to a file and executed with the step's env and the image's
/// `livecov` on PATH; the token a file of the Secret volume.
struct TaskRun {
    dir: PathBuf,
    /// The workspace `output`.
    workspace: PathBuf,
    /// The optional workspaces bound, and their folders.
    bound: BTreeMap<String, PathBuf>,
}

struct StepOutcome {
    status: std::process::ExitStatus,
    stderr: String,
    results: BTreeMap<String, String>,
}

impl TaskRun {
    fn new(name: &str) -> TaskRun {
        let dir = scratch("manifests", name);
        let workspace = dir.join("workspace");
        std::fs::create_dir_all(&workspace).unwrap();
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(livecov_bin(), bin.join("livecov")).expect("put livecov on the step's PATH");
        TaskRun { dir, workspace, bound: BTreeMap::new() }
    }

    /// Binds the optional workspace `name` to the folder `path`.
    fn bind(mut self, name: &str, path: &Path) -> TaskRun {
        self.bound.insert(name.to_owned(), path.to_path_buf());
        self
    }

    /// Runs step `collect` of the Task with `given` params over the defaults.
    fn run(&self, b: &Bundle, given: &[(&str, &str)]) -> StepOutcome {
        let task = &b.find("Task", "livecov-collect").expect("Task livecov-collect").value["spec"];
        let decl = task_decl(task);
        let mut params: BTreeMap<String, String> = decl.params.iter().map(|(k, v)| (k.clone(), v.clone().unwrap_or_default())).collect();
        for (k, v) in given {
            assert!(params.contains_key(*k), "the Task has no param {k}");
            params.insert(k.to_string(), v.to_string());
        }
        let results_dir = self.dir.join("results");
        let _ = std::fs::remove_dir_all(&results_dir);
        std::fs::create_dir_all(&results_dir).unwrap();
        let substitute = |s: &str| -> String {
            let mut s = with_params(s, &params);
            for w in &decl.workspaces {
                let path = match self.bound.get(w) {
                    Some(path) => Some(path.as_path()),
                    None if decl.optional.contains(w) => None,
                    None => Some(self.workspace.as_path()),
                };
                // Tekton's values for an optional workspace left unbound.
                s = s.replace(&format!("$(workspaces.{w}.path)"), path.map_or("", |p| p.to_str().unwrap()));
                s = s.replace(&format!("$(workspaces.{w}.bound)"), if path.is_some() { "true" } else { "false" });
            }
            for r in &decl.results {
                s = s.replace(&format!("$(results.{r}.path)"), results_dir.join(r).to_str().unwrap());
            }
            assert!(tekton_refs(&s).is_empty(), "variables left after substitution: {:?}", tekton_refs(&s));
            s
        };
        let volumes = materialize(b, arr(&task["volumes"]), &params, &self.dir);
        let step = arr(&task["steps"]).iter().find(|s| s["name"] == "collect").expect("step collect");
        let script = self.dir.join("script");
        std::fs::write(&script, substitute(step["script"].as_str().expect("a script"))).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut cmd = Command::new(&script);
        cmd.env_clear().env("PATH", format!("{}:/usr/bin:/bin", self.dir.join("bin").display()));
        for e in arr(&step["env"]) {
            cmd.env(e["name"].as_str().unwrap(), localize(&substitute(e["value"].as_str().unwrap()), step, &volumes));
        }
        let out = cmd.stdin(Stdio::null()).output().expect("run the step's script");
        let results = decl.results.iter().filter_map(|r| Some((r.clone(), std::fs::read_to_string(results_dir.join(r)).ok()?))).collect();
        StepOutcome { status: out.status, stderr: String::from_utf8_lossy(&out.stderr).into_owned(), results }
    }
}

/// The pipeline's livecov-collect tasks, in order, with their params
/// (pipeline params at their defaults).
fn pipeline_collections(b: &Bundle) -> Vec<(String, Vec<(String, String)>)> {
    let spec = &b.find("Pipeline", "e2e-with-coverage").expect("Pipeline e2e-with-coverage").value["spec"];
    let defaults: BTreeMap<String, String> =
        arr(&spec["params"]).iter().map(|x| (x["name"].as_str().unwrap().to_owned(), x["default"].as_str().unwrap_or("").to_owned())).collect();
    arr(&spec["tasks"])
        .iter()
        .chain(arr(&spec["finally"]))
        .filter(|t| t["taskRef"]["name"] == "livecov-collect")
        .map(|t| {
            let params = arr(&t["params"]).iter().map(|x| (x["name"].as_str().unwrap().to_owned(), with_params(x["value"].as_str().unwrap(), &defaults))).collect();
            (t["name"].as_str().unwrap().to_owned(), params)
        })
        .collect()
}

/// The Task's collect step, really run against the fixture service's agent
/// on TCP with the Secret's pod token, with the params of the pipeline's
/// two collections around a test: what ran before is in `before`, what the
/// test ran (and only that, thanks to the reset) in the test's folder; the
/// results name the files and give the numbers of manifest.json.
#[test]
fn tekton_task_collects_into_the_workspace() {
    let b = Bundle::load();
    let port = replicas::free_port();
    let token = secret_value(&b, "livecov-tokens", "pod-token");
    let listen = format!("127.0.0.1:{port}");
    let service = Service::start("manifests", "tekton-service", &[], &[("LIVECOV_LISTEN", &listen), ("LIVECOV_TOKEN", &token)]);
    wait_for("the agent's TCP listener", || std::net::TcpStream::connect(&listen).ok());
    let target = format!("http://{listen}");
    let run = TaskRun::new("tekton");

    let collections = pipeline_collections(&b);
    assert_eq!(collections.len(), 2, "the pipeline collects before and after the tests: {collections:?}");
    service.get("/hello?name=startup");
    let mut outputs = Vec::new();
    for (i, (task, params)) in collections.iter().enumerate() {
        if i == 1 {
            // What the pipeline's run-tests does.
            service.get("/hello?name=ci");
            service.get("/fib?n=20");
        }
        let mut given: Vec<(&str, &str)> = params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        given.extend([("replicas", ""), ("target", target.as_str())]);
        let out = run.run(&b, &given);
        assert!(out.status.success(), "task {task}: the step failed ({}): {}", out.status, out.stderr);
        let test = params.iter().find(|(k, _)| k == "test").map(|(_, v)| v.clone()).expect("a test name");

        // The results name the workspace's files and give manifest.json's numbers.
        let lcov_path = run.workspace.join(&out.results["lcov"]);
        let manifest_path = run.workspace.join(&out.results["manifest"]);
        assert_eq!(out.results["lcov"], format!("coverage/{test}/merged.lcov"));
        let manifest: Value = serde_json::from_str(&std::fs::read_to_string(&manifest_path).expect("manifest.json at the result's path")).expect("JSON");
        let lcov = std::fs::read_to_string(&lcov_path).expect("merged.lcov at the result's path");
        let (hit, found) = (manifest["totals"]["lines_hit"].as_u64().unwrap(), manifest["totals"]["lines"].as_u64().unwrap());
        assert!(hit > 0 && found > hit, "{}", manifest["totals"]);
        assert_eq!(out.results["lines"], format!("{hit}/{found}"));
        assert_eq!(out.results["line-percent"], format!("{:.2}", 100.0 * hit as f64 / found as f64));
        assert_eq!((manifest["test"].as_str(), manifest["reset"].as_bool()), (Some(test.as_str()), Some(true)));
        assert_eq!(manifest["targets"][0]["address"], target.as_str());
        assert_eq!(test_names(&lcov), [test.as_str()]);
        // The Pipeline asks for a Cobertura report of the tests only, and no push.
        let cobertura = params.iter().find(|(k, _)| k == "cobertura").map(|(_, v)| v.as_str());
        match cobertura {
            Some(name) if !name.is_empty() => {
                assert_eq!(out.results["cobertura"], format!("coverage/{test}/{name}"));
                let xml = std::fs::read_to_string(run.workspace.join(&out.results["cobertura"])).expect("the Cobertura report");
                assert!(xml.starts_with("<?xml") && xml.contains(r#"filename="handlers.rs""#), "{xml}");
            }
            _ => assert_eq!(out.results["cobertura"], ""),
        }
        assert_eq!(out.results["artifact"], "");
        outputs.push(lcov);
    }
    // The reset of the first collection: each /hello counted once, where it ran.
    assert_eq!(function_count(&outputs[0], HELLO), 1, "{}", outputs[0]);
    assert_eq!((function_count(&outputs[1], HELLO), function_count(&outputs[1], FIB) > 0), (1, true), "{}", outputs[1]);
}

/// The Task's defaults (the headless Service's SRV name) on a machine
/// without cluster DNS: collect runs with the Task's arguments and fails on
/// the name (status 1, the files and results still written), never on its
/// command line (status 2); a bad flag param is refused by the script.
#[test]
fn tekton_task_defaults_reach_livecov_and_fail_on_dns_only() {
    let b = Bundle::load();
    let run = TaskRun::new("tekton-defaults");
    let out = run.run(&b, &[("test", "nodns"), ("reset", "true")]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(!out.stderr.contains("Usage:"), "livecov refused the Task's arguments: {}", out.stderr);
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(run.workspace.join(&out.results["manifest"])).expect("manifest.json")).expect("JSON");
    let default = task_decl(&b.find("Task", "livecov-collect").unwrap().value["spec"]).params["replicas"].clone().unwrap();
    assert_eq!(manifest["sources"][0]["source"], default.as_str(), "{manifest}");
    assert_eq!(out.results["lines"], "0/0");

    let out = run.run(&b, &[("reset", "yes")]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("param reset must be \"true\" or \"false\""), "{}", out.stderr);

    // allow-empty reaches livecov as --allow-empty, and is checked too.
    let out = run.run(&b, &[("test", "empty"), ("allow-empty", "true")]);
    assert!(!out.stderr.contains("Usage:") && !out.stderr.contains("unexpected argument"), "{}", out.stderr);
    let out = run.run(&b, &[("allow-empty", "maybe")]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("param allow-empty must be \"true\" or \"false\""), "{}", out.stderr);
    // So are push-plain-http and cobertura, before anything is collected.
    let out = run.run(&b, &[("push", "localhost:5000/coverage:x"), ("push-plain-http", "maybe")]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("param push-plain-http must be \"true\" or \"false\""), "{}", out.stderr);
    let out = run.run(&b, &[("cobertura", "../coverage.xml")]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("param cobertura is a file name"), "{}", out.stderr);
}

/// The Task's report, push and gate, really run: a Cobertura report beside
/// merged.lcov, the folder pushed to a registry on loopback (an htpasswd
/// login from the workspace dockerconfig, bound as a dockerconfigjson
/// Secret is), and the step failing under the threshold only after both.
#[test]
fn tekton_task_writes_cobertura_pushes_and_fails_under_the_threshold() {
    let b = Bundle::load();
    let port = replicas::free_port();
    let token = secret_value(&b, "livecov-tokens", "pod-token");
    let listen = format!("127.0.0.1:{port}");
    let service = Service::start("manifests", "tekton-push-service", &[], &[("LIVECOV_LISTEN", &listen), ("LIVECOV_TOKEN", &token)]);
    wait_for("the agent's TCP listener", || std::net::TcpStream::connect(&listen).ok());
    service.get("/fib?n=10");
    let target = format!("http://{listen}");

    let dir = scratch("manifests", "tekton-registry");
    let htpasswd = dir.join("htpasswd");
    let hash = Command::new("htpasswd").args(["-Bbn", "ci", "s3cret"]).output().expect("run htpasswd (apache2-utils)");
    std::fs::write(&htpasswd, hash.stdout).unwrap();
    let registry = livecov_tests::registry::Registry::start(&dir, livecov_tests::registry::Auth::Htpasswd(&htpasswd), None);
    let dockerconfig = dir.join("dockerconfig");
    std::fs::create_dir_all(&dockerconfig).unwrap();
    let auth = Command::new("sh").args(["-c", "printf ci:s3cret | base64 -w0"]).output().expect("run base64").stdout;
    let config = serde_json::json!({ "auths": { registry.address.as_str(): { "auth": String::from_utf8_lossy(&auth) } } });
    std::fs::write(dockerconfig.join(".dockerconfigjson"), config.to_string()).unwrap();
    let reference = format!("{}/coverage/service:e2e", registry.address);
    let params = [
        ("replicas", ""),
        ("target", target.as_str()),
        ("test", "e2e"),
        ("cobertura", "coverage.xml"),
        ("push", reference.as_str()),
        ("push-plain-http", "true"),
    ];

    // Under the threshold: the report and the push are done, then the step fails.
    let run = TaskRun::new("tekton-push").bind("dockerconfig", &dockerconfig);
    let out = run.run(&b, &[&params[..], &[("fail-under-lines", "100")]].concat());
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("is under --fail-under-lines 100"), "{}", out.stderr);
    assert_eq!(out.results["cobertura"], "coverage/e2e/coverage.xml");
    let folder = run.workspace.join("coverage/e2e");
    assert!(std::fs::read_to_string(folder.join("coverage.xml")).unwrap().contains("<coverage "));
    let digest = out.results["artifact"].strip_prefix(&format!("{}/coverage/service@", registry.address)).expect("the artifact");
    let login = format!("authorization: Basic {}", String::from_utf8_lossy(&auth));
    let manifest = registry.get(
        &format!("/v2/coverage/service/manifests/{digest}"),
        &["accept: application/vnd.oci.image.manifest.v1+json", &login],
    );
    assert_eq!(manifest.status, 200, "{}", manifest.text());
    let titles: Vec<String> = manifest.json()["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["annotations"]["org.opencontainers.image.title"].as_str().unwrap().to_owned())
        .collect();
    for file in ["coverage.xml", "manifest.json", "merged.lcov"] {
        assert!(titles.iter().any(|t| t == file), "{file} not pushed: {titles:?}");
    }

    // Over it: the step succeeds.
    let out = run.run(&b, &[&params[..], &[("fail-under-lines", "1")]].concat());
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.results["artifact"].starts_with(&format!("{}/coverage/service@sha256:", registry.address)));

    // Without the workspace the registry refuses the push: the step fails, the files stay.
    let run = TaskRun::new("tekton-push-anonymous");
    let out = run.run(&b, &params);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("asks for a login"), "{}", out.stderr);
    assert_eq!((out.results["artifact"].as_str(), out.results["cobertura"].as_str()), ("", "coverage/e2e/coverage.xml"));
    // A workspace with no config in it.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = TaskRun::new("tekton-push-empty").bind("dockerconfig", &empty).run(&b, &params);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("neither config.json nor .dockerconfigjson"), "{}", out.stderr);
}
