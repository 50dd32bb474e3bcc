"""docker-compose.yaml and its override files: schema, structure and hardening.

The files are rendered here the way Compose renders them (YAML merge keys, then ``${VAR}``
interpolation with ``:-`` / ``-`` defaults, ``:?`` / ``?`` required variables and ``$$``), so
these checks need no Docker. Where the Compose plugin is installed (scripts/compose_e2e.sh
installs it) the last tests ask `docker compose config` itself. The stack really running is
tests/compose/test_stack.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MAIN, TEST, GPU = "docker-compose.yaml", "docker-compose.test.yaml", "docker-compose.gpu.yaml"
PROJECT_SERVICES = ("mlflow", "mlflow-init", "spark-master", "spark-worker", "ray-head", "ray-worker", "airflow-init",
                    "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                    "airflow-worker")
SECRETS = ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "AIRFLOW_ADMIN_PASSWORD", "AIRFLOW_JWT_SECRET",
           "AIRFLOW_SECRET_KEY", "AIRFLOW_FERNET_KEY", "MLFLOW_ADMIN_PASSWORD", "MLFLOW_WORKER_PASSWORD",
           "MLFLOW_SECRET_KEY", "SPARK_AUTH_SECRET", "RAY_AUTH_TOKEN")
# secrets that reach containers as files (Compose's top-level secrets), never as a variable
FILE_SECRETS = {"RAY_AUTH_TOKEN": "ray_auth_token"}
CODE_MOUNTS = {"./dags:/opt/project/dags:ro", "./plugins:/opt/project/plugins:ro",
               "./pipelines:/opt/project/pipelines:ro"}
_VAR = re.compile(r"\$\$|\$\{([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_EXPR = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?$", re.S)


class MissingVariable(ValueError):
    def __init__(self, name: str, message: str):
        super().__init__(f"required variable {name} is missing a value: {message}")
        self.name = name


def _interpolate_str(text: str, env: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        expr = m.group(1) if m.group(1) is not None else m.group(2)
        name, op, arg = _EXPR.match(expr).groups()
        value, unset = env.get(name), name not in env
        empty = unset or value == ""
        if op == ":-":
            return arg if empty else value
        if op == "-":
            return arg if unset else value
        if op == ":?":
            if empty:
                raise MissingVariable(name, arg)
            return value
        if op == "?":
            if unset:
                raise MissingVariable(name, arg)
            return value
        if op == ":+":
            return "" if empty else arg
        if op == "+":
            return "" if unset else arg
        return value or ""

    return _VAR.sub(sub, text)


def _interpolate(node, env: dict[str, str]):
    if isinstance(node, str):
        return _interpolate_str(node, env)
    if isinstance(node, dict):
        return {k: _interpolate(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, env) for v in node]
    return node


def _raw(name: str = MAIN) -> dict:
    return yaml.safe_load((ROOT / name).read_text())


def render(env: dict[str, str] | None = None, name: str = MAIN) -> dict:
    """One compose file with merge keys resolved and variables interpolated from ``env``. Compose
    interpolates the extension fields too (a required variable there refuses the file), then they go."""
    raw = _raw(name)
    _interpolate({k: v for k, v in raw.items() if k.startswith("x-")}, dict(env or {}))
    doc = {k: v for k, v in raw.items() if not k.startswith("x-")}
    return _interpolate(doc, dict(env or {}))


def secrets_env(**extra: str) -> dict[str, str]:
    env = dict(line.split("=", 1) for line in subprocess.run(
        ["bash", str(ROOT / "docker" / "make_env.sh"), "-"], capture_output=True, text=True, check=True,
    ).stdout.splitlines() if line and not line.startswith("#"))
    env.update(extra)
    return env


def _ports(service: dict) -> list[tuple[str, str, str]]:
    """Short-syntax ports -> (host_ip, published, target)."""
    out = []
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        assert len(parts) == 3, f"port {spec!r} must name its host address (host_ip:published:target)"
        out.append(tuple(parts))
    return out


# --- schema and structure -----------------------------------------------------------------

@pytest.mark.parametrize("name", [MAIN, TEST, GPU])
def test_compose_files_match_the_compose_spec_schema(name):
    schema = json.loads((ROOT / "tests" / "fixtures" / "compose_spec.json").read_text())
    errors = list(jsonschema.Draft201909Validator(schema).iter_errors(_raw(name)))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_compose_has_the_production_stack():
    services = render(secrets_env())["services"]
    for name in ("postgres", "redis", *PROJECT_SERVICES):
        assert name in services, f"service {name} missing"
    worker = services["airflow-worker"]
    assert worker["environment"]["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert worker["environment"]["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://")
    assert worker["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    mlflow = services["mlflow"]
    assert "--artifacts-destination" in mlflow["command"]
    assert mlflow["environment"]["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://")
    assert CODE_MOUNTS <= set(worker["volumes"]), "the DAG and pipeline code must be mounted"
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]
    assert worker["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"


# --- hardening: secrets -------------------------------------------------------------------

def test_up_refuses_to_start_without_each_secret():
    required = set()
    full = secrets_env()
    for name in SECRETS:
        env = {k: v for k, v in full.items() if k != name}
        with pytest.raises(MissingVariable) as err:
            render(env)
        required.add(err.value.name)
        assert err.value.name == name, f"without {name}, rendering stopped at {err.value.name} instead"
    assert "make_env.sh" in str(MissingVariable("X", "set X (bash docker/make_env.sh)"))
    assert required == set(SECRETS)
    render(full)  # and with every secret it renders


def test_no_default_or_public_secret_values():
    for name in (MAIN, TEST, GPU):
        text = (ROOT / name).read_text()
        assert "change-me" not in text, name
        assert "airflow:airflow@" not in text, f"{name}: a fixed database password"
        for secret in SECRETS:
            assert not re.search(r"\$\{" + secret + r":?-", text), f"{name}: {secret} has a default"
    env = secrets_env()
    rendered = render(env)
    for secret in SECRETS:
        if secret in FILE_SECRETS:  # a file in /run/secrets: its value is in no service's definition
            assert env[secret] not in json.dumps(rendered["services"]), f"{secret} reaches a service as a value"
            assert rendered["secrets"][FILE_SECRETS[secret]] == {"environment": secret}
        else:
            assert env[secret] in json.dumps(rendered), f"{secret} is not used by the stack"


def test_make_env_generates_fresh_url_safe_secrets():
    one, two = secrets_env(), secrets_env()
    assert set(one) == set(SECRETS)
    for name in SECRETS:
        assert len(one[name]) >= 32 and one[name] != two[name], name
        assert re.fullmatch(r"[A-Za-z0-9_=-]+", one[name]), f"{name} must be URL-safe (used inside URLs)"


# --- hardening: network exposure ----------------------------------------------------------

def test_every_published_port_binds_loopback_by_default():
    published = {}
    for name, service in render(secrets_env())["services"].items():
        for host_ip, port, target in _ports(service):
            assert host_ip == "127.0.0.1", f"{name} publishes {port} on {host_ip}"
            published[target] = name
    assert published == {"8080": "airflow-apiserver", "5000": "mlflow", "7077": "spark-master",
                         "8081": "spark-master", "10001": "ray-head"}
    for name in ("postgres", "redis"):
        assert not render(secrets_env())["services"][name].get("ports"), f"{name} must not be published"


def test_bind_address_opts_in_to_other_interfaces_except_the_spark_ui():
    services = render(secrets_env(BIND_ADDRESS="0.0.0.0"))["services"]
    ips = {target: host_ip for s in services.values() for host_ip, _, target in _ports(s)}
    assert ips == {"8080": "0.0.0.0", "5000": "0.0.0.0", "7077": "0.0.0.0", "8081": "127.0.0.1", "10001": "0.0.0.0"}


# --- hardening: Spark, MLflow, users ------------------------------------------------------

def _run_entrypoint(tmp_path: Path, env: dict[str, str], *cmd: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SPARK_CONF_DIR": str(tmp_path / "spark-conf"),
            "AIRFLOW_HOME": str(tmp_path / "airflow")}
    return subprocess.run(["bash", str(ROOT / "docker" / "entrypoint.sh"), *cmd], env={**base, **env},
                          capture_output=True, text=True, check=True)


def test_spark_authentication_between_driver_master_and_workers(tmp_path):
    services = render(secrets_env(SPARK_AUTH_SECRET="s" * 64))["services"]
    for name in ("spark-master", "spark-worker", "airflow-worker"):  # the drivers run in the workers
        assert services[name]["environment"]["SPARK_AUTH_SECRET"] == "s" * 64, name
    # The image's entrypoint turns it into the spark-defaults.conf every Spark JVM reads.
    out = _run_entrypoint(tmp_path, {"SPARK_AUTH_SECRET": "s" * 64}, "sh", "-c", 'echo "$SPARK_LOCAL_IP"')
    conf = (tmp_path / "spark-conf" / "spark-defaults.conf")
    lines = conf.read_text().splitlines()
    assert "spark.authenticate true" in lines and f"spark.authenticate.secret {'s' * 64}" in lines
    assert "spark.network.crypto.enabled true" in lines
    assert "spark.master.rest.enabled false" in lines  # unauthenticated job submission on :6066
    assert oct(conf.stat().st_mode & 0o777) == "0o600"
    assert out.stdout.strip(), "SPARK_LOCAL_IP must default to the container's address"


def test_mlflow_requires_basic_auth_and_tasks_log_with_credentials(tmp_path):
    env = secrets_env()
    services = render(env)["services"]
    mlflow = services["mlflow"]
    assert "--app-name basic-auth" in mlflow["command"]
    assert "--enable-workspaces" in mlflow["command"]  # resource grants then withhold experiment creation
    assert mlflow["environment"]["MLFLOW_AUTH_ADMIN_PASSWORD"] == env["MLFLOW_ADMIN_PASSWORD"]
    assert mlflow["environment"]["MLFLOW_FLASK_SERVER_SECRET_KEY"] == env["MLFLOW_SECRET_KEY"]
    assert mlflow["environment"]["MLFLOW_AUTH_DATABASE_URI"].endswith("@postgres:5432/mlflow_auth")
    assert "mlflow_auth" in (ROOT / "docker" / "postgres-init.sql").read_text()
    _run_entrypoint(tmp_path, {"MLFLOW_AUTH_DATABASE_URI": "sqlite:///x.db"}, "true")
    ini = (tmp_path / "mlflow_basic_auth.ini").read_text()
    assert "database_uri = sqlite:///x.db" in ini and "authenticate_request_basic_auth" in ini
    assert "grant_default_workspace_access = false" in ini
    assert oct((tmp_path / "mlflow_basic_auth.ini").stat().st_mode & 0o777) == "0o600"


def test_workers_log_as_their_own_mlflow_user_never_the_admin():
    env = secrets_env()
    services = render(env)["services"]
    worker = services["airflow-worker"]["environment"]
    assert worker["MLFLOW_TRACKING_USERNAME"] == "benchmark-worker"
    assert worker["MLFLOW_TRACKING_PASSWORD"] == env["MLFLOW_WORKER_PASSWORD"]
    assert worker["BENCHMARK_MLFLOW_EXPERIMENT"] == "distributed-training-benchmark"
    # the admin's password reaches the server and its one-shot init step only
    holders = sorted(name for name, s in services.items() if env["MLFLOW_ADMIN_PASSWORD"] in json.dumps(s))
    assert holders == ["mlflow", "mlflow-init"]
    init = services["mlflow-init"]
    assert init["environment"]["MLFLOW_WORKER_PASSWORD"] == env["MLFLOW_WORKER_PASSWORD"]
    assert init["environment"]["BENCHMARK_MLFLOW_EXPERIMENT"] == worker["BENCHMARK_MLFLOW_EXPERIMENT"]
    assert init["depends_on"] == {"mlflow": {"condition": "service_healthy"}} and init["restart"] == "no"
    assert "mlflow-init" in init["command"][-1]
    assert services["airflow-worker"]["depends_on"]["mlflow-init"]["condition"] == "service_completed_successfully"
    assert "COPY docker/mlflow_init.py /usr/local/bin/mlflow-init" in (ROOT / "Dockerfile").read_text()


def test_ray_cells_submit_to_the_standing_ray_cluster_with_its_token_as_a_secret():
    """The stack's Ray: a head that trains nothing and a worker node; the Celery workers' Ray cells
    join it through Ray Client (a deployment field: a trigger cannot point them elsewhere), and
    the nodes and those drivers alone hold the token, as a file (Compose's secret), never a variable."""
    services = render(secrets_env())["services"]
    head, node, worker = services["ray-head"], services["ray-worker"], services["airflow-worker"]
    assert "--head" in head["command"] and "--num-cpus=0" in head["command"]
    assert "--ray-client-server-port=10001" in head["command"] and "--include-dashboard=false" in head["command"]
    assert "--address=ray-head:6379" in node["command"]
    assert node["depends_on"] == {"ray-head": {"condition": "service_healthy"}}
    assert worker["environment"]["BENCHMARK_RAY_ADDRESS"] == "ray://ray-head:10001"
    holders = sorted(n for n, s in services.items() if s.get("secrets"))
    assert holders == ["airflow-worker", "ray-head", "ray-worker"]
    for name in holders:
        secret, = services[name]["secrets"]
        assert secret["source"] == "ray_auth_token" and secret["mode"] == 0o444, name
        assert "uid" not in secret, name  # Docker would look the image's user up on the host: "getent unable to find"
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_auth_token"
        assert "RAY_AUTH_TOKEN" not in env, name


def test_the_workers_ray_address_is_the_ray_cells_cluster():
    """The Celery workers' variable is the deployment default of engines.ray.address (as the DAG reads it)."""
    from pipelines.config import load_config
    from pipelines.config.loading import site_defaults

    worker = render(secrets_env())["services"]["airflow-worker"]["environment"]
    assert load_config("smoke", site_defaults(worker)).engine("ray").address == "ray://ray-head:10001"


# --- hardening: secrets at rest -------------------------------------------------------------

def _bind_sources(service: dict) -> list[str]:
    """Host paths a service bind-mounts (short and long volume syntax), as written."""
    out = []
    for spec in service.get("volumes", []):
        if isinstance(spec, dict):
            if spec.get("type", "bind") == "bind":
                out.append(str(spec.get("source", "")))
            continue
        source = str(spec).split(":", 1)[0]
        if source.startswith((".", "/", "~", "$")):  # else a named volume
            out.append(source)
    return out


def _root_or_env(source: str) -> bool:
    """The project root (or a folder above it), or an env file."""
    resolved = (ROOT / source).resolve()
    return resolved == ROOT or resolved in ROOT.parents or resolved.name.endswith(".env")


@pytest.mark.parametrize("name", [MAIN, TEST, GPU])
def test_no_service_mounts_the_project_root_or_env(name):
    services = render(secrets_env(SHARED_DATA="/srv/data"), name).get("services", {})
    for service_name, service in services.items():
        for source in _bind_sources(service):
            assert not _root_or_env(source), f"{name}: {service_name} bind-mounts {source}"
    if name == MAIN:
        mounts = {n: set(s.get("volumes", [])) for n, s in services.items()}
        for airflow in ("airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                        "airflow-triggerer", "airflow-worker"):
            assert CODE_MOUNTS <= mounts[airflow], airflow
        assert mounts["spark-master"] == set() and mounts["mlflow-init"] == set()
        assert mounts["mlflow"] == {"mlflow-artifacts:/mlflow/artifacts"}
        for node in ("spark-worker", "ray-head", "ray-worker"):  # they import pipelines and write the run folder
            assert mounts[node] == {"./pipelines:/opt/project/pipelines:ro", "runs:/opt/runs",
                                    "hf-cache:/opt/hf-cache"}, node


def test_env_file_is_ignored_by_git_and_kept_out_of_build_contexts():
    for path in (".env", "docker/.env.local"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False).returncode == 0, path
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".env", "**/.env", ".git", ".venv", "runs", "tests"} <= ignored
    kept = ("docker", "pipelines", "dags", "plugins", "scripts", "bench", "deploy", "requirements.txt")
    assert not ignored & set(kept), "the Dockerfile COPYs these"



def test_airflow_login_password_comes_from_the_environment(tmp_path):
    services = render(secrets_env(AIRFLOW_ADMIN_PASSWORD="p" * 32))["services"]
    assert services["airflow-apiserver"]["environment"]["AIRFLOW_ADMIN_PASSWORD"] == "p" * 32
    assert "AIRFLOW_ADMIN_PASSWORD" not in services["airflow-worker"]["environment"]
    _run_entrypoint(tmp_path, {"AIRFLOW_ADMIN_PASSWORD": "p" * 32}, "true")
    written = tmp_path / "airflow" / "simple_auth_manager_passwords.json"
    assert json.loads(written.read_text()) == {"admin": "p" * 32}
    assert oct(written.stat().st_mode & 0o777) == "0o600"


def _last_user(dockerfile: Path) -> str:
    users = [line.split()[1] for line in dockerfile.read_text().splitlines() if line.startswith("USER ")]
    assert users, f"{dockerfile} sets no USER"
    return users[-1]


def test_nothing_runs_as_root():
    for dockerfile in (ROOT / "Dockerfile", ROOT / "docker" / "postgres" / "Dockerfile",
                       ROOT / "docker" / "redis" / "Dockerfile"):
        assert _last_user(dockerfile) not in ("root", "0"), dockerfile
    for name in (MAIN, TEST, GPU):
        services = render(secrets_env(SHARED_DATA="/data"), name).get("services", {})
        for service_name, service in services.items():
            user = str(service.get("user", ""))
            assert user.split(":")[0] not in ("root", "0"), f"{name}: {service_name} runs as {user}"
    services = render(secrets_env())["services"]
    assert services["postgres"]["user"] == "postgres" and services["redis"]["user"] == "redis"


SECCOMP = ROOT / "docker" / "seccomp"
NO_NEW_PRIVILEGES = "no-new-privileges:true"
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
# every other namespace flag, and CLONE_FS / CLONE_FILES (unshare), CLONE_NEWTIME
OTHER_NAMESPACES = {"CLONE_NEWNS": 0x20000, "CLONE_NEWPID": 0x20000000, "CLONE_NEWIPC": 0x08000000,
                    "CLONE_NEWUTS": 0x04000000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWTIME": 0x80}


def _make_profile():
    """docker/seccomp/make_profile.py (not a package: loaded from its path)."""
    spec = importlib.util.spec_from_file_location("make_profile", SECCOMP / "make_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cells_profile() -> dict:
    return json.loads((SECCOMP / "cells.json").read_text())


def _applies_without_capabilities(rule: dict) -> bool:
    """Whether dockerd keeps ``rule`` for an amd64 container that holds no capability (cap_drop: ALL)."""
    includes, excludes = rule.get("includes", {}), rule.get("excludes", {})
    if includes.get("caps") or "amd64" in excludes.get("arches", []):
        return False
    return not includes.get("arches") or "amd64" in includes["arches"]


def _holds(cond: dict, args: tuple[int, ...]) -> bool:
    """One of a rule's argument conditions (the operators the profiles use), for the call ``args``."""
    value = args[cond["index"]] if cond["index"] < len(args) else 0
    if cond["op"] == "SCMP_CMP_MASKED_EQ":  # value = the mask, valueTwo = what the masked bits must be
        return value & cond["value"] == cond.get("valueTwo", 0)
    if cond["op"] == "SCMP_CMP_EQ":
        return value == cond["value"]
    assert cond["op"] == "SCMP_CMP_NE", cond
    return value != cond["value"]


def _action(profile: dict, name: str, *args: int) -> tuple[str, int]:
    """(action, errno) the profile takes on ``name(*args)`` in such a container: the first rule that
    applies and whose conditions all hold, else the default."""
    for rule in profile["syscalls"]:
        if (name in rule["names"] and _applies_without_capabilities(rule)
                and all(_holds(cond, args) for cond in rule.get("args") or [])):
            return rule["action"], rule.get("errnoRet", 0)
    return profile["defaultAction"], profile.get("defaultErrnoRet", 1)


def _allowed(profile: dict, name: str, *args: int) -> bool:
    return _action(profile, name, *args)[0] == "SCMP_ACT_ALLOW"


def _ever_allowed(profile: dict) -> set[str]:
    """The calls such a container may make with some arguments."""
    return {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW"
            and _applies_without_capabilities(rule) for n in rule["names"]}


def test_workers_seccomp_profile_is_dockers_default_plus_unshare_and_setns():
    """cells.json is what make_profile.py derives from Docker's default profile (the pinned copy in
    docker/seccomp/docker-default.json): its rules, unchanged and in order, then the two additions."""
    make = _make_profile()
    base = make.load_base()  # refuses a copy whose sha256 is not the pinned one
    assert (SECCOMP / "cells.json").read_text() == make.render(make.derive(base)), \
        "cells.json is stale: python docker/seccomp/make_profile.py"
    profile = _cells_profile()
    assert {k: v for k, v in profile.items() if k not in ("comment", "syscalls")} == \
        {k: v for k, v in base.items() if k != "syscalls"}
    kept, added = profile["syscalls"][:len(base["syscalls"])], profile["syscalls"][len(base["syscalls"]):]
    assert kept == base["syscalls"]
    assert [rule["names"] for rule in added] == [["unshare"], ["setns"]]
    for rule in added:
        assert rule["action"] == "SCMP_ACT_ALLOW" and rule["args"] and rule["comment"]
        assert rule["excludes"] == {"caps": ["CAP_SYS_ADMIN"]}  # with it, the base allows them already
    # every call a worker may make is one Docker's default allows it, or one of the documented additions
    assert _ever_allowed(profile) == _ever_allowed(base) | {"unshare", "setns"}
    assert not {"unshare", "setns"} & _ever_allowed(base)
    # Docker's default itself refuses both to a container without CAP_SYS_ADMIN (why the profile exists)
    assert not _allowed(base, "unshare", CLONE_NEWUSER | CLONE_NEWNET)
    assert not _allowed(base, "setns", 3, CLONE_NEWNET)


def test_workers_seccomp_profile_refuses_by_default_and_never_io_uring():
    profile = _cells_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and profile["defaultErrnoRet"] == 1  # EPERM
    for rule in profile["syscalls"]:  # under no condition, capability or architecture
        if rule["action"] == "SCMP_ACT_ALLOW":
            assert not [n for n in rule["names"] if n.startswith("io_uring")], rule
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        assert _action(profile, name, 1, 0) == ("SCMP_ACT_ERRNO", 1)
    # what Docker's default keeps from a container without capability, the workers' profile too
    for name in ("mount", "umount2", "pivot_root", "init_module", "finit_module", "kexec_load", "bpf",
                 "perf_event_open", "userfaultfd", "open_by_handle_at", "reboot", "swapon", "fsopen",
                 "move_mount", "open_tree", "lookup_dcookie", "quotactl", "acct", "settimeofday",
                 "clock_settime", "iopl", "ioperm", "kcmp", "pidfd_getfd", "chroot", "sethostname", "syslog"):
        assert not _allowed(profile, name, 0, 0, 0), name
    arches = {a["architecture"]: set(a["subArchitectures"] or ()) for a in profile["archMap"]}
    assert arches["SCMP_ARCH_X86_64"] == {"SCMP_ARCH_X86", "SCMP_ARCH_X32"}  # no 32-bit way around the list


def test_cells_may_unshare_and_setns_user_and_network_namespaces_only():
    """pipelines/cluster/netns.py: ``unshare --user --map-root-user --net`` (unshare(CLONE_NEWUSER|
    CLONE_NEWNET)) and ``nsenter --net --user`` (setns with either, or both on a pidfd); no other
    namespace, and clone/clone3 as Docker has them (no namespace by clone; clone3 ENOSYS for glibc)."""
    profile = _cells_profile()
    for flags in (CLONE_NEWUSER | CLONE_NEWNET, CLONE_NEWUSER, CLONE_NEWNET):
        assert _allowed(profile, "unshare", flags), hex(flags)
        assert _allowed(profile, "setns", 3, flags), hex(flags)
    assert _allowed(profile, "setns", 3, 0)  # "any type" (os.setns's default): see make_profile.py
    for name, flag in {**OTHER_NAMESPACES, "CLONE_FS": 0x200, "CLONE_FILES": 0x400}.items():
        assert _action(profile, "unshare", CLONE_NEWUSER | CLONE_NEWNET | flag) == ("SCMP_ACT_ERRNO", 1), name
        assert _action(profile, "unshare", flag) == ("SCMP_ACT_ERRNO", 1), name
        if name in OTHER_NAMESPACES:
            assert _action(profile, "setns", 3, flag) == ("SCMP_ACT_ERRNO", 1), name
            assert not _allowed(profile, "clone", CLONE_NEWUSER | flag), name
    assert _allowed(profile, "clone", 0x3D0F00)  # a thread: CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_THREAD|...
    assert not _allowed(profile, "clone", CLONE_NEWUSER | CLONE_NEWNET | 17)  # namespaces only by unshare
    assert _action(profile, "clone3", 0, 88) == ("SCMP_ACT_ERRNO", 38)  # ENOSYS: glibc falls back to clone


def test_celery_workers_run_under_the_cells_profile_and_keep_no_capability():
    worker = render(secrets_env())["services"]["airflow-worker"]
    assert worker["security_opt"] == [NO_NEW_PRIVILEGES, "seccomp=./docker/seccomp/cells.json"]
    assert worker["cap_drop"] == ["ALL"]
    for name in (TEST, GPU):  # the overrides keep it
        overrides = render(secrets_env(SHARED_DATA="/data"), name)["services"]
        assert "security_opt" not in overrides.get("airflow-worker", {})


def test_every_service_sets_no_new_privileges_and_nothing_needs_a_setuid_binary():
    services = render(secrets_env())["services"]
    for name, service in services.items():
        assert NO_NEW_PRIVILEGES in service.get("security_opt", []), name
    for name in (TEST, GPU):  # an override naming security_opt would have to keep it: none does
        for service_name, service in render(secrets_env(SHARED_DATA="/data"), name)["services"].items():
            assert "security_opt" not in service, f"{name}: {service_name}"
    # what a service runs on its way to its command: no setuid helper (no-new-privileges makes them fail)
    setuid_helpers = re.compile(r"\b(sudo|su|gosu|su-exec|newuidmap|newgidmap|ping|chsh|passwd|mount)\b(?!=)")
    for path in (ROOT / "Dockerfile", *sorted((ROOT / "docker").rglob("*.sh")),
                 ROOT / "docker" / "postgres" / "Dockerfile", ROOT / "docker" / "redis" / "Dockerfile",
                 ROOT / "docker" / "mlflow_init.py"):
        code = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        found = [line for line in code if setuid_helpers.search(line)]
        assert not found, f"{path.relative_to(ROOT)}: {found}"
    for service_name, service in services.items():
        command = service.get("command", "")
        assert not setuid_helpers.search(" ".join(command) if isinstance(command, list) else command), service_name


# --- override files -----------------------------------------------------------------------

def test_test_override_swaps_images_and_data_only():
    services = render({"SHARED_DATA": "/data"}, TEST)["services"]
    assert set(services) == {"postgres", "redis", *PROJECT_SERVICES}
    for name, service in services.items():
        assert set(service) <= {"build", "image", "pull_policy", "volumes", "environment"}, name
        assert service["pull_policy"] == "never", name
        assert service["build"]["network"] == "host", name
        assert service["build"]["args"]["BASE_IMAGE"] == "imdb-bench/debian:bookworm", name
        for key in service.get("environment", {}):
            assert key.startswith(("BENCHMARK_", "HF_")), f"{name}: {key}"
    assert services["postgres"]["build"]["context"] == "docker/postgres"
    assert services["redis"]["build"]["context"] == "docker/redis"
    assert services["airflow-worker"]["environment"]["BENCHMARK_DATASET_SOURCE"] == "/data/imdb"
    assert "/data:/data:ro" in services["airflow-worker"]["volumes"]


def test_gpu_reservations_live_in_their_own_override():
    assert "deploy" not in render(secrets_env())["services"]["airflow-worker"]
    worker = render({}, GPU)["services"]["airflow-worker"]
    device = worker["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and device["count"] == "1"
    assert render({"TRAINING_GPUS": "4"}, GPU)["services"]["airflow-worker"]["deploy"]["resources"][
        "reservations"]["devices"][0]["count"] == "4"


def test_dockerfile_base_and_torch_index_are_build_arguments():
    text = (ROOT / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in text and "FROM ${BASE_IMAGE}" in text
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in text
    assert render(secrets_env(TORCH_INDEX="https://download.pytorch.org/whl/cu128"))["services"][
        "airflow-worker"]["build"]["args"]["TORCH_INDEX"].endswith("/cu128")


# --- the Compose plugin itself, where installed ---------------------------------------------

def _compose_plugin() -> list[str] | None:
    if not shutil.which("docker"):
        return None
    ok = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True).returncode == 0
    return ["docker", "compose", "--project-directory", str(ROOT)] if ok else None


@pytest.mark.skipif(_compose_plugin() is None, reason="the Docker Compose plugin is not installed")
def test_docker_compose_config_refuses_without_secrets_and_binds_loopback(tmp_path):
    compose = _compose_plugin()
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS and k != "BIND_ADDRESS"}
    empty = tmp_path / "empty.env"
    empty.write_text("")
    refused = subprocess.run([*compose, "--env-file", str(empty), "-f", str(ROOT / MAIN), "config"],
                             capture_output=True, text=True, env=clean)
    assert refused.returncode != 0 and "required variable" in refused.stderr, refused.stderr
    env_file = tmp_path / "stack.env"
    env_file.write_text("\n".join(f"{k}={v}" for k, v in secrets_env().items()) + "\n")
    for files in ([MAIN], [MAIN, TEST], [MAIN, GPU]):
        args = [a for f in files for a in ("-f", str(ROOT / f))]
        out = subprocess.run([*compose, "--env-file", str(env_file), *args, "config", "--format", "json"],
                             capture_output=True, text=True, check=True,
                             # a data folder that is above no checkout (a clone under /tmp is one README user's)
                             env={**clean, "SHARED_DATA": str(tmp_path / "shared-data")})
        services = json.loads(out.stdout)["services"]
        ports = [p for s in services.values() for p in s.get("ports", [])]
        assert ports and all(p["host_ip"] == "127.0.0.1" for p in ports), (files, ports)
        binds = {(n, v["source"]) for n, s in services.items() for v in s.get("volumes", []) if v["type"] == "bind"}
        assert binds and not [b for b in binds if _root_or_env(b[1])], (files, binds)  # absolute paths here
        # Compose's own merge of the overrides keeps every service's no-new-privileges (and the workers' profile)
        assert all(NO_NEW_PRIVILEGES in s.get("security_opt", []) for s in services.values()), files
        assert any(o.startswith("seccomp=") for o in services["airflow-worker"]["security_opt"]), files
