"""The KubernetesExecutor deployment (deploy/kubernetes/): its pod template and network policy are
valid objects of the Kubernetes API, by the `kubernetes` client's own models (every field known,
every required one set), and the cncf.kubernetes provider builds a task's pod from the template as
the executor does; every Airflow option of executor.env exists. No cluster runs them here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = PROJECT_ROOT / "deploy" / "kubernetes"
_LIST, _DICT = re.compile(r"list\[(.+)\]"), re.compile(r"dict[(\[]([^,]*), (.*)[)\]]")  # dict(k, v) or dict[k, v]
_PRIMITIVES = {"str": str, "int": int, "float": (int, float), "bool": bool, "datetime": str, "date": str}


def schema_errors(value, kind: str, where: str = "") -> list[str]:
    """Where ``value`` departs from the client's model ``kind`` (e.g. "V1Pod"): unknown fields and
    wrong types, with their path. The client's own deserializer ignores unknown fields: a typo
    would pass it silently, hence this walk over its ``openapi_types`` and ``attribute_map``."""
    if kind == "object":  # IntOrString, Quantity and other free-form fields
        return []
    if m := _LIST.fullmatch(kind):
        if not isinstance(value, list):
            return [f"{where}: a list expected, got {type(value).__name__}"]
        return [e for i, v in enumerate(value) for e in schema_errors(v, m[1], f"{where}[{i}]")]
    if m := _DICT.fullmatch(kind):
        if not isinstance(value, dict):
            return [f"{where}: a mapping expected, got {type(value).__name__}"]
        return [e for k, v in value.items() for e in schema_errors(v, m[2], f"{where}.{k}")]
    if kind in _PRIMITIVES:
        ok = isinstance(value, _PRIMITIVES[kind]) and not (kind != "bool" and isinstance(value, bool))
        return [] if ok else [f"{where}: {kind} expected, got {value!r}"]
    model = getattr(k8s, kind)
    if not isinstance(value, dict):
        return [f"{where}: a {kind} mapping expected, got {type(value).__name__}"]
    fields = {json_key: attr for attr, json_key in model.attribute_map.items()}
    errors = [f"{where}.{key}: no such field in {kind}" for key in value if key not in fields]
    for key, v in value.items():
        if key in fields and v is not None:
            errors += schema_errors(v, model.openapi_types[fields[key]], f"{where}.{key}")
    return errors


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def executor_settings() -> dict[str, str]:
    lines = (DEPLOY / "executor.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def test_the_pod_template_is_a_pod_by_the_kubernetes_api_models():
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

    raw = load("pod_template.yaml")
    assert schema_errors(raw, "V1Pod") == []
    pod = PodGenerator.deserialize_model_file(str(DEPLOY / "pod_template.yaml"))  # required fields checked
    base = pod.spec.containers[0]
    assert base.name == "base" and base.resources.limits["nvidia.com/gpu"] == "1"
    assert pod.spec.security_context.run_as_non_root and base.security_context.allow_privilege_escalation is False
    assert base.security_context.capabilities.drop == ["ALL"]
    profile = pod.spec.security_context.seccomp_profile
    assert profile.type == "Localhost" and profile.localhost_profile.endswith("/cells.json")
    assert (PROJECT_ROOT / "docker" / "seccomp" / "cells.json").is_file()  # the profile the nodes get
    mounts = {m.mount_path: m.name for m in base.volume_mounts}
    assert mounts["/opt/runs"] == "runs" and {v.name for v in pod.spec.volumes} >= set(mounts.values())


def test_the_check_is_not_blind():
    raw = load("pod_template.yaml")
    raw["spec"]["containers"][0]["resource"] = raw["spec"]["containers"][0].pop("resources")  # a typo
    raw["spec"]["securityContext"]["runAsUser"] = "50000"
    assert sorted(schema_errors(raw, "V1Pod")) == [
        ".spec.containers[0].resource: no such field in V1Container",
        ".spec.securityContext.runAsUser: int expected, got '50000'",
    ]
    with pytest.raises(ValueError, match="name"):  # the client's models refuse a missing required field
        from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

        del raw["spec"]["containers"][0]["name"]
        PodGenerator.deserialize_model_dict(raw)


def test_the_executor_builds_a_tasks_pod_from_the_template():
    """The provider's PodGenerator merges the template with what the executor adds for a task try
    (its command, labels, the configured image): the GPU, mounts and confinement survive."""
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

    settings = executor_settings()
    image = f"{settings['AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_REPOSITORY']}:" \
            f"{settings['AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_TAG']}"
    template = PodGenerator.deserialize_model_file(str(DEPLOY / "pod_template.yaml"))
    args = ["airflow", "tasks", "run", "imdb_benchmark", "train_cell", "manual__1", "--local"]
    pod = PodGenerator.construct_pod(
        dag_id="imdb_benchmark", task_id="train_cell", pod_id="imdb-benchmark-train-cell", try_number=1,
        kube_image=image, date=None, args=args, pod_override_object=None, base_worker_pod=template,
        namespace=settings["AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE"], scheduler_job_id="1", run_id="manual__1")
    as_sent = k8s.ApiClient().sanitize_for_serialization(pod)  # the JSON the API server would get
    assert schema_errors(as_sent, "V1Pod") == []
    base = as_sent["spec"]["containers"][0]
    assert base["name"] == "base" and base["args"] == args
    assert base["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert base["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert as_sent["spec"]["securityContext"]["seccompProfile"]["type"] == "Localhost"
    assert as_sent["metadata"]["namespace"] == "imdb-benchmark"
    assert as_sent["metadata"]["labels"]["dag_id"] == "imdb_benchmark"


def test_every_airflow_option_of_the_executor_settings_exists():
    from airflow.configuration import conf
    from airflow.providers.cncf.kubernetes.get_provider_info import get_provider_info

    provider = {(section, option) for section, spec in get_provider_info()["config"].items()
                for option in spec["options"]}
    settings = executor_settings()
    for key in settings:
        if key.startswith("AIRFLOW__"):
            section, option = key.removeprefix("AIRFLOW__").lower().split("__", 1)
            assert (section, option) in provider or conf.has_option(section, option), f"{key}: no such option"
    assert settings["AIRFLOW__CORE__EXECUTOR"] == "KubernetesExecutor"
    # the template's path in the image: the Dockerfile's WORKDIR and its copy of deploy/
    path = Path(settings["AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE"])
    dockerfile = (PROJECT_ROOT / "Dockerfile").read_text()
    assert "WORKDIR /opt/project" in dockerfile and "COPY deploy deploy" in dockerfile
    assert (PROJECT_ROOT / path.relative_to("/opt/project")).is_file()


def test_the_network_policy_that_makes_the_namespace_trusted_is_valid():
    raw = load("network_policy.yaml")
    assert schema_errors(raw, "V1NetworkPolicy") == []
    policy = k8s.ApiClient()._ApiClient__deserialize_model(raw, k8s.V1NetworkPolicy)
    assert policy.metadata.namespace == executor_settings()["AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE"]
    assert set(policy.spec.policy_types) == {"Ingress", "Egress"}
