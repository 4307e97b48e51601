"""The signer CLI end to end: keygen, propose, independent signing, combine, verify."""

from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from governance.cli import add_commands, parse_param


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    """Run one `quorum ...` command through add_commands; return (exit code, stdout JSON)."""
    parser = argparse.ArgumentParser(prog="quorum")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    code = args.func(args)
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else captured.err


def write(path: Path, value: object) -> str:
    path.write_text(json.dumps(value))
    return str(path)


@pytest.fixture
def signers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Three principals made with `token keygen`, and a registry listing them."""
    pubs = {}
    for name in ("alice", "bob", "carol"):
        code, out = run(capsys, "token", "keygen", "--principal", name, "--out", str(tmp_path))
        assert code == 0 and out["kid"]
        pubs[name] = (tmp_path / f"{name}.pub").read_text().strip()
    everyone = sorted(pubs)
    registry = {
        "issuer": "gov-cli",
        "policyEpoch": 1,
        "expires": "2099-01-01T00:00:00Z",
        "principals": {n: [p] for n, p in pubs.items()},
        "operations": {
            "model-unload": {"threshold": 2, "principals": everyone},
            "cache-flush": {"threshold": 1, "principals": everyone},
        },
    }
    return {"dir": tmp_path, "registry": write(tmp_path / "registry.json", registry)}


def test_cli_keygen_writes_private_key_0600_and_refuses_overwrite(
    signers: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """keygen writes NAME.key with mode 0600 and never overwrites an existing key."""
    key = signers["dir"] / "alice.key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert key.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    code, _ = run(capsys, "token", "keygen", "--principal", "alice", "--out", str(signers["dir"]))
    assert code == 1


def test_cli_two_of_three_round_trip(
    signers: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two signers sign a proposal independently; combined it verifies, alone it gets 403."""
    d = signers["dir"]
    code, proposal = run(
        capsys,
        "token",
        "propose",
        "--operation",
        "model-unload",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--param",
        "force=true",
        "--aud",
        "runner-x",
        "--iss",
        "gov-cli",
        "--ttl",
        "300",
    )
    assert code == 0 and proposal["signatures"] == []
    proposal_file = write(d / "proposal.json", proposal)
    signed = {}
    for name in ("alice", "carol"):
        code, signed[name] = run(
            capsys, "token", "sign", proposal_file, "--key", str(d / f"{name}.key")
        )
        assert code == 0 and len(signed[name]["signatures"]) == 1
    files = [write(d / f"{n}.json", doc) for n, doc in signed.items()]
    code, combined = run(capsys, "token", "combine", *files, "--b64")
    assert code == 0 and combined.startswith("eyJ")
    token_file = write(d / "token.json", combined)

    code, result = run(capsys, "token", "verify", token_file, "--registry", signers["registry"])
    assert code == 0 and result["ok"] and result["principals"] == ["alice", "carol"]
    code, result = run(capsys, "token", "verify", files[0], "--registry", signers["registry"])
    assert (code, result["status"], result["code"]) == (1, 403, "threshold_not_met")
    code, result = run(
        capsys,
        "token",
        "verify",
        token_file,
        "--registry",
        signers["registry"],
        "--runner-id",
        "runner-y",
    )
    assert (code, result["status"]) == (1, 403)
    code, result = run(
        capsys,
        "token",
        "verify",
        token_file,
        "--registry",
        signers["registry"],
        "--param",
        "force=false",
    )
    assert (code, result["status"]) == (1, 403)

    code, shown = run(capsys, "token", "inspect", token_file)
    assert code == 0 and shown["claims"]["params"] == {"force": True}
    assert [h["kid"] for h in shown["signatures"]] == [
        run(capsys, "token", "inspect", f)[1]["signatures"][0]["kid"] for f in files
    ]


def test_cli_combine_refuses_different_payloads(
    signers: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Signatures over two different proposals cannot be combined."""
    d = signers["dir"]
    docs = []
    for name in ("alice", "bob"):
        _, proposal = run(
            capsys,
            "token",
            "propose",
            "--operation",
            "cache-flush",
            "--param",
            "scope=all",
            "--aud",
            "r",
            "--iss",
            "gov-cli",
        )
        _, signed = run(
            capsys, "token", "sign", write(d / "p.json", proposal), "--key", str(d / f"{name}.key")
        )
        docs.append(write(d / f"{name}-signed.json", signed))
    code, _ = run(capsys, "token", "combine", *docs)
    assert code == 2


def test_cli_registry_check(
    signers: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """registry check passes a safe registry and exits non-zero on an unsafe one."""
    code, summary = run(capsys, "registry", "check", signers["registry"])
    assert code == 0 and summary["operations"]["model-unload"]["threshold"] == 2
    doc = json.loads(Path(signers["registry"]).read_text())
    doc["operations"]["model-unload"]["threshold"] = 0
    code, err = run(capsys, "registry", "check", write(tmp_path / "bad.json", doc))
    assert code == 1 and "threshold 0" in err


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("n=32768", ("n", 32768)),
        ("q=awq-4bit", ("q", "awq-4bit")),
        ("b=true", ("b", True)),
        ('s="123"', ("s", "123")),
        ("x=1.5", ("x", "1.5")),
        ("e=", ("e", "")),
        ('o={"a":1}', ("o", {"a": 1})),
        ("k=a=b", ("k", "a=b")),
    ],
)
def test_cli_parse_param(item: str, expected: tuple[str, object]) -> None:
    """--param values are JSON when they parse strictly (no floats), else text."""
    assert parse_param(item) == expected
