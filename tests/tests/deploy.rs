//! The deployment files say what the code does: every `SKEIN_*` and `OTEL_*` variable that
//! `deploy/` sets is one the binaries read, the admin port that probes, services and scrape
//! annotations use is the admin server's default, the gateway's port is the same everywhere and
//! its default's, the binaries the images and containers run exist, the autoscaler watches a
//! stream and consumers the code creates, and pods get longer to stop than the drain takes. Text only: fast and offline (`deploy/validate` renders and checks the
//! manifests themselves).

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Every file under `deploy/`, as (path relative to the repository, text).
fn deploy_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("list {dir:?}: {e}"));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.ends_with("__pycache__") {
                continue;
            }
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(&root().join("deploy"), &mut paths);
    paths.sort();
    let files: Vec<(String, String)> = paths
        .into_iter()
        .map(|path| {
            let text =
                std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path:?}: {e}"));
            let relative = path
                .strip_prefix(root())
                .unwrap_or(&path)
                .display()
                .to_string();
            (relative, text)
        })
        .collect();
    assert!(files.len() > 20, "found deploy/: {} files", files.len());
    files
}

fn deploy_file<'a>(files: &'a [(String, String)], path: &str) -> &'a str {
    files
        .iter()
        .find(|(p, _)| p.ends_with(path))
        .map(|(_, text)| text.as_str())
        .unwrap_or_else(|| panic!("deploy/{path} exists"))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'
}

/// Names starting with `prefix` (`SKEIN_`, `OTEL_`) in `text`: whole upper-case words. A name
/// followed by `*` is a family (`OTEL_BSP_*`) and is returned with its `*`.
fn names(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| is_name_char(c) || c.is_ascii_lowercase()) {
            continue;
        }
        let end = text[start..]
            .char_indices()
            .find(|&(_, c)| !is_name_char(c))
            .map_or(text.len(), |(i, _)| start + i);
        let name = &text[start..end];
        if name.len() == prefix.len() {
            continue; // `SKEIN_*`, `OTEL_*`: the families as a whole
        }
        if text[end..].starts_with('*') {
            found.insert(format!("{name}*"));
        } else if !name.ends_with('_') {
            found.insert(name.to_owned());
        }
    }
    found
}

/// The string values of `pub const` items in a Rust source file.
fn const_values(source: &str, name_prefix: &str) -> BTreeSet<String> {
    source
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with(&format!("pub const {name_prefix}")))
        .filter_map(|l| l.split('"').nth(1))
        .map(str::to_owned)
        .collect()
}

/// `KEY=value` from an env file.
fn env_value(env_file: &str, key: &str) -> Option<String> {
    env_file
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_owned())
}

/// Seconds in a duration as the settings write them (`30s`, `2m`, `1m30s`).
fn seconds(duration: &str) -> u64 {
    let mut total = 0;
    let mut number = String::new();
    for c in duration.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number.parse().unwrap_or_else(|_| panic!("{duration:?}"));
        number.clear();
        total += match c {
            's' => n,
            'm' => n * 60,
            'h' => n * 3600,
            _ => panic!("unit {c:?} in {duration:?}"),
        };
    }
    assert!(number.is_empty(), "{duration:?} ends with a unit");
    total
}

/// The number after `key` on each line that has it, e.g. `terminationGracePeriodSeconds: 60`.
fn numbers_after(text: &str, key: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| l.split_once(key).map(|(_, rest)| rest))
        .filter_map(|rest| {
            let digits: String = rest
                .trim_start_matches([':', ' ', '"', '='])
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect()
}

fn admin_port() -> u64 {
    let admin = repo_file("common/src/admin.rs");
    let default = admin
        .split("env = ENV_ADMIN_ADDR, default_value = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("AdminConfig has a default address");
    default
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("port in {default:?}"))
}

/// The gateway's settings (`SKEIN_GATEWAY_*`), declared beside its code.
const GATEWAY_SETTINGS: &str = "lead/src/gateway/mod.rs";

/// The `shell` tool's settings (`SKEIN_SHELL_*`), declared beside its code; the shell pool
/// (`deploy/k8s/components/shell-pool`) sets them.
const SHELL_SETTINGS: &str = "worker/src/tools/shell/config.rs";

/// The port in an address (`0.0.0.0:8080`).
fn port_of(addr: &str) -> u64 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("port in {addr:?}"))
}

