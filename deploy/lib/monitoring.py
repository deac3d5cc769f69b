"""The monitoring checks of deploy/validate: alerts, dashboards and ServiceMonitors name what exists.

Every metric a PrometheusRule or a Grafana dashboard (a ConfigMap labelled grafana_dashboard)
names must be one Skein exports -- the families registered in common/src/metrics.rs, with the
suffixes their types give them -- or one of the exporters' listed below, and every expression must
parse as PromQL. A `job` matcher must name a Service that a ServiceMonitor scrapes (the job label of
its targets is the Service's name). Every alert has a severity and a runbook section in
deploy/README.md, and the alerts the deployment promises exist and watch what they say.
"""

import json
import os
import re

import promql_parser

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
METRICS_RS = os.path.join(ROOT, "common", "src", "metrics.rs")
README = os.path.join(ROOT, "deploy", "README.md")

# Metrics of the exporters the monitoring component runs, as their pinned versions name them:
# prometheus-nats-exporter (-varz: gnatsd_varz_<numeric key of /varz>; -jsz: jetstream_*) and
# redis_exporter (namespace redis). Only the names used here; add one when an alert needs it.
EXPORTER_METRICS = {
    "prometheus-nats-exporter": {
        "gnatsd_varz_connections", "gnatsd_varz_routes", "gnatsd_varz_remotes", "gnatsd_varz_mem", "gnatsd_varz_cpu",
        "gnatsd_varz_slow_consumers", "gnatsd_varz_in_msgs", "gnatsd_varz_out_msgs",
        "jetstream_server_total_message_bytes", "jetstream_server_max_storage",
        "jetstream_server_total_streams", "jetstream_stream_total_messages",
        "jetstream_consumer_num_pending", "jetstream_consumer_num_ack_pending",
    },
    "redis_exporter": {
        "redis_up", "redis_memory_used_bytes", "redis_memory_max_bytes", "redis_connected_slaves",
        "redis_connected_clients", "redis_master_link_up", "redis_commands_processed_total",
        "redis_rejected_connections_total", "redis_aof_last_write_status", "redis_instance_info",
    },
    # Prometheus's own series for every target.
    "prometheus": {"up"},
    # KEDA's operator (2.15 and later), scraped through its chart's ServiceMonitor.
    "keda": {"keda_scaler_detail_errors_total", "keda_scaled_object_errors_total"},
    # The OpenTelemetry Collector's own metrics (service.telemetry, port 8888).
    "otelcol": {
        "otelcol_exporter_send_failed_spans_total", "otelcol_exporter_enqueue_failed_spans_total",
        "otelcol_processor_refused_spans_total", "otelcol_exporter_sent_spans_total",
        "otelcol_receiver_accepted_spans_total",
    },
}

# The alerts the deployment promises, and a metric each must watch.
REQUIRED_ALERTS = {
    "SkeinDeadLettersGrowing": "skein_dead_letters_total",
    "SkeinTurnsFailing": "skein_turns_total",
    "SkeinConsumerLag": "skein_queue_pending",
    "SkeinNoLiveWorkers": "up",
    "SkeinLeaseConflicts": "skein_lease_conflicts_total",
    # A NATS server cut off from a peer: `remotes` counts the peers it is routed to; `routes`
    # counts route connections (several per peer) and does not drop when one peer is gone.
    "SkeinNatsRouteMissing": "gnatsd_varz_remotes",
    "SkeinJetStreamStreamWithoutLeader": "jetstream_stream_total_messages",
    "SkeinRedisFailover": "redis_instance_info",
    "SkeinKedaScalerErrors": "keda_scaler_detail_errors_total",
    "SkeinCollectorDroppingSpans": "otelcol_exporter_send_failed_spans_total",
}

# Metrics an alert must not watch, and why.
MISLEADING_METRICS = {
    "gnatsd_varz_routes": "counts route connections, not peers: a server keeps its count with a peer "
                          "gone; alert on gnatsd_varz_remotes",
}

# The label kube-prometheus-stack's Prometheus selects ServiceMonitors and PrometheusRules by.
PROMETHEUS_SELECTOR_LABEL = "release"

SEVERITIES = {"critical", "warning", "info"}


