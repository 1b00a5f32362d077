#!/usr/bin/env python3
"""Cross-checks of deploy/ against the real build and the real push-worker CLI (deploy/check.sh runs it).

Each section reads the artifact as its tool would, then asks the binary named by $PUSH_WORKER_BIN:
every command line is parsed by `push-worker check-arguments`, ports and grace periods are compared
with the defaults `push-worker run --help` prints, paths with the repository and the build.

    python3 deploy/check_deploy.py systemd docker kubernetes prometheus
"""

import json
import os
import re
import shlex
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PUSH_WORKER_BIN", "")
problems = []


def problem(artifact, message):
    problems.append(f"{artifact}: {message}")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def check_arguments(artifact, arguments):
    """Parses a push-worker command line with the real CLI, as `run` would at start."""
    result = subprocess.run([BIN, "check-arguments", *arguments], capture_output=True, text=True)
    if result.returncode != 0:
        problem(artifact, f"push-worker rejects {' '.join(arguments)!r}: {result.stderr.strip()}")
    else:
        print(f"   {artifact}: {result.stdout.strip()}")


def run_help_defaults():
    """Defaults of `push-worker run`, from its --help (the source of truth users read)."""
    text = subprocess.run([BIN, "run", "--help"], capture_output=True, text=True, check=True).stdout
    flat = re.sub(r"\s+", " ", text)

    def default(option):
        match = re.search(re.escape(option) + r" <[^>]+> .*?\(default: ([^)]+)\)", flat)
        if not match:
            raise SystemExit(f"check_deploy.py: `push-worker run --help` shows no default for {option}")
        return match.group(1)

    return {"metrics_port": int(default("--metrics-port")), "shutdown_grace": seconds(default("--shutdown-grace"))}