fn gateway_default_port() -> u64 {
    let gateway = repo_file(GATEWAY_SETTINGS);
    let default = gateway
        .split("env = ENV_GATEWAY_ADDR, default_value = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("GatewayConfig has a default address");
    port_of(default)
}

fn binaries() -> BTreeSet<String> {
    let mut bins = BTreeSet::new();
    for manifest in ["lead/Cargo.toml", "worker/Cargo.toml"] {
        let text = repo_file(manifest);
        let mut in_bin = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_bin = line == "[[bin]]";
            } else if in_bin && line.starts_with("name") {
                if let Some(name) = line.split('"').nth(1) {
                    bins.insert(name.to_owned());
                }
            }
        }
    }
    bins
}

#[test]
fn every_skein_variable_in_deploy_is_read_by_the_binaries() {
    let mut variables = const_values(&repo_file("common/src/config.rs"), "ENV_");
    assert!(variables.len() > 20, "found the constants: {variables:?}");
    variables.extend(const_values(&repo_file(GATEWAY_SETTINGS), "ENV_GATEWAY_"));
    variables.extend(const_values(&repo_file(SHELL_SETTINGS), "ENV_SHELL_"));
    let streams = const_values(&repo_file("common/src/subjects.rs"), "");
    let mut used = BTreeSet::new();
    for (path, text) in deploy_files() {
        for name in names(&text, "SKEIN_") {
            let family = name.strip_suffix('*');
            // Stream names (SKEIN_WORK, ...) share the prefix; they must exist too.
            let known = variables.contains(&name)
                || name
                    .strip_suffix("_FILE")
                    .is_some_and(|secret| variables.contains(secret))
                || streams.contains(&name)
                || family.is_some_and(|f| variables.iter().any(|v| v.starts_with(f)));
            assert!(
                known,
                "{path} uses {name}, which is neither a variable in common/src/config.rs, \
                 {GATEWAY_SETTINGS} or {SHELL_SETTINGS} nor a stream in common/src/subjects.rs"
            );
            used.insert(name);
        }
    }
    for essential in [
        "SKEIN_NATS_URL",
        "SKEIN_NATS_PASSWORD",
        "SKEIN_REDIS_URL",
        "SKEIN_INSTANCE_ID",
        "SKEIN_K8S_POD",
        "SKEIN_K8S_NAMESPACE",
        "SKEIN_GRACE",
        "SKEIN_ADMIN_ADDR",
        "SKEIN_WORKSPACE",
        "SKEIN_WORKSPACE_ROOT",
        "SKEIN_SCRATCH_DIR",
        "SKEIN_GATEWAY_ADDR",
        "SKEIN_GATEWAY_KEYS",
    ] {
        assert!(used.contains(essential), "deploy/ sets {essential}");
    }
}

#[test]
fn every_otel_variable_in_deploy_is_read_by_the_telemetry_module() {
    let dir = root().join("common/src/telemetry");
    let mut telemetry = String::new();
    for entry in std::fs::read_dir(&dir).expect("common/src/telemetry") {
        let path = entry.expect("directory entry").path();
        if path.extension().is_some_and(|e| e == "rs") {
            telemetry.push_str(&std::fs::read_to_string(&path).expect("telemetry source"));
        }
    }
    let read = names(&telemetry, "OTEL_");
    assert!(
        read.contains("OTEL_EXPORTER_OTLP_ENDPOINT"),
        "found the telemetry variables: {read:?}"
    );
    let mut used = BTreeSet::new();
    for (path, text) in deploy_files() {
        for name in names(&text, "OTEL_") {
            let known = read.contains(&name)
                || read.iter().any(|family| {
                    family
                        .strip_suffix('*')
                        .is_some_and(|prefix| name.starts_with(prefix))
                });
            assert!(
                known,
                "{path} uses {name}, which common/src/telemetry does not read"
            );
            used.insert(name);
        }
    }
    assert!(
        used.contains("OTEL_EXPORTER_OTLP_ENDPOINT"),
        "deploy/ sends traces somewhere"
    );
}

