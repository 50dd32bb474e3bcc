"""The data contract as GX expectation suites: snapshot, class balance, contract facts and token
shards, plus the small frames (class shares, contract facts) those suites check."""

from __future__ import annotations

import logging

import pandas as pd

from pipelines.config import BenchmarkConfig
from pipelines.data.manifest import ManifestError, task_labels

log = logging.getLogger("pipelines.data.validate")  # the stage's logger, as before the split


# --- snapshot -----------------------------------------------------------------------------


def expected_labels(manifest: dict) -> list[int]:
    """The task's label set (manifest); when the train labels do not form 0..K-1, the set they
    should have been (0..K-1 for K distinct labels), so GX names every row outside it."""
    try:
        return task_labels(manifest)
    except ManifestError as err:
        log.warning("%s", err)
        count = len(manifest.get("splits", {}).get("train", {}).get("rows_per_label") or {})
        return list(range(max(count, 2)))


def class_share_bound(config: BenchmarkConfig, num_classes: int, split: str = "test") -> float:
    """Smallest allowed share of one class: ``min_class_fraction`` is the bound for two classes,
    scaled to K classes (0.4 for 2 classes -> 0.267 for 3).

    A train split made imbalanced on purpose (``class_ratio``) is held to the share the ratio
    asks for instead (ratio / (1 + (K-1) ratio), less 10 % for rounding), so the contract still
    catches a train split even more skewed than requested; test keeps ``min_class_fraction``."""
    bound = config.data.min_class_fraction * 2 / num_classes
    if split == "train" and config.data.class_ratio is not None:
        intended = config.data.class_ratio / (1 + (num_classes - 1) * config.data.class_ratio)
        return min(bound, 0.9 * intended)
    return bound


def class_frame(frame: pd.DataFrame, labels: list[int]) -> pd.DataFrame:
    """One row per label of the task: its share of the split (what the balance suite checks)."""
    counts = frame["label"].value_counts() if "label" in frame.columns else pd.Series(dtype="int64")
    total = max(len(frame), 1)
    return pd.DataFrame({"label": labels, "share": [float(counts.get(k, 0)) / total for k in labels]})


def class_expectations(config: BenchmarkConfig, labels: list[int], split: str = "test") -> list:
    import great_expectations.expectations as gxe

    bound = class_share_bound(config, len(labels), split)
    note = ("" if split != "train" or config.data.class_ratio is None
            else f" (class_ratio={config.data.class_ratio}: train imbalanced on purpose)")
    if split == "train" and config.data.class_ratio is None:
        note = " (an imbalanced train split on purpose: set class_ratio, which relaxes this bound for train)"
    return [gxe.ExpectColumnValuesToBeBetween(column="share", min_value=bound,
                                              meta={"notes": f"every class holds >= {bound:.3f} of {split}{note}"})]


def snapshot_expectations(config: BenchmarkConfig, expected_rows: int, labels: list[int]) -> list:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnToExist(column="text"),
        gxe.ExpectColumnToExist(column="label"),
        gxe.ExpectTableColumnsToMatchSet(column_set=["text", "label"], exact_match=True),
        gxe.ExpectTableRowCountToEqual(value=expected_rows),  # what the manifest promised
        gxe.ExpectTableRowCountToBeBetween(min_value=1),  # an empty split is never fine
        gxe.ExpectColumnValuesToBeOfType(column="text", type_="str"),
        gxe.ExpectColumnValuesToBeOfType(column="label", type_="int64"),
        gxe.ExpectColumnValuesToNotBeNull(column="text"),
        gxe.ExpectColumnValuesToNotBeNull(column="label"),
        gxe.ExpectColumnValuesToNotMatchRegex(column="text", regex=r"^\s*$"),  # blank after strip
        gxe.ExpectColumnValueLengthsToBeBetween(
            column="text", min_value=config.data.min_text_chars, max_value=config.data.max_text_chars
        ),
        gxe.ExpectColumnValuesToBeInSet(column="label", value_set=labels),  # the manifest's task
    ]


