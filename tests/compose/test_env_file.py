"""docker/make_env.sh: the stack's .env is private from its first byte and survives re-runs
(the stack's volumes need the same PostgreSQL, MLflow and Fernet values). Static: no Docker."""

from __future__ import annotations

import subprocess

from tests.compose.test_compose import ROOT, SECRETS


def test_make_env_writes_a_private_file_and_keeps_its_values(tmp_path):
    target = tmp_path / ".env"

    def make_env() -> dict[str, str]:
        subprocess.run(["bash", "-c", f'umask 022; bash "{ROOT}/docker/make_env.sh" "{target}"'], check=True,
                       capture_output=True)
        assert oct(target.stat().st_mode & 0o777) == "0o600"
        return dict(line.split("=", 1) for line in target.read_text().splitlines() if "=" in line)

    first = make_env()
    assert set(first) == set(SECRETS)
    target.chmod(0o644)  # e.g. written by an older `make_env.sh > .env`
    lines = [ln for ln in target.read_text().splitlines() if not ln.startswith("SPARK_AUTH_SECRET=")]
    target.write_text("\n".join([*lines, "TORCH_INDEX=https://download.pytorch.org/whl/cu128"]))
    second = make_env()  # a re-run: the stack's volumes need the same values
    assert {k: v for k, v in second.items() if k != "SPARK_AUTH_SECRET"} == {
        **{k: v for k, v in first.items() if k != "SPARK_AUTH_SECRET"},
        "TORCH_INDEX": "https://download.pytorch.org/whl/cu128"}
    assert len(second["SPARK_AUTH_SECRET"]) == 64  # the missing secret was added
    assert not list(tmp_path.glob(".env.tmp-*"))