def skein_metrics(path=METRICS_RS):
    """The series names Skein exports: the families registered in metrics.rs (`counter(r,
    "turns", ...)`, `gauge(...)`, `seconds(...)`) under the registry's prefix, with the suffixes
    the OpenMetrics encoding adds (_total; _seconds_bucket, _sum, _count)."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    prefix = re.search(r'const PREFIX: &str = "([a-z_]+)";', source).group(1)
    names = set()
    for kind, name in re.findall(r'\b(counter|gauge|seconds)\(\s*r\s*,\s*"([a-z_]+)"', source):
        base = f"{prefix}_{name}"
        if kind == "counter":
            names.add(f"{base}_total")
        elif kind == "gauge":
            names.add(base)
        else:
            names.update(f"{base}_seconds_{suffix}" for suffix in ("bucket", "sum", "count"))
    return names


def known_metrics():
    known = set(skein_metrics())
    for names in EXPORTER_METRICS.values():
        known |= names
    return known


def selectors(node):
    """Every vector selector in a parsed expression."""
    kind = type(node).__name__
    if kind == "VectorSelector":
        yield node
    elif kind == "MatrixSelector":
        yield node.vector_selector
    elif kind == "BinaryExpr":
        yield from selectors(node.lhs)
        yield from selectors(node.rhs)
    elif kind == "Call":
        for arg in node.args:
            yield from selectors(arg)
    elif kind in ("AggregateExpr", "ParenExpr", "UnaryExpr", "SubqueryExpr"):
        yield from selectors(node.expr)
        if kind == "AggregateExpr" and node.param is not None:
            yield from selectors(node.param)


def check_expression(expr, where, known, jobs, problems):
    """Parses `expr`, then checks the metrics and jobs it names; returns the metric names."""
    try:
        parsed = promql_parser.parse(expr)
    except ValueError as e:
        problems.add(where, f"not PromQL ({e}): {expr}")
        return set()
    names = set()
    for vs in selectors(parsed):
        if vs.name is None:
            problems.add(where, f"a selector without a metric name: {expr}")
            continue
        names.add(vs.name)
        if vs.name not in known:
            problems.add(where, f"{vs.name} is exported neither by Skein (common/src/metrics.rs) "
                         "nor by an exporter deploy/lib/monitoring.py lists")
        for m in vs.matchers.matchers:
            if m.name != "job":
                continue
            if m.op == promql_parser.MatchOp.Equal and m.value not in jobs:
                problems.add(where, f'job="{m.value}" is no Service a ServiceMonitor scrapes {sorted(jobs)}')
            if m.op == promql_parser.MatchOp.Re and not any(re.fullmatch(m.value, j) for j in jobs):
                problems.add(where, f'job=~"{m.value}" matches no Service a ServiceMonitor scrapes')
    return names


def scraped_jobs(r, problems):
    """The job names of the ServiceMonitors' targets: the names of the Services they select, which
    must have the endpoint's port."""
    jobs = set()
    for sm in r.kind("ServiceMonitor").values():
        spec = sm["spec"]
        selected = [s for s in r.kind("Service").values()
                    if r.selects(spec["selector"], s["metadata"].get("labels") or {})]
        if not selected:
            problems.add(f"ServiceMonitor/{sm['metadata']['name']}", "selects no Service")
        for endpoint in spec["endpoints"]:
            for svc in selected:
                if endpoint["port"] not in {p.get("name") for p in svc["spec"]["ports"]}:
                    problems.add(f"ServiceMonitor/{sm['metadata']['name']}",
                                 f"Service {svc['metadata']['name']} has no port {endpoint['port']}")
        if spec.get("jobLabel"):
            problems.add(f"ServiceMonitor/{sm['metadata']['name']}",
                         "jobLabel changes the job names the alerts rely on")
        jobs |= {s["metadata"]["name"] for s in selected}
    return jobs


def readme_anchors(path=README):
    with open(path, encoding="utf-8") as f:
        return set(re.findall(r'<a id="([^"]+)"', f.read()))