def seconds(text):
    """'20s', '45', '1m', '2m30s' → seconds."""
    text = str(text).strip()
    if re.fullmatch(r"\d+", text):
        return int(text)
    total = 0
    for number, unit in re.findall(r"(\d+)\s*(ms|s|m|h|d|w)", text):
        total += int(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
    if total == 0:
        raise ValueError(f"not a duration: {text!r}")
    return total


def option_value(arguments, name):
    """The value of --name in an argument list (--name=value or --name value), or None."""
    for index, argument in enumerate(arguments):
        if argument.startswith(name + "="):
            return argument.split("=", 1)[1]
        if argument == name and index + 1 < len(arguments):
            return arguments[index + 1]
    return None


def environment_variables_read_by_the_code():
    names = set()
    for directory, _, files in os.walk(os.path.join(ROOT, "Sources")):
        for name in files:
            if name.endswith(".swift"):
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    names.update(re.findall(r'"([A-Z][A-Z0-9_]{3,})"', f.read()))
    return names


# --- systemd -----------------------------------------------------------------------------------

def parse_unit(text):
    sections, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            key, _, value = line.partition("=")
            current.append((key.strip(), value.strip()))
    return sections


def check_systemd(defaults):
    artifact = "deploy/systemd/push-worker.service"
    unit = parse_unit(read(artifact))
    service = unit.get("Service", [])
    values = {}
    for key, value in service:
        values.setdefault(key, []).append(value)

    def one(key):
        return values.get(key, [None])[-1]

    env_file = {}
    for line in read("deploy/systemd/push-worker.env").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env_file[key] = value
    known = environment_variables_read_by_the_code() | {"PUSH_WORKER_OPTS"}
    for key in env_file:
        if key not in known:
            problem("deploy/systemd/push-worker.env", f"{key} is read by nothing in Sources/ (typo?)")

    if one("Type") != "notify":
        problem(artifact, "Type= must be notify (push-worker run sends READY=1)")
    for key, expected in [("ProtectSystem", "strict"), ("NoNewPrivileges", "yes"), ("PrivateTmp", "yes")]:
        if one(key) != expected:
            problem(artifact, f"{key}= must be {expected}")
    if one("DynamicUser") != "yes" and not one("User"):
        problem(artifact, "needs DynamicUser=yes or a dedicated User=")
    credentials = [v.split(":", 1)[0] for v in values.get("LoadCredential", [])]
    key_path = next((v.split("=", 1)[1] for v in values.get("Environment", []) if v.startswith("APNS_KEY_PATH=")), None)
    if not credentials or key_path != f"%d/{credentials[0]}":
        problem(artifact, f"APNS_KEY_PATH must point into the credentials directory: %d/<LoadCredential name>, got {key_path}")

    command = shlex.split(one("ExecStart") or "")
    if not command or command[0] != "/usr/local/bin/push-worker":
        problem(artifact, "ExecStart= must start /usr/local/bin/push-worker")
        return
    arguments = []
    for word in command[1:]:
        if word == "$PUSH_WORKER_OPTS":
            arguments += shlex.split(env_file.get("PUSH_WORKER_OPTS", ""))
        else:
            arguments.append(word.replace("%H", "host.example"))
    check_arguments(artifact, arguments)
    grace = seconds(option_value(arguments, "--shutdown-grace") or defaults["shutdown_grace"])
    stop = seconds(one("TimeoutStopSec") or "90s")
    if stop < grace + 10:
        problem(artifact, f"TimeoutStopSec={stop}s must exceed --shutdown-grace ({grace}s) by at least 10s for the final flush")
    print(f"   {artifact}: TimeoutStopSec {stop}s > shutdown grace {grace}s + 10s")


# --- docker ------------------------------------------------------------------------------------

def dockerfile_instructions(text):
    lines, buffer = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        buffer += stripped
        keyword, _, rest = buffer.partition(" ")
        lines.append((keyword.upper(), rest.strip()))
        buffer = ""
    return lines


def exec_form(text):
    try:
        value = json.loads(text)
        return value if isinstance(value, list) else None
    except json.JSONDecodeError:
        return None


def check_docker(defaults):
    artifact = "deploy/docker/Dockerfile"
    instructions = dockerfile_instructions(read(artifact))
    ignored = {line.strip() for line in read(".dockerignore").splitlines() if line.strip() and not line.startswith("#")}
    args = {}
    stages = []
    for keyword, rest in instructions:
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = value
        if keyword == "FROM":
            stages.append(rest)

    swift = subprocess.run(["swift", "--version"], capture_output=True, text=True).stdout
    local = re.search(r"Swift version (\d+\.\d+)", swift)
    if local and args.get("SWIFT_VERSION") != local.group(1):
        problem(artifact, f"SWIFT_VERSION {args.get('SWIFT_VERSION')} differs from the toolchain the project builds and tests with ({local.group(1)})")
    if len(stages) < 2:
        problem(artifact, "must be multi-stage (build, then a runtime image)")

    package = json.loads(subprocess.run(["swift", "package", "dump-package"], cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    executables = {t["name"] for t in package["targets"] if t["type"] == "executable"}

    built_to, copied_from, user, exposed, useradd_uid = None, None, None, [], None
    entrypoint, cmd, healthcheck = None, None, None
    for keyword, rest in instructions:
        if keyword == "COPY" and not rest.startswith("--from"):
            for source in shlex.split(rest)[:-1]:
                if not os.path.exists(os.path.join(ROOT, source)):
                    problem(artifact, f"COPY {source}: no such path in the repository")
                if source.rstrip("/") in ignored:
                    problem(artifact, f"COPY {source}: excluded by .dockerignore")
        if keyword == "COPY" and rest.startswith("--from"):
            words = shlex.split(rest)
            copied_from = words[1]
        if keyword == "RUN" and "swift build" in rest:
            product = re.search(r"--product\s+(\S+)", rest)
            if not product or product.group(1) not in executables:
                problem(artifact, f"swift build --product must name an executable target ({sorted(executables)})")
            if "--static-swift-stdlib" not in rest:
                problem(artifact, "the release build must use --static-swift-stdlib")
            build = re.search(r"(swift build [^&;]*?--product \S+)", rest)
            show = re.search(r'"\$\((swift build [^)]*--show-bin-path)\)/(\S+?)"', rest)
            if not show or (product and show.group(2) != product.group(1)):
                problem(artifact, "the binary must be installed from $(swift build … --show-bin-path)/<product>")
            else:
                # The same flags must locate the same binary: ask SwiftPM where it would be.
                build_flags = set(shlex.split(build.group(1))) - {"--product", product.group(1)}
                show_flags = set(shlex.split(show.group(1))) - {"--show-bin-path"}
                if build_flags != show_flags:
                    problem(artifact, f"--show-bin-path is asked with other flags than the build: {sorted(build_flags ^ show_flags)}")
                path = subprocess.run(shlex.split(show.group(1)), cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
                if not path.endswith("/release"):
                    problem(artifact, f"swift build --show-bin-path gives {path}, not a release directory")
                print(f"   {artifact}: {build.group(1)} → {path.replace(ROOT, '.')}/{product.group(1)}")
            install = re.search(r"install -D (?:-s )?-m 0755 \"[^\"]+\" (\S+)", rest)
            built_to = install.group(1) if install else None
            if "/root" in rest or "/home" in rest:
                problem(artifact, "the build stage should not depend on a home directory")
        if keyword == "RUN" and "useradd" in rest:
            match = re.search(r"--uid (\d+)", rest)
            useradd_uid = match.group(1) if match else None
        if keyword == "USER":
            user = rest
        if keyword == "EXPOSE":
            exposed += [int(p.split("/")[0]) for p in rest.split()]
        if keyword == "ENTRYPOINT":
            entrypoint = exec_form(rest)
        if keyword == "CMD":
            cmd = exec_form(rest)
        if keyword == "HEALTHCHECK":
            healthcheck = exec_form(rest.split(" CMD ", 1)[1]) if " CMD " in rest else None

    if copied_from != built_to or built_to is None:
        problem(artifact, f"the runtime stage copies {copied_from}, the build stage installs {built_to}")
    if not user or user.split(":")[0] in ("0", "root"):
        problem(artifact, "USER must be a non-root numeric uid")
    elif user.split(":")[0] != useradd_uid:
        problem(artifact, f"USER {user} is not the uid the image creates ({useradd_uid})")
    if defaults["metrics_port"] not in exposed:
        problem(artifact, f"EXPOSE {exposed} lacks the metrics port {defaults['metrics_port']}")
    if entrypoint != ["push-worker"]:
        problem(artifact, 'ENTRYPOINT must be ["push-worker"] (exec form, so SIGTERM reaches the worker)')
    if cmd:
        check_arguments(artifact + " CMD", cmd)
    if not healthcheck or healthcheck[0] != "push-worker":
        problem(artifact, "HEALTHCHECK must run push-worker healthcheck (the image has no curl)")
    else:
        check_arguments(artifact + " HEALTHCHECK", healthcheck[1:])

    release = os.environ.get("PUSH_WORKER_RELEASE_BIN")
    if release:
        check_runtime_libraries(artifact, release, instructions)
    check_compose(defaults)


def debian_slim_packages():
    """What every debian-slim image has: the Essential and priority-required packages and everything
    they depend on, as this Debian's package database says."""
    listing = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Essential}\t${Priority}\t${Pre-Depends}, ${Depends}\n"],
                             capture_output=True, text=True, check=True).stdout
    depends, wanted = {}, []
    for line in listing.splitlines():
        package, essential, priority, dependencies = line.split("\t")
        names = re.findall(r"(?:^|[,|]\s*)([a-z0-9][a-z0-9.+-]+)", dependencies)
        depends[package] = [n.split(":")[0] for n in names]
        if essential == "yes" or priority == "required":
            wanted.append(package)
    closure = set()
    while wanted:
        package = wanted.pop()
        if package not in closure:
            closure.add(package)
            wanted.extend(depends.get(package, []))
    return closure


def check_runtime_libraries(artifact, binary, instructions):
    """Every shared library the static-stdlib binary still needs comes from the runtime image:
    a package every debian-slim has, or one the Dockerfile installs."""
    installed = set()
    for keyword, rest in instructions:
        if keyword == "RUN" and "apt-get install" in rest:
            words = re.split(r"[\s&]+", rest.split("apt-get install", 1)[1])
            installed.update(w for w in words if re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", w))
    slim = debian_slim_packages()
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    for path in re.findall(r"=> (/\S+)", ldd):
        owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
        if owner.returncode != 0:
            owner = subprocess.run(["dpkg", "-S", os.path.realpath(path)], capture_output=True, text=True)
        package = owner.stdout.split(":")[0].strip()
        if "swift" in path or not package:
            problem(artifact, f"{binary} links {path}, which is not from a Debian package: is the stdlib really static?")
        elif package not in slim and package not in installed:
            problem(artifact, f"the binary needs {path} from {package}; install it in the runtime stage")
        else:
            print(f"   {artifact}: {os.path.basename(path)} from {package} ({'installed by the Dockerfile' if package in installed else 'in debian-slim'})")


def check_compose(defaults):
    artifact = "deploy/compose.yaml"
    document = yaml.safe_load(read(artifact))  # resolves the YAML merge keys (<<) as Compose does
    try:
        from compose_spec import PyCompose
    except ImportError:
        problem(artifact, "compose-spec (PyPI) is not installed: the Compose-spec check cannot run")
    else:
        try:
            PyCompose.from_json(json.dumps(document))
            print(f"   {artifact}: valid against the Compose specification (compose-spec)")
        except ValueError as error:
            problem(artifact, f"not a valid Compose file: {error}")

    services = document.get("services", {})
    volumes = set(document.get("volumes", {}) or {})
    simulator_sources = read("Sources/APNsSimulator/SimulatorCredentials.swift")
    sim_key_id = re.search(r'keyID: String = "([A-Z0-9]+)"', simulator_sources).group(1)
    sim_team_id = re.search(r'teamID: String = "([A-Z0-9]+)"', simulator_sources).group(1)
    for name, service in services.items():
        where = f"{artifact} {name}"
        build = service.get("build")
        if build:
            context = os.path.normpath(os.path.join(ROOT, "deploy", build["context"]))
            if not os.path.isfile(os.path.join(context, build["dockerfile"])):
                problem(where, f"build.dockerfile {build['dockerfile']} not found from context {build['context']}")
        ours = bool(build)
        if ours:
            check_arguments(where, service.get("command", ["run"]))
            environment = service.get("environment", {})
            if "APNS_KEY_PATH" in environment:
                if not environment["APNS_KEY_PATH"].endswith(f"AuthKey_{sim_key_id}.p8") or environment.get("APNS_KEY_ID") != sim_key_id or environment.get("APNS_TEAM_ID") != sim_team_id:
                    problem(where, f"the key settings must match what the simulator writes (AuthKey_{sim_key_id}.p8, {sim_key_id}, {sim_team_id})")
            command = service.get("command", [])
            if command and command[0] == "run":
                grace = seconds(option_value(command, "--shutdown-grace") or defaults["shutdown_grace"])
                if seconds(service.get("stop_grace_period", "10s")) <= grace:
                    problem(where, f"stop_grace_period must exceed --shutdown-grace ({grace}s)")
        for dependency, condition in (service.get("depends_on") or {}).items():
            if dependency not in services:
                problem(where, f"depends on unknown service {dependency}")
            elif condition.get("condition") == "service_healthy" and "healthcheck" not in services[dependency]:
                problem(where, f"waits for {dependency} to be healthy, but {dependency} has no healthcheck")
        for mount in service.get("volumes", []):
            source = mount.split(":")[0]
            if not source.startswith((".", "/")) and source not in volumes:
                problem(where, f"volume {source} is not declared at the top level")
    workers = [n for n, s in services.items() if (s.get("command") or [""])[0] == "run"]
    if len(workers) < 2:
        problem(artifact, f"expected two workers, found {workers}")
    if not any((s.get("command") or [""])[0] == "migrate" for s in services.values()):
        problem(artifact, "expected a one-shot migrate service")


# --- kubernetes --------------------------------------------------------------------------------

def check_kubernetes(defaults):
    directory = os.path.join(ROOT, "deploy", "kubernetes")
    resources = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".yaml"):
            for document in yaml.safe_load_all(read(f"deploy/kubernetes/{name}")):
                if document:
                    resources[(document["kind"], document["metadata"]["name"])] = (name, document)
    deployment_file, deployment = resources[("Deployment", "push-worker")]
    where = f"deploy/kubernetes/{deployment_file}"
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    arguments = container.get("args", [])
    check_arguments(where, arguments)
    if spec.get("replicas", 1) < 2:
        problem(where, "replicas must be at least 2")
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    metrics_port = int(option_value(arguments, "--metrics-port") or defaults["metrics_port"])
    if ports.get("metrics") != metrics_port:
        problem(where, f"containerPort 'metrics' {ports.get('metrics')} is not the worker's metrics port {metrics_port}")
    for probe, path in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]:
        http = container.get(probe, {}).get("httpGet", {})
        if http.get("path") != path or ports.get(http.get("port"), http.get("port")) != metrics_port:
            problem(where, f"{probe} must GET {path} on the metrics port")
    grace = seconds(option_value(arguments, "--shutdown-grace") or defaults["shutdown_grace"])
    if pod.get("terminationGracePeriodSeconds", 30) < grace + 10:
        problem(where, f"terminationGracePeriodSeconds must exceed --shutdown-grace ({grace}s) by at least 10s")
    if not container.get("resources", {}).get("requests"):
        problem(where, "resource requests are missing")
    annotations = spec["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") != "true" or int(annotations.get("prometheus.io/port", 0)) != metrics_port:
        problem(where, "scrape annotations must name the metrics port")

    # Secrets and config: every reference resolves, keys are mounted owner-read-only.
    _, secret = resources[("Secret", "push-worker")]
    secret_keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    for variable in container.get("env", []):
        reference = variable.get("valueFrom", {}).get("secretKeyRef")
        if reference and reference["key"] not in secret_keys:
            problem(where, f"env {variable['name']} refers to secret key {reference['key']}, which the example Secret lacks")
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    key_files = set()
    for volume in pod.get("volumes", []):
        if "secret" in volume:
            mode = volume["secret"].get("defaultMode", 0o644)
            if mode & 0o007:
                problem(where, f"secret volume {volume['name']} mode {oct(mode)} is world-accessible: push-worker refuses such a key")
            for item in volume["secret"].get("items", []):
                if item["key"] not in secret_keys:
                    problem(where, f"secret item {item['key']} is not in the example Secret")
                key_files.add(os.path.join(mounts[volume["name"]]["mountPath"], item["path"]))
    config_path = option_value(arguments, "--config")
    if config_path:
        _, configmap = resources[("ConfigMap", "push-worker")]
        mount = next((m for m in mounts.values() if m["mountPath"] == config_path), None)
        if not mount or mount.get("subPath") not in configmap["data"]:
            problem(where, f"--config {config_path} is not mounted from the ConfigMap")
        else:
            config = json.loads(configmap["data"][mount["subPath"]])
            for name, credential in config["credentials"].items():
                if credential["key_path"] not in key_files:
                    problem(where, f"credential {name}: key_path {credential['key_path']} is not a mounted secret file ({sorted(key_files)})")
    check_secret_volume_layout(where, pod, mounts)
    print(f"   {where}: ports, probes, grace, secrets, config and scrape annotations agree")

    job_file, job = resources[("Job", "push-worker-migrate")]
    job_arguments = job["spec"]["template"]["spec"]["containers"][0]["args"]
    check_arguments(f"deploy/kubernetes/{job_file}", job_arguments)
    if job_arguments[0] != "migrate" or option_value(arguments, "--migrations") != "check":
        problem(where, "the Job migrates and the workers only check (--migrations=check)")
    _, pdb = resources[("PodDisruptionBudget", "push-worker")]
    labels = spec["template"]["metadata"]["labels"]
    if not all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items()):
        problem("deploy/kubernetes/pdb.yaml", "the selector does not match the Deployment's pods")


