"""Configuration: precedence, validation messages, the shipped reference file, check-config, logging."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.config import ConfigError, load_config
from proxy.logs import JsonFormatter

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "brimful.toml"
    path.write_text(text)
    return path


def test_reference_file_is_valid_and_equals_the_defaults() -> None:
    from proxy.config import Config

    assert load_config(ROOT / "config" / "brimful.toml", env={}) == Config()


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, '[upstream]\nurl = "http://file:1"\ntimeout = 30\n[policy]\nmargin_tokens = 3\n')
    env = {"BRIMFUL_UPSTREAM_URL": "http://env:2", "BRIMFUL_POLICY_MARGIN_TOKENS": "5"}
    config = load_config(path, env=env, overrides={"upstream.url": "http://flag:3"})
    assert config.upstream.url == "http://flag:3"          # flag beats env and file
    assert config.policy.margin_tokens == 5                 # env beats file
    assert config.upstream.timeout == 30.0                  # file beats default
    assert config.server.port == 8100                       # default


def test_per_model_overrides_build_the_policy(tmp_path: Path, qwen3_dir: Path) -> None:
    path = write(tmp_path, f'[policy]\nmargin_tokens = 8\n[models."m"]\nmargin_tokens = 2\n'
                           f'on_overflow = "reject"\ntokenizer = "{qwen3_dir}"\n')
    config = load_config(path, env={})
    assert (config.policy_for("m").margin_tokens, config.policy_for("m").on_overflow) == (2, "reject")
    assert config.policy_for("other").margin_tokens == 8


def test_tokenizer_mode_per_model(tmp_path: Path) -> None:
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    (mistral / "tekken.json").write_text("{}")
    config = load_config(write(tmp_path, f'[models."m"]\ntokenizer = "{mistral}"\ntokenizer_mode = "mistral"\n'),
                         env={})
    assert (config.models["m"].tokenizer_mode, config.models["m"].tokenizer) == ("mistral", str(mistral))
    default = load_config(write(tmp_path, '[models."m"]\nmax_model_len = 8\n'), env={})
    assert default.models["m"].tokenizer_mode == "auto"
    with pytest.raises(ConfigError, match="must be one of 'auto', 'hf', 'mistral'"):
        load_config(write(tmp_path, '[models."m"]\ntokenizer_mode = "slow"\n'), env={})


@pytest.mark.parametrize(
    "text,expected",
    [
        ('[upstream]\nulr = "x"\n', "unknown configuration key 'upstream.ulr'; did you mean 'upstream.url'?"),
        ('[polcy]\n', "unknown configuration key 'polcy'; did you mean 'policy'?"),
        ('[policy]\non_overflow = "clip"\n', "'policy.on_overflow' must be one of 'clamp', 'reject', got 'clip'"),
        ('[policy]\nmargin_tokens = "8"\n', "'policy.margin_tokens' must be a whole number, got '8'"),
        ('[policy]\nmargin_tokens = -1\n', "'policy.margin_tokens' must not be negative, got -1"),
        ('[upstream]\ntimeout = true\n', "'upstream.timeout' must be a number, got True"),
        ('[server]\napi_keys = "k"\n', "'server.api_keys' must be a list, got str"),
        ('[upstream]\nurl = "ftp://x"\n', "'upstream.url' must start with http:// or https://, got 'ftp://x'"),
        ('[models."m"]\ntokenizer = "/nonexistent"\n', "is not a directory holding tokenizer.json"),
        ('[policy\n', "is not valid TOML"),
        ('[logging]\njson = "yes"\n', "'logging.json' must be true or false, got 'yes'"),
    ],
)
def test_validation_messages_name_key_value_and_what_is_allowed(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert expected in str(info.value)


def test_the_pages_listener_goes_with_workers_but_not_on_the_api_port(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[server]\nport = 8000\nworkers = 2\nmetrics_port = 9100\n"), env={})
    assert (config.server.workers, config.server.metrics_port) == (2, 9100)
    with pytest.raises(ConfigError, match=r"'server.metrics_port' must be 0 \(off\) or a port other than server.port"):
        load_config(write(tmp_path, "[server]\nport = 8000\nworkers = 2\nmetrics_port = 8000\n"), env={})


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"BRIMFUL_SERVER_PORT": "eighty"})
    assert "BRIMFUL_SERVER_PORT" in str(info.value) and "'eighty'" in str(info.value)


def test_environment_lists_and_booleans() -> None:
    config = load_config(env={"BRIMFUL_SERVER_API_KEYS": "a, b", "BRIMFUL_LOGGING_JSON": "true"})
    assert config.server.api_keys == ["a", "b"] and config.logging.json is True


def test_check_config_command(tmp_path: Path, capsys) -> None:
    assert main(["check-config", str(ROOT / "config" / "brimful.toml")]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["check-config", str(write(tmp_path, "[upstream]\nulr = 1\n"))]) == 1
    assert "did you mean 'upstream.url'" in capsys.readouterr().err


def test_json_log_lines_carry_extra_fields() -> None:
    record = logging.LogRecord("brimful", logging.WARNING, __file__, 1, "drift on %s", ("m",), None)
    record.request_id = "abc"
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "drift on m" and line["level"] == "warning" and line["request_id"] == "abc"


def test_the_floor_is_set_per_surface_and_per_model(tmp_path: Path) -> None:
    path = tmp_path / "floor.toml"
    path.write_text('[policy]\nmin_completion_tokens_by_surface = { messages = 2000, chat = 500 }\n'
                    '[models."agent"]\nmin_completion_tokens_by_surface = { messages = 4000 }\n'
                    'upstream_clamps_overflow = false\n')
    config = load_config(path, env={})
    assert (config.policy_for("other").floor("messages"), config.policy_for("other").floor("chat")) == (2000, 500)
    agent = config.policy_for("agent")
    assert (agent.floor("messages"), agent.floor("chat"), agent.upstream_clamps_overflow) == (4000, 1, False)
    path.write_text("[policy]\nmin_completion_tokens_by_surface = { messages = 0 }\n")
    with pytest.raises(ConfigError, match="min_completion_tokens"):
        load_config(path, env={})


def test_the_agents_page_configuration_loads(tmp_path: Path) -> None:
    """docs/agents.md's configuration examples load, and mean what the page says."""
    from tests.support.docs import BLOCKS

    blocks = [b.text for b in BLOCKS if b.doc == "docs/agents.md" and b.info == "toml"]
    assert len(blocks) == 2
    path = tmp_path / "agents.toml"
    path.write_text(blocks[0])
    config = load_config(path, env={})
    assert config.policy.floor("messages") == 3000 and config.policy.upstream_clamps_overflow
    agent = config.policy_for("my-agent-model")
    assert (agent.floor("messages"), agent.floor("chat"), agent.floor("responses")) == (3000, 1500, 1)
    path.write_text(blocks[1])
    assert load_config(path, env={}).policy_for("my-agent-model").trim == "oldest"
