"""Checks of deploy/validate that the generic tools do not make.

  checks.py manifests RENDERED BUILTIN_OUT [--prod]
      Reads a rendered overlay (kubectl kustomize output). Validates custom resources against the
      schemas in this folder (the Kubernetes schemas do not cover them), writes the built-in
      resources to BUILTIN_OUT for kubernetes-validate, and checks that the resources fit
      together: references resolve, selectors select, probes and the autoscalers point at what
      exists (triggers only for consumers the pool creates, the gateways on CPU, scale-down one
      pod a minute), the grace period outlasts SKEIN_GRACE, every pod is locked down, images are
      pinned, no secret is on a command line, pods reading an external Secret carry its hash, the
      gateways listen where their port, probes and Service say and find their keys file on the
      mounted Secret, a process that requires signed operations finds its principals file on a
      mounted volume and one that signs finds its key on a mounted Secret, the settings every
      process must share agree, Ingresses lead to a Service port, DNS and egress policies work
      with NodeLocal DNSCache, IPv6 and 100.64.0.0/10; NATS and Redis as stateful.py says, alerts
      and dashboards as monitoring.py says. With --prod, also what production promises: replicated
      NATS and Redis, autoscaled leads, workers and gateways, signed operations required by leads
      and workers and signing keys for leads and gateways (none for workers), a collector in
      front of the tracing backend, monitoring.

  checks.py compose COMPOSE DOCKERFILE RENDERED_DEV
      Checks that the compose file starts the same processes as the dev overlay: the same images
      for NATS, Redis and Jaeger, the same binaries, the same settings, from files that exist, and
      no secret on a command line.

  checks.py dockerfile DOCKERFILE
      Checks the images as dockerfile.py says: distroless runtime, matching Debian releases,
      versioned bases, OCI labels.

Prints one line per problem and exits 1 if there is any.
"""

import ipaddress
import json
import os
import re
import sys

import jsonschema
import yaml

import dockerfile as dockerfile_checks
import monitoring
import rollout
import stateful

HERE = os.path.dirname(os.path.abspath(__file__))

# Custom resources and the schema each is validated against.
CUSTOM_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.schema.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.schema.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.schema.json",
    ("cert-manager.io/v1", "Issuer"): "certmanager.schema.json",
    ("cert-manager.io/v1", "Certificate"): "certmanager.schema.json",
}

# Kinds without a namespace.
CLUSTER_SCOPED = {"Namespace", "PriorityClass"}

# API groups whose schemas ship with Kubernetes (kubernetes-validate knows them).
BUILTIN_GROUPS = {
    "", "apps", "batch", "policy", "autoscaling", "networking.k8s.io", "rbac.authorization.k8s.io",
    "storage.k8s.io", "scheduling.k8s.io", "coordination.k8s.io", "discovery.k8s.io",
}

# Secrets the prod overlay expects to exist in the cluster rather than rendering them.
EXTERNAL_SECRETS = {"skein-nats", "skein-redis", "skein-model", "skein-gateway-keys", "skein-principals",
                    "skein-principal-keys", "skein-nats-tenants"}

# The binaries that serve the admin server (SKEIN_ADMIN_ADDR: /metrics, /healthz, /readyz). The
# gateway serves /healthz on its own port (SKEIN_GATEWAY_ADDR) and has no admin server.
ADMIN_BINARIES = {"skein-lead", "skein-worker"}
GATEWAY_BINARY = "skein-gateway"
PROCESS_BINARIES = ADMIN_BINARIES | {GATEWAY_BINARY}

# Signed operations (common/src/config.rs, NatsConfig): whether a process refuses unsigned ones,
# the principals file it checks them against, and its own key (a seed, or the file that holds
# one), which signs what it publishes.
REQUIRE_SIGNED = "SKEIN_REQUIRE_SIGNED"
PRINCIPALS = "SKEIN_PRINCIPALS"
PRINCIPAL_KEY = "SKEIN_PRINCIPAL_KEY"
PRINCIPAL_KEY_FILE = "SKEIN_PRINCIPAL_KEY_FILE"
# What checks signatures (leads and workers) and what signs in production: a lead the cancels of
# a multitask rollback, a gateway for the callers its API keys prove. Workers only check.
CHECKING_BINARIES = ("skein-lead", "skein-worker")
SIGNING_BINARIES = ("skein-lead", GATEWAY_BINARY)

# Settings that must be the same in every process that reads them, with the default of an unset
# one: a cluster where only some processes require signatures lets unsigned operations through
# the others; the audit stream has one retention, whoever creates or updates it.
SHARED_SETTINGS = {
    REQUIRE_SIGNED: (CHECKING_BINARIES, "false"),
    "SKEIN_SIGNATURE_WINDOW": (CHECKING_BINARIES, "5m"),
    "SKEIN_AUDIT_RETENTION": (tuple(sorted(PROCESS_BINARIES)), "90days"),
}
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "[::1]"}

# Variables Kubernetes sets per pod, which compose has no counterpart for.
POD_ONLY_VARIABLES = {"SKEIN_INSTANCE_ID", "SKEIN_K8S_POD", "SKEIN_K8S_NAMESPACE"}

# The annotation of a pod template that holds a hash of an external Secret it reads:
# checksum/<secret name>. A new hash restarts the pods (deploy/README.md, rotation).
SECRET_HASH_ANNOTATION = "checksum/{}"

# Private and special-purpose ranges that egress "to the outside" must leave out.
PRIVATE_RANGES = [ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "fc00::/7", "fe80::/10")]

# NodeLocal DNSCache's default link-local address.
NODE_LOCAL_DNS = ipaddress.ip_network("169.254.20.10/32")

# Images built here (any tag but latest); every other image is pinned to a full version.
OWN_IMAGES = re.compile(r"^(.*/)?skein(-lead|-worker|-worker-tools|-gateway)?$")
FULL_VERSION = re.compile(r"^v?\d+\.\d+\.\d+([-.+][0-9A-Za-z.-]+)?$")

# What a scale-down may remove: one pod a minute.
SCALE_DOWN_PODS, SCALE_DOWN_PERIOD = 1, 60

