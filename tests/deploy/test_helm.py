"""The Helm chart (deploy/helm/brimful), rendered by Helm and checked without a cluster.

Rendering uses Helm's own engine: `helm-python-sdk` binds Helm's Go SDK (v4)
through its C ABI, the same template engine, values coalescing and lint as the
`helm` binary (which no package registry reachable here ships).  Every object
of every documented value set (the chart's defaults, each file in examples/,
and the switches users flip: gateway/sidecar, API keys, HPA on/off, each length
log mode) is validated against the Kubernetes JSON schemas in strict mode
(`kubernetes-validate`, unknown fields are errors), and the ServiceMonitor
against the Prometheus Operator's CRD model (cloudcoil's, round-tripped so an
unknown field is caught too).  Then what matters is asserted against brimful
itself: the probe paths answer on a running brimful, the ConfigMap passes
`brimful check-config` and loads to the ports and upstream the objects use,
labels and ports line up between Deployment, Service, ServiceMonitor, PDB and
HPA, the grace period outlasts preStop + the SIGTERM drain, and the tokenizer
init container's script fetches a real tokenizer from a local stand-in hub.

Not checked (no Docker engine here, so no kind/k3d cluster): that the pods
schedule, that the images pull, that a Prometheus scrapes the ServiceMonitor.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import http.server
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm  # hard imports: a skip would hide a broken chart
import httpx
import kubernetes_validate
import pytest
import yaml

from proxy.app import BrimfulApp
from proxy.cli import build_parser
from proxy.cli import main as cli_main
from proxy.config import load_config
from proxy.recording.metrics import Metrics
from tests.support.docs import block
from tests.support.fakevllm import FakeVLLM
from tokenizer_cache import find_tokenizer_dir, load_model_tokenizer

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "brimful"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
DEPLOYMENT = (ROOT / "docs" / "deployment.md").read_text()     # where the chart is documented
PERFORMANCE = (ROOT / "docs" / "performance.md").read_text()   # where brimful's RSS was measured
KUBE_VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version() + ".0")
RELEASE, NAMESPACE = "hr", "ai"


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((CHART / "examples" / name).read_text())


def merged(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for dotted, value in changes.items():
        node = out
        *parents, last = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return out


# Every documented value set: the defaults, the examples, and the switches on top of them.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{f"examples/{p.name}": yaml.safe_load(p.read_text()) for p in EXAMPLES},
    "gateway+hpa-cpu-only": {"autoscaling": {"enabled": True}},
    "autoscaling-example-hpa-off": merged(example("gateway-autoscaling.yaml"), autoscaling__enabled=False),
    "gateway+keys-in-chart-secret": {"apiKeys": {"keys": ["a", "b"]}},
    "gateway+length-log-volume-emptydir": {"lengthLog": {"mode": "volume"}},
    "gateway+length-log-off": {"lengthLog": {"mode": "off"}},
    "gateway+own-init-container": {"tokenizers": {"initContainers": [
        {"name": "copy", "image": "busybox:1.36", "command": ["cp", "-r", "/src/.", "/hf-cache/"],
         "volumeMounts": [{"name": "hf-cache", "mountPath": "/hf-cache"}]}]}},
    "gateway+more-upstreams": {"config": {"upstreams": [{"name": "big", "url": "http://vllm-big:8000"}],
                                          "models": {"Qwen/Qwen3-8B": {"max_model_len": 16384}}}},
    "sidecar-defaults": {"mode": "sidecar"},
    "sidecar+keys+volume-log": merged(example("sidecar.yaml"), apiKeys={"existingSecret": "keys"},
                                      lengthLog={"mode": "volume", "claim": "lengths"}),
    "sidecar+hpa": merged(example("sidecar.yaml"), autoscaling={"enabled": True}),
}


@functools.cache
def render(name: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(template path, object) for every object the value set renders."""
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(VALUE_SETS[name], name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [(path, obj) for obj in yaml.safe_load_all(text) if obj]
    return tuple(objects)


def objects(name: str, kind: str) -> list[dict[str, Any]]:
    return [obj for _, obj in render(name) if obj["kind"] == kind]


def one(name: str, kind: str) -> dict[str, Any]:
    found = objects(name, kind)
    assert len(found) == 1, f"{name}: {len(found)} {kind} objects"
    return found[0]


def container(name: str, which: str = "brimful") -> dict[str, Any]:
    pod = one(name, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == which)


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def brimful_toml(name: str) -> str:
    return one(name, "ConfigMap")["data"]["brimful.toml"]


ALL = pytest.mark.parametrize("name", list(VALUE_SETS))


# ----------------------------------------------------------------- schemas

def strictly_valid(obj: dict[str, Any]) -> list[str]:
    """Problems of one object against its schema (empty: valid); every kind must have one."""
    if obj["kind"] == "ServiceMonitor":
        # imported here: the operator's models take ~3 s to import, paid by every xdist worker at collection
        from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

        model = ServiceMonitor.model_validate(obj)
        dumped = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
        return [] if dumped == obj else [f"ServiceMonitor has fields the CRD does not know: {dumped} != {obj}"]
    problems = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            problems.append(f"{obj['kind']} {version}: {path}: {exc.message}")
    return problems


@ALL
def test_every_object_validates_against_the_kubernetes_schemas(name: str) -> None:
    rendered = render(name)
    assert {obj["kind"] for _, obj in rendered} >= {"ConfigMap", "Deployment", "Service"}
    for path, obj in rendered:
        assert strictly_valid(obj) == [], path
        assert obj["metadata"]["namespace"] == NAMESPACE


def test_the_validation_can_fail() -> None:
    """A misspelt field and a wrong type are caught, so the test above cannot pass vacuously."""
    deployment = copy.deepcopy(one("defaults", "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/ready"
    assert strictly_valid(deployment)
    service = copy.deepcopy(one("defaults", "Service"))
    service["spec"]["ports"][0]["port"] = "eighty"
    assert strictly_valid(service)
    monitor = copy.deepcopy(one("examples/gateway-autoscaling.yaml", "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["scrapeIntervall"] = "15s"
    assert strictly_valid(monitor)


@ALL
def test_helm_lint_finds_no_problem(name: str) -> None:
    report = helm.lint(str(CHART), VALUE_SETS[name], strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values, message", [
    ({"mode": "daemonset"}, "mode must be gateway or sidecar"),
    ({"lengthLog": {"mode": "file"}}, "lengthLog.mode must be stdout, volume or off"),
    ({"tokenizers": {"hfCacheClaim": "hf", "fetch": {"models": ["Qwen/Qwen3-8B"]}}}, "not both"),
    ({"upstream": {"url": ""}}, "upstream.url is required"),
])
def test_nonsense_values_fail_with_the_reason(values: dict[str, Any], message: str) -> None:
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError, match=re.escape(message)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


# ----------------------------------------------------------------- brimful's own view

@ALL
def test_the_configmap_passes_check_config_and_matches_the_objects(name: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    toml = tmp_path / "brimful.toml"
    toml.write_text(brimful_toml(name))
    # `brimful check-config` in this process (its own process costs ~0.2 s of start-up per value set)
    assert cli_main(["check-config", str(toml)]) == 0, capsys.readouterr().err
    brimful = container(name)
    variables = {k: v for k, v in env(brimful).items() if isinstance(v, str) and k.startswith("BRIMFUL_")}
    config = load_config(str(toml), env=variables)
    ports = {p["name"]: p["containerPort"] for p in brimful["ports"]}
    assert config.server.port == ports["http"] and config.server.host == "0.0.0.0"
    values = VALUE_SETS[name]
    if values.get("mode") == "sidecar":
        vllm = container(name, "vllm")
        assert config.upstream.url == f"http://127.0.0.1:{values.get('sidecar', {}).get('vllm', {}).get('port', 8000)}"
        assert any(a == f"--port={config.upstream.url.rsplit(':', 1)[1]}" for a in vllm["args"])
    else:
        assert config.upstream.url == values.get("upstream", {}).get("url", "http://vllm:8000")
    mode = values.get("lengthLog", {}).get("mode", "stdout")
    assert config.length_log.path == {"stdout": "-", "volume": "/var/lib/brimful/$(POD_NAME).jsonl",
                                      "off": None}[mode]
    # the brimful command line is one brimful accepts
    args = build_parser().parse_args(brimful["args"])
    assert args.command == "serve" and args.config == "/etc/brimful/brimful.toml"


@ALL
def test_probes_and_drain_timing(name: str, tmp_path: Path) -> None:
    brimful = container(name)
    assert brimful["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert brimful["livenessProbe"]["httpGet"] == {"path": "/live", "port": "http"}
    pod = one(name, "Deployment")["spec"]["template"]["spec"]
    shutdown = tomllib.loads(brimful_toml(name))["server"]["shutdown_timeout"]
    pre_stop = int(brimful["lifecycle"]["preStop"]["exec"]["command"][1])
    assert brimful["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert pre_stop > 0 and pre_stop + shutdown < pod["terminationGracePeriodSeconds"]
    if VALUE_SETS[name].get("mode") == "sidecar":
        # vLLM must outlive brimful's drain: it gets SIGTERM only after it, within the grace period.
        vllm = container(name, "vllm")
        vllm_sleep = int(vllm["lifecycle"]["preStop"]["exec"]["command"][1])
        assert pre_stop + shutdown <= vllm_sleep < pod["terminationGracePeriodSeconds"]
        assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"      # vLLM's own


@ALL
def test_labels_ports_and_selectors_line_up(name: str) -> None:
    deployment = one(name, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    service = one(name, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    pod = deployment["spec"]["template"]["spec"]
    container_ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert {p["targetPort"] for p in service_ports.values()} <= container_ports
    assert "http" in service_ports
    for monitor in objects(name, "ServiceMonitor"):
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= set(service_ports)
        assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    for pdb in objects(name, "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpas = objects(name, "HorizontalPodAutoscaler")
    autoscaling = VALUE_SETS[name].get("autoscaling", {}).get("enabled", False)
    assert len(hpas) == (1 if autoscaling else 0)
    assert ("replicas" in deployment["spec"]) == (not autoscaling)   # the HPA owns the count
    for hpa in hpas:
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                 "name": deployment["metadata"]["name"]}
    mounts = {m["name"] for c in pod["containers"] + pod.get("initContainers", []) for m in c.get("volumeMounts", [])}
    assert mounts <= {v["name"] for v in pod["volumes"]}


def test_the_in_flight_metric_the_hpa_scales_on_is_exported() -> None:
    hpa = one("examples/gateway-autoscaling.yaml", "HorizontalPodAutoscaler")
    pods_metric = next(m for m in hpa["spec"]["metrics"] if m["type"] == "Pods")
    name = pods_metric["pods"]["metric"]["name"]

    class Gate:
        in_flight, waiting = 3, 0

    metrics = Metrics()
    metrics.attach_gates(lambda: [("default", Gate())])
    assert f'{name}{{upstream="default"}} 3.0' in metrics.render()[0].decode()
    assert "averageValue" in pods_metric["pods"]["target"]
    assert name in DEPLOYMENT                                # the adapter rule is documented


def test_requests_are_sized_from_the_measured_rss() -> None:
    measured = int(re.search(r"brimful's RSS is (\d+) MiB with 3 tokenizers loaded", PERFORMANCE).group(1))
    assert f"{measured} MiB with three tokenizers loaded" in DEPLOYMENT
    for name in VALUE_SETS:
        resources = container(name)["resources"]
        assert int(resources["requests"]["memory"].removesuffix("Mi")) >= measured
        assert int(resources["limits"]["memory"].removesuffix("Mi")) >= 2 * measured
        assert "cpu" not in resources.get("limits", {})      # throttling would only add latency


def test_api_keys_come_from_a_secret_never_the_configmap() -> None:
    name = "gateway+keys-in-chart-secret"
    secret = one(name, "Secret")
    ref = env(container(name))["BRIMFUL_SERVER_API_KEYS"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "api-keys"}
    assert secret["stringData"]["api-keys"] == "a,b"
    assert "api_keys" not in brimful_toml(name) and "a,b" not in brimful_toml(name)
    # …and brimful reads that variable as its key list:
    assert load_config(None, env={"BRIMFUL_SERVER_API_KEYS": "a,b"}).server.api_keys == ["a", "b"]
    name = "examples/gateway-fetch.yaml"
    assert objects(name, "Secret") == []                     # an existing Secret is used, not made
    variables = env(container(name))
    assert variables["BRIMFUL_SERVER_API_KEYS"]["secretKeyRef"] == {"name": "brimful-keys", "key": "api-keys"}
    assert variables["BRIMFUL_UPSTREAM_API_KEY"]["secretKeyRef"]["name"] == "vllm-api-key"


def test_volume_length_log_is_one_file_per_pod() -> None:
    brimful = container("examples/gateway-fetch.yaml")
    names = [e["name"] for e in brimful["env"]]
    assert names.index("POD_NAME") < names.index("BRIMFUL_LENGTH_LOG_PATH")   # $(POD_NAME) expands
    assert env(brimful)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert {"name": "length-log", "mountPath": "/var/lib/brimful"} in brimful["volumeMounts"]
    pod = one("examples/gateway-fetch.yaml", "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "length-log")
    assert volume == {"name": "length-log", "persistentVolumeClaim": {"claimName": "brimful-lengths"}}


def test_sidecar_shares_the_model_volume_and_hf_home() -> None:
    name = "examples/sidecar.yaml"
    brimful, vllm = container(name), container(name, "vllm")
    assert env(brimful)["HF_HOME"] == env(vllm)["HF_HOME"] == "/models/hf"
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in brimful["volumeMounts"]
    assert {"name": "models", "mountPath": "/models"} in vllm["volumeMounts"]
    assert vllm["args"][0] == "Qwen/Qwen3-8B"
    service_ports = {p["name"] for p in one(name, "Service")["spec"]["ports"]}
    assert service_ports == {"http", "vllm-metrics"}
    assert {p["name"] for p in one("sidecar-defaults", "Service")["spec"]["ports"]} == {"http"}
    assert one("sidecar-defaults", "Deployment")["spec"]["replicas"] == 1
    assert one("defaults", "Deployment")["spec"]["replicas"] == 2


def test_chart_version_follows_brimful() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    assert container("defaults")["image"] == f"brimful:{project['version']}"


def test_every_example_is_documented() -> None:
    for path in EXAMPLES:
        assert f"examples/{path.name}" in DEPLOYMENT, path.name


# ----------------------------------------------------------------- docs/deployment.md's commands, rendered

def documented_block(start: str) -> list[str]:
    return block("\n" + start)


def test_the_documented_install_renders_what_the_docs_say() -> None:
    """`docker build/push`, `helm install … -f examples/gateway.yaml --set image.repository=…` and the
    kubectl lines after it, rendered as Helm would install them: the image pushed is the image run, and
    the names the docs use (Service URL, deploy/brimful, container, labels, volume path) are the chart's."""
    lines = " ".join(documented_block("docker build -t registry.example.com/brimful")).replace("\\ ", "")
    build, install, rollout = (part.strip() for part in re.split(r"(?= helm install | kubectl )", lines))
    image = re.search(r"docker build -t (\S+) \. && docker push (\S+)$", build)
    assert image and image.group(1) == image.group(2)
    args = install.split()
    assert args[:4] == ["helm", "install", "brimful", "deploy/helm/brimful"]
    release, namespace = args[2], args[args.index("--namespace") + 1]
    values = yaml.safe_load((ROOT / args[args.index("-f") + 1]).read_text())
    key, _, value = args[args.index("--set") + 1].partition("=")
    assert key == "image.repository"
    values = merged(values, image__repository=value)
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name=release, namespace=namespace, is_install=True)
    rendered = [o for path, text in manifests.items() if not path.endswith("NOTES.txt")
                for o in yaml.safe_load_all(text) if o]
    [deployment] = [o for o in rendered if o["kind"] == "Deployment"]
    [service] = [o for o in rendered if o["kind"] == "Service"]
    pod = deployment["spec"]["template"]
    [brimful] = [c for c in pod["spec"]["containers"] if c["name"] == "brimful"]
    assert brimful["image"] == image.group(1)                  # the pushed tag is the chart's appVersion
    assert rollout == f"kubectl -n {namespace} rollout status deploy/{deployment['metadata']['name']}"
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    assert f"http://{service['metadata']['name']}.{namespace}.svc:{port}/v1" in DEPLOYMENT
    logs = " ".join(documented_block("kubectl -n ai logs"))
    selector = re.search(r"-l (\S+)=(\S+) -c (\S+)", logs)
    assert pod["metadata"]["labels"][selector.group(1)] == selector.group(2) == release
    assert selector.group(3) == brimful["name"]
    [exec_line] = documented_block("kubectl -n ai exec deploy/brimful")
    assert exec_line.startswith(f"kubectl -n {namespace} exec deploy/{deployment['metadata']['name']} -c brimful ")
    volume = container("gateway+length-log-volume-emptydir")
    assert {"name": "length-log", "mountPath": "/var/lib/brimful"} in volume["volumeMounts"]
    assert "/var/lib/brimful/*.jsonl" in exec_line


def test_the_documented_adapter_rule_feeds_the_hpa() -> None:
    """The prometheus-adapter rule of docs/deployment.md serves, per pod, the metric the example HPA asks for."""
    rule = yaml.safe_load("\n".join(documented_block("rules:")))["rules"]["custom"][0]
    hpa = one("examples/gateway-autoscaling.yaml", "HorizontalPodAutoscaler")
    name = next(m for m in hpa["spec"]["metrics"] if m["type"] == "Pods")["pods"]["metric"]["name"]
    assert rule["name"]["as"] == name
    assert rule["seriesQuery"].startswith(name + "{")
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert "<<.Series>>" in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]


# ----------------------------------------------------------------- against a running brimful

def test_probe_and_metrics_paths_answer_on_a_real_brimful(qwen3_dir: Path, tmp_path: Path) -> None:
    """Every path the chart points a probe or a ServiceMonitor at, GET on brimful itself."""
    probes = {(c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"])
              for name in VALUE_SETS for c in [container(name)]}
    assert len(probes) == 1
    ready_path, live_path = probes.pop()
    metrics_paths = {e["path"] for name in VALUE_SETS for m in objects(name, "ServiceMonitor")
                     for e in m["spec"]["endpoints"] if e["port"] == "http"}
    toml = tmp_path / "brimful.toml"
    toml.write_text(brimful_toml("examples/gateway.yaml"))

    async def scenario() -> None:
        async with FakeVLLM(model="Qwen/Qwen3-8B", root=str(qwen3_dir)) as fake:
            fake.ready = False                       # vLLM still loading
            config = load_config(str(toml), env={"BRIMFUL_UPSTREAM_URL": fake.base_url})
            app = BrimfulApp(config)
            await app.startup()
            try:
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as http:
                    await app.backends.refresh_all()
                    assert (await http.get(ready_path)).status_code == 503
                    assert (await http.get(live_path)).status_code == 200
                    fake.ready = True
                    await app.backends.refresh_all()
                    while app._background:
                        await asyncio.gather(*list(app._background), return_exceptions=True)
                    assert (await http.get(ready_path)).status_code == 200
                    assert (await http.get(live_path)).status_code == 200
                    for path in metrics_paths:
                        response = await http.get(path)
                        assert response.status_code == 200 and "brimful_in_flight_requests" in response.text
                    assert not [r for r in fake.requests if r.path in {ready_path, live_path, *metrics_paths}]
            finally:
                await app.shutdown()

    asyncio.run(scenario())


# ----------------------------------------------------------------- the tokenizer init container

@pytest.fixture
def stand_in_hub(qwen3_dir: Path) -> Iterator[str]:
    """A local HTTP server answering /ORG/NAME/resolve/REV/FILE from the Qwen3 tokenizer files."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            match = re.fullmatch(r"/Qwen/Qwen3-8B/resolve/main/([\w.]+)", self.path)
            file = qwen3_dir / match.group(1) if match else None
            if file is None or not file.is_file() or self.headers.get("Authorization") != "Bearer hf_test":
                self.send_response(404)
                self.end_headers()
                return
            data = file.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_init_container_fetches_a_tokenizer_brimful_then_finds(
    stand_in_hub: str, qwen3_dir: Path, tmp_path: Path
) -> None:
    name = "examples/gateway-fetch.yaml"
    pod = one(name, "Deployment")["spec"]["template"]["spec"]
    init = next(c for c in pod["initContainers"] if c["name"] == "fetch-tokenizers")
    script = one(name, "ConfigMap")["data"]["fetch_tokenizers.py"]
    assert script == (CHART / "files" / "fetch_tokenizers.py").read_text()
    assert init["command"] == ["python", "/etc/brimful/fetch_tokenizers.py"]
    assert init["args"] == VALUE_SETS[name]["tokenizers"]["fetch"]["models"]
    assert env(init)["HF_HOME"] == env(container(name))["HF_HOME"] == "/hf-cache"

    hf_home = tmp_path / "hf-cache"
    (tmp_path / "fetch_tokenizers.py").write_text(script)
    run = subprocess.run(
        [sys.executable, str(tmp_path / "fetch_tokenizers.py"), "Qwen/Qwen3-8B", "nobody/missing@v1"],
        env={"HF_HOME": str(hf_home), "HF_ENDPOINT": stand_in_hub, "HF_TOKEN": "hf_test", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False,
    )
    assert run.returncode == 1                                # the missing model is an error…
    assert "nobody/missing: tokenizer.json not found" in run.stderr
    found = find_tokenizer_dir("Qwen/Qwen3-8B", None, str(hf_home))   # …the real one is where brimful looks
    assert found == hf_home / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "main"
    body = {"messages": [{"role": "user", "content": "Why does ice float on water?"}]}
    assert load_model_tokenizer(found).count_chat(body) == load_model_tokenizer(qwen3_dir).count_chat(body)