#[test]
fn the_admin_port_in_deploy_is_the_admin_servers_default() {
    let port = admin_port();
    let files = deploy_files();
    let common_env = deploy_file(&files, "k8s/base/config/common.env");
    let addr = env_value(common_env, "SKEIN_ADMIN_ADDR").expect("SKEIN_ADMIN_ADDR is set");
    assert!(
        addr.ends_with(&format!(":{port}")),
        "SKEIN_ADMIN_ADDR {addr} listens on {port}"
    );

    let mut checked = 0;
    for (path, text) in &files {
        // Scrape annotations.
        for annotated in numbers_after(text, "prometheus.io/port") {
            assert_eq!(annotated, port, "{path}: prometheus.io/port");
            checked += 1;
        }
        // Ports named `admin` (containers and the metrics services): the number follows the name.
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim() == "- name: admin" {
                let next = lines.get(i + 1).copied().unwrap_or_default();
                let number = numbers_after(next, "containerPort")
                    .into_iter()
                    .chain(numbers_after(next, "port"))
                    .next()
                    .unwrap_or_else(|| panic!("{path}: a number follows port `admin`"));
                assert_eq!(number, port, "{path}: port `admin`");
                checked += 1;
            }
        }
        // The probes of leads and workers use that port, by name; the gateway, which has no
        // admin server, its own (`http`, checked below).
        if text.contains("/usr/local/bin/skein-")
            && !text.contains("/usr/local/bin/skein-gateway")
            && path.ends_with(".yaml")
        {
            for (i, line) in lines.iter().enumerate() {
                let trimmed = line.trim();
                if trimmed == "path: /healthz" || trimmed == "path: /readyz" {
                    let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or_default();
                    assert_eq!(next, "port: admin", "{path}: probe on the admin port");
                    checked += 1;
                }
            }
        }
    }
    let dockerfile = deploy_file(&files, "docker/Dockerfile");
    assert_eq!(
        numbers_after(dockerfile, "EXPOSE"),
        vec![port, gateway_default_port()],
        "EXPOSE: the admin port in the runtime, the gateway's in its image"
    );
    assert!(checked >= 12, "found the admin port {checked} times");
}

#[test]
fn the_gateway_listens_where_deploy_sends_its_requests() {
    let port = gateway_default_port();
    let files = deploy_files();
    // The gateway's settings, read by the manifests and the compose file alike.
    let gateway_env = deploy_file(&files, "k8s/base/config/gateway.env");
    let addr = env_value(gateway_env, "SKEIN_GATEWAY_ADDR").expect("SKEIN_GATEWAY_ADDR is set");
    assert_eq!(port_of(&addr), port, "SKEIN_GATEWAY_ADDR {addr}");
    assert!(
        !addr.starts_with("127.") && !addr.starts_with("localhost"),
        "SKEIN_GATEWAY_ADDR {addr} is reachable from outside the pod"
    );
    let keys = env_value(gateway_env, "SKEIN_GATEWAY_KEYS").expect("SKEIN_GATEWAY_KEYS is set");

    // The image: the same address, its port exposed.
    let dockerfile = deploy_file(&files, "docker/Dockerfile");
    assert!(
        dockerfile.contains(&format!("ENV SKEIN_GATEWAY_ADDR={addr}")),
        "the gateway image listens on {addr}"
    );

    // The Deployment: port `http`, probed on /healthz; the keys Secret mounted where
    // SKEIN_GATEWAY_KEYS points.
    let deployment = deploy_file(&files, "k8s/base/skein/gateway.yaml");
    assert!(deployment.contains("command: [\"/usr/local/bin/skein-gateway\"]"));
    let lines: Vec<&str> = deployment.lines().map(str::trim).collect();
    let http = lines
        .iter()
        .position(|l| *l == "- name: http")
        .expect("the gateway names its port `http`");
    assert_eq!(numbers_after(lines[http + 1], "containerPort"), vec![port]);
    let mut probes = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("path: /") {
            assert_eq!(*line, "path: /healthz", "the gateway serves /healthz only");
            assert_eq!(lines[i + 1], "port: http", "probe on the gateway's port");
            probes += 1;
        }
    }
    assert_eq!(probes, 3, "startup, liveness and readiness probes");
    let (directory, file) = keys.rsplit_once('/').expect("SKEIN_GATEWAY_KEYS is a path");
    assert!(
        deployment.contains(&format!("mountPath: {directory}"))
            && deployment.contains("secretName: skein-gateway-keys")
            && deployment.contains(&format!("path: {file}")),
        "Secret skein-gateway-keys is mounted at {directory} with {file}"
    );

    // The Service and compose reach that port.
    let services = deploy_file(&files, "k8s/base/skein/services.yaml");
    let service = services
        .split("\n---\n")
        .find(|doc| doc.contains("name: skein-gateway\n"))
        .expect("a Service for the gateways");
    assert!(service.contains("targetPort: http"));
    assert_eq!(numbers_after(service, "port:"), vec![port]);
    let compose = deploy_file(&files, "compose.yaml");
    assert!(
        compose.contains(&format!(":{port}:{port}\"")),
        "compose publishes the gateway's port"
    );
    assert!(
        compose.contains(&format!(":{keys}:ro")),
        "compose mounts a keys file at {keys}"
    );
}

