"""Puts a defect the deployment once had back into a rendering, so that deploy/validate can show
that its checks refuse it (step 4d).

  mutate.py NAME RENDERED OUT     writes RENDERED with defect NAME to OUT
  mutate.py --list                prints the defects' names

Each defect is a function of the rendered documents; it fails if the rendering no longer has the
shape it changes, so a mutation cannot silently stop applying.
"""

import re
import sys

import yaml


def find(docs, kind, name):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise SystemExit(f"mutate: no {kind}/{name} in the rendering")


def container(doc, name, init=False):
    pod = doc["spec"]["template"]["spec"]
    for c in pod["initContainers" if init else "containers"]:
        if c["name"] == name:
            return c
    raise SystemExit(f"mutate: no container {name} in {doc['kind']}/{doc['metadata']['name']}")


def env_var(c, name):
    for e in c.get("env") or []:
        if e["name"] == name:
            return e
    raise SystemExit(f"mutate: no {name} in container {c['name']}")


def config_map(docs, prefix):
    """A ConfigMap by its name before kustomize's hash suffix."""
    for d in docs:
        if d["kind"] == "ConfigMap" and re.fullmatch(rf"{re.escape(prefix)}(-[a-z0-9]{{10}})?", d["metadata"]["name"]):
            return d
    raise SystemExit(f"mutate: no ConfigMap {prefix}")


def replace_text(cm, key, old, new):
    text = cm["data"][key]
    if old not in text:
        raise SystemExit(f"mutate: {old!r} is not in {key}")
    cm["data"][key] = text.replace(old, new)


# 1. The password read unquoted from the environment, as nats.conf had it.
def nats_password_unquoted(docs):
    replace_text(config_map(docs, "nats-config"), "auth.conf", "$NATS_AUTH_PASSWORD", "$SKEIN_NATS_PASSWORD")


# 2. A strict spread over zones.
def zone_spread_strict(docs):
    for name in ("nats", "redis"):
        for t in find(docs, "StatefulSet", name)["spec"]["template"]["spec"]["topologySpreadConstraints"]:
            if t["topologyKey"] == "topology.kubernetes.io/zone":
                t["whenUnsatisfiable"] = "DoNotSchedule"


# 3. Separate triggers (the larger backlog wins) and no fallback.
def keda_larger_backlog(docs):
    so = find(docs, "ScaledObject", "skein-worker")
    del so["spec"]["advanced"]["scalingModifiers"]
    del so["spec"]["fallback"]


# 4. Monitoring as it was: no release label, relative runbooks, routes, fewer alerts.
def monitoring_unselected(docs):
    for d in docs:
        if d["kind"] in ("ServiceMonitor", "PrometheusRule"):
            del d["metadata"]["labels"]["release"]


def runbook_relative(docs):
    for group in find(docs, "PrometheusRule", "skein")["spec"]["groups"]:
        for rule in group["rules"]:
            rule["annotations"]["runbook_url"] = "deploy/README.md#" + rule["annotations"]["runbook_url"].split("#")[1]


def route_alert_on_routes(docs):
    for group in find(docs, "PrometheusRule", "skein")["spec"]["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "SkeinNatsRouteMissing":
                rule["expr"] = ("gnatsd_varz_routes < 2 and on (namespace, pod) "
                                "(count by (namespace, pod) (gnatsd_varz_routes) > 0)")


def alerts_missing(docs):
    gone = {"SkeinRedisFailover", "SkeinKedaScalerErrors", "SkeinCollectorDroppingSpans",
            "SkeinJetStreamStreamWithoutLeader"}
    for group in find(docs, "PrometheusRule", "skein")["spec"]["groups"]:
        group["rules"] = [rule for rule in group["rules"] if rule.get("alert") not in gone]


# 5. NATS's user from the processes' ConfigMap, and one Secret for every credential.
def nats_reads_app_config(docs):
    nats = container(find(docs, "StatefulSet", "nats"), "nats")
    common = config_map(docs, "skein-common")["metadata"]["name"]
    nats["env"].insert(0, {"name": "SKEIN_NATS_USER",
                           "valueFrom": {"configMapKeyRef": {"name": common, "key": "SKEIN_NATS_USER"}}})


def one_secret(docs):
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = d["spec"]["template"]["spec"]
        for c in pod["containers"] + (pod.get("initContainers") or []):
            for e in c.get("env") or []:
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref and ref["name"] in ("skein-nats", "skein-redis", "skein-model"):
                    ref["name"] = "skein-secrets"


# 6. Redis electing its first pod whenever nobody answers, and stopping without a failover.
def redis_no_bootstrap_marker(docs):
    redis = find(docs, "StatefulSet", "redis")
    init = container(redis, "init", init=True)
    init["env"] = [e for e in init["env"] if e["name"] != "BOOTSTRAP_MARKER"]
    del redis["spec"]["podManagementPolicy"]


def redis_no_failover(docs):
    del container(find(docs, "StatefulSet", "redis"), "redis")["lifecycle"]


# 7. The shell pool as the default workers run: RuntimeDefault, UID 10001, the 4 GiB default.
def shell_runtime_default(docs):
    pool = find(docs, "Deployment", "skein-worker-shell")
    psc = pool["spec"]["template"]["spec"]["securityContext"]
    psc["seccompProfile"] = {"type": "RuntimeDefault"}
    psc["runAsUser"] = psc["runAsGroup"] = 10001
    config_map(docs, "skein-worker-shell")["data"]["SKEIN_SHELL_MEMORY"] = "4GiB"


# 8. A 30 s drain for everything, 60 s pods, one pod at a time.
def short_drain(docs):
    config_map(docs, "skein-common")["data"]["SKEIN_GRACE"] = "30s"
    for name in ("skein-lead", "skein-worker"):
        config_map(docs, name)["data"].pop("SKEIN_GRACE")
        deployment = find(docs, "Deployment", name)
        deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 60
        deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] = 1