def contract_frame(frames: dict[str, pd.DataFrame], manifest: dict, labels: list[int],
                   text_facts: dict[str, float] | None = None) -> pd.DataFrame:
    """One row of data-contract facts: leakage, duplicates, rows against the request, class sizes;
    ``text_facts``: the normalised and near-duplicate fractions (``near_duplicates.text_duplicates``)."""
    facts: dict[str, float] = {}
    if all("text" in f.columns for f in frames.values()):
        train_texts = set(frames["train"]["text"].dropna()) | set(frames["validation"]["text"].dropna())
        test = frames["test"]["text"]
        facts["test_rows_in_train_fraction"] = float(test.isin(train_texts).mean()) if len(test) else 0.0
        for split, frame in frames.items():
            facts[f"duplicate_fraction_{split}"] = float(frame["text"].duplicated().mean()) if len(frame) else 0.0
    splits = manifest.get("splits", {})
    sampled = {"train": splits.get("train", {}).get("rows", 0) + splits.get("validation", {}).get("rows", 0),
               "test": splits.get("test", {}).get("rows", 0)}
    for split in ("train", "test"):
        requested = splits.get(split, {}).get("requested_samples")
        facts[f"rows_short_{split}"] = float(max(0, (requested or 0) - sampled[split]))
        counts = frames[split]["label"].value_counts() if "label" in frames[split].columns else pd.Series()
        facts[f"smallest_class_{split}"] = float(min((counts.get(k, 0) for k in labels), default=0))
    facts.update({k: float(v) for k, v in (text_facts or {}).items()})
    return pd.DataFrame([facts])


def near_bounds(config: BenchmarkConfig) -> tuple[float, float]:
    """(within-split, test-in-train) bounds on near-duplicates: the exact ones unless set."""
    data = config.data
    duplicate, overlap = data.max_near_duplicate_fraction, data.max_near_overlap_fraction
    return (data.max_duplicate_fraction if duplicate is None else duplicate,
            data.max_overlap_fraction if overlap is None else overlap)


def _text_rule(config: BenchmarkConfig, column: str) -> tuple[float, str] | None:
    """Bound and rule of a normalised / near-duplicate fact column, None for other columns."""
    data, (near_duplicate, near_overlap) = config.data, near_bounds(config)
    normal = "normalised text (NFKC, case-folded, markup and punctuation removed, spaces collapsed)"
    near = (f"near-copy (MinHash of 3-word shingles of the normalised text, Jaccard >= "
            f"{data.near_duplicate_threshold}, near_duplicate_threshold)")
    split = column.rsplit("_", 1)[-1]
    if column == "test_rows_in_train_normalized_fraction":
        return data.max_overlap_fraction, (f"rule normalised train/test overlap: test rows whose {normal} is "
                                           f"also in train <= max_overlap_fraction={data.max_overlap_fraction}")
    if column == "test_rows_near_train_fraction":
        return near_overlap, (f"rule near-duplicate train/test overlap: test rows with a {near} in train "
                              f"<= max_near_overlap_fraction={near_overlap}")
    if column.startswith("normalized_duplicate_fraction_"):
        return data.max_duplicate_fraction, (f"rule normalised duplicates: {split} rows whose {normal} repeats "
                                             f"an earlier row's <= max_duplicate_fraction={data.max_duplicate_fraction}")
    if column.startswith("near_duplicate_fraction_"):
        return near_duplicate, (f"rule near-duplicates: {split} rows with an earlier {near} <= "
                                f"max_near_duplicate_fraction={near_duplicate}")
    return None


