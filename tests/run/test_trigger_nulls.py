"""A JSON null in the Airflow trigger form's ``overrides`` sets the field to None, or is refused
naming the field; an empty form field still means "the profile's value"."""

from __future__ import annotations

import pytest

from pipelines.config import PROFILES, ConfigError
from pipelines.run.dag_plan import config_from_params, overrides_from_params

BASE = {"profile": "smoke", "backends": ["ddp"], "train_samples": None}  # the form's field left empty


def test_a_null_in_overrides_reaches_the_config():
    assert PROFILES["smoke"]["train_samples"] is not None  # so None below is the null's doing
    unset = config_from_params({**BASE, "overrides": {}}, {})
    assert unset.data.train_samples == PROFILES["smoke"]["train_samples"]
    for key in ("data.train_samples", "train_samples"):  # dotted path or flat name
        config = config_from_params({**BASE, "overrides": {key: None}}, {})
        assert config.data.train_samples is None, key  # all rows, as --set data.train_samples=null
    nested = config_from_params({**BASE, "overrides": {"data": {"train_samples": None}}}, {})
    assert nested.data.train_samples is None


def test_a_null_where_none_is_not_allowed_is_refused_with_the_field():
    with pytest.raises(ConfigError, match=r"training\.epochs"):
        config_from_params({**BASE, "overrides": {"training.epochs": None}}, {})
    with pytest.raises(ConfigError, match=r"overrides\.profile: unknown profile"):
        config_from_params({**BASE, "overrides": {"profile": None}}, {})
    with pytest.raises(ValueError, match="output_root: set by the deployment"):
        overrides_from_params({**BASE, "overrides": {"output_root": None}}, {})