# 9. A start-up probe of 10 minutes and a store as large as its volume.
def nats_short_catch_up(docs):
    container(find(docs, "StatefulSet", "nats"), "nats")["startupProbe"]["failureThreshold"] = 120


def tenant_fills_store(docs):
    config_map(docs, "skein-common")["data"].pop("SKEIN_WORKSPACE_BUCKET_BYTES")


def nats_store_fills_volume(docs):
    env_var(container(find(docs, "StatefulSet", "nats"), "nats"), "NATS_MAX_FILE_STORE")["value"] = "21GB"


# 10. No TLS: plain NATS clients and routes, redis+sentinel://, an insecure export.
def no_tls(docs):
    nats_config = config_map(docs, "nats-config")
    nats_config["data"]["tls.conf"] = "# none\n"
    nats_config["data"]["cluster.conf"] = re.sub(r"\n  tls \{.*?\n  \}", "", nats_config["data"]["cluster.conf"],
                                                 flags=re.DOTALL)
    common = config_map(docs, "skein-common")["data"]
    common["SKEIN_REDIS_URL"] = common["SKEIN_REDIS_URL"].replace("rediss+", "redis+")
    replace_text(config_map(docs, "otel-collector-config"), "collector.yaml", "insecure: false", "insecure: true")


# Settings: the namespace written by hand where it is named, and left behind on a rename.
def namespace_left_behind(docs):
    for d in docs:
        if d["kind"] == "ScaledObject":
            for trigger in d["spec"]["triggers"]:
                endpoint = (trigger.get("metadata") or {}).get("natsServerMonitoringEndpoint")
                if endpoint:
                    trigger["metadata"]["natsServerMonitoringEndpoint"] = "nats.skein.svc:8222"
        if d["kind"] == "Certificate" and d["spec"].get("dnsNames"):
            d["spec"]["dnsNames"] = [re.sub(r"\.[a-z0-9-]+\.svc$", ".skein.svc", n) for n in d["spec"]["dnsNames"]]


# Settings: partitions set without a trigger for each partition's consumers.
def partitions_without_triggers(docs):
    for name in ("skein-worker", "skein-lead"):
        env = container(find(docs, "Deployment", name), name.removeprefix("skein-")).setdefault("env", [])
        env.append({"name": "SKEIN_PARTITIONS", "value": "2"})


MUTATIONS = {
    "nats-password-unquoted": nats_password_unquoted,
    "zone-spread-strict": zone_spread_strict,
    "keda-larger-backlog": keda_larger_backlog,
    "monitoring-unselected": monitoring_unselected,
    "runbook-relative": runbook_relative,
    "route-alert-on-routes": route_alert_on_routes,
    "alerts-missing": alerts_missing,
    "nats-reads-app-config": nats_reads_app_config,
    "one-secret": one_secret,
    "redis-no-bootstrap-marker": redis_no_bootstrap_marker,
    "redis-no-failover": redis_no_failover,
    "shell-runtime-default": shell_runtime_default,
    "short-drain": short_drain,
    "nats-short-catch-up": nats_short_catch_up,
    "nats-store-fills-volume": nats_store_fills_volume,
    "tenant-fills-store": tenant_fills_store,
    "no-tls": no_tls,
    "namespace-left-behind": namespace_left_behind,
    "partitions-without-triggers": partitions_without_triggers,
}


def main(argv):
    if argv[1:] == ["--list"]:
        print("\n".join(MUTATIONS))
        return 0
    if len(argv) != 4 or argv[1] not in MUTATIONS:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[2], encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    MUTATIONS[argv[1]](docs)
    with open(argv[3], "w", encoding="utf-8") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