def check_rules(r, known, jobs, problems, prod=False):
    anchors = readme_anchors()
    alerts = {}
    for rule_set in r.kind("PrometheusRule").values():
        for group in rule_set["spec"]["groups"]:
            for rule in group["rules"]:
                name = rule.get("alert") or rule.get("record")
                where = f"PrometheusRule/{rule_set['metadata']['name']} {name}"
                names = check_expression(rule["expr"], where, known, jobs, problems)
                if "alert" not in rule:
                    continue
                alerts[name] = names
                for metric in sorted(names & set(MISLEADING_METRICS)):
                    problems.add(where, f"watches {metric}, which {MISLEADING_METRICS[metric]}")
                if (rule.get("labels") or {}).get("severity") not in SEVERITIES:
                    problems.add(where, f"severity must be one of {sorted(SEVERITIES)}")
                runbook = (rule.get("annotations") or {}).get("runbook_url", "")
                page, _, anchor = runbook.partition("#")
                if not page.endswith("README.md") or anchor not in anchors:
                    problems.add(where, f"runbook_url {runbook!r} is not a section of deploy/README.md "
                                 '(<a id="..."> anchors)')
                elif prod and not re.match(r"https?://[^/]+/", page):
                    problems.add(where, f"runbook_url {runbook!r} is a relative path, which no alert "
                                 "receiver can open: set runbookBase in the overlay's settings.yaml")
    return alerts


def check_dashboards(r, known, jobs, problems):
    found = 0
    for cm in r.kind("ConfigMap").values():
        if (cm["metadata"].get("labels") or {}).get("grafana_dashboard") != "1":
            continue
        for key, text in (cm.get("data") or {}).items():
            where = f"ConfigMap/{cm['metadata']['name']} {key}"
            try:
                dashboard = json.loads(text)
            except json.JSONDecodeError as e:
                problems.add(where, f"not JSON: {e}")
                continue
            found += 1
            panels = list(dashboard.get("panels") or [])
            for panel in panels:
                panels.extend(panel.get("panels") or [])
                for target in panel.get("targets") or []:
                    # Grafana's own variables stand for durations.
                    expr = re.sub(r"\$__\w+", "5m", target.get("expr", ""))
                    check_expression(expr, f"{where} panel {panel.get('title')!r}", known, jobs, problems)
            for variable in (dashboard.get("templating") or {}).get("list") or []:
                query = variable.get("query")
                query = query.get("query", "") if isinstance(query, dict) else str(query or "")
                m = re.match(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,", query)
                if m and m.group(1) not in known:
                    problems.add(where, f"variable {variable.get('name')}: {m.group(1)} is not exported")
    return found


def check(r, problems, prod):
    """Checks the rendering's monitoring; in prod, also that it is there."""
    known = known_metrics()
    jobs = scraped_jobs(r, problems)
    alerts = check_rules(r, known, jobs, problems, prod)
    dashboards = check_dashboards(r, known, jobs, problems)
    if not prod:
        return
    if not r.kind("ServiceMonitor"):
        problems.add("monitoring", "no ServiceMonitor scrapes the leads and workers")
    if not dashboards:
        problems.add("monitoring", "no Grafana dashboard (ConfigMap labelled grafana_dashboard)")
    for alert, metric in REQUIRED_ALERTS.items():
        if alert not in alerts:
            problems.add("monitoring", f"no alert {alert}")
        elif metric not in alerts[alert]:
            problems.add("monitoring", f"{alert} does not watch {metric}")
    for job in ("skein-lead-metrics", "skein-worker-metrics"):
        if job not in jobs:
            problems.add("monitoring", f"no ServiceMonitor scrapes Service {job}")
    # kube-prometheus-stack's Prometheus selects ServiceMonitors and rules by its release label:
    # without it, the resources are created and nothing reads them.
    for kind in ("ServiceMonitor", "PrometheusRule"):
        for doc in r.kind(kind).values():
            if not (doc["metadata"].get("labels") or {}).get(PROMETHEUS_SELECTOR_LABEL):
                problems.add(f"{kind}/{doc['metadata']['name']}", f"no `{PROMETHEUS_SELECTOR_LABEL}` label: "
                             "kube-prometheus-stack's Prometheus selects by it and would ignore this "
                             "(prometheusRelease in the overlay's settings.yaml)")