WORKLOAD_KINDS = ("Deployment", "StatefulSet")


class Problems:
    def __init__(self, label):
        self.label = label
        self.items = []

    def add(self, where, message):
        self.items.append(f"{self.label}: {where}: {message}")

    def finish(self):
        for item in self.items:
            print(f"ERROR {item}")
        return 1 if self.items else 0


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def api_group(api_version):
    return api_version.split("/")[0] if "/" in api_version else ""


def duration_seconds(text):
    """Seconds in a humantime duration as Skein writes them: 30s, 2m, 1m30s, 500ms."""
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h)", text):
        total += int(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    if not total and text.strip() not in ("0", "0s"):
        raise ValueError(f"not a duration: {text!r}")
    return total


def selector_matches(selector, labels):
    """A label selector (matchLabels, matchExpressions) against a label set."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def where(doc):
    return f"{doc['kind']}/{doc['metadata']['name']}"


def binary_of(c):
    """The program a container runs: the base name of its command's first word."""
    return os.path.basename((c.get("command") or [""])[0])


class Rendered:
    def __init__(self, docs):
        self.docs = docs
        self.by_kind = {}
        for d in docs:
            self.by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d

    def kind(self, kind):
        return self.by_kind.get(kind, {})

    def workloads(self):
        for kind in WORKLOAD_KINDS:
            yield from self.kind(kind).values()

    def pod_labels(self):
        return [w["spec"]["template"]["metadata"].get("labels", {}) for w in self.workloads()]

    @staticmethod
    def selects(selector, labels):
        return selector_matches(selector, labels)

    def container_env(self, container):
        """The container's environment as literal values where they are known: config map
        values (envFrom and configMapKeyRef) and plain values; `<secret NAME/KEY>` for a
        secret's key; None for fields."""
        env = {}
        for source in container.get("envFrom") or []:
            ref = source.get("configMapRef")
            if ref and ref["name"] in self.kind("ConfigMap"):
                env.update(self.kind("ConfigMap")[ref["name"]].get("data") or {})
        for var in container.get("env") or []:
            secret = (var.get("valueFrom") or {}).get("secretKeyRef")
            if "value" in var:
                env[var["name"]] = var["value"]
            elif secret:
                env[var["name"]] = f"<secret {secret['name']}/{secret['key']}>"
            else:
                ref = (var.get("valueFrom") or {}).get("configMapKeyRef")
                cm = self.kind("ConfigMap").get(ref["name"]) if ref else None
                env[var["name"]] = (cm.get("data") or {}).get(ref["key"]) if cm else None
        return env


def check_custom_resource(doc, problems):
    schema_file = CUSTOM_SCHEMAS[(doc["apiVersion"], doc["kind"])]
    with open(os.path.join(HERE, schema_file), encoding="utf-8") as f:
        schema = json.load(f)
    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        path = "/".join(str(p) for p in error.absolute_path) or "(root)"
        problems.add(where(doc), f"{path}: {error.message}")


def check_namespaces(r, problems):
    namespaces = {d["metadata"].get("namespace") for d in r.docs if d["kind"] not in CLUSTER_SCOPED}
    if len(namespaces) != 1 or None in namespaces or "default" in namespaces:
        problems.add("namespaces", f"expected one namespace other than default, found {namespaces}")
    declared = set(r.kind("Namespace"))
    if declared and not namespaces <= declared:
        problems.add("namespaces", f"resources in {namespaces}, Namespace objects {declared}")


def check_workload(r, w, problems):
    name = where(w)
    spec = w["spec"]
    pod = spec["template"]
    labels = pod["metadata"].get("labels", {})
    if not selector_matches(spec["selector"], labels):
        problems.add(name, "selector does not select its own pod template")
    pod_spec = pod["spec"]
    if pod_spec.get("automountServiceAccountToken") is not False:
        problems.add(name, "automountServiceAccountToken must be false")
    psc = pod_spec.get("securityContext") or {}
    if psc.get("runAsNonRoot") is not True:
        problems.add(name, "pod securityContext.runAsNonRoot must be true")
    seccomp = (psc.get("seccompProfile") or {}).get("type")
    # The shell pool's own Localhost profile (rollout.py checks it); RuntimeDefault everywhere else.
    if seccomp != "RuntimeDefault" and not (seccomp == "Localhost" and runs_shell(r, w)):
        problems.add(name, "pod seccompProfile must be RuntimeDefault")
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    for template in spec.get("volumeClaimTemplates") or []:
        volumes[template["metadata"]["name"]] = {"persistentVolumeClaim": {}}
    for volume in volumes.values():
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and claim not in r.kind("PersistentVolumeClaim"):
            problems.add(name, f"volume claim {claim} is not rendered")
        cm = (volume.get("configMap") or {}).get("name")
        if cm and cm not in r.kind("ConfigMap"):
            problems.add(name, f"config map volume {cm} is not rendered")
        secret = (volume.get("secret") or {}).get("secretName")
        if secret and secret not in r.kind("Secret") and secret not in EXTERNAL_SECRETS \
                and secret not in issued_secrets(r):
            problems.add(name, f"secret volume {secret} is not rendered")
    for c in pod_spec["containers"]:
        check_container(r, w, c, volumes, problems)
    for c in pod_spec.get("initContainers") or []:
        check_locked_down(f"{name} init container {c['name']}", c, problems)
    for c in pod_spec["containers"] + (pod_spec.get("initContainers") or []):
        check_image(name, c, problems)
        check_command_line(name, c, problems)
        check_env_references(name, c, problems)
    priority = pod_spec.get("priorityClassName")
    if priority and not priority.startswith("system-") and priority not in r.kind("PriorityClass"):
        problems.add(name, f"priorityClassName {priority} is not rendered")
    check_secret_hash(r, w, problems)


def issued_secrets(r):
    """The Secrets cert-manager writes for the rendered Certificates."""
    return {c["spec"]["secretName"] for c in r.kind("Certificate").values()}


def runs_shell(r, w):
    """Whether a workload runs workers with the `shell` tool."""
    for c in w["spec"]["template"]["spec"]["containers"]:
        tools = (r.container_env(c).get("SKEIN_TOOLS") or "").split(",")
        if binary_of(c) == "skein-worker" and "shell" in [t.strip() for t in tools]:
            return True
    return False


def check_locked_down(name, c, problems):
    resources = c.get("resources") or {}
    for part in ("requests", "limits"):
        for resource in ("cpu", "memory"):
            if resource not in (resources.get(part) or {}):
                problems.add(name, f"no {resource} {part[:-1]}")
    sc = c.get("securityContext") or {}
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.add(name, "allowPrivilegeEscalation must be false")
    if sc.get("readOnlyRootFilesystem") is not True:
        problems.add(name, "readOnlyRootFilesystem must be true")
    if (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
        problems.add(name, "capabilities must drop ALL")
    if sc.get("privileged"):
        problems.add(name, "must not be privileged")


def check_image(name, c, problems):
    """Pinned images: a digest, or a tag that is a full version (x.y.z) for images from elsewhere;
    Skein's own images any tag but latest (dev runs locally built `dev` images)."""
    image = c["image"]
    if "@sha256:" in image:
        return
    repository, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
    if not tag or tag == "latest":
        problems.add(f"{name} container {c['name']}", f"image {image} is not pinned (no tag, or latest)")
    elif not OWN_IMAGES.match(repository) and not FULL_VERSION.match(tag):
        problems.add(f"{name} container {c['name']}", f"image {image}: pin a full version (x.y.z), "
                     "not a moving tag")


def check_env_references(name, c, problems):
    """A `$(NAME)` in an env value names a variable defined before it in the list: Kubernetes
    expands only those, and leaves any other as the literal text."""
    defined = set()
    for var in c.get("env") or []:
        for ref in re.findall(r"\$\((\w+)\)", var.get("value") or ""):
            if ref not in defined:
                problems.add(f"{name} container {c['name']}", f"{var['name']} refers to $({ref}), which "
                             "is not defined before it: Kubernetes would leave the text as it is")
        defined.add(var["name"])


def check_command_line(name, c, problems):
    """No secret on a command line, where every process of the node can read it (/proc)."""
    secrets = {v["name"] for v in c.get("env") or [] if (v.get("valueFrom") or {}).get("secretKeyRef")}
    for word in (c.get("command") or []) + (c.get("args") or []):
        named = set(re.findall(r"\$\((\w+)\)", word)) & secrets
        if named or re.search(r"requirepass|masterauth|passw(or)?d", word, re.IGNORECASE):
            problems.add(f"{name} container {c['name']}", f"a secret on the command line: {word!r}")


def check_secret_hash(r, w, problems):
    """A pod reading a Secret that is not rendered here (created beforehand), from its environment
    or a volume, carries a hash of it in its template, so that rotating it restarts the pod; a
    rendered Secret's generated name changes with its content, which does the same."""
    pod = w["spec"]["template"]
    read = set()
    for c in pod["spec"]["containers"] + (pod["spec"].get("initContainers") or []):
        for var in c.get("env") or []:
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                read.add(ref["name"])
        read |= {s["secretRef"]["name"] for s in c.get("envFrom") or [] if "secretRef" in s}
    # A mounted Secret too: its files change in place, but Skein reads them once, at start.
    read |= {v["secret"]["secretName"] for v in pod["spec"].get("volumes") or [] if "secret" in v}
    annotations = pod["metadata"].get("annotations") or {}
    # cert-manager's Secrets change in place on renewal; no hash of theirs can be known beforehand.
    for secret in sorted(read - set(r.kind("Secret")) - issued_secrets(r)):
        if SECRET_HASH_ANNOTATION.format(secret) not in annotations:
            problems.add(where(w), f"reads Secret {secret} but has no {SECRET_HASH_ANNOTATION.format(secret)} "
                         "annotation: rotating it would not restart the pods")


def check_container(r, w, c, volumes, problems):
    name = f"{where(w)} container {c['name']}"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if probe not in c:
            problems.add(name, f"no {probe}")
    check_locked_down(name, c, problems)

    ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        action = (c.get(probe) or {}).get("httpGet") or (c.get(probe) or {}).get("tcpSocket")
        if action and isinstance(action["port"], str) and action["port"] not in ports:
            problems.add(name, f"{probe} names port {action['port']}, which the container lacks")

    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
    for mount_name in mounts.values():
        if mount_name not in volumes:
            problems.add(name, f"mounts volume {mount_name}, which the pod lacks")

    for source in c.get("envFrom") or []:
        ref = source.get("configMapRef") or source.get("secretRef")
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        if ref["name"] not in r.kind(kind) and not (kind == "Secret" and ref["name"] in EXTERNAL_SECRETS):
            problems.add(name, f"envFrom {kind} {ref['name']} is not rendered")
    for var in c.get("env") or []:
        value_from = var.get("valueFrom") or {}
        for kind, ref in (("ConfigMap", value_from.get("configMapKeyRef")),
                          ("Secret", value_from.get("secretKeyRef"))):
            if not ref:
                continue
            obj = r.kind(kind).get(ref["name"])
            if obj is None:
                if not (kind == "Secret" and ref["name"] in EXTERNAL_SECRETS):
                    problems.add(name, f"{var['name']}: {kind} {ref['name']} is not rendered")
                continue
            keys = set(obj.get("data") or {}) | set(obj.get("stringData") or {})
            if ref["key"] not in keys and not ref.get("optional"):
                problems.add(name, f"{var['name']}: {kind} {ref['name']} has no key {ref['key']}")

    env = r.container_env(c)
    pod_spec = w["spec"]["template"]["spec"]
    if env.get("SKEIN_GRACE"):
        grace = duration_seconds(env["SKEIN_GRACE"])
        period = pod_spec.get("terminationGracePeriodSeconds", 30)
        if period <= grace:
            problems.add(name, f"terminationGracePeriodSeconds {period} is not longer than SKEIN_GRACE {grace:g}s")
    binary = binary_of(c)
    check_principals(r, name, c, env, volumes, problems)
    if env.get("SKEIN_ADMIN_ADDR") and binary in ADMIN_BINARIES:
        admin_port = int(env["SKEIN_ADMIN_ADDR"].rsplit(":", 1)[1])
        if ports.get("admin") != admin_port:
            problems.add(name, f"port `admin` is {ports.get('admin')}, SKEIN_ADMIN_ADDR says {admin_port}")
        annotations = w["spec"]["template"]["metadata"].get("annotations") or {}
        if annotations.get("prometheus.io/port") != str(admin_port):
            problems.add(name, "prometheus.io/port does not name the admin port")
    if binary == GATEWAY_BINARY:
        check_gateway(r, w, c, env, ports, mounts, volumes, problems)
        return
    for variable in ("SKEIN_WORKSPACE_ROOT", "SKEIN_SCRATCH_DIR"):
        if env.get(variable) and env[variable] not in mounts:
            problems.add(name, f"{variable}={env[variable]} is not a mounted volume (the root is read-only)")
    check_workspace_mode(r, name, env, mounts, volumes, problems)


def check_gateway(r, w, c, env, ports, mounts, volumes, problems):
    """The gateway listens on SKEIN_GATEWAY_ADDR, which must be reachable from outside the pod and
    be its port `http`, the one the probes (/healthz) and a Service use; it reads its keys file
    (SKEIN_GATEWAY_KEYS) once at start, from a mounted Secret; it has no admin server to scrape."""
    name = f"{where(w)} container {c['name']}"
    addr = env.get("SKEIN_GATEWAY_ADDR")
    if not addr:
        problems.add(name, "no SKEIN_GATEWAY_ADDR: the gateway's default, 127.0.0.1, is out of reach")
    else:
        host, _, port = addr.rpartition(":")
        if host in LOOPBACK_HOSTS or host.startswith("127."):
            problems.add(name, f"SKEIN_GATEWAY_ADDR {addr} is the loopback interface, out of reach of "
                         "the probes and the Service")
        if not port.isdigit() or ports.get("http") != int(port):
            problems.add(name, f"port `http` is {ports.get('http')}, SKEIN_GATEWAY_ADDR says {addr}")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        action = (c.get(probe) or {}).get("httpGet") or {}
        if action.get("port") != "http" or action.get("path") != "/healthz":
            problems.add(name, f"{probe} must get /healthz on port `http` (the gateway has no admin port)")
    labels = w["spec"]["template"]["metadata"].get("labels", {})
    serving = [svc for svc in r.kind("Service").values()
               if svc["spec"].get("selector") and selector_matches({"matchLabels": svc["spec"]["selector"]}, labels)
               and any(p.get("targetPort") in ("http", ports.get("http")) for p in svc["spec"]["ports"])]
    if not serving:
        problems.add(where(w), "no Service sends requests to port `http`")
    annotations = w["spec"]["template"]["metadata"].get("annotations") or {}
    if any(a.startswith("prometheus.io/") for a in annotations):
        problems.add(where(w), "prometheus.io/* annotations: the gateway has no admin server to scrape")

    keys = env.get("SKEIN_GATEWAY_KEYS")
    if not keys:
        problems.add(name, "no SKEIN_GATEWAY_KEYS: the gateway does not start without its keys file")
        return
    missing = mounted_file_problem(r, c, volumes, keys, ("Secret",))
    if missing:
        problems.add(name, f"SKEIN_GATEWAY_KEYS={keys}: {missing}")


def mounted_file_problem(r, c, volumes, path, kinds):
    """Why the file `path` is not one that container `c` reads from a mounted volume of one of
    `kinds` (Secret, ConfigMap) that holds it, or None when it is: the deepest mount above it is
    such a volume, projects the file (its `items`, if it lists any) and, when the object is
    rendered here, has the key. A Secret created beforehand is taken to have it."""
    mounts = c.get("volumeMounts") or []
    above = [m for m in mounts if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    if not above:
        return f"{path} is on no mounted volume (the image holds no such file)"
    mount = max(above, key=lambda m: len(m["mountPath"]))
    relative = path[len(mount["mountPath"].rstrip("/")) + 1:]
    if mount.get("subPath"):
        relative = "/".join(p for p in (mount["subPath"], relative) if p)
    if not relative:
        return f"{path} is where volume {mount['name']} is mounted: a directory, not a file"
    volume = volumes.get(mount["name"]) or {}
    for kind, field, name_field in (("Secret", "secret", "secretName"), ("ConfigMap", "configMap", "name")):
        source = volume.get(field)
        if source is None:
            continue
        if kind not in kinds:
            return f"{mount['mountPath']} is {kind} {source[name_field]}, not a {' or '.join(kinds)}"
        items = source.get("items")
        if items is not None and relative not in {i["path"] for i in items}:
            return (f"{kind} {source[name_field]} is mounted at {mount['mountPath']} without {relative} "
                    f"({sorted(i['path'] for i in items)})")
        key = next((i["key"] for i in items or [] if i["path"] == relative), relative)
        rendered = r.kind(kind).get(source[name_field])
        data = "binaryData" if kind == "ConfigMap" else "stringData"
        if rendered is not None and key not in set(rendered.get("data") or {}) | set(rendered.get(data) or {}):
            return f"{kind} {source[name_field]} has no key {key}"
        return None
    return f"{mount['mountPath']} is not a mounted {' or '.join(kinds)}"


def check_principals(r, name, c, env, volumes, problems):
    """Signed operations: SKEIN_REQUIRE_SIGNED is true or false (the process refuses anything
    else); a process that requires signatures has a principals file (SKEIN_PRINCIPALS; without one
    it refuses to start), and the file, wherever it is set, is on a mounted Secret or ConfigMap
    (it is read once, at start); a principal key is a seed, so it comes from a Secret: a file on
    a mounted Secret (SKEIN_PRINCIPAL_KEY_FILE), or SKEIN_PRINCIPAL_KEY from a secretKeyRef, never
    a value written in a manifest or config map."""
    require = env.get(REQUIRE_SIGNED)
    if require is not None and require not in ("true", "false"):
        problems.add(name, f"{REQUIRE_SIGNED}={require}: say true or false")
    principals = env.get(PRINCIPALS)
    if require == "true" and not principals:
        problems.add(name, f"{REQUIRE_SIGNED}=true without {PRINCIPALS}: the process refuses to start "
                     "with no principals file to check signatures against")
    if principals:
        missing = mounted_file_problem(r, c, volumes, principals, ("Secret", "ConfigMap"))
        if missing:
            problems.add(name, f"{PRINCIPALS}={principals}: {missing}")
    key_file = env.get(PRINCIPAL_KEY_FILE)
    if key_file:
        missing = mounted_file_problem(r, c, volumes, key_file, ("Secret",))
        if missing:
            problems.add(name, f"{PRINCIPAL_KEY_FILE}={key_file}: {missing}")
    key = env.get(PRINCIPAL_KEY)
    if PRINCIPAL_KEY in env and not (key or "").startswith("<secret "):
        problems.add(name, f"{PRINCIPAL_KEY} is not from a Secret: a principal key is a seed; mount it "
                     f"from a Secret and name the file in {PRINCIPAL_KEY_FILE}")


def check_workspace_mode(r, name, env, mounts, volumes, problems):
    """Object mode (the default) needs no volume; volume mode needs its root on a claim that every
    worker of the pool can mount."""
    mode = env.get("SKEIN_WORKSPACE")
    if mode in (None, "object"):
        return
    if mode != "volume":
        problems.add(name, f"SKEIN_WORKSPACE={mode} is neither object nor volume")
        return
    root = env.get("SKEIN_WORKSPACE_ROOT")
    volume = volumes.get(mounts.get(root)) if root else None
    claim = ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName")
    if not claim:
        problems.add(name, "SKEIN_WORKSPACE=volume needs SKEIN_WORKSPACE_ROOT on a persistent volume claim")
        return
    modes = set((r.kind("PersistentVolumeClaim").get(claim) or {}).get("spec", {}).get("accessModes") or [])
    if not modes & {"ReadWriteMany", "ReadWriteOnce"}:
        problems.add(name, f"workspace claim {claim} cannot be mounted for writing ({sorted(modes)})")


def check_services(r, problems):
    for ingress in r.kind("Ingress").values():
        rules = ingress["spec"].get("rules") or []
        backends = [path["backend"] for rule in rules for path in (rule.get("http") or {}).get("paths") or []]
        if ingress["spec"].get("defaultBackend"):
            backends.append(ingress["spec"]["defaultBackend"])
        for backend in backends:
            service = backend.get("service") or {}
            svc = r.kind("Service").get(service.get("name"))
            port = service.get("port") or {}
            if svc is None:
                problems.add(where(ingress), f"backend Service {service.get('name')} is not rendered")
            elif not any(p.get("name") == port.get("name") if "name" in port else p["port"] == port.get("number")
                         for p in svc["spec"]["ports"]):
                problems.add(where(ingress), f"backend port {port} is not a port of Service {svc['metadata']['name']}")
    for svc in r.kind("Service").values():
        selector = svc["spec"].get("selector")
        matched = [w for w in r.workloads()
                   if selector and all(w["spec"]["template"]["metadata"].get("labels", {}).get(k) == v
                                       for k, v in selector.items())]
        if not matched:
            problems.add(where(svc), f"selector {selector} selects no pod")
            continue
        names = set()
        numbers = set()
        for w in matched:
            for c in w["spec"]["template"]["spec"]["containers"]:
                for p in c.get("ports") or []:
                    names.add(p.get("name"))
                    numbers.add(p["containerPort"])
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if (isinstance(target, str) and target not in names) or (isinstance(target, int) and target not in numbers):
                problems.add(where(svc), f"targetPort {target} is not a port of the selected pods")


def check_selectors(r, problems):
    labels = r.pod_labels()

    def selects(selector):
        return any(selector_matches(selector, l) for l in labels)

    for pdb in r.kind("PodDisruptionBudget").values():
        if not selects(pdb["spec"]["selector"]):
            problems.add(where(pdb), "selects no pod")
    for np in r.kind("NetworkPolicy").values():
        spec = np["spec"]
        if spec["podSelector"] and not selects(spec["podSelector"]):
            problems.add(where(np), "podSelector selects no pod")
        for rule in (spec.get("ingress") or []) + (spec.get("egress") or []):
            for peer in (rule.get("from") or []) + (rule.get("to") or []):
                if "podSelector" in peer and "namespaceSelector" not in peer and not selects(peer["podSelector"]):
                    problems.add(where(np), f"peer {peer['podSelector']} selects no pod")


# Words the worker refuses in SKEIN_SUBAGENTS rather than take them for agent names.
SUBAGENTS_AMBIGUOUS = ("yes", "no", "on", "off", "1", "0")
# What an agent name must be to appear in a subject or a consumer (protocol::validate_token).
TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")


def subagent_consumers(pool, value):
    """The agent consumers a worker creates for SKEIN_SUBAGENTS (worker/src/config.rs
    `SubagentTypes`): `skein-agents-<pool>` for `true` (the default), none for `false`, and one
    `skein-agents-<pool>~<agent>` per agent a list names. Raises ValueError for what the worker
    refuses."""
    value = (value if value is not None else "true").strip()
    if value.lower() == "true":
        return {f"skein-agents-{pool}"}
    if value.lower() == "false":
        return set()
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ValueError("say true or false, or list agent names")
    for name in names:
        if name.lower() in SUBAGENTS_AMBIGUOUS or not TOKEN.fullmatch(name):
            raise ValueError(f"{name!r} is neither true, false nor an agent name")
    return {f"skein-agents-{pool}~{name}" for name in names}


def pool_consumers(env):
    """The consumers a worker creates on SKEIN_WORK (worker/src/run.rs): `skein-tools-<pool>` when
    it provides a tool (SKEIN_TOOLS, a default list when unset), and its agent consumers
    (SKEIN_SUBAGENTS, see subagent_consumers). Raises ValueError for a SKEIN_SUBAGENTS the worker
    refuses."""
    pool = env.get("SKEIN_POOL") or "default"
    consumers = set()
    tools = env.get("SKEIN_TOOLS")
    if tools is None or any(t.strip() for t in tools.split(",")):
        consumers.add(f"skein-tools-{pool}")
    return consumers | subagent_consumers(pool, env.get("SKEIN_SUBAGENTS"))


def partition_streams(base, value):
    """The streams of a partitioned stream a process with SKEIN_PARTITIONS `value` consumes
    (common/src/subjects.rs): `base`, then `base_1` ... `base_<N-1>`."""
    count = int(value) if value not in (None, "") else 1
    if not 1 <= count <= 64:
        raise ValueError("not within 1 to 64 (the process refuses it)")
    return [base] + [f"{base}_{k}" for k in range(1, count)]


def check_scale_down(name, behavior, problems):
    """Scale-in removes at most one pod a minute: every policy is a Pods policy of at most
    SCALE_DOWN_PODS per SCALE_DOWN_PERIOD seconds (the HPA's default allows 100 % at once)."""
    rules = (behavior or {}).get("scaleDown") or {}
    policies = rules.get("policies") or []
    if not policies or rules.get("selectPolicy") == "Disabled":
        problems.add(name, "no scale-down policy: the HPA default may remove every pod above the "
                     f"minimum at once; allow {SCALE_DOWN_PODS} pod per {SCALE_DOWN_PERIOD} s")
    for policy in policies:
        if policy["type"] != "Pods" or policy["value"] / policy["periodSeconds"] > SCALE_DOWN_PODS / SCALE_DOWN_PERIOD:
            problems.add(name, f"scale-down policy {policy} removes more than {SCALE_DOWN_PODS} pod "
                         f"per {SCALE_DOWN_PERIOD} s")


def check_autoscalers(r, problems):
    deployments = r.kind("Deployment")
    scaled = {}
    for so in r.kind("ScaledObject").values():
        target = deployments.get(so["spec"]["scaleTargetRef"]["name"])
        if target is None:
            problems.add(where(so), "scaleTargetRef names no Deployment")
            continue
        scaled.setdefault(target["metadata"]["name"], []).append(where(so))
        if "replicas" in target["spec"]:
            problems.add(where(so), f"{where(target)} sets replicas, which `kubectl apply` would reset")
        check_scale_down(where(so), ((so["spec"].get("advanced") or {}).get("horizontalPodAutoscalerConfig")
                                     or {}).get("behavior"), problems)
        c = target["spec"]["template"]["spec"]["containers"][0]
        env = r.container_env(c)
        binary = binary_of(c)
        if binary == GATEWAY_BINARY:
            # Stateless HTTP: it consumes no stream, so its backlog is nowhere to read.
            types = sorted({t["type"] for t in so["spec"]["triggers"]})
            if types != ["cpu"]:
                problems.add(where(so), f"triggers {types}: {binary} consumes no stream; scale it on cpu")
            if so["spec"].get("minReplicaCount", 0) < 1:
                problems.add(where(so), "minReplicaCount below 1: a cpu trigger cannot scale to zero")
            continue
        if binary == "skein-worker":
            try:
                base, consumers = "SKEIN_WORK", pool_consumers(env)
            except ValueError as e:
                problems.add(where(target), f"SKEIN_SUBAGENTS {env.get('SKEIN_SUBAGENTS')!r}: {e} "
                             "(the worker refuses it)")
                continue
        elif binary == "skein-lead":
            base, consumers = "SKEIN_SUBMIT", {"skein-leads"}
        else:
            problems.add(where(so), f"scales {where(target)}, which runs neither skein-lead, skein-worker "
                         f"nor {GATEWAY_BINARY}")
            continue
        try:
            streams = partition_streams(base, env.get("SKEIN_PARTITIONS"))
        except ValueError as e:
            problems.add(where(target), f"SKEIN_PARTITIONS {env.get('SKEIN_PARTITIONS')!r}: {e}")
            continue
        watched = set()
        for trigger in so["spec"]["triggers"]:
            if trigger["type"] != "nats-jetstream":
                continue
            meta = trigger["metadata"]
            watched.add((meta["stream"], meta["consumer"]))
            if meta["stream"] not in streams:
                problems.add(where(so), f"stream {meta['stream']}: {binary} consumes {', '.join(streams)}")
            if meta["consumer"] not in consumers:
                problems.add(where(so), f"consumer {meta['consumer']} is not created by {where(target)} "
                             f"({sorted(consumers)}, from SKEIN_POOL, SKEIN_TOOLS, SKEIN_SUBAGENTS): KEDA "
                             "would read the stream's last sequence as its backlog and keep "
                             "maxReplicaCount for ever")
            if env.get("SKEIN_CONCURRENCY") and meta.get("lagThreshold") != env["SKEIN_CONCURRENCY"]:
                problems.add(where(so), f"lagThreshold {meta.get('lagThreshold')} is not one process's "
                             f"SKEIN_CONCURRENCY {env['SKEIN_CONCURRENCY']}")
            check_monitoring_endpoint(r, so, meta["natsServerMonitoringEndpoint"], problems)
        for stream in streams:
            for missing in sorted(c for c in consumers if (stream, c) not in watched):
                on = "" if stream == base else f" on stream {stream} (SKEIN_PARTITIONS)"
                problems.add(where(so), f"no trigger for consumer {missing}{on}, which {where(target)} creates")
    for hpa in r.kind("HorizontalPodAutoscaler").values():
        ref = hpa["spec"]["scaleTargetRef"]
        target = r.kind(ref["kind"]).get(ref["name"])
        if target is None:
            problems.add(where(hpa), f"scaleTargetRef names no {ref['kind']} {ref['name']}")
            continue
        scaled.setdefault(ref["name"], []).append(where(hpa))
        if "replicas" in target["spec"]:
            problems.add(where(hpa), f"{where(target)} sets replicas, which `kubectl apply` would reset")
        check_scale_down(where(hpa), hpa["spec"].get("behavior"), problems)
    for target, scalers in scaled.items():
        if len(scalers) > 1:
            problems.add("autoscaling", f"{' and '.join(scalers)} would all scale {target}")
    return scaled


def check_monitoring_endpoint(r, so, endpoint, problems):
    """`<service>.<namespace>.svc:<port>`: KEDA resolves it from its own namespace, so the
    namespace is needed; the cluster domain is not (and differs between clusters)."""
    host, port = endpoint.rsplit(":", 1)
    parts = host.split(".")
    svc = r.kind("Service").get(parts[0])
    if svc is None:
        problems.add(where(so), f"monitoring endpoint names no Service ({parts[0]})")
        return
    namespace = svc["metadata"].get("namespace")
    if parts[1:] != [namespace, "svc"]:
        problems.add(where(so), f"monitoring endpoint {host} must be {parts[0]}.{namespace}.svc: the "
                     "namespace (KEDA resolves it from its own) and no cluster domain")
    if int(port) not in {p["port"] for p in svc["spec"]["ports"]}:
        problems.add(where(so), f"monitoring endpoint port {port} is not a port of Service {parts[0]}")


def check_network(r, problems):
    """DNS reachable with NodeLocal DNSCache too; egress to the outside leaves out the private
    ranges, IPv4 and IPv6 alike."""
    dns_ok = False
    for np in r.kind("NetworkPolicy").values():
        for rule in np["spec"].get("egress") or []:
            ports = {(p.get("protocol", "TCP"), p.get("port")) for p in rule.get("ports") or []}
            peers = rule.get("to") or []
            blocks = [p["ipBlock"] for p in peers if "ipBlock" in p]
            if np["spec"]["podSelector"] == {} and {("UDP", 53), ("TCP", 53)} <= ports:
                kube_dns = any((p.get("podSelector") or {}).get("matchLabels", {}).get("k8s-app") == "kube-dns"
                               for p in peers)
                node_local = any(NODE_LOCAL_DNS.subnet_of(ipaddress.ip_network(b["cidr"]))
                                 for b in blocks if ipaddress.ip_network(b["cidr"]).version == 4)
                dns_ok = dns_ok or (kube_dns and node_local)
            check_outside(np, blocks, problems)
    if not dns_ok:
        problems.add("network", "no policy lets every pod reach DNS on 53/UDP and 53/TCP at kube-dns "
                     f"and at NodeLocal DNSCache ({NODE_LOCAL_DNS})")


def check_outside(np, blocks, problems):
    """An ipBlock for the whole IPv4 or IPv6 space comes with the other and leaves out every
    private range of its family."""
    wide = {ipaddress.ip_network(b["cidr"]).version: b for b in blocks
            if ipaddress.ip_network(b["cidr"]).prefixlen == 0}
    if not wide:
        return
    for version in (4, 6):
        block = wide.get(version)
        if block is None:
            problems.add(where(np), f"opens IPv{6 if version == 4 else 4}'s whole space but not "
                         f"IPv{version}'s: egress breaks on {'IPv4' if version == 4 else 'IPv6'} clusters")
            continue
        excepted = [ipaddress.ip_network(e) for e in block.get("except") or []]
        for private in PRIVATE_RANGES:
            if private.version == version and not any(private.subnet_of(e) for e in excepted if e.version == version):
                problems.add(where(np), f"egress to {block['cidr']} does not leave out {private}")


def skein_containers(r):
    """(workload, container, binary, environment) of every container that runs a Skein process."""
    for w in r.workloads():
        for c in w["spec"]["template"]["spec"]["containers"]:
            if binary_of(c) in PROCESS_BINARIES:
                yield w, c, binary_of(c), r.container_env(c)


def check_shared_settings(r, problems):
    """The settings of SHARED_SETTINGS have one value in every process that reads them."""
    for variable, (binaries, default) in SHARED_SETTINGS.items():
        values = {}
        for w, c, binary, env in skein_containers(r):
            if binary in binaries:
                values.setdefault(env.get(variable) or default, []).append(f"{where(w)} container {c['name']}")
        if len(values) > 1:
            problems.add("settings", f"{variable} differs between processes: "
                         + "; ".join(f"{value} in {', '.join(sorted(at))}" for value, at in sorted(values.items()))
                         + f" (set it once, in skein-common; unset means {default})")


def check_signed_operations(r, problems):
    """Production takes only signed operations: every lead and worker requires them and, as every
    gateway, reads the principals file (check_principals holds it to a mounted volume); leads and
    gateways sign with a key mounted from a Secret (SKEIN_PRINCIPAL_KEY_FILE); workers, which run
    the tools, hold no key."""
    for w, c, binary, env in skein_containers(r):
        name = f"{where(w)} container {c['name']}"
        if binary in CHECKING_BINARIES and env.get(REQUIRE_SIGNED) != "true":
            problems.add(name, f"{REQUIRE_SIGNED} is {env.get(REQUIRE_SIGNED) or 'unset'}: production "
                         "refuses unsigned operations (set it to true in skein-common)")
        if not env.get(PRINCIPALS):
            problems.add(name, f"no {PRINCIPALS}: {binary} reads the principals file in production "
                         "(key principals.toml of the Secret skein-principals)")
        if binary in SIGNING_BINARIES and not env.get(PRINCIPAL_KEY_FILE):
            problems.add(name, f"no {PRINCIPAL_KEY_FILE}: {binary} signs what it publishes in production, "
                         "with its key mounted from the Secret skein-principal-keys")
        if binary not in SIGNING_BINARIES and (env.get(PRINCIPAL_KEY_FILE) or env.get(PRINCIPAL_KEY)):
            problems.add(name, f"{binary} holds a principal key: it signs nothing, and a key where the "
                         "tools run is one more place to steal it from")


def check_prod(r, scaled, problems):
    """What the prod overlay promises beyond consistency."""
    for name in ("skein-lead", "skein-worker", GATEWAY_BINARY):
        if name not in scaled:
            problems.add("prod", f"nothing autoscales {name}")
    check_signed_operations(r, problems)
    for w in r.kind("Deployment").values():
        for c in w["spec"]["template"]["spec"]["containers"]:
            endpoint = r.container_env(c).get("OTEL_EXPORTER_OTLP_ENDPOINT")
            if not endpoint:
                continue
            host = re.sub(r"^\w+://", "", endpoint).split(":")[0].split(".")[0]
            svc = r.kind("Service").get(host)
            backends = [d for d in r.workloads() if svc and selector_matches(
                {"matchLabels": svc["spec"].get("selector") or {}}, d["spec"]["template"]["metadata"].get("labels", {}))]
            if not any("opentelemetry-collector" in x["image"] for d in backends
                       for x in d["spec"]["template"]["spec"]["containers"]):
                problems.add(where(w), f"OTEL_EXPORTER_OTLP_ENDPOINT {endpoint} is not an OpenTelemetry Collector")
    for d in r.workloads():
        if any("jaegertracing/" in c["image"] for c in d["spec"]["template"]["spec"]["containers"]):
            problems.add(where(d), "Jaeger all-in-one keeps traces in memory: development only")


def manifests(rendered_path, builtin_out, prod=False):
    label = os.path.basename(rendered_path)
    problems = Problems(label)
    docs = load_all(rendered_path)
    builtin = []
    for doc in docs:
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key in CUSTOM_SCHEMAS:
            check_custom_resource(doc, problems)
        elif api_group(doc.get("apiVersion", "")) in BUILTIN_GROUPS:
            builtin.append(doc)
        else:
            problems.add(where(doc), f"{key[0]} is neither a Kubernetes API nor a custom resource with a schema here")
    with open(builtin_out, "w", encoding="utf-8") as f:
        yaml.safe_dump_all(builtin, f, sort_keys=False)

    r = Rendered(docs)
    check_namespaces(r, problems)
    for w in r.workloads():
        check_workload(r, w, problems)
    check_services(r, problems)
    check_selectors(r, problems)
    scaled = check_autoscalers(r, problems)
    check_network(r, problems)
    check_shared_settings(r, problems)
    stateful.check(r, problems, prod)
    monitoring.check(r, problems, prod)
    rollout.check(r, problems, prod, mounted_file_problem)
    if prod:
        check_prod(r, scaled, problems)
    print(f"{label}: {len(docs)} resources ({len(docs) - len(builtin)} custom) checked")
    return problems.finish()


def compose(compose_path, dockerfile_path, rendered_dev):
    problems = Problems(os.path.basename(compose_path))
    base = os.path.dirname(os.path.abspath(compose_path))
    with open(compose_path, encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    stages = dockerfile_checks.stages_with_binaries(dockerfile_path)
    r = Rendered(load_all(rendered_dev))
    k8s = {}
    for w in r.workloads():
        for c in w["spec"]["template"]["spec"]["containers"]:
            k8s[w["metadata"]["name"]] = (w, c)
    counterpart = {"nats": "nats", "redis": "redis", "jaeger": "jaeger", "lead": "skein-lead", "worker": "skein-worker",
                   "gateway": GATEWAY_BINARY}

    for name, svc in spec["services"].items():
        at = f"service {name}"
        words = []
        for key in ("command", "entrypoint"):
            value = svc.get(key) or []
            words += value if isinstance(value, list) else value.split()
        for word in words:
            if re.search(r"requirepass|masterauth|passw(or)?d|\$\{\w*(PASSWORD|SECRET|KEY)", word, re.IGNORECASE):
                problems.add(at, f"a secret on the command line: {word!r}")
        for env_file in svc.get("env_file") or []:
            if not os.path.isfile(os.path.join(base, env_file)):
                problems.add(at, f"env_file {env_file} does not exist")
        for volume in svc.get("volumes") or []:
            source = volume.split(":")[0]
            if source.startswith(".") and not os.path.exists(os.path.join(base, source)):
                problems.add(at, f"volume source {source} does not exist")
        build = svc.get("build")
        if build:
            context = os.path.normpath(os.path.join(base, build["context"]))
            dockerfile = os.path.join(context, build["dockerfile"])
            if os.path.abspath(dockerfile) != os.path.abspath(dockerfile_path):
                problems.add(at, f"builds from {build['dockerfile']}, not the checked Dockerfile")
            if build.get("target") not in stages:
                problems.add(at, f"build target {build.get('target')} is not a Dockerfile stage")
            entry = os.path.basename((svc.get("entrypoint") or [""])[0])
            if entry not in stages.get(build.get("target"), set()):
                problems.add(at, f"entrypoint {entry} is not copied into stage {build.get('target')}")

        if name not in counterpart or counterpart[name] not in k8s:
            problems.add(at, "has no counterpart in the dev overlay")
            continue
        w, c = k8s[counterpart[name]]
        if "build" not in svc and svc.get("image") != c["image"]:
            problems.add(at, f"image {svc.get('image')} differs from the manifests' {c['image']}")
        if "build" in svc:
            if svc.get("entrypoint") != c.get("command"):
                problems.add(at, f"entrypoint {svc.get('entrypoint')} differs from the manifests' "
                             f"command {c.get('command')}")
            compose_env = set(svc.get("environment") or {})
            for env_file in svc.get("env_file") or []:
                with open(os.path.join(base, env_file), encoding="utf-8") as f:
                    compose_env |= {line.split("=", 1)[0].strip() for line in f
                                    if "=" in line and not line.lstrip().startswith("#")}
            k8s_env = set(r.container_env(c)) - POD_ONLY_VARIABLES
            if compose_env != k8s_env:
                problems.add(at, "settings differ from the manifests': "
                             f"only in compose {sorted(compose_env - k8s_env)}, "
                             f"only in the manifests {sorted(k8s_env - compose_env)}")
    return problems.finish()


def main(argv):
    if len(argv) in (4, 5) and argv[1] == "manifests" and argv[4:] in ([], ["--prod"]):
        return manifests(argv[2], argv[3], prod=argv[4:] == ["--prod"])
    if len(argv) == 5 and argv[1] == "compose":
        return compose(argv[2], argv[3], argv[4])
    if len(argv) == 3 and argv[1] == "dockerfile":
        problems = Problems(os.path.basename(argv[2]))
        dockerfile_checks.check(argv[2], problems)
        return problems.finish()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
