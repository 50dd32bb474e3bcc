"""The Determined experiment config we generate passes Determined's own schema check.

The schema is the installed determined package's when it ships one (``determined.common.schemas``,
as releases up to 0.21.0 did). The pinned 0.37.0 does not: it checks configs in the master only,
so the expconf v0 schema and keyword extensions come from the 0.21.0 wheel, the last that ships
them (tests/fixtures/determined_expconf/README.md says why and how to refresh them), with the same
validator construction as ``determined.common.schemas.expconf._validate``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest

from pipelines.platforms.determined.adapter import experiment_config

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "determined_expconf"
EXPERIMENT = "http://determined.ai/schemas/expconf/v0/experiment.json"
KEYWORDS = ("disallowProperties", "union", "checks", "compareProperties", "optionalRef")


def _installed_schema() -> tuple[dict, object] | None:
    """(schemas, extensions module) of the installed determined, or None where it ships none."""
    if importlib.util.find_spec("determined.common.schemas") is None:
        return None
    from determined.common.schemas import extensions
    from determined.common.schemas.expconf import _gen

    return _gen.schemas, extensions


def _vendored_schema() -> tuple[dict, object]:
    schemas = json.loads((FIXTURE / "expconf_v0.json").read_text())
    spec = importlib.util.spec_from_file_location("det_expconf_extensions", FIXTURE / "extensions.py")
    ext_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext_module)
    return schemas, ext_module


def _validator():
    schemas, ext_module = _installed_schema() or _vendored_schema()
    ext = {name: getattr(ext_module, name) for name in KEYWORDS}
    resolver = jsonschema.RefResolver(base_uri=EXPERIMENT, referrer=schemas[EXPERIMENT],
                                      handlers={"http": lambda url: schemas[url]})
    cls = jsonschema.validators.extend(jsonschema.Draft7Validator, ext)
    return cls(schema=schemas[EXPERIMENT], resolver=resolver)


def _errors(conf: dict) -> list[str]:
    """Determined's sanity check (the completeness check needs the cluster's defaults)."""
    return sorted(f"{list(e.absolute_path)}: {e.message}" for e in _validator().iter_errors(conf))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_generated_config_passes_determineds_schema(make_config):
    conf = experiment_config(make_config(epochs=3), 2, Path("/r/cells/determined-w2-r0"), 1.0, 400)
    assert _errors(conf) == []
    # and it is a real check: Determined's own rules reject a broken config
    broken = {**conf, "resources": {"slots_per_trial": "two"}, "max_restarts": -1, "epochs": 3}
    problems = _errors(broken)
    assert any("slots_per_trial" in p for p in problems), problems
    assert any("'epochs' was unexpected" in p for p in problems), problems
    assert any("max_restarts" in p for p in problems), problems


def test_the_vendored_schema_is_used_only_while_the_pinned_determined_ships_none():
    """The vendored copy stands in for the pinned release's schema only while that release has
    none: a pin that ships it again makes the copy stale, and this says so."""
    version = importlib.metadata.version("determined")
    assert _installed_schema() is None, (
        f"determined {version} ships its expconf schema (determined.common.schemas): the check above "
        "already uses it; delete tests/fixtures/determined_expconf and the fallback to it")
