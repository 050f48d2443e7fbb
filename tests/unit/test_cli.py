import subprocess
import sys

import pytest

from sluice.cli import parse_serve_args


def test_triton_spellings():
    c = parse_serve_args(
        [
            "--model-repository=/r",
            "--model-control-mode=explicit",
            "--load-model=a",
            "--load-model",
            "b",
            "--strict-readiness=false",
            "--http-port=9000",
            "--grpc-port",
            "9001",
            "--metrics-port=9002",
            "--exit-timeout-secs=5",
            "--repository-poll-secs=2",
            "--disable-auto-complete-config",
            "--log-verbose=1",
        ]
    )
    assert c.load_models == ("a", "b") and c.strict_readiness is False
    assert (c.http_port, c.grpc_port, c.metrics_port) == (9000, 9001, 9002)
    assert c.exit_timeout_secs == 5 and c.disable_auto_complete_config


def test_star_must_be_alone(capsys):
    with pytest.raises(SystemExit) as info:
        parse_serve_args(
            [
                "--model-repository=/r",
                "--model-control-mode=explicit",
                "--load-model=*",
                "--load-model=a",
            ]
        )
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: --load-model=* must be the only --load-model" in err, err


def test_unknown_flag_is_a_clear_error_not_a_traceback():
    r = subprocess.run(
        [sys.executable, "-m", "sluice", "serve", "--model-repository=/r", "--no-such-flag=1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "unrecognized arguments: --no-such-flag=1" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_repository_is_one_clear_line(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "serve",
            f"--model-repository={tmp_path / 'nope'}",
            "--http-port=0",
            "--grpc-port=0",
            "--metrics-port=0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "no such directory" in r.stderr and "Traceback" not in r.stderr


def test_port_zero_and_port_file():
    c = parse_serve_args(
        [
            "--model-repository=/r",
            "--http-port=0",
            "--grpc-port=0",
            "--metrics-port=0",
            "--port-file=/tmp/ports.json",
        ]
    )
    assert (c.http_port, c.grpc_port, c.metrics_port) == (0, 0, 0)
    assert c.port_file == "/tmp/ports.json"
    assert parse_serve_args(["--model-repository=/r"]).port_file == ""


def test_write_port_file_is_whole_json(tmp_path):
    import json

    from sluice.server import write_port_file

    path = tmp_path / "ports.json"
    write_port_file(str(path), {"grpc": 1, "http": 2, "metrics": None})
    assert json.loads(path.read_text()) == {"grpc": 1, "http": 2, "metrics": None}
    assert [p.name for p in tmp_path.iterdir()] == ["ports.json"]  # no temporary left


def test_on_demand_flags(capsys):
    c = parse_serve_args(
        [
            "--model-repository=/r",
            "--model-control-mode=explicit",
            "--model-load-on-demand=true",
            "--model-pin=a",
            "--model-pin",
            "b",
            "--model-pin=a",
            "--model-memory-limit=2G",
        ]
    )
    assert c.model_load_on_demand and c.model_pins == ("a", "b")
    assert c.model_memory_limit == 2 << 30
    assert parse_serve_args(["--model-repository=/r"]).model_load_on_demand is False
    refusals = [
        (
            ["--model-control-mode=poll", "--model-load-on-demand=true"],
            "--model-load-on-demand requires --model-control-mode=none or explicit",
        ),
        (["--model-pin=a"], "--model-pin requires --model-load-on-demand=true"),
        (
            ["--model-load-on-demand=true", "--model-pin=../x"],
            "--model-pin: invalid model name '../x'",
        ),
    ]
    for flags, words in refusals:
        with pytest.raises(SystemExit) as info:
            parse_serve_args(["--model-repository=/r", *flags])
        assert info.value.code == 2
        assert words in capsys.readouterr().err
