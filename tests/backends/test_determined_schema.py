"""The Determined experiment config we generate passes Determined's own schema check.

Uses the expconf v0 schema and keyword extensions of the determined package (vendored from its
0.19.11 wheel, the last one that ships them: tests/fixtures/determined_expconf/README.md) with
the same validator construction as ``determined.common.schemas.expconf._validate``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest

from pipelines.platforms.determined.adapter import experiment_config

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "determined_expconf"
EXPERIMENT = "http://determined.ai/schemas/expconf/v0/experiment.json"


def _validator():
    schemas = json.loads((FIXTURE / "expconf_v0.json").read_text())
    spec = importlib.util.spec_from_file_location("det_expconf_extensions", FIXTURE / "extensions.py")
    ext_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext_module)
    ext = {name: getattr(ext_module, name) for name in
           ("disallowProperties", "union", "checks", "compareProperties", "optionalRef")}
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
    assert any("max_restarts" in p for p in problems), problems
    assert any("'epochs' was unexpected" in p for p in problems), problems
