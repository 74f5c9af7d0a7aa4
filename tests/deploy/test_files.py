"""The deployment files, checked without Docker.

Docker cannot run on the test machines, so nothing here builds an image or
starts a container.  What can be checked statically is checked for real:

* docker-compose.yml is parsed (with compose's own `${VAR:-default}`
  interpolation) and every reference in it is followed: Dockerfiles, bind
  mounts, named volumes, ports against the `--port` each program is started
  with, health checks, `depends_on`, the shared Hugging Face cache, profiles;
* brimful's command lines (compose's and the Dockerfile's) are parsed by
  `proxy.cli.build_parser()`, so an unknown or misspelt flag fails here;
* config/prometheus.yml targets must be compose services on their real ports;
* the Grafana provisioning must reference the data source the dashboard uses,
  and every PromQL expression may only name metrics that `proxy.recording.metrics`
  really exports (rendered from a live registry) or that vLLM exports;
* the Dockerfile goes through hadolint-style rules, each a small function that
  returns problems; the real file must have none and a broken sample must
  trip each rule (so a rule cannot pass vacuously).

Not checked (needs Docker or the images): that the images pull and build,
that vLLM's images really ship python3, that Grafana renders the panels.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml  # PyYAML: test dependency only (a hard import: a skip would hide a broken compose file)

from proxy.cli import serve_overrides
from proxy.config import load_config
from proxy.recording.lengthlog import LengthLogStats
from proxy.recording.metrics import CONTEXT_SIZES, DEFAULT_TOKEN_BUCKETS, Metrics
from proxy.sizing.capacity import kv_bytes_per_token, startup_check
from tests.support.deploy_lint import (
    COMPOSE_FILE,
    DOCKERFILE,
    DOCKERIGNORE,
    GRAFANA_BUILTINS,
    GRAFANA_DIR,
    HF_CACHE_VOLUME,
    PROMETHEUS_FILE,
    ROOT,
    VarUse,
    brimful_exposition,
    command_list,
    dockerfile_problems,
    env_dict,
    exec_form,
    from_image,
    grafana_variables,
    healthcheck_urls,
    ignore_patterns,
    interpolate_tree,
    is_brimful,
    is_ignored,
    is_vllm,
    listen_port,
    listening_ports,
    option_value,
    parse_cli,
    parse_dockerfile,
    parse_port,
    parse_volume,
    profile_sets,
    promql_selectors,
    resolve_name,
    stages,
    vllm_exposition,
)
from tests.support.docs import DOCS, block


@pytest.fixture(scope="module")
def compose_raw() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def compose(compose_raw: dict[str, Any]) -> dict[str, Any]:
    """The compose file as `docker compose config` would see it with no .env: every default applied."""
    return interpolate_tree({k: v for k, v in compose_raw.items() if not k.startswith("x-")}, env={})


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


@pytest.fixture(scope="module")
def prometheus() -> dict[str, Any]:
    return yaml.safe_load(PROMETHEUS_FILE.read_text())


@pytest.fixture(scope="module")
def grafana_datasources() -> list[dict[str, Any]]:
    files = sorted((GRAFANA_DIR / "provisioning" / "datasources").glob("*.y*ml"))
    assert files, "no Grafana data source provisioning file"
    return [ds for f in files for ds in yaml.safe_load(f.read_text())["datasources"]]


@pytest.fixture(scope="module")
def grafana_providers() -> list[dict[str, Any]]:
    files = sorted((GRAFANA_DIR / "provisioning" / "dashboards").glob("*.y*ml"))
    assert files, "no Grafana dashboard provider file"
    return [p for f in files for p in yaml.safe_load(f.read_text())["providers"]]


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    files = sorted((GRAFANA_DIR / "dashboards").glob("*.json"))
    assert files, "no dashboard JSON"
    return {f.name: json.loads(f.read_text()) for f in files}


@pytest.fixture(scope="module")
def known_metrics() -> dict[str, set[str]]:
    return {**brimful_exposition(), **vllm_exposition()}


def all_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard.get("panels", []):
        panels.append(panel)
        panels += panel.get("panels", [])
    return panels


def all_exprs(dashboard: Mapping[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in all_panels(dashboard) for t in p.get("targets", []) if t.get("expr")]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            exprs.append(query["query"] if isinstance(query, Mapping) else query)
    return exprs


def label_values_metric(expr: str) -> str | None:
    """`label_values(metric, label)` (a Grafana function, not PromQL) → the metric."""
    m = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*,\s*\w+\s*\)\s*", expr)
    return m.group(1) if m else None


# ===========================================================================
# Tests: docker-compose.yml
# ===========================================================================

def test_every_compose_variable_has_a_default(compose_raw: dict[str, Any]) -> None:
    """`docker compose up` must work with no .env: every ${VAR} carries a default."""
    uses: list[VarUse] = []
    interpolate_tree(compose_raw, env={}, uses=uses)
    assert uses, "the compose file was expected to be configurable through variables"
    missing = sorted({u.name for u in uses if u.op not in (":-", "-")})
    assert not missing, f"variables without a default: {missing}"


def test_compose_variables_override_the_defaults(compose_raw: dict[str, Any]) -> None:
    resolved = interpolate_tree(compose_raw,
                                env={"MODEL": "org/other", "MAX_MODEL_LEN": "2048", "VLLM_VERSION": "v9.9.9"})
    vllm = resolved["services"]["vllm"]
    assert vllm["image"] == "vllm/vllm-openai:v9.9.9"
    assert command_list(vllm)[0] == "org/other"
    assert option_value(command_list(vllm), "--max-model-len") == "2048"


def test_every_service_has_an_image_or_a_build_with_a_dockerfile(services: dict[str, Any]) -> None:
    for name, service in services.items():
        build = service.get("build")
        assert build or service.get("image"), f"{name}: neither image nor build"
        if build:
            spec = {"context": build} if isinstance(build, str) else build
            context = (ROOT / spec.get("context", ".")).resolve()
            assert context.is_dir(), f"{name}: build context {context} missing"
            assert (context / spec.get("dockerfile", "Dockerfile")).is_file(), f"{name}: Dockerfile missing"


def test_pulled_images_are_pinned_to_a_version(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if "build" in service:
            continue
        image = service["image"]
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        assert tag and "latest" not in tag, f"{name}: image {image} is not pinned"


def test_bind_mounts_exist_in_the_repository(services: dict[str, Any]) -> None:
    binds = [(n, parse_volume(v)) for n, s in services.items() for v in s.get("volumes", [])]
    assert any(m.is_bind for _, m in binds)
    for name, mount in binds:
        if mount.is_bind:
            assert mount.source.startswith("./"), f"{name}: bind {mount.source} is not relative to the repository"
            assert (ROOT / mount.source).exists(), f"{name}: bind source {mount.source} does not exist"


def test_named_volumes_are_declared(compose: dict[str, Any], services: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    mounts = [parse_volume(v) for s in services.values() for v in s.get("volumes", [])]
    named = {m.source for m in mounts if m.source and not m.is_bind}
    assert named <= declared, f"undeclared volumes: {named - declared}"
    assert declared <= named, f"declared but unused volumes: {declared - named}"


def test_host_ports_are_unique_within_each_profile(services: dict[str, Any]) -> None:
    sets = profile_sets(services)
    assert set(sets) == {"gpu", "cpu"}
    for profile, running in sets.items():
        seen: dict[int, str] = {}
        for name in sorted(running):
            for spec in services[name].get("ports", []):
                port = parse_port(spec)
                assert port.host is not None, f"{name}: {spec} publishes on a random host port"
                assert port.host not in seen, (f"profile {profile}: host port {port.host} "
                                               f"used by {seen[port.host]} and {name}")
                seen[port.host] = name


def test_published_ports_match_what_each_program_listens_on(services: dict[str, Any]) -> None:
    for name, service in services.items():
        ports = listening_ports(service)
        assert ports, f"{name}: publishes no port"
        flag = option_value(command_list(service), "--port")
        if is_vllm(service) or is_brimful(service):
            assert flag is not None, f"{name}: the listening port should be explicit (--port)"
        if flag is not None:
            assert int(flag) in ports, f"{name}: listens on {flag} but publishes {sorted(ports)}"
        for url in healthcheck_urls(service):
            assert urlsplit(url).port in ports, f"{name}: health check {url} is not on a listening port"


def test_only_brimful_is_published_beyond_loopback(services: dict[str, Any]) -> None:
    """Apps reach vLLM through brimful; vLLM, Prometheus and Grafana stay on 127.0.0.1."""
    for name, service in services.items():
        for spec in service.get("ports", []):
            port = parse_port(spec)
            if is_brimful(service):
                assert port.container == 8100
            else:
                assert port.host_ip == "127.0.0.1", f"{name}: {spec} is published on every interface"


def test_hf_cache_is_shared_read_write_by_vllm_and_read_only_by_brimful(services: dict[str, Any]) -> None:
    users = 0
    for name, service in services.items():
        mounts = [parse_volume(v) for v in service.get("volumes", [])]
        cache = [m for m in mounts if m.source == HF_CACHE_VOLUME]
        if not (is_vllm(service) or is_brimful(service)):
            assert not cache, f"{name} should not mount the model cache"
            continue
        assert len(cache) == 1, f"{name}: expected one {HF_CACHE_VOLUME} mount"
        users += 1
        mount = cache[0]
        assert mount.read_only == is_brimful(service), (
            f"{name}: {HF_CACHE_VOLUME} must be {'read-only' if is_brimful(service) else 'writable'}")
        # HF_HOME/hub/models--ORG--NAME/snapshots/* must be where each side looks.
        assert env_dict(service).get("HF_HOME") == mount.target, f"{name}: HF_HOME is not the cache mount"
    assert users == 4   # vllm, brimful, vllm-cpu, brimful-cpu


def test_dockerfile_hf_home_matches_the_compose_mount(services: dict[str, Any]) -> None:
    env = " ".join(i.value for i in parse_dockerfile(DOCKERFILE.read_text()) if i.keyword == "ENV")
    m = re.search(r"HF_HOME=(\S+)", env)
    assert m, "the image should default HF_HOME to the cache mount point"
    for name, service in services.items():
        if is_brimful(service):
            assert env_dict(service)["HF_HOME"] == m.group(1), name


def test_each_profile_is_one_complete_stack(services: dict[str, Any]) -> None:
    for profile, running in profile_sets(services).items():
        vllms = [n for n in running if is_vllm(services[n])]
        brimfuls = [n for n in running if is_brimful(services[n])]
        assert len(vllms) == 1 and len(brimfuls) == 1, f"profile {profile}: {vllms} {brimfuls}"
        assert {"prometheus", "grafana"} <= running
        # Prometheus and brimful address them as vllm / brimful in every profile.
        assert resolve_name("vllm", running, services) == vllms[0]
        assert resolve_name("brimful", running, services) == brimfuls[0]


def test_brimful_starts_after_a_healthy_vllm_it_forwards_to(services: dict[str, Any]) -> None:
    for profile, running in profile_sets(services).items():
        brimful = next(n for n in running if is_brimful(services[n]))
        service = services[brimful]
        upstream = urlsplit(option_value(command_list(service), "--upstream") or "")
        target = resolve_name(upstream.hostname or "", running, services)
        assert is_vllm(services[target]), f"{brimful} forwards to {target}, not to vLLM"
        assert upstream.port in listening_ports(services[target])
        assert service.get("depends_on", {}).get(target, {}).get("condition") == "service_healthy", (
            f"profile {profile}: {brimful} must wait for {target} to be healthy")
        checks = [urlsplit(u) for u in healthcheck_urls(services[target])]
        assert [(c.path, c.port) for c in checks] == [("/health", upstream.port)], f"{target}: health check {checks}"
        assert "python3" in services[target]["healthcheck"]["test"]


def test_gpu_vllm_reserves_gpus_and_shares_host_ipc(services: dict[str, Any]) -> None:
    vllm = services["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:v")
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    assert vllm["ipc"] == "host"


def test_vllm_commands_name_a_model_and_a_max_model_len(services: dict[str, Any]) -> None:
    """The images' entrypoint is `vllm serve`: the model is the first (positional) argument."""
    for name, service in services.items():
        if not is_vllm(service):
            continue
        argv = command_list(service)
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", argv[0]), f"{name}: first argument {argv[0]!r} is not a model id"
        assert argv[0] != "serve", f"{name}: the image already runs `vllm serve`"
        assert int(option_value(argv, "--max-model-len") or 0) > 0