# --- prometheus --------------------------------------------------------------------------------

def check_secret_volume_layout(where, pod, mounts):
    """Lays each key out as the kubelet does (key -> ..data/key -> ..<timestamp>/key, mode defaultMode,
    plus group read when the pod has an fsGroup, owned by root and that group) and asks the real binary to
    load it with `push-worker check-keys`. Here the pod's fsGroup is played by this process's own group."""
    import shutil
    import tempfile
    fs_group = pod.get("securityContext", {}).get("fsGroup")
    for volume in pod.get("volumes", []):
        if "secret" not in volume:
            continue
        mode = volume["secret"].get("defaultMode", 0o644)
        if fs_group is not None:
            mode |= 0o440
        for item in volume["secret"].get("items", []):
            name = os.path.basename(item["path"])
            if not name.endswith(".p8"):
                continue
            key_id = name[len("AuthKey_"):-len(".p8")] if name.startswith("AuthKey_") else "ABC123DEFG"
            root = tempfile.mkdtemp(prefix="k8s-secret-")
            try:
                timestamped = os.path.join(root, "..2026_11_23_08_00_00.000000001")
                os.makedirs(timestamped)
                target = os.path.join(timestamped, item["path"])
                subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                                "-out", target], check=True, capture_output=True)
                os.chown(target, 0, os.getegid())
                os.chmod(target, mode)
                os.symlink(os.path.basename(timestamped), os.path.join(root, "..data"))
                key = os.path.join(root, item["path"])
                os.symlink(os.path.join("..data", item["path"]), key)
                result = subprocess.run([BIN, "check-keys", "--apns-key-path", key, "--apns-key-id", key_id,
                                         "--apns-team-id", "TEAM123456"], capture_output=True, text=True)
                if result.returncode != 0:
                    problem(where, f"secret volume {volume['name']}: {item['path']} laid out as the kubelet does "
                                   f"(a symlink into ..data, mode {oct(mode)}) does not load: {result.stderr.strip()}")
                else:
                    print(f"   {where}: {item['path']} loads through the Secret volume's ..data symlink (mode {oct(mode)})")
            finally:
                shutil.rmtree(root, ignore_errors=True)


