"""The checks of deploy/validate that keep a deployment healthy through ordinary operations on an
ordinary cluster: configuration it can parse, pods that schedule without zone labels, autoscaling
that follows the real load, restarts confined to what changed, Redis that never elects an empty
primary, rollouts that hand back no call, storage that one tenant cannot fill for everyone, the
shell sandbox working where it runs, and TLS where production says so.

Every rendering:
  1. nats.conf's password is a quoted string: nats-server parses a `$VARIABLE`'s value as
     configuration, and `3e5...` or `12b...` reads as a number with a unit (the server exits);
  2. NATS's and Redis's spread over zones is a preference (ScheduleAnyway), over nodes strict;
  3. a ScaledObject with several nats-jetstream triggers sums them (scalingModifiers), and every
     nats-jetstream ScaledObject has a fallback;
  5. NATS and Redis read no ConfigMap the leads, workers or gateways read (those are rolled with
     every application change), and no Secret with keys they do not read (rotating the model key
     must not restart them); NATS's user is the processes' SKEIN_NATS_USER;
  6. Redis with Sentinels: the pods start together (Parallel), the init container elects a first
     primary only without a bootstrap marker on the data volume, and the redis container's preStop
     fails over before the primary stops;
  7. a worker with the `shell` tool runs under its own UID, a Localhost seccomp profile (rendered
     in a ConfigMap, which the check reads) that allows user namespaces and Landlock, no egress
     beyond the stack's own services, a SKEIN_SHELL_MEMORY below its memory limit, and refuses to
     run commands unisolated;
  8. SKEIN_GRACE covers the longest call a process runs (the tool time limit; the subagent time
     limit in a pool that runs subagents; the model time limit in a lead), the pod's grace period
     covers SKEIN_GRACE plus the last pull and trace flush, and leads and workers roll with
     maxSurge 25%;
  9. NATS's volume is above max_file_store (at most 90 %), a tenant's workspace bucket is
     bounded (SKEIN_WORKSPACE_BUCKET_BYTES) and fits the store beside Skein's bounded streams, and
     the start-up probe allows a long catch-up (30 minutes at least);
 10. (--prod) NATS's clients and routes over TLS, SKEIN_NATS_TLS_CA and SKEIN_REDIS_TLS_CA on
     mounted files, Redis over rediss+sentinel:// with its servers on TLS, and the collector's
     export without `insecure`.
"""

import json
import os
import re

import stateful

ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
PROCESS_BINARIES = ("skein-lead", "skein-worker", "skein-gateway")
# The configuration's own defaults (common/src/config.rs) of the time limits the grace must cover.
DEFAULTS = {"SKEIN_TOOL_TIMEOUT": "60s", "SKEIN_MODEL_TIMEOUT": "120s", "SKEIN_SUBAGENT_TIMEOUT": "300s",
            "SKEIN_GRACE": "30s"}
# What a stopping process does after its drain: the last pull (2 s) and the final trace flush (5 s).
DRAIN_TAIL_SECONDS = 7
MAX_SURGE = "25%"
# nats-server's start-up probe must allow a server to catch up on every replicated stream.
NATS_CATCH_UP_SECONDS = 30 * 60
# max_file_store at most this share of the volume: file system overhead, compaction.
STORE_SHARE = 0.9
# What Skein's own streams may hold at most on each server (common/src/bus/streams.rs,
# STREAM_LIMITS): SKEIN_SUBMIT and SKEIN_WORK 1 GiB each, SKEIN_EVENTS 4 GiB, SKEIN_DLQ 1 GiB.
BOUNDED_STREAMS_BYTES = (1 + 1 + 4 + 1) * 2**30
# The syscalls the shell sandbox needs beyond a runtime's default profile: user namespaces
# (unshare, clone with CLONE_NEWUSER), the proc mount of its process namespace, and Landlock.
SANDBOX_SYSCALLS = {"unshare", "clone", "mount", "landlock_create_ruleset", "landlock_add_rule",
                    "landlock_restrict_self"}
SHELL_DEFAULT_MEMORY = "4GiB"
SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
              "g": 2**30, "gb": 2**30, "gib": 2**30}
NATS_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
                   "t": 10**12, "tb": 10**12, "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20,
                   "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}


