"""Building a config: a profile's defaults, this host's BENCHMARK_* defaults, then overrides."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipelines.config.fields import ConfigError, _merge, deployment_fields, nest
from pipelines.config.model import BenchmarkConfig, format_error
from pipelines.config.profiles import PROFILES, defaults as profile_defaults
from pipelines.runfolder.fileio import atomic_write_text


def site_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Config overrides (dotted paths) from the BENCHMARK_* variables of deployment fields that are set."""
    environ = os.environ if environ is None else environ
    return {path: environ[var] for path, var in deployment_fields().items() if var and environ.get(var)}


def check_profiles(profile: Any, overrides: dict[str, Any] | None = None) -> None:
    """ConfigError unless ``profile`` and ``overrides["profile"]`` (each where not None) name one
    of PROFILES: a profile reaches report titles, mail subjects and links, so nothing else may."""
    for where, name in (("profile", profile), ("overrides.profile", (overrides or {}).get("profile"))):
        if name is not None and (not isinstance(name, str) or name not in PROFILES):
            raise ConfigError(f"{where}: unknown profile {name!r} (allowed: {', '.join(PROFILES)})")


class _SetNull:
    """An override that sets a field to None (``--set data.test_samples=null``: "all rows"), where a
    plain None means "not given, keep the default" (an empty field of the trigger form)."""

    def __repr__(self) -> str:
        return "null"


SET_NULL = _SetNull()


def load_config(profile: str = "smoke", overrides: dict[str, Any] | None = None) -> BenchmarkConfig:
    """Profile defaults, then $MLFLOW_TRACKING_URI, then overrides (None = keep the default;
    ``SET_NULL`` = set the field to None). Keys are dotted paths (``training.epochs``) or flat
    names (``epochs``). ``profile``, and a ``profile`` key of the overrides, must name one of
    PROFILES (ConfigError otherwise)."""
    check_profiles("" if profile is None else profile, overrides)
    values = nest({**profile_defaults(profile), "profile": profile})
    if os.environ.get("MLFLOW_TRACKING_URI"):  # e.g. the compose stack's MLflow server
        values = _merge(values, {"tracking": {"mlflow_tracking_uri": os.environ["MLFLOW_TRACKING_URI"]}})
    given = {k: None if v is SET_NULL else v for k, v in (overrides or {}).items() if v is not None}
    values = _merge(values, nest(given))
    try:
        return BenchmarkConfig(**values)
    except ValidationError as err:
        raise ConfigError(format_error(err)) from None


def parse_set_options(pairs: list[str]) -> dict[str, Any]:
    """``["epochs=3", "matrix.worker_counts=[1, 2]"]`` -> dict; values are JSON if they parse, else str;
    ``null`` is ``SET_NULL`` (the field set to None, not left at its default)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair!r}: expected key=value")
        try:
            value = json.loads(raw)
            out[key.strip()] = SET_NULL if value is None else value
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def save_config(config: BenchmarkConfig, path: Path) -> None:
    atomic_write_text(path, config.to_json())


def read_config(path: Path) -> BenchmarkConfig:
    """A run folder's config.json, sectioned or flat (written before sections existed)."""
    try:
        return BenchmarkConfig.model_validate_json(Path(path).read_text())
    except ValidationError as err:
        raise ConfigError(f"{path}: " + format_error(err)) from None
