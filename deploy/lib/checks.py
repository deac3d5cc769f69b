"""Checks of deploy/validate that the generic tools do not make.

  checks.py manifests RENDERED BUILTIN_OUT
      Reads a rendered overlay (kubectl kustomize output). Validates custom resources against the
      schemas in this folder (the Kubernetes schemas do not cover them), writes the built-in
      resources to BUILTIN_OUT for kubernetes-validate, and checks that the resources fit
      together: references resolve, selectors select, probes and the autoscalers point at what
      exists, the grace period outlasts SKEIN_GRACE, every pod is locked down.

  checks.py compose COMPOSE DOCKERFILE RENDERED_DEV
      Checks that the compose file starts the same processes as the dev overlay: the same images
      for NATS, Redis and Jaeger, the same binaries, the same settings, from files that exist.

Prints one line per problem and exits 1 if there is any.
"""

import json
import os
import re
import sys

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))

# Custom resources and the schema each is validated against.
CUSTOM_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.schema.json",
}

# API groups whose schemas ship with Kubernetes (kubernetes-validate knows them).
BUILTIN_GROUPS = {
    "", "apps", "batch", "policy", "autoscaling", "networking.k8s.io", "rbac.authorization.k8s.io",
    "storage.k8s.io", "scheduling.k8s.io", "coordination.k8s.io", "discovery.k8s.io",
}

# Secrets the prod overlay expects to exist in the cluster rather than rendering them.
EXTERNAL_SECRETS = {"skein-secrets"}

# Variables Kubernetes sets per pod, which compose has no counterpart for.
POD_ONLY_VARIABLES = {"SKEIN_INSTANCE_ID", "SKEIN_K8S_POD", "SKEIN_K8S_NAMESPACE", "REDIS_PASSWORD"}

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

    def container_env(self, container):
        """The container's environment as literal values where they are known: config map
        values (envFrom and configMapKeyRef) and plain values; None for secrets and fields."""
        env = {}
        for source in container.get("envFrom") or []:
            ref = source.get("configMapRef")
            if ref and ref["name"] in self.kind("ConfigMap"):
                env.update(self.kind("ConfigMap")[ref["name"]].get("data") or {})
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = var["value"]
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
    namespaces = {d["metadata"].get("namespace") for d in r.docs if d["kind"] != "Namespace"}
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
    if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
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
    for c in pod_spec["containers"]:
        check_container(r, w, c, volumes, problems)


def check_container(r, w, c, volumes, problems):
    name = f"{where(w)} container {c['name']}"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if probe not in c:
            problems.add(name, f"no {probe}")
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
    if env.get("SKEIN_ADMIN_ADDR"):
        admin_port = int(env["SKEIN_ADMIN_ADDR"].rsplit(":", 1)[1])
        if ports.get("admin") != admin_port:
            problems.add(name, f"port `admin` is {ports.get('admin')}, SKEIN_ADMIN_ADDR says {admin_port}")
        annotations = w["spec"]["template"]["metadata"].get("annotations") or {}
        if annotations.get("prometheus.io/port") != str(admin_port):
            problems.add(name, "prometheus.io/port does not name the admin port")
    for variable in ("SKEIN_WORKSPACE_ROOT", "SKEIN_SCRATCH_DIR"):
        if env.get(variable) and env[variable] not in mounts:
            problems.add(name, f"{variable}={env[variable]} is not a mounted volume (the root is read-only)")
    check_workspace_mode(r, name, env, mounts, volumes, problems)


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


def check_autoscalers(r, problems):
    deployments = r.kind("Deployment")
    for so in r.kind("ScaledObject").values():
        target = deployments.get(so["spec"]["scaleTargetRef"]["name"])
        if target is None:
            problems.add(where(so), "scaleTargetRef names no Deployment")
            continue
        if "replicas" in target["spec"]:
            problems.add(where(so), f"{where(target)} sets replicas, which `kubectl apply` would reset")
        env = r.container_env(target["spec"]["template"]["spec"]["containers"][0])
        pool = env.get("SKEIN_POOL", "default")
        consumers = {f"skein-tools-{pool}", f"skein-agents-{pool}"}
        for trigger in so["spec"]["triggers"]:
            if trigger["type"] != "nats-jetstream":
                continue
            meta = trigger["metadata"]
            if meta["consumer"] not in consumers:
                problems.add(where(so), f"consumer {meta['consumer']} is not one of pool {pool}'s {sorted(consumers)}")
            host, port = meta["natsServerMonitoringEndpoint"].rsplit(":", 1)
            parts = host.split(".")
            svc = r.kind("Service").get(parts[0])
            if svc is None:
                problems.add(where(so), f"monitoring endpoint names no Service ({parts[0]})")
                continue
            if len(parts) < 2 or parts[1] != svc["metadata"].get("namespace"):
                problems.add(where(so), f"monitoring endpoint {host} must name namespace "
                             f"{svc['metadata'].get('namespace')} (KEDA resolves it from its own namespace)")
            if int(port) not in {p["port"] for p in svc["spec"]["ports"]}:
                problems.add(where(so), f"monitoring endpoint port {port} is not a port of Service {parts[0]}")
    for hpa in r.kind("HorizontalPodAutoscaler").values():
        ref = hpa["spec"]["scaleTargetRef"]
        target = r.kind(ref["kind"]).get(ref["name"])
        if target is None:
            problems.add(where(hpa), f"scaleTargetRef names no {ref['kind']} {ref['name']}")
        elif "replicas" in target["spec"]:
            problems.add(where(hpa), f"{where(target)} sets replicas, which `kubectl apply` would reset")
    if r.kind("ScaledObject") and r.kind("HorizontalPodAutoscaler"):
        problems.add("autoscaling", "a ScaledObject and an HPA would both scale the workers")


def manifests(rendered_path, builtin_out):
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
    check_autoscalers(r, problems)
    print(f"{label}: {len(docs)} resources ({len(docs) - len(builtin)} custom) checked")
    return problems.finish()


def dockerfile_stages(path):
    """Stage name -> names of the binaries copied into /usr/local/bin in that stage."""
    stages = {}
    current = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
            if m:
                current = m.group(1)
                stages[current] = set()
            elif current and line.startswith("COPY --from=") and "/usr/local/bin" in line:
                stages[current].update(os.path.basename(p) for p in line.split()[2:-1])
    return stages


def compose(compose_path, dockerfile_path, rendered_dev):
    problems = Problems(os.path.basename(compose_path))
    base = os.path.dirname(os.path.abspath(compose_path))
    with open(compose_path, encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    stages = dockerfile_stages(dockerfile_path)
    r = Rendered(load_all(rendered_dev))
    k8s = {}
    for w in r.workloads():
        for c in w["spec"]["template"]["spec"]["containers"]:
            k8s[w["metadata"]["name"]] = (w, c)
    counterpart = {"nats": "nats", "redis": "redis", "jaeger": "jaeger", "lead": "skein-lead", "worker": "skein-worker"}

    for name, svc in spec["services"].items():
        at = f"service {name}"
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
    if len(argv) == 4 and argv[1] == "manifests":
        return manifests(argv[2], argv[3])
    if len(argv) == 5 and argv[1] == "compose":
        return compose(argv[2], argv[3], argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
