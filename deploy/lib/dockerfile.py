"""The Dockerfile checks of deploy/validate (checkov scans it for the rest).

The images Skein deploys (targets lead, worker, gateway, cli) run on a distroless base, the builder and
the runtime on the same Debian release (the binaries link against its glibc), every base image is
named by a version (never latest), and every final image carries the OCI labels, its version the
workspace's.
"""

import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
CARGO_TOML = os.path.join(HERE, "..", "..", "Cargo.toml")

# Targets that must be small: distroless, no shell or package manager.
DISTROLESS_TARGETS = ("lead", "worker", "gateway", "cli")
# Every final image (a target someone builds) carries these.
OCI_LABELS = ("title", "description", "licenses", "version", "revision", "source")
DEBIAN_VERSIONS = {"bullseye": "11", "bookworm": "12", "trixie": "13"}


def parse(path):
    """Global ARG defaults and the stages: name -> {base, lines, args (the stage's ARGs)}."""
    args, stages, current = {}, {}, None
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"\\\n", " ", f.read())
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if m:
            current = {"base": m.group(1), "lines": [], "args": {}}
            stages[m.group(2) or f"stage{len(stages)}"] = current
            continue
        m = re.match(r"ARG\s+(\w+)(?:=(\S*))?", line)
        if m:
            (current["args"] if current else args)[m.group(1)] = m.group(2)
        if current is not None:
            current["lines"].append(line)
    return args, stages


def resolve(text, args):
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1)) or "", text)


def stages_with_binaries(path):
    """Stage name -> names of the binaries copied into /usr/local/bin in that stage."""
    _, stages = parse(path)
    found = {}
    for name, stage in stages.items():
        found[name] = set()
        for line in stage["lines"]:
            if line.startswith("COPY --from=") and "/usr/local/bin" in line:
                found[name].update(os.path.basename(p) for p in line.split()[2:-1])
    return found


def labels(stages, name):
    """The labels of a stage, its ancestors' included."""
    found = {}
    chain = []
    while name in stages:
        chain.append(stages[name])
        name = stages[name]["base"]
    for stage in reversed(chain):
        for line in stage["lines"]:
            if line.startswith("LABEL "):
                found.update(re.findall(r'([\w.-]+)="?([^"\s]*)"?', line[len("LABEL "):]))
    return found


def root_base(stages, name, args):
    while name in stages:
        base = stages[name]["base"]
        if base not in stages:
            return resolve(base, args)
        name = base
    return name


def check(path, problems):
    args, stages = parse(path)
    for name, stage in stages.items():
        base = resolve(stage["base"], args)
        if base not in stages and (":" not in base.split("/")[-1] or base.endswith(":latest")):
            problems.add(f"stage {name}", f"base image {base} is not named by a version")
    distroless = root_base(stages, "lead", args)
    release = args.get("DEBIAN_RELEASE")
    m = re.search(r"distroless/\w+-debian(\d+)", distroless)
    if not m:
        problems.add("runtime", f"the runtime base {distroless} is not distroless")
    elif DEBIAN_VERSIONS.get(release) != m.group(1):
        problems.add("runtime", f"builder on Debian {release}, runtime on debian{m.group(1)}: the "
                     "binaries need the builder's glibc")
    for target in DISTROLESS_TARGETS:
        if target not in stages:
            problems.add(f"stage {target}", "missing")
        elif root_base(stages, target, args) != distroless:
            problems.add(f"stage {target}", "does not run on the distroless runtime")
    with open(CARGO_TOML, encoding="utf-8") as f:
        version = re.search(r'^\[workspace\.package\]\s*\nversion = "([^"]+)"', f.read(), re.MULTILINE)
    # Final images: stages no other stage builds on or copies from.
    used = {s["base"] for s in stages.values()}
    used |= {m for s in stages.values() for line in s["lines"] for m in re.findall(r"--from=(\S+)", line)}
    final = [n for n in stages if n not in used]
    for target in final:
        found = labels(stages, target)
        for label in OCI_LABELS:
            if f"org.opencontainers.image.{label}" not in found:
                problems.add(f"stage {target}", f"no org.opencontainers.image.{label} label")
        chain_args = {}
        name = target
        while name in stages:
            chain_args = {**stages[name]["args"], **chain_args}
            name = stages[name]["base"]
        if version and chain_args.get("VERSION") != version.group(1):
            problems.add(f"stage {target}", f"VERSION {chain_args.get('VERSION')} is not the "
                         f"workspace's {version.group(1)}")
