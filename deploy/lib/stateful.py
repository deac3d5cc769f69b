"""The NATS and Redis checks of deploy/validate: the stateful services are sized, configured and,
in production, replicated so that the loss of a node loses nothing.

Every rendering: requests equal limits in every container of NATS and Redis (the Guaranteed class);
GOMEMLIMIT below NATS's memory limit; NATS ready on `/healthz?js-server-only=true`, in lame duck
mode on shutdown for less than the grace period, routes naming every server when there are several;
Redis's maxmemory at 50-80 % of its memory limit, noeviction, the append-only file, its included
files in place; the streams' and buckets' replicas 1-5 and within the cluster's size;
SKEIN_REDIS_URL naming what is rendered (the Sentinels and their primary's name) or a Redis Cluster
(redis+cluster://, or SKEIN_REDIS_CLUSTER=true), and no password.

Production (`--prod`) also: three NATS servers spread over zones, SKEIN_STREAM_REPLICAS=3 and as many
replicas of the workers' workspace buckets; Redis with Sentinels (three pods, a quorum), a managed
Redis over TLS (rediss://) or a Redis Cluster; both stateful
services under a PriorityClass.
"""

import os
import re
from urllib.parse import urlsplit

# Go's GOMEMLIMIT suffixes and Kubernetes' quantities, in bytes.
BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
# Redis's units (redis.conf): k = 1000, kb = 1024, m = 10^6, mb = 2^20, g = 10^9, gb = 2^30.
REDIS_UNITS = {"": 1, "k": 10**3, "kb": 2**10, "m": 10**6, "mb": 2**20, "g": 10**9, "gb": 2**30}

NATS_READINESS = "/healthz?js-server-only=true"
PROD_NATS_SERVERS = 3
# Replicas Skein accepts for a stream or a bucket (common/src/config.rs, MAX_REPLICAS).
MAX_REPLICAS = 5
ZONE = "topology.kubernetes.io/zone"


def memory_bytes(quantity):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(quantity))
    if not m:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    unit = m.group(2) or ""
    return float(m.group(1)) * (BINARY.get(unit) or DECIMAL.get(unit) or 1)