def test_upstream_flag_given_twice_makes_a_second_upstream() -> None:
    """docs/pools.md's `brimful serve --upstream A --upstream B`."""
    from proxy.cli import build_parser, serve_overrides
    from tests.support.docs import block

    [command] = block("\nbrimful serve --upstream http://127.0.0.1:8001 --upstream")
    args = build_parser().parse_args(command.split()[1:])
    config = load_config(None, env={}, overrides=serve_overrides(args))
    assert config.upstream.url == "http://127.0.0.1:8001"
    assert [(u.name, u.url) for u in config.upstreams] == [("upstream-2", "http://127.0.0.1:8002")]
    one = load_config(None, env={}, overrides=serve_overrides(build_parser().parse_args(
        ["serve", "--upstream", "http://a:8000"])))
    assert one.upstreams == []


def test_the_documented_pools_are_two_upstreams(tmp_path: Path) -> None:
    """docs/pools.md's configuration: [upstream] and one [[upstreams]] entry named "long"."""
    from tests.support.docs import block

    path = tmp_path / "brimful.toml"
    path.write_text("\n".join(block('\n[[upstreams]]\nname = "long"')) + "\n")
    config = load_config(path, env={})
    assert config.upstream.url == "http://vllm-short:8000"
    assert [(u.name, u.url) for u in config.upstreams] == [("long", "http://vllm-long:8000")]