#[test]
fn the_binaries_deploy_runs_exist() {
    let bins = binaries();
    assert!(
        ["skein-lead", "skein-worker", "skein"]
            .iter()
            .all(|b| bins.contains(*b)),
        "found the binaries: {bins:?}"
    );
    let mut named = BTreeSet::new();
    for (path, text) in deploy_files() {
        let mut rest = text.as_str();
        while let Some(at) = rest.find("/usr/local/bin/") {
            rest = &rest[at + "/usr/local/bin/".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            if name.is_empty() {
                continue; // the directory itself, as a COPY destination
            }
            assert!(
                bins.contains(&name),
                "{path} runs {name}, which is not a [[bin]] of lead/ or worker/"
            );
            named.insert(name);
        }
    }
    assert_eq!(named, bins, "the images hold every binary");

    // The Dockerfile copies each binary the builder made, and builds with the lock file.
    let files = deploy_files();
    let dockerfile = deploy_file(&files, "docker/Dockerfile");
    for bin in &bins {
        assert!(
            dockerfile.contains(&format!("target/dist/{bin}")),
            "the Dockerfile takes {bin} from the build"
        );
    }
    assert!(dockerfile.contains("cargo build --profile dist --locked"));
}

#[test]
fn the_image_builds_every_workspace_member() {
    let workspace = repo_file("Cargo.toml");
    let members: Vec<&str> = workspace
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = ["))
        .expect("the workspace lists its members")
        .split('"')
        .skip(1)
        .step_by(2)
        .collect();
    assert!(
        members.contains(&"common"),
        "found the members: {members:?}"
    );
    let files = deploy_files();
    let dockerfile = deploy_file(&files, "docker/Dockerfile");
    let ignore = deploy_file(&files, "docker/Dockerfile.dockerignore");
    for member in members {
        // The dependency layer needs every manifest, the build every crate, the context both.
        assert!(
            dockerfile.contains(&format!("COPY {member}/Cargo.toml {member}/Cargo.toml")),
            "the Dockerfile copies {member}/Cargo.toml"
        );
        // A member inside a folder (examples/guarded-lead) comes with its folder.
        let top = member.split('/').next().unwrap_or(member);
        assert!(
            dockerfile.contains(&format!("COPY {member} {member}"))
                || dockerfile.contains(&format!("COPY {top} {top}")),
            "the Dockerfile copies {member}/"
        );
        assert!(
            ignore
                .lines()
                .any(|l| l.trim() == format!("!{member}") || l.trim() == format!("!{top}")),
            "Dockerfile.dockerignore lets {member}/ into the build context"
        );
    }
}

#[test]
fn the_autoscaler_watches_what_the_workers_consume() {
    let subjects = repo_file("common/src/subjects.rs");
    let files = deploy_files();
    let scaled = deploy_file(&files, "k8s/components/keda/scaledobject.yaml");
    let pool = env_value(
        deploy_file(&files, "k8s/base/config/worker.env"),
        "SKEIN_POOL",
    )
    .expect("the workers' pool is set");
    let value = |line: &str| {
        line.split_once(':')
            .map(|(_, v)| v.trim().trim_matches('"').to_owned())
    };
    let streams: Vec<String> = scaled
        .lines()
        .filter(|l| l.trim_start().starts_with("stream:"))
        .filter_map(value)
        .collect();
    let consumers: Vec<String> = scaled
        .lines()
        .filter(|l| l.trim_start().starts_with("consumer:"))
        .filter_map(value)
        .collect();
    assert!(!streams.is_empty() && !consumers.is_empty());
    for stream in &streams {
        assert!(
            subjects.contains(&format!("pub const WORK_STREAM: &str = \"{stream}\";")),
            "the workers' stream is {stream}"
        );
    }
    let expected: BTreeSet<String> = ["skein-tools-", "skein-agents-"]
        .iter()
        .inspect(|prefix| {
            assert!(
                subjects.contains(&format!("\"{prefix}{{pool}}\"")),
                "common/src/subjects.rs names consumers {prefix}{{pool}}"
            )
        })
        .map(|prefix| format!("{prefix}{pool}"))
        .collect();
    let consumers: BTreeSet<String> = consumers.into_iter().collect();
    assert_eq!(
        consumers, expected,
        "KEDA watches both consumers of the pool"
    );
}

/// A worker that lists agent types binds one consumer per type; the checker that holds KEDA's
/// triggers to the consumers a pool creates must name them as the worker does.
#[test]
fn the_trigger_checker_names_per_type_consumers_as_the_worker_does() {
    let subjects = repo_file("common/src/subjects.rs");
    let checks = repo_file("deploy/lib/checks.py");
    assert!(
        subjects.contains(r#"format!("skein-agents-{pool}~{agent}")"#),
        "common/src/subjects.rs names per-type consumers skein-agents-{{pool}}~{{agent}}"
    );
    assert!(
        checks.contains(r#"f"skein-agents-{pool}~{name}""#),
        "deploy/lib/checks.py wants a trigger per listed type, named as the worker names it"
    );
}

#[test]
fn pods_get_longer_to_stop_than_the_drain_takes() {
    let files = deploy_files();
    let grace = env_value(
        deploy_file(&files, "k8s/base/config/common.env"),
        "SKEIN_GRACE",
    )
    .expect("SKEIN_GRACE is set");
    let grace = seconds(&grace);
    assert!(
        repo_file("common/src/config.rs").contains("env = ENV_GRACE, default_value = \"30s\""),
        "the documented default grace is the code's"
    );
    for file in ["k8s/base/skein/lead.yaml", "k8s/base/skein/worker.yaml"] {
        let periods = numbers_after(deploy_file(&files, file), "terminationGracePeriodSeconds");
        assert_eq!(
            periods.len(),
            1,
            "{file} sets terminationGracePeriodSeconds"
        );
        assert!(
            periods[0] > grace,
            "{file}: terminationGracePeriodSeconds {} > SKEIN_GRACE {grace}",
            periods[0]
        );
    }
    let compose = deploy_file(&files, "compose.yaml");
    let stop = compose
        .lines()
        .find_map(|l| l.trim().strip_prefix("stop_grace_period:"))
        .map(|v| seconds(v.trim()))
        .expect("compose sets stop_grace_period");
    assert!(stop > grace, "compose stop_grace_period {stop} > {grace}");
}

#[test]
fn ci_runs_the_deploy_validation() {
    let ci = repo_file(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == "deploy/validate"),
        "CI runs deploy/validate"
    );
    let validate = root().join("deploy/validate");
    let mode = std::fs::metadata(&validate)
        .expect("deploy/validate")
        .permissions();
    assert!(mode.mode() & 0o111 != 0, "deploy/validate is executable");
}