def go_memory_bytes(text):
    m = re.fullmatch(r"(\d+)(B|KiB|MiB|GiB|TiB)?", text)
    if not m:
        raise ValueError(f"not a GOMEMLIMIT: {text!r}")
    return int(m.group(1)) * {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[m.group(2) or ""]


def redis_bytes(text):
    m = re.fullmatch(r"(\d+)([a-z]*)", text.lower())
    if not m or m.group(2) not in REDIS_UNITS:
        raise ValueError(f"not a Redis memory size: {text!r}")
    return int(m.group(1)) * REDIS_UNITS[m.group(2)]


def duration_seconds(text):
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h)", text):
        total += int(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def where(doc):
    return f"{doc['kind']}/{doc['metadata']['name']}"


def by_app(r, name):
    """The StatefulSet whose pods are app.kubernetes.io/name=<name>, if any."""
    for sts in r.kind("StatefulSet").values():
        if sts["spec"]["template"]["metadata"].get("labels", {}).get("app.kubernetes.io/name") == name:
            return sts
    return None


def container(w, name):
    return next((c for c in w["spec"]["template"]["spec"]["containers"] if c["name"] == name), None)


def mounted_config(r, w, c, path):
    """The ConfigMap mounted at `path` in container `c`, as a dict of its keys, or None."""
    volumes = {v["name"]: v for v in w["spec"]["template"]["spec"].get("volumes") or []}
    for mount in c.get("volumeMounts") or []:
        if mount["mountPath"] == path:
            name = (volumes.get(mount["name"], {}).get("configMap") or {}).get("name")
            cm = r.kind("ConfigMap").get(name)
            return (cm or {}).get("data") or {}
    return None


def mount_paths(c):
    return {m["mountPath"] for m in c.get("volumeMounts") or []}


def check_guaranteed(w, problems):
    pod = w["spec"]["template"]["spec"]
    for c in pod["containers"] + (pod.get("initContainers") or []):
        res = c.get("resources") or {}
        for resource in ("cpu", "memory"):
            req = (res.get("requests") or {}).get(resource)
            lim = (res.get("limits") or {}).get(resource)
            if req is None or str(req) != str(lim):
                problems.add(f"{where(w)} container {c['name']}",
                             f"{resource} request {req} must equal its limit {lim} (a stateful service)")


def check_gomemlimit(w, c, problems, required):
    env = {e["name"]: e.get("value") for e in c.get("env") or []}
    name = f"{where(w)} container {c['name']}"
    if "GOMEMLIMIT" not in env:
        if required:
            problems.add(name, "no GOMEMLIMIT: the Go runtime would grow into the memory limit")
        return
    limit = memory_bytes(((c.get("resources") or {}).get("limits") or {}).get("memory", "0"))
    value = go_memory_bytes(env["GOMEMLIMIT"])
    if not 0.5 * limit <= value < limit:
        problems.add(name, f"GOMEMLIMIT {env['GOMEMLIMIT']} should be 50-99 % of the memory limit")


def nats_setting(conf, key):
    m = re.search(rf"^\s*{key}\s*[:=]?\s*(\S+)", conf, re.MULTILINE)
    return m.group(1).strip('"') if m else None


def check_nats(r, problems, prod, skein_env, worker_env):
    sts = by_app(r, "nats")
    if sts is None:
        if prod:
            problems.add("nats", "no NATS StatefulSet")
        return
    name = where(sts)
    c = container(sts, "nats")
    pod = sts["spec"]["template"]["spec"]
    replicas = sts["spec"].get("replicas", 1)
    check_guaranteed(sts, problems)
    check_gomemlimit(sts, c, problems, required=True)

    readiness = ((c.get("readinessProbe") or {}).get("httpGet") or {}).get("path")
    if readiness != NATS_READINESS:
        problems.add(name, f"readiness probe {readiness}: use {NATS_READINESS} (a stream catching up "
                     "must not take a server out of the Service)")

    files = mounted_config(r, sts, c, "/etc/nats") or {}
    conf = files.get("nats.conf", "")
    for include in re.findall(r"^\s*include\s+\.?/?(\S+)", conf, re.MULTILINE):
        if include not in files:
            problems.add(name, f"nats.conf includes {include}, which the config map lacks")
        else:
            conf += "\n" + files[include]
    pid = nats_setting(conf, "pid_file")
    stop = " ".join(((c.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command") or [])
    if not pid or f"ldm={pid}" not in stop:
        problems.add(name, "preStop must put the server in lame duck mode (nats-server --signal "
                     "ldm=<pid_file>)")
    elif not any(pid.startswith(p.rstrip("/") + "/") for p in mount_paths(c)):
        problems.add(name, f"pid_file {pid} is not on a mounted volume (the root is read-only)")
    lame = duration_seconds(nats_setting(conf, "lame_duck_duration") or "0s")
    grace = duration_seconds(nats_setting(conf, "lame_duck_grace_period") or "0s")
    period = pod.get("terminationGracePeriodSeconds", 30)
    if not lame or lame + grace >= period:
        problems.add(name, f"lame_duck_duration {lame:g}s + grace {grace:g}s must be set and shorter "
                     f"than terminationGracePeriodSeconds {period}")
    payload = nats_setting(conf, "max_payload")
    for env in skein_env:
        if env.get("SKEIN_MAX_PAYLOAD") and payload and env["SKEIN_MAX_PAYLOAD"] != payload:
            problems.add(name, f"max_payload {payload} differs from SKEIN_MAX_PAYLOAD {env['SKEIN_MAX_PAYLOAD']}")

    if replicas > 1:
        check_nats_cluster(r, sts, c, conf, replicas, problems)
    for env in skein_env:
        for variable in ("SKEIN_STREAM_REPLICAS", "SKEIN_WORKSPACE_REPLICAS"):
            wanted = int(env.get(variable) or 1)
            if not 1 <= wanted <= MAX_REPLICAS:
                problems.add(name, f"{variable}={wanted}: Skein takes 1 to {MAX_REPLICAS}")
            elif wanted > replicas:
                problems.add(name, f"{variable}={wanted} but only {replicas} NATS servers")
    if prod:
        # An odd number of servers, three at least (a majority survives a node); streams and
        # buckets keep three replicas on a larger cluster.
        if replicas < PROD_NATS_SERVERS or replicas % 2 == 0:
            problems.add(name, f"prod runs an odd number of NATS servers, {PROD_NATS_SERVERS} or more, "
                         f"not {replicas}")
        stream_replicas = min(replicas, PROD_NATS_SERVERS)
        for env in skein_env:
            if int(env.get("SKEIN_STREAM_REPLICAS") or 1) != stream_replicas:
                problems.add(name, f"SKEIN_STREAM_REPLICAS must be {stream_replicas} in prod, "
                             f"not {env.get('SKEIN_STREAM_REPLICAS') or 'the default 1'}")
        for env in worker_env:
            # The workspace buckets (object mode): their own setting, else the streams'.
            if (env.get("SKEIN_WORKSPACE") or "object") == "object":
                buckets = env.get("SKEIN_WORKSPACE_REPLICAS") or env.get("SKEIN_STREAM_REPLICAS") or "1"
                if int(buckets) != stream_replicas:
                    problems.add(name, f"workspace buckets get {buckets} replicas "
                                 f"(SKEIN_WORKSPACE_REPLICAS): prod keeps {stream_replicas}")
        if not pod.get("priorityClassName"):
            problems.add(name, "no priorityClassName")


def check_nats_cluster(r, sts, c, conf, replicas, problems):
    name = where(sts)
    block = re.search(r"^\s*cluster\s*\{(.*?)^\s*\}", conf, re.MULTILINE | re.DOTALL)
    if not block:
        problems.add(name, f"{replicas} servers but no cluster block in the configuration")
        return
    port = nats_setting(block.group(1), "port")
    routes = re.findall(r"nats://([^\s,\]]+)", block.group(1))
    service = sts["spec"]["serviceName"]
    # The routes are seeds: the first servers (three, or every one of a smaller cluster); a
    # server routed to a seed learns the others from it, at the name each advertises.
    seeds = min(replicas, PROD_NATS_SERVERS)
    wanted = {f"{sts['metadata']['name']}-{i}.{service}:{port}" for i in range(seeds)}
    if set(routes) != wanted:
        problems.add(name, f"routes {sorted(routes)} must be the first {seeds} servers, which exist "
                     f"whatever the cluster's size: {sorted(wanted)}")
    advertise = nats_setting(block.group(1), "advertise") or ""
    env = {e["name"]: e.get("value") for e in c.get("env") or []}
    if advertise.startswith("$"):
        advertise = env.get(advertise[1:]) or ""
    if not re.fullmatch(rf"\$\(NATS_SERVER_NAME\)\.{re.escape(service)}:{port}", advertise):
        problems.add(name, f"the cluster block must advertise each server as <pod>.{service}:{port} "
                     f"(found {advertise!r}): the servers beyond the seeds are reached by that name, "
                     "which their certificate holds")
    if any("cluster.local" in route for route in routes):
        problems.add(name, "routes name the cluster domain; names in the namespace need none")
    ports = {p.get("name"): str(p["containerPort"]) for p in c.get("ports") or []}
    if ports.get("cluster") != port:
        problems.add(name, f"the container's port `cluster` must be the cluster port {port}")
    if sts["spec"].get("podManagementPolicy") != "Parallel":
        problems.add(name, "podManagementPolicy must be Parallel (servers wait for each other's routes)")
    check_spread_and_budget(r, sts, replicas, problems)


def check_spread_and_budget(r, sts, replicas, problems):
    """Spread over zones, and a budget that keeps a majority."""
    name = where(sts)
    labels = sts["spec"]["template"]["metadata"].get("labels", {})
    spread = sts["spec"]["template"]["spec"].get("topologySpreadConstraints") or []
    if not any(t["topologyKey"] == ZONE and r.selects(t.get("labelSelector"), labels) for t in spread):
        problems.add(name, f"no topologySpreadConstraint over {ZONE} selecting its pods")
    majority = replicas // 2 + 1
    budgets = [p for p in r.kind("PodDisruptionBudget").values() if r.selects(p["spec"]["selector"], labels)]
    if not budgets:
        problems.add(name, "no PodDisruptionBudget")
    for pdb in budgets:
        spec = pdb["spec"]
        if "maxUnavailable" in spec and replicas - int(spec["maxUnavailable"]) < majority:
            problems.add(where(pdb), f"lets the {replicas} pods drop below a majority ({majority})")
        if "minAvailable" in spec and int(spec["minAvailable"]) < majority:
            problems.add(where(pdb), f"minAvailable below a majority ({majority})")


def check_redis(r, problems, prod, skein_env):
    urls = {env.get("SKEIN_REDIS_URL") for env in skein_env if env.get("SKEIN_REDIS_URL")}
    for url in urls:
        if "@" in url.split("://", 1)[-1].split("/", 1)[0]:
            problems.add("SKEIN_REDIS_URL", "carries credentials: use SKEIN_REDIS_PASSWORD from the Secret")
    sts = by_app(r, "redis")
    if sts is not None:
        check_redis_node(r, sts, problems, prod)
    for url in urls:
        check_redis_url(r, sts, url, problems, prod, skein_env)


def check_redis_node(r, sts, problems, prod):
    name = where(sts)
    c = container(sts, "redis")
    check_guaranteed(sts, problems)
    files = mounted_config(r, sts, c, "/etc/redis") or {}
    conf = "\n".join(files.values())
    settings = {}
    for line in conf.splitlines():
        parts = line.split(None, 1)
        if parts and not parts[0].startswith("#"):
            settings.setdefault(parts[0].lower(), []).append(parts[1].strip() if len(parts) > 1 else "")
    for include in settings.get("include", []):
        directory = include.rsplit("/", 1)[0]
        if include.startswith("/etc/redis/") and include.rsplit("/", 1)[1] not in files:
            problems.add(name, f"redis.conf includes {include}, which the config map lacks")
        elif directory not in mount_paths(c):
            problems.add(name, f"redis.conf includes {include}, on no mounted volume")
    if settings.get("maxmemory-policy") != ["noeviction"]:
        problems.add(name, "maxmemory-policy must be noeviction (Skein's keys are state)")
    if settings.get("appendonly") != ["yes"]:
        problems.add(name, "appendonly must be yes")
    limit = memory_bytes(((c.get("resources") or {}).get("limits") or {}).get("memory", "0"))
    if len(settings.get("maxmemory", [])) != 1:
        problems.add(name, "exactly one maxmemory, sized to the memory limit")
    else:
        maxmemory = redis_bytes(settings["maxmemory"][0])
        if not 0.5 * limit <= maxmemory <= 0.8 * limit:
            problems.add(name, f"maxmemory {settings['maxmemory'][0]} is {maxmemory / limit:.0%} of the "
                         "memory limit: keep it at 50-80 % (the rest is for rewrites and buffers)")
    if prod and not sts["spec"]["template"]["spec"].get("priorityClassName"):
        problems.add(name, "no priorityClassName")


def check_redis_url(r, sts, url, problems, prod, skein_env):
    parts = urlsplit(url)
    scheme = parts.scheme
    cluster = any((env.get("SKEIN_REDIS_CLUSTER") or "").strip().lower() == "true" for env in skein_env)
    if cluster and scheme not in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        problems.add("SKEIN_REDIS_URL", f"SKEIN_REDIS_CLUSTER=true needs a redis://, rediss:// or "
                     f"redis+cluster:// URL, not {scheme}:// (the processes refuse to start)")
        return
    if scheme in ("redis+cluster", "rediss+cluster") or (cluster and scheme in ("redis", "rediss")):
        # A Redis Cluster's seed nodes (store/topology.rs): it survives a node with its replicas.
        if parts.path.strip("/") not in ("", "0"):
            problems.add("SKEIN_REDIS_URL", f"{url}: a Redis Cluster has database 0 only")
        return
    if scheme in ("redis+sentinel", "rediss+sentinel"):
        hosts = parts.netloc.rsplit("@", 1)[-1].split(",")
        master = parts.path.strip("/").split("/")[0]
        for host in hosts:
            svc_name, _, port = host.partition(":")
            svc = r.kind("Service").get(svc_name.split(".")[0])
            if svc is None or int(port or 26379) not in {p["port"] for p in svc["spec"]["ports"]}:
                problems.add("SKEIN_REDIS_URL", f"{host} is no rendered Service and port")
        if sts is None:
            problems.add("SKEIN_REDIS_URL", "names Sentinels, but no redis StatefulSet is rendered")
            return
        replicas = sts["spec"].get("replicas", 1)
        init = next(iter(sts["spec"]["template"]["spec"].get("initContainers") or []), {})
        init_env = {e["name"]: e.get("value") for e in init.get("env") or []}
        if init_env.get("MASTER_SET") != master:
            problems.add(where(sts), f"the Sentinels watch {init_env.get('MASTER_SET')!r}, "
                         f"SKEIN_REDIS_URL asks for {master!r}")
        quorum = int(init_env.get("QUORUM") or 0)
        if not replicas // 2 < quorum <= replicas:
            problems.add(where(sts), f"QUORUM {quorum} must be a majority of {replicas} Sentinels")
        if replicas < 3:
            problems.add(where(sts), f"{replicas} pods: Sentinels need three to survive a node")
        if not any(str(p["containerPort"]) == "26379" for c in sts["spec"]["template"]["spec"]["containers"]
                   for p in c.get("ports") or []):
            problems.add(where(sts), "no Sentinel container (port 26379)")
        if any(not env.get("SKEIN_REDIS_SENTINEL_PASSWORD", "").startswith("<secret")
               for env in skein_env):
            problems.add("SKEIN_REDIS_URL", "the Sentinels need SKEIN_REDIS_SENTINEL_PASSWORD from the Secret")
        check_spread_and_budget(r, sts, replicas, problems)
    elif scheme in ("redis", "rediss"):
        host = (parts.hostname or "").split(".")[0]
        if scheme == "redis" and host not in r.kind("Service"):
            problems.add("SKEIN_REDIS_URL", f"{url}: Service {host} is not rendered")
        if prod and scheme == "redis":
            problems.add("SKEIN_REDIS_URL", "one Redis node does not survive its node: use "
                         "redis+sentinel:// (components/redis-sentinel) or a managed Redis over rediss://")
    else:
        problems.add("SKEIN_REDIS_URL", f"unknown scheme {scheme!r}")


def check(r, problems, prod):
    # The environment of every lead, worker and gateway container, secrets marked as such.
    skein_env, worker_env = [], []
    for w in r.kind("Deployment").values():
        for c in w["spec"]["template"]["spec"]["containers"]:
            binary = os.path.basename((c.get("command") or [""])[0])
            if binary in ("skein-lead", "skein-worker", "skein-gateway"):
                skein_env.append(r.container_env(c))
            if binary == "skein-worker":
                worker_env.append(r.container_env(c))
    check_nats(r, problems, prod, skein_env, worker_env)
    check_redis(r, problems, prod, skein_env)