def github_anchor(heading):
    anchor = heading.strip().lower()
    anchor = re.sub(r"[^\w\- ]", "", anchor)
    return anchor.replace(" ", "-")


def check_prometheus(defaults):
    artifact = "deploy/prometheus/alerts.yaml"
    rules = [r for g in yaml.safe_load(read(artifact))["groups"] for r in g["rules"]]
    metrics_source = read("Sources/PushWorker/WorkerMetrics.swift")
    exported = set(re.findall(r'label: "(push_[a-z_]+)"', metrics_source))
    tested = read("deploy/prometheus/alerts.test.yaml")
    runbook = read("docs/runbook.md")
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", runbook, flags=re.M)}
    for rule in rules:
        name = rule["alert"]
        for metric in set(re.findall(r"\bpush_[a-z_]+", rule["expr"])):
            if metric not in exported:
                problem(artifact, f"{name} uses {metric}, which the worker does not export ({sorted(exported)})")
        if f"alertname: {name}" not in tested:
            problem(artifact, f"{name} has no case in alerts.test.yaml")
        url = rule["annotations"].get("runbook_url", "")
        anchor = url.split("#")[-1]
        if not url.startswith("docs/runbook.md#") or anchor not in anchors:
            problem(artifact, f"{name}: runbook_url {url!r} is not docs/runbook.md#<a heading of docs/runbook.md>")
    print(f"   {artifact}: {len(rules)} alerts use exported metrics, each tested and with a runbook entry")


def main():
    if not BIN or not os.access(BIN, os.X_OK):
        raise SystemExit("check_deploy.py: set PUSH_WORKER_BIN to the built push-worker")
    defaults = run_help_defaults()
    sections = {"systemd": check_systemd, "docker": check_docker, "kubernetes": check_kubernetes, "prometheus": check_prometheus}
    for name in sys.argv[1:] or sections:
        print(f"== {name}: cross-checks against the build and the CLI")
        sections[name](defaults)
    if problems:
        print("\n".join(["", "deploy/ problems:"] + [f"  - {p}" for p in problems]), file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