def test_cpu_profile_uses_the_cpu_image_and_a_kv_cache_that_fits_one_request(services: dict[str, Any]) -> None:
    cpu = services["vllm-cpu"]
    assert re.fullmatch(r"vllm/vllm-openai-cpu:v[\d.]+-(x86_64|arm64)", cpu["image"]), cpu["image"]
    assert "deploy" not in cpu, "the CPU service must not reserve a GPU"
    argv = command_list(cpu)
    kv_bytes = int(option_value(argv, "--kv-cache-memory-bytes") or 0)
    max_model_len = int(option_value(argv, "--max-model-len") or 0)
    # The default CPU model, Qwen/Qwen3-0.6B (its config.json on the Hugging Face Hub):
    # vLLM refuses to start unless one max_model_len request fits the KV cache.
    assert argv[0] == "Qwen/Qwen3-0.6B"
    qwen3_06b = {"model_type": "qwen3", "num_hidden_layers": 28, "num_attention_heads": 16,
                 "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 1024, "torch_dtype": "bfloat16"}
    check = startup_check(max_model_len, kv_bytes, kv_bytes_per_token(qwen3_06b))
    assert check.fits, check.message


def test_brimful_command_is_accepted_by_brimful_and_its_config_loads(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if not is_brimful(service):
            continue
        args = parse_cli(command_list(service))
        assert args.command == "serve"
        mounts = {m.target: m for m in map(parse_volume, service.get("volumes", []))}
        config_mount = mounts.get(args.config)
        assert config_mount is not None and config_mount.is_bind and config_mount.read_only, (
            f"{name}: --config {args.config} is not a read-only bind of a repository file")
        config = load_config(ROOT / config_mount.source, env={}, overrides=serve_overrides(args))
        assert config.server.host == "0.0.0.0" and config.server.port in listening_ports(service)
        log_dir = str(Path(args.length_log).parent)
        assert log_dir in mounts and not mounts[log_dir].is_bind, f"{name}: the length log is not on a volume"


# ===========================================================================
# Tests: Prometheus
# ===========================================================================

def test_prometheus_config_mount_is_the_repository_file(services: dict[str, Any]) -> None:
    prom = services["prometheus"]
    config = option_value(command_list(prom), "--config.file")
    mounts = {m.target: m for m in map(parse_volume, prom["volumes"])}
    assert (ROOT / mounts[config].source).resolve() == PROMETHEUS_FILE.resolve()


def test_prometheus_targets_are_compose_services_on_their_ports(
    prometheus: dict[str, Any], services: dict[str, Any]
) -> None:
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert {"brimful", "vllm"} <= set(jobs)
    scraped: dict[str, set[str]] = {}
    for job_name, job in jobs.items():
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, port = target.rpartition(":")
                if host in ("localhost", "127.0.0.1"):   # Prometheus scraping itself
                    assert int(port) in listening_ports(services["prometheus"])
                    continue
                for profile, running in profile_sets(services).items():
                    owner = resolve_name(host, running, services)
                    assert int(port) in listening_ports(services[owner]), f"{job_name}: {target} in profile {profile}"
                    scraped.setdefault(job_name, set()).add(owner)
    assert scraped["brimful"] == {n for n, s in services.items() if is_brimful(s)}
    assert scraped["vllm"] == {n for n, s in services.items() if is_vllm(s)}
    assert jobs["brimful"].get("metrics_path", "/metrics") == "/metrics"
    assert jobs["vllm"].get("metrics_path", "/metrics") == "/metrics"


# ===========================================================================
# Tests: Grafana
# ===========================================================================

def test_grafana_data_source_is_the_prometheus_service(
    grafana_datasources: list[dict[str, Any]], services: dict[str, Any], prometheus: dict[str, Any]
) -> None:
    (ds,) = [d for d in grafana_datasources if d["type"] == "prometheus"]
    url = urlsplit(ds["url"])
    assert url.hostname == "prometheus" and url.port in listening_ports(services["prometheus"])
    # $__rate_interval is computed from this: it must be the real scrape interval.
    assert ds["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]


def test_grafana_mounts_provisioning_and_dashboards_where_the_provider_looks(
    services: dict[str, Any], grafana_providers: list[dict[str, Any]], dashboards: dict[str, Any]
) -> None:
    grafana = services["grafana"]
    mounts = {m.target: m for m in map(parse_volume, grafana["volumes"])}
    provisioning = mounts["/etc/grafana/provisioning"]
    assert (ROOT / provisioning.source).resolve() == (GRAFANA_DIR / "provisioning").resolve()
    for provider in grafana_providers:
        path = provider["options"]["path"]
        assert path in mounts, f"provider path {path} is not mounted"
        assert (ROOT / mounts[path].source).resolve() == (GRAFANA_DIR / "dashboards").resolve()
    home = env_dict(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).name in dashboards and str(Path(home).parent) in mounts
    assert "prometheus" in grafana["depends_on"]


def test_dashboards_use_the_provisioned_data_source(
    dashboards: dict[str, Any], grafana_datasources: list[dict[str, Any]]
) -> None:
    uids = {d["uid"] for d in grafana_datasources}
    for file, dash in dashboards.items():
        refs = [p["datasource"] for p in all_panels(dash) if "datasource" in p]
        refs += [t["datasource"] for p in all_panels(dash) for t in p.get("targets", []) if "datasource" in t]
        refs += [v["datasource"] for v in dash["templating"]["list"] if "datasource" in v]
        assert refs
        for ref in refs:
            assert ref["uid"] in uids, f"{file}: data source {ref} is not provisioned"


def test_dashboard_queries_name_only_exported_metrics_and_labels(
    dashboards: dict[str, Any], known_metrics: dict[str, set[str]]
) -> None:
    for file, dash in dashboards.items():
        for expr in all_exprs(dash):
            metric = label_values_metric(expr)
            if metric is not None:
                assert metric in known_metrics, f"{file}: {metric} is not exported"
                continue
            selectors, grouping = promql_selectors(expr)
            assert selectors, f"{file}: no metric in {expr!r}"
            labels_in_scope = {"le"}
            for sel in selectors:
                assert sel.metric in known_metrics, f"{file}: {sel.metric} is neither brimful's nor vLLM's: {expr!r}"
                labels = known_metrics[sel.metric]
                labels_in_scope |= labels
                for label, _, _ in sel.matchers:
                    assert label in labels, f"{file}: {sel.metric} has no label {label!r}: {expr!r}"
            assert grouping <= labels_in_scope, f"{file}: grouping by {grouping - labels_in_scope} in {expr!r}"


def test_dashboard_variables_are_defined_and_context_sizes_are_bucket_bounds(dashboards: dict[str, Any]) -> None:
    for file, dash in dashboards.items():
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        used = set()
        for expr in all_exprs(dash):
            used |= grafana_variables(expr)
        for p in all_panels(dash):
            used |= grafana_variables(p.get("title", ""))
        undefined = used - GRAFANA_BUILTINS - set(variables)
        assert not undefined, f"{file}: undefined {undefined}"
        if "context" in variables:
            # The "share within $context" stat reads the bucket le=$context: it must be a real bound.
            sizes = [int(s) for s in variables["context"]["query"].split(",")]
            assert set(sizes) <= set(CONTEXT_SIZES) and set(sizes) <= set(DEFAULT_TOKEN_BUCKETS)


def test_dashboard_shows_lengths_policy_drift_and_vllm_kv_cache(dashboards: dict[str, Any]) -> None:
    exprs = " ".join(e for dash in dashboards.values() for e in all_exprs(dash))
    for hist in ("brimful_prompt_tokens_bucket", "brimful_completion_tokens_bucket", "brimful_total_tokens_bucket"):
        for q in ("0.5", "0.95", "0.99"):
            assert re.search(rf"histogram_quantile\({q}, [^;]*?\b{hist}\b", exprs), f"no p{q} of {hist}"
    assert "sum by (action) (rate(brimful_requests_total" in exprs
    assert 'action="clamped"' in exprs and 'action="rejected"' in exprs
    for needed in ("brimful_clamped_tokens_total", "brimful_prompt_token_drift_total",
                   "brimful_prompt_token_drift_tokens_bucket", "vllm:kv_cache_usage_perc",
                   "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert needed in exprs, needed


def test_dashboard_panels_do_not_overlap(dashboards: dict[str, Any]) -> None:
    for file, dash in dashboards.items():
        cells: dict[tuple[int, int], str] = {}
        for panel in all_panels(dash):
            g = panel["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, f"{file}: {panel['title']} is wider than the grid"
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{file}: {panel['title']} overlaps {cells[(x, y)]}"
                    cells[(x, y)] = panel["title"]
        ids = [p["id"] for p in all_panels(dash)]
        assert len(ids) == len(set(ids)), f"{file}: duplicate panel ids"


def test_promql_reader_sees_metrics_not_functions_labels_or_variables() -> None:
    """The metric-name check above is only as good as this reader."""
    selectors, grouping = promql_selectors(
        'histogram_quantile(0.95, sum by (le, model) (rate(brimful_total_tokens_bucket{model=~"$model", '
        'le=~"8192(\\\\.0)?"}[$__rate_interval]))) / on (model) group_left max(vllm:kv_cache_usage_perc) '
        'or sum without (engine) (vllm:num_requests_running offset 5m)'
    )
    assert [s.metric for s in selectors] == [
        "brimful_total_tokens_bucket", "vllm:kv_cache_usage_perc", "vllm:num_requests_running"]
    assert selectors[0].matchers == (("model", "=~", "$model"), ("le", "=~", "8192(\\\\.0)?"))
    assert grouping == {"le", "model", "engine"}
    variables = grafana_variables('rate(x{a="$model"}[$__rate_interval]) ${context}')
    assert variables == {"model", "__rate_interval", "context"}


def test_brimful_exposition_covers_every_registered_metric() -> None:
    """The records above touch every metric, so the known-name set is complete."""
    names = brimful_exposition()
    metrics = Metrics()
    metrics.attach_lengthlog(LengthLogStats())
    for family in metrics.registry.collect():
        assert any(n == family.name or n.startswith(family.name + "_") for n in names), family.name


# ===========================================================================
# Tests: Dockerfile and .dockerignore
# ===========================================================================

def test_dockerfile_passes_every_rule() -> None:
    assert dockerfile_problems(DOCKERFILE.read_text()) == []


GOOD = DOCKERFILE.read_text()


def _mutate(old: str, new: str) -> str:
    assert old in GOOD, f"sample mutation does not apply: {old!r}"
    return GOOD.replace(old, new)


@pytest.mark.parametrize(
    ("broken", "problem"),
    [
        (lambda: _mutate("FROM python:3.11-slim-bookworm AS builder", "FROM python:latest AS builder"),
         "pinned to latest"),
        (lambda: _mutate("FROM python:3.11-slim-bookworm\n", "FROM python\n"), "has no tag"),
        (lambda: _mutate("USER brimful\n", ""), "runs as root"),
        (lambda: _mutate("USER brimful\n", "USER root\n"), "runs as root"),
        (lambda: _mutate('ENTRYPOINT ["brimful"]', "ENTRYPOINT brimful"), "shell form"),
        (lambda: re.sub(r"HEALTHCHECK .*?\]\n", "", GOOD, flags=re.S), "no HEALTHCHECK"),
        (lambda: _mutate("127.0.0.1:8100/live", "127.0.0.1:8100/health"), "not brimful's own endpoint"),
        (lambda: _mutate("127.0.0.1:8100/live", "127.0.0.1:8000/live"), "CMD listens on 8100"),
        (lambda: _mutate("pip install --no-cache-dir /wheels", "pip install /wheels"), "without --no-cache-dir"),
        (lambda: _mutate("COPY proxy ./proxy", "COPY proxies ./proxy"), "does not exist"),
        (lambda: _mutate("COPY proxy ./proxy", "COPY tests ./tests"), "excluded by .dockerignore"),
        (lambda: _mutate('"--port", "8100"', '"--listen-port", "8100"'), "brimful rejects"),
        (lambda: _mutate('ENTRYPOINT ["brimful"]', 'ENTRYPOINT ["brimfuld"]'), "not one of the project's scripts"),
    ],
)
def test_each_dockerfile_rule_catches_its_mistake(broken: Callable[[], str], problem: str) -> None:
    problems = dockerfile_problems(broken())
    assert any(problem in p for p in problems), problems


def test_dockerfile_base_python_satisfies_requires_python() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = tuple(int(x) for x in re.fullmatch(r">=\s*(\d+)\.(\d+)", requires).groups())
    for ins in parse_dockerfile(GOOD):
        if ins.keyword == "FROM" and from_image(ins).startswith("python:"):
            version = tuple(int(x) for x in re.match(r"python:(\d+)\.(\d+)", from_image(ins)).groups())
            assert version >= minimum, from_image(ins)


def test_image_config_and_length_log_paths_exist_in_the_image(services: dict[str, Any]) -> None:
    """The CMD's --config is COPYed into the image; compose's brimful uses the same path."""
    instructions = parse_dockerfile(GOOD)
    final = stages(instructions)[-1]
    cmd = next(exec_form(i.value) for i in reversed(final) if i.keyword == "CMD")
    config = option_value(cmd, "--config")
    copied = [shlex.split(i.value)[-1] for i in final if i.keyword == "COPY" and "--from" not in i.value]
    assert config in copied
    for name, service in services.items():
        if is_brimful(service):
            assert option_value(command_list(service), "--config") == config, name
            log_dir = str(Path(option_value(command_list(service), "--length-log")).parent)
            assert any(log_dir in i.value for i in final if i.keyword == "RUN" and "chown" in i.value), (
                "the length log directory must be created and owned by the brimful user in the image")
    exposed = {int(p) for i in final if i.keyword == "EXPOSE" for p in i.value.split()}
    assert listen_port(instructions) in exposed


def test_dockerignore_matcher_follows_docker_rules() -> None:
    patterns = ignore_patterns("tests\n**/__pycache__\n*.egg-info\nconfig/grafana\n!config/grafana/keep.json\n")
    assert is_ignored("tests", patterns) and is_ignored("tests/test_x.py", patterns)
    assert is_ignored("proxy/__pycache__/a.pyc", patterns)
    assert is_ignored("brimful.egg-info", patterns)
    assert not is_ignored("proxy", patterns) and not is_ignored("config/brimful.toml", patterns)
    assert is_ignored("config/grafana/dash.json", patterns)
    assert not is_ignored("config/grafana/keep.json", patterns)
    # Docker's * stops at '/', unlike fnmatch's: *.pyc is the root only, **/*.pyc any depth.
    assert not is_ignored("a/b/c.pyc", ignore_patterns("*.pyc"))
    assert is_ignored("a/b/c.pyc", ignore_patterns("**/*.pyc"))


def test_dockerignore_keeps_the_build_context_small() -> None:
    patterns = ignore_patterns(DOCKERIGNORE.read_text())
    for path in (".git", "tests", "bench", "brimful.egg-info", "proxy/__pycache__"):
        assert is_ignored(path, patterns), path
    for path in ("pyproject.toml", "README.md", "proxy", "tokenizer_cache", "config/brimful.toml"):
        assert not is_ignored(path, patterns), path


def test_the_documented_compose_commands(compose_raw: dict[str, Any]) -> None:
    """docs/deployment.md's `docker compose --profile …` lines, checked against the compose file (Docker
    cannot run here): each profile starts one vLLM and one brimful, the variables reach vLLM's command,
    and the addresses and the report command the page names are the stack's."""
    page = DOCS["docs/deployment.md"]
    for line in block("\nMODEL=Qwen/Qwen3-8B MAX_MODEL_LEN=16384 docker compose --profile gpu up -d"):
        words = shlex.split(line.split("#", 1)[0])
        env = dict(w.split("=", 1) for w in words[:words.index("docker")])
        profile = words[words.index("--profile") + 1]
        assert words[-2:] == ["up", "-d"]
        stack = {name: s for name, s in interpolate_tree(
            {k: v for k, v in compose_raw.items() if not k.startswith("x-")}, env=env)["services"].items()
            if profile in s.get("profiles", [profile])}
        vllm = [s for s in stack.values() if is_vllm(s)]
        brimful = [name for name, s in stack.items() if is_brimful(s)]
        assert len(vllm) == 1 and len(brimful) == 1, (profile, sorted(stack))
        command = command_list(vllm[0])
        if "MODEL" in env:
            assert command[0] == env["MODEL"] and f"--max-model-len={env['MAX_MODEL_LEN']}" in command
        published = {parse_port(p).host for s in stack.values() for p in s.get("ports", [])}
        for url in re.findall(r"`http://localhost:(\d+)", page):
            assert int(url) in published, (profile, url)
        [service] = brimful
        log = option_value(command_list(stack[service]), "--length-log")
        report = f"docker compose exec {service} brimful report {log}"
        assert report in page or f"`{service}` under the {profile} profile" in page, report
    assert "docker compose exec brimful brimful report /var/lib/brimful/lengths.jsonl" in page