def short_rows_note(config: BenchmarkConfig, split: str, source_rows: int | None) -> str:
    """What a split short of its requested rows means, and the settings that would pass."""
    requested = getattr(config.data, f"{split}_samples")
    has = f"the source's {split} split has {source_rows} rows" if source_rows is not None else \
        f"the source's {split} split has fewer rows"
    fits = f"<= {source_rows}" if source_rows is not None else "lower"
    return (f"rule requested rows: data.{split}_samples={requested} but {has}: set data.{split}_samples {fits} "
            f"(or null: all rows), or data.allow_small_data=true to train on fewer rows than asked")


def contract_expectations(config: BenchmarkConfig, columns: list[str],
                          examples: dict[str, list[dict]] | None = None,
                          source_rows: dict[str, int | None] | None = None) -> list:
    """The contract's bounds, one per fact column; a normalised / near-duplicate one carries its
    rule (``meta.notes``) and a few matching rows of both sides (``meta.examples``); a split short
    of its rows names the setting and the values that pass (``source_rows``: the source's rows)."""
    import great_expectations.expectations as gxe

    out = []
    for column in columns:
        rule = _text_rule(config, column)
        if rule is not None:
            meta = {"notes": rule[1], "examples": (examples or {}).get(column, [])}
            out.append(gxe.ExpectColumnValuesToBeBetween(column=column, max_value=rule[0], meta=meta))
        elif column == "test_rows_in_train_fraction":
            out.append(gxe.ExpectColumnValuesToBeBetween(column=column, max_value=config.data.max_overlap_fraction))
        elif column.startswith("duplicate_fraction_"):
            out.append(gxe.ExpectColumnValuesToBeBetween(column=column, max_value=config.data.max_duplicate_fraction))
        elif column.startswith("rows_short_") and not config.data.allow_small_data:
            split = column.removeprefix("rows_short_")
            note = short_rows_note(config, split, (source_rows or {}).get(split))
            out.append(gxe.ExpectColumnValuesToBeBetween(column=column, max_value=0, meta={"notes": note}))
        elif column.startswith("smallest_class_") and not config.data.allow_small_data:
            out.append(gxe.ExpectColumnValuesToBeBetween(column=column, min_value=config.data.min_rows_per_class))
    return out


def contract_relaxed(config: BenchmarkConfig, facts: dict) -> bool:
    """The data passed only because allow_small_data let it: such a run is never a baseline."""
    small = any(v > 0 for k, v in facts.items() if k.startswith("rows_short_")) or any(
        v < config.data.min_rows_per_class for k, v in facts.items() if k.startswith("smallest_class_"))
    return config.data.allow_small_data and small


# --- tokens -------------------------------------------------------------------------------


def token_expectations(config: BenchmarkConfig, expected_rows: int, vocab_size: int, cls_id: int | None,
                       check_order: bool, labels: list[int]) -> list:
    import great_expectations.expectations as gxe

    length = config.data.max_seq_len
    helpers = ("input_len", "mask_len", "id_min", "id_max", "first_id", "mask_min", "mask_max", "label")
    expectations = [gxe.ExpectColumnToExist(column=c) for c in helpers] + [
        gxe.ExpectTableRowCountToEqual(value=expected_rows),  # same rows as the snapshot
        gxe.ExpectTableRowCountToBeBetween(min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="input_len", min_value=length, max_value=length),
        gxe.ExpectColumnValuesToBeBetween(column="mask_len", min_value=length, max_value=length),
        gxe.ExpectColumnValuesToBeBetween(column="id_min", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="id_max", max_value=vocab_size - 1),
        gxe.ExpectColumnValuesToBeBetween(column="mask_min", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="mask_max", min_value=0, max_value=1),
        gxe.ExpectColumnValuesToNotBeNull(column="label"),
        gxe.ExpectColumnValuesToBeInSet(column="label", value_set=labels),
    ]
    if cls_id is not None:
        expectations.append(gxe.ExpectColumnValuesToBeInSet(column="first_id", value_set=[cls_id]))
    if check_order:  # labels line up with the snapshot row by row: the order contract holds
        expectations.append(gxe.ExpectColumnPairValuesToBeEqual(column_A="label", column_B="snapshot_label"))
    return expectations
