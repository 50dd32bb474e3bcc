"""One typed configuration for a benchmark run, flowing through the CLI, the DAG and the reports.

    from pipelines.config import load_config
    cfg = load_config("smoke", {"training.epochs": 3})   # or {"epochs": 3}: flat names are aliases
    cfg.training.epochs, cfg.engine(name)           # engines.<name>: a platform's or an engine's settings

Sections (``sections.py``): data, training, matrix, engines (the settings of each platform and of
each engine the data stage runs on), cluster, tracking.
``model.py``: ``BenchmarkConfig``; ``fields.py``: flat names and dotted paths; ``loading.py``: profile + host
defaults + overrides; ``profiles.py``: smoke, nightly, paper; ``strategy.py``: ``TrainingStrategy``.
"""

from pipelines.config.loading import (
    SET_NULL, load_config, parse_set_options, read_config, save_config, site_defaults,
)
from pipelines.config.fields import ConfigError, deployment_fields, deployment_keys, field_paths, path_of
from pipelines.config.model import BenchmarkConfig, flat_view, form_schema, json_schema
from pipelines.config.profiles import PROFILES
from pipelines.platforms.fields import deployment
from pipelines.config.sections import DEFAULT_DATASET, DEFAULT_MODEL, SECTIONS
from pipelines.config.strategy import STRATEGY_EXAMPLES, STRATEGY_PATTERN, TrainingStrategy, parse_strategy

__all__ = [
    "BenchmarkConfig", "ConfigError", "DEFAULT_DATASET", "DEFAULT_MODEL", "PROFILES", "SECTIONS",
    "STRATEGY_EXAMPLES", "STRATEGY_PATTERN", "TrainingStrategy", "deployment", "deployment_fields", "deployment_keys",
    "SET_NULL", "field_paths", "flat_view", "form_schema", "json_schema", "load_config", "parse_set_options", "parse_strategy",
    "path_of", "read_config", "save_config", "site_defaults",
]