def where(doc):
    return f"{doc['kind']}/{doc['metadata']['name']}"


def binary_of(c):
    return os.path.basename((c.get("command") or [""])[0])


def seconds(text):
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h)", text or ""):
        total += int(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def size_bytes(text):
    """SKEIN_SHELL_MEMORY's sizes: bytes, or K, M, G (KiB, MiB, GiB) powers of 1024."""
    m = re.fullmatch(r"(\d+)\s*([a-zA-Z]*)", str(text).strip())
    if not m or m.group(2).lower() not in SIZE_UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(m.group(1)) * SIZE_UNITS[m.group(2).lower()]


def nats_size_bytes(text):
    m = re.fullmatch(r"(\d+)\s*([a-zA-Z]*)", str(text).strip())
    if not m or m.group(2).lower() not in NATS_SIZE_UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(m.group(1)) * NATS_SIZE_UNITS[m.group(2).lower()]


def plain_env(c):
    """Literal `value`s of a container's env (not envFrom)."""
    return {e["name"]: e.get("value") for e in c.get("env") or [] if "value" in e}


def skein_containers(r):
    for w in r.kind("Deployment").values():
        for c in w["spec"]["template"]["spec"]["containers"]:
            if binary_of(c) in PROCESS_BINARIES:
                yield w, c, binary_of(c), r.container_env(c)


# --- 1 ---------------------------------------------------------------------------------------------

def check_nats_password(r, problems):
    sts = stateful.by_app(r, "nats")
    if sts is None:
        return
    c = stateful.container(sts, "nats")
    files = stateful.mounted_config(r, sts, c, "/etc/nats") or {}
    conf = "\n".join(files.values())
    env = plain_env(c)
    for value in re.findall(r"^\s*password\s*[:=]\s*(\S+)", conf, re.MULTILINE):
        if value.startswith('"') or value.startswith("'"):
            continue
        variable = value.lstrip("$")
        if not value.startswith("$"):
            problems.add(where(sts), f"nats.conf password {value} is not quoted")
        elif not re.fullmatch(r'"[^"]*"', env.get(variable) or ""):
            problems.add(where(sts), f"nats.conf password is ${variable}, whose value is not a quoted "
                         "string: nats-server parses it as configuration, and a password like 3e5... or "
                         "12b... (digits, e or b, digits) reads as a number and stops the server; set "
                         f"{variable} to '\"$(SKEIN_NATS_PASSWORD)\"'")


# --- 2 ---------------------------------------------------------------------------------------------

def check_spread(r, problems):
    for app in ("nats", "redis"):
        sts = stateful.by_app(r, app)
        if sts is None:
            continue
        for t in sts["spec"]["template"]["spec"].get("topologySpreadConstraints") or []:
            mode = t.get("whenUnsatisfiable")
            if t["topologyKey"] == ZONE and mode != "ScheduleAnyway":
                problems.add(where(sts), f"zone spread is {mode}: on a cluster without zone labels "
                             "(kubeadm, bare metal, k3s) the pods never schedule; use ScheduleAnyway")
            if t["topologyKey"] == HOSTNAME and mode != "DoNotSchedule":
                problems.add(where(sts), f"node spread is {mode}: two servers on one node lose the "
                             "quorum with it; use DoNotSchedule")


# --- 3 ---------------------------------------------------------------------------------------------

def check_keda(r, problems):
    for so in r.kind("ScaledObject").values():
        triggers = [t for t in so["spec"]["triggers"] if t["type"] == "nats-jetstream"]
        if not triggers:
            continue
        if not so["spec"].get("fallback"):
            problems.add(where(so), "no fallback: while KEDA cannot read the backlog (NATS restarting, "
                         "a former consumer leader) the pool is not held anywhere")
        if len(triggers) < 2:
            continue
        modifiers = (so["spec"].get("advanced") or {}).get("scalingModifiers") or {}
        formula = modifiers.get("formula", "")
        names = [t.get("name") for t in triggers]
        terms = [term.strip() for term in formula.split("+")] if formula else []
        if not formula or sorted(terms) != sorted(n for n in names if n):
            problems.add(where(so), f"{len(triggers)} nats-jetstream triggers scale on the larger backlog, "
                         "not the sum, though they share one pool's slots: name each trigger and sum "
                         f"them in advanced.scalingModifiers.formula (triggers {names}, formula {formula!r})")


# --- 5 ---------------------------------------------------------------------------------------------

def check_confined_restarts(r, problems):
    process_configs = set()
    process_secret_keys = {}
    for _, c, _, _ in skein_containers(r):
        process_configs |= {s["configMapRef"]["name"] for s in c.get("envFrom") or [] if "configMapRef" in s}
    referenced = {}
    for w in list(r.kind("Deployment").values()) + list(r.kind("StatefulSet").values()):
        pod = w["spec"]["template"]["spec"]
        for c in pod["containers"] + (pod.get("initContainers") or []):
            for var in c.get("env") or []:
                ref = (var.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    referenced.setdefault(ref["name"], set()).add(ref["key"])
    for app in ("nats", "redis"):
        sts = stateful.by_app(r, app)
        if sts is None:
            continue
        pod = sts["spec"]["template"]["spec"]
        read_keys = {}
        for c in pod["containers"] + (pod.get("initContainers") or []):
            for var in c.get("env") or []:
                vf = var.get("valueFrom") or {}
                cm = vf.get("configMapKeyRef")
                if cm and cm["name"] in process_configs:
                    problems.add(where(sts), f"reads {var['name']} from ConfigMap {cm['name']}, which the "
                                 "leads, workers and gateways read: every change of their settings "
                                 f"rolls every {app} pod; give {app} its own")
                ref = vf.get("secretKeyRef")
                if ref:
                    read_keys.setdefault(ref["name"], set()).add(ref["key"])
            for source in c.get("envFrom") or []:
                if "configMapRef" in source and source["configMapRef"]["name"] in process_configs:
                    problems.add(where(sts), f"reads ConfigMap {source['configMapRef']['name']}, which the "
                                 "processes read")
        for secret, keys in sorted(read_keys.items()):
            others = referenced.get(secret, set()) - keys
            if others and secret not in r.kind("Secret"):
                problems.add(where(sts), f"reads Secret {secret}, which also holds {sorted(others)}: its "
                             f"checksum restarts every {app} pod when one of those rotates; keep "
                             f"{app}'s credentials in a Secret of their own")
    # NATS's user is written in nats.conf: it must be the processes'.
    sts = stateful.by_app(r, "nats")
    if sts is not None:
        c = stateful.container(sts, "nats")
        conf = "\n".join((stateful.mounted_config(r, sts, c, "/etc/nats") or {}).values())
        env = plain_env(c)
        users = [env.get(u[1:], u) if u.startswith("$") else u.strip('"') for u in
                 re.findall(r"\buser\s*[:=]\s*(\$?[A-Za-z0-9_.\"-]+)", conf)]
        for _, cont, _, env in skein_containers(r):
            wanted = env.get("SKEIN_NATS_USER")
            if users and wanted and wanted not in users:
                problems.add(where(sts), f"nats.conf's user {users} is not SKEIN_NATS_USER {wanted}")
                break


# --- 6 ---------------------------------------------------------------------------------------------

def check_redis_bootstrap(r, problems):
    sts = stateful.by_app(r, "redis")
    if sts is None:
        return
    pod = sts["spec"]["template"]["spec"]
    if not any(p.get("containerPort") == 26379 for c in pod["containers"] for p in c.get("ports") or []):
        return  # one Redis node, no Sentinels: nothing is elected
    name = where(sts)
    if sts["spec"].get("podManagementPolicy") != "Parallel":
        problems.add(name, "podManagementPolicy must be Parallel: a pod with a new volume waits for its "
                     "peers' Sentinels, which one pod at a time never starts")
    init = next(iter(pod.get("initContainers") or []), {})
    env = plain_env(init)
    marker = env.get("BOOTSTRAP_MARKER")
    mounts = {m["mountPath"] for m in init.get("volumeMounts") or [] if m["name"] == "data"}
    script = "\n".join((stateful.mounted_config(r, sts, init, "/etc/redis") or {}).values())
    if not marker or not any(marker.startswith(m.rstrip("/") + "/") for m in mounts) \
            or "BOOTSTRAP_MARKER" not in script:
        problems.add(name, "no bootstrap marker (BOOTSTRAP_MARKER on the data volume, read by the init "
                     "script): with no Sentinel answering and no sentinel.conf, a pod elects the first "
                     "pod, and after losing its volume an empty primary wipes the replicas")
    redis = stateful.container(sts, "redis") or {}
    stop = " ".join(((redis.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command") or [])
    if "sentinel failover" not in stop:
        problems.add(f"{name} container redis", "no preStop failover: the primary stops before a Sentinel "
                     "has promoted a replica (writes fail until the Sentinels notice, 5 s or more)")


# --- 7 ---------------------------------------------------------------------------------------------

def check_shell_pool(r, problems):
    uids = {}
    for w in r.workloads():
        psc = w["spec"]["template"]["spec"].get("securityContext") or {}
        uids.setdefault(psc.get("runAsUser"), []).append(where(w))
    for w, c, binary, env in skein_containers(r):
        tools = [t.strip() for t in (env.get("SKEIN_TOOLS") or "").split(",")]
        if binary != "skein-worker" or "shell" not in tools:
            continue
        name = where(w)
        pod = w["spec"]["template"]["spec"]
        psc = pod.get("securityContext") or {}
        uid = psc.get("runAsUser")
        if len(uids.get(uid, [])) > 1:
            problems.add(name, f"runs the shell tool as UID {uid}, shared with "
                         f"{sorted(set(uids[uid]) - {name})}: RLIMIT_NPROC counts every process of that UID "
                         "on the node; give the shell pool a UID of its own")
        profile = psc.get("seccompProfile") or {}
        if profile.get("type") != "Localhost":
            problems.add(name, f"seccomp profile {profile.get('type')}: the runtime's default refuses user "
                         "namespaces, and the shell tool falls back to rlimits; use the Localhost profile "
                         "of components/shell-pool")
        else:
            check_seccomp_profile(r, name, profile.get("localhostProfile", ""), problems)
        limit = stateful.memory_bytes(((c.get("resources") or {}).get("limits") or {}).get("memory", "0"))
        memory = size_bytes(env.get("SKEIN_SHELL_MEMORY") or SHELL_DEFAULT_MEMORY)
        if memory >= limit:
            problems.add(name, f"SKEIN_SHELL_MEMORY {env.get('SKEIN_SHELL_MEMORY') or SHELL_DEFAULT_MEMORY} is "
                         "not below the container's memory limit: a command is killed by the pod's OOM "
                         "instead of its own limit, and takes the worker with it")
        if (env.get("SKEIN_SHELL_UNISOLATED") or "refuse") != "refuse":
            problems.add(name, "SKEIN_SHELL_UNISOLATED lets commands run without isolation")
        labels = w["spec"]["template"]["metadata"].get("labels", {})
        for np in r.kind("NetworkPolicy").values():
            if not r.selects(np["spec"]["podSelector"], labels) or np["spec"]["podSelector"] == {}:
                continue
            for rule in np["spec"].get("egress") or []:
                if any("ipBlock" in peer for peer in rule.get("to") or []) or not rule.get("to"):
                    problems.add(name, f"NetworkPolicy/{np['metadata']['name']} lets the shell pool reach "
                                 "addresses outside the stack: commands run there")


def check_seccomp_profile(r, name, path, problems):
    """The profile is rendered in a ConfigMap whose key is the file's name (the nodes install it
    from there, deploy/README.md); it must allow what the sandbox needs."""
    file_name = os.path.basename(path)
    for cm in r.kind("ConfigMap").values():
        text = (cm.get("data") or {}).get(file_name)
        if text is None:
            continue
        profile = json.loads(text)
        allowed = set()
        for rule in profile.get("syscalls") or []:
            if rule.get("action") == "SCMP_ACT_ALLOW" and not rule.get("args"):
                allowed |= set(rule.get("names") or [])
        default_allows = profile.get("defaultAction") == "SCMP_ACT_ALLOW"
        denied = set()
        for rule in profile.get("syscalls") or []:
            if rule.get("action") != "SCMP_ACT_ALLOW":
                denied |= set(rule.get("names") or [])
        missing = sorted(SANDBOX_SYSCALLS - allowed) if not default_allows else sorted(SANDBOX_SYSCALLS & denied)
        if missing:
            problems.add(name, f"seccomp profile {path} does not allow {missing}, which the shell sandbox "
                         "needs (user namespaces, Landlock)")
        if default_allows:
            problems.add(name, f"seccomp profile {path} allows every syscall it does not list")
        return
    problems.add(name, f"seccomp profile {path}: no rendered ConfigMap holds {file_name}")


# --- 8 ---------------------------------------------------------------------------------------------

def check_drain(r, problems):
    lead_env = next((env for _, _, b, env in skein_containers(r) if b == "skein-lead"), {})
    for w, c, binary, env in skein_containers(r):
        name = f"{where(w)} container {c['name']}"
        grace = seconds(env.get("SKEIN_GRACE") or DEFAULTS["SKEIN_GRACE"])
        needs = []
        if binary == "skein-worker":
            needs.append("SKEIN_TOOL_TIMEOUT")
            if (env.get("SKEIN_SUBAGENTS") or "false").strip().lower() not in ("false", ""):
                needs.append("SKEIN_SUBAGENT_TIMEOUT")
        elif binary == "skein-lead":
            needs.append("SKEIN_MODEL_TIMEOUT")
        for variable in needs:
            source = lead_env if variable == "SKEIN_SUBAGENT_TIMEOUT" else env
            limit = seconds(source.get(variable) or DEFAULTS[variable])
            if grace < limit:
                problems.add(name, f"SKEIN_GRACE {grace:g}s is shorter than {variable} {limit:g}s: every "
                             "rollout hands back calls that would have finished, and runs them again "
                             "(model calls paid twice)")
        if binary in ("skein-lead", "skein-worker"):
            period = w["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
            if period < grace + DRAIN_TAIL_SECONDS:
                problems.add(name, f"terminationGracePeriodSeconds {period} does not cover SKEIN_GRACE "
                             f"{grace:g}s and the last pull and trace flush ({DRAIN_TAIL_SECONDS} s)")
            rolling = (w["spec"].get("strategy") or {}).get("rollingUpdate") or {}
            if str(rolling.get("maxSurge")) != MAX_SURGE or rolling.get("maxUnavailable") != 0:
                problems.add(where(w), f"rolls with maxSurge {rolling.get('maxSurge')}, maxUnavailable "
                             f"{rolling.get('maxUnavailable')}: use {MAX_SURGE} and 0 (each old pod drains "
                             "for SKEIN_GRACE)")


# --- 9 ---------------------------------------------------------------------------------------------

def check_nats_capacity(r, problems):
    sts = stateful.by_app(r, "nats")
    if sts is None:
        return
    name = where(sts)
    c = stateful.container(sts, "nats")
    conf = "\n".join((stateful.mounted_config(r, sts, c, "/etc/nats") or {}).values())
    store = stateful.nats_setting(conf, "max_file_store")
    if store and store.startswith("$"):
        store = plain_env(c).get(store[1:])
    claim = next((t for t in sts["spec"].get("volumeClaimTemplates") or [] if t["metadata"]["name"] == "data"), None)
    if not store or claim is None:
        problems.add(name, "max_file_store and the data volume must both be set")
    else:
        volume = stateful.memory_bytes(claim["spec"]["resources"]["requests"]["storage"])
        if nats_size_bytes(store) > STORE_SHARE * volume:
            problems.add(name, f"max_file_store {store} is more than {STORE_SHARE:.0%} of the volume "
                         f"{claim['spec']['resources']['requests']['storage']}: JetStream fills the disk "
                         "before its own limit")
    # One tenant's workspace bucket is bounded, and it fits the store beside Skein's own streams.
    if store and not str(store).startswith("$"):
        for w, cont, binary, env in skein_containers(r):
            if binary != "skein-worker" or (env.get("SKEIN_WORKSPACE") or "object") != "object":
                continue
            bucket = env.get("SKEIN_WORKSPACE_BUCKET_BYTES")
            if not bucket:
                problems.add(f"{where(w)} container {cont['name']}", "no SKEIN_WORKSPACE_BUCKET_BYTES: one "
                             "tenant's workspace bucket can fill the JetStream store the work queues share, "
                             "and stop every tenant's submissions")
            elif size_bytes(bucket) + BOUNDED_STREAMS_BYTES > nats_size_bytes(store):
                problems.add(f"{where(w)} container {cont['name']}", f"SKEIN_WORKSPACE_BUCKET_BYTES {bucket} "
                             f"with Skein's bounded streams (7 GiB) is more than max_file_store {store}")
    probe = c.get("startupProbe") or {}
    allowed = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
    if allowed < NATS_CATCH_UP_SECONDS:
        problems.add(name, f"the startup probe allows {allowed} s: a server catching up on replicated "
                     f"streams after a long absence is restarted mid-copy; allow {NATS_CATCH_UP_SECONDS} s")


# --- 10 --------------------------------------------------------------------------------------------

def check_certificates(r, problems):
    """A certificate's names in a namespace (`<service>.<namespace>.svc`) are in the rendered
    one: clients dial those names, and a certificate for another namespace fails every check."""
    for cert in r.kind("Certificate").values():
        namespace = cert["metadata"].get("namespace")
        for name in cert["spec"].get("dnsNames") or []:
            parts = name.split(".")
            if len(parts) >= 3 and parts[-1] == "svc" and parts[-2] != namespace:
                problems.add(where(cert), f"names {name}, in namespace {parts[-2]}, not {namespace}")


def check_tls(r, problems, mounted_file_problem):
    sts = stateful.by_app(r, "nats")
    if sts is not None:
        c = stateful.container(sts, "nats")
        files = stateful.mounted_config(r, sts, c, "/etc/nats") or {}
        conf = "\n".join(files.values())
        top = re.sub(r"^\s*cluster\s*\{.*?^\}", "", conf, flags=re.MULTILINE | re.DOTALL)
        if not re.search(r"^\s*tls\s*\{", top, re.MULTILINE):
            problems.add(where(sts), "clients reach NATS without TLS (no tls block): components/tls")
        cluster = re.search(r"^\s*cluster\s*\{(.*?)^\}", conf, re.MULTILINE | re.DOTALL)
        if cluster and not re.search(r"^\s*tls\s*\{", cluster.group(1), re.MULTILINE):
            problems.add(where(sts), "routes between the NATS servers without TLS: components/tls")
        for path in re.findall(r"(?:cert_file|key_file|ca_file)\s*:\s*(\S+)", conf):
            if not any(path.startswith(m.rstrip("/") + "/") for m in stateful.mount_paths(c)):
                problems.add(where(sts), f"{path} is on no mounted volume")
    for w, c, binary, env in skein_containers(r):
        name = f"{where(w)} container {c['name']}"
        volumes = {v["name"]: v for v in w["spec"]["template"]["spec"].get("volumes") or []}
        for variable in ("SKEIN_NATS_TLS_CA", "SKEIN_REDIS_TLS_CA"):
            path = env.get(variable)
            if not path:
                problems.add(name, f"no {variable}: the process does not check its server's certificate")
                continue
            missing = mounted_file_problem(r, c, volumes, path, ("Secret", "ConfigMap"))
            if missing:
                problems.add(name, f"{variable}={path}: {missing}")
        url = env.get("SKEIN_REDIS_URL") or ""
        if not url.startswith("rediss"):
            problems.add(name, f"SKEIN_REDIS_URL {url} is not TLS (rediss+sentinel://)")
    redis = stateful.by_app(r, "redis")
    if redis is not None:
        init = next(iter(redis["spec"]["template"]["spec"].get("initContainers") or []), {})
        if not plain_env(init).get("REDIS_TLS_DIR"):
            problems.add(where(redis), "Redis and its Sentinels listen without TLS (REDIS_TLS_DIR unset)")
    for cm in r.kind("ConfigMap").values():
        text = (cm.get("data") or {}).get("collector.yaml")
        if text and re.search(r"^\s*insecure:\s*true", text, re.MULTILINE):
            problems.add(f"ConfigMap/{cm['metadata']['name']}", "the collector exports with tls.insecure: "
                         "traces cross the network in the clear")


def check(r, problems, prod, mounted_file_problem):
    check_nats_password(r, problems)
    check_spread(r, problems)
    check_keda(r, problems)
    check_confined_restarts(r, problems)
    check_redis_bootstrap(r, problems)
    check_shell_pool(r, problems)
    check_drain(r, problems)
    check_nats_capacity(r, problems)
    check_certificates(r, problems)
    if prod:
        check_tls(r, problems, mounted_file_problem)
