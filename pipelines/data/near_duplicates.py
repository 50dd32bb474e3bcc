"""Duplicates and train/test overlap beyond the exact text: on normalised text, and near-copies.

A review copied into the test split with its case, spacing, punctuation or ``<br />`` markup
changed is the same review to the model. Two checks catch it, both on the snapshot splits:

* **normalised**: the text after ``normalize_text`` (Unicode NFKC, markup and HTML entities
  removed, case-folded, punctuation removed, whitespace collapsed) is compared exactly;
* **near**: MinHash (``datasketch``, ``NUM_PERM`` permutations, fixed ``SEED``) of the
  normalised text's ``SHINGLE_WORDS``-word shingles, candidates from ``MinHashLSH`` and each
  candidate confirmed by the exact Jaccard similarity of the two shingle sets (>= threshold).
  A few words changed in a long review keep it above 0.9.

``text_duplicates(frames, threshold)`` returns the contract facts (fractions, one number per
split or pair) and, per fact, a few examples: the row ids (position in the snapshot split)
and text snippets of both sides. The same data gives the same facts and examples.
"""

from __future__ import annotations

import html
import re
import unicodedata
import zlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

SHINGLE_WORDS = 3  # word shingles: a changed word breaks 3 of a review's ~230 shingles
NUM_PERM = 128  # MinHash permutations: Jaccard estimate std ~0.03 at 0.9
SEED = 1  # fixed: the same snapshot always gives the same sketches, candidates and facts
# LSH looks for candidates this far below the threshold (0.7 for 0.9: 14 bands of 9 rows, a pair
# at Jaccard 0.9 is missed with p ~0.001); each candidate's exact Jaccard decides
LSH_SLACK = 0.2
MAX_EXAMPLES = 3
SNIPPET_CHARS = 80
TRAIN_SIDES = ("train", "validation")  # test is compared with both (validation is carved from train)

_TAG = re.compile(r"</?[A-Za-z][^<>]*>")  # <br />, <i>, </p>; not "<3" or "a < b ... c > d"
_APOSTROPHES = "'\u2019\u02bc`"  # removed: don't == dont


class _WordChars(dict):
    """``str.translate`` table, filled per character seen: letters and digits kept, apostrophes
    removed, any other character (punctuation, symbols, ``_``) a word break. 3x a regex's speed."""

    def __missing__(self, code: int) -> int | None:
        char = chr(code)
        value = self[code] = None if char in _APOSTROPHES else code if char.isalnum() else 32
        return value


_WORD_CHARS = _WordChars()
_MIX = (np.uint32(0x9E3779B1), np.uint32(0x85EBCA77))


def normalize_text(text: object) -> str:
    """NFKC, markup and entities removed, case-folded, punctuation removed, spaces collapsed."""
    if not isinstance(text, str):
        return ""
    text = _TAG.sub(" ", text)
    if "&" in text:  # &amp; &#39; ...
        text = html.unescape(text)
    return " ".join(unicodedata.normalize("NFKC", text).casefold().translate(_WORD_CHARS).split())


def snippet(text: object, limit: int = SNIPPET_CHARS) -> str:
    flat = " ".join(str(text).split()) if isinstance(text, str) else repr(text)
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass
class DuplicateReport:
    """Facts (column -> fraction) and examples (column -> [{row, text, match, match_text, ...}])."""

    facts: dict[str, float] = field(default_factory=dict)
    examples: dict[str, list[dict]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)


class _WordHashes(dict):
    """Word -> stable 32-bit hash (crc32), computed once per distinct word."""

    def __missing__(self, word: str) -> int:
        value = self[word] = zlib.crc32(word.encode("utf-8"))
        return value


def _mix(ids: np.ndarray, k: int) -> np.ndarray:
    """Hash of each run of k consecutive word hashes (uint32 arithmetic wraps on purpose)."""
    count = len(ids) - k + 1
    with np.errstate(over="ignore"):
        out = ids[:count].copy()
        for offset in range(1, k):
            out = (out * _MIX[offset % 2]) ^ ids[offset: count + offset]
    return out


def shingle_hashes(texts: list[str], k: int = SHINGLE_WORDS, chunk: int = 1024) -> list[np.ndarray]:
    """Per normalised text, the hashes of its k-word shingles (uint32, in order, repeats kept); a
    text of fewer than k words is one shingle, an empty one none. Texts are hashed a chunk at a
    time (one split and one array per chunk, not per text)."""
    words, out = _WordHashes(), []
    for first in range(0, len(texts), chunk):
        batch = texts[first: first + chunk]
        lengths = [t.count(" ") + 1 if t else 0 for t in batch]  # normalised: single spaces
        ids = np.array(list(map(words.__getitem__, " ".join(batch).split())), dtype=np.uint32)
        if sum(lengths) != len(ids):
            raise ValueError("shingle_hashes takes normalised texts (normalize_text): words one space apart")
        runs = _mix(ids, k) if len(ids) >= k else ids[:0]
        start = 0
        for length in lengths:
            if length >= k:
                out.append(runs[start: start + length - k + 1])
            else:
                out.append(_mix(ids[start: start + length], length) if length else ids[:0])
            start += length
    return out


class _Sketches:
    """Every row's shingles and MinHash, all in one MinHashLSH (key: the row's position in
    ``texts``); ``near(i)`` gives the rows at Jaccard >= threshold, confirmed on the exact sets."""

    def __init__(self, texts: list[str], threshold: float):
        from datasketch import LeanMinHash, MinHash, MinHashLSH

        work = MinHash(num_perm=NUM_PERM, seed=SEED, hashfunc=int)  # shingles are 32-bit hashes already
        self.shingles = shingle_hashes(texts)
        self.minhashes = []
        for shingles in self.shingles:
            sketch = None
            if len(shingles):
                work.clear()
                work.update_batch(shingles.tolist())
                sketch = LeanMinHash(work)
            self.minhashes.append(sketch)
        self.threshold = threshold
        self.lsh = MinHashLSH(threshold=max(0.05, threshold - LSH_SLACK), num_perm=NUM_PERM)
        with self.lsh.insertion_session() as session:
            for row, sketch in enumerate(self.minhashes):
                if sketch is not None:
                    session.insert(row, sketch, check_duplication=False)
        self._sets: dict[int, np.ndarray] = {}

    def _set(self, row: int) -> np.ndarray:
        if row not in self._sets:
            self._sets[row] = np.unique(self.shingles[row])
        return self._sets[row]

    def near(self, row: int) -> list[tuple[int, float]]:
        """(other row, Jaccard) of every other row at >= threshold, in row order."""
        sketch = self.minhashes[row]
        if sketch is None:
            return []
        out = []
        for other in sorted(self.lsh.query(sketch)):
            if other != row:
                a, b = self._set(row), self._set(other)
                inter = len(np.intersect1d(a, b, assume_unique=True))
                similarity = inter / (len(a) + len(b) - inter)
                if similarity >= self.threshold:
                    out.append((other, similarity))
        return out


def _example(frames, split: str, row: int, other: str, match: int, similarity: float | None) -> dict:
    out = {"row": f"{split}[{row}]", "text": snippet(frames[split]["text"].iloc[row]),
           "match": f"{other}[{match}]", "match_text": snippet(frames[other]["text"].iloc[match])}
    if similarity is not None:
        out["jaccard"] = round(float(similarity), 3)
    return out


def _normalised_checks(frames: dict[str, pd.DataFrame], normalised: dict[str, list[str]],
                       report: DuplicateReport) -> None:
    for split, texts in normalised.items():
        first: dict[str, int] = {}
        hits = []
        for row, text in enumerate(texts):
            if not text:
                continue
            if text in first:
                hits.append((row, first[text]))
            else:
                first[text] = row
        column = f"normalized_duplicate_fraction_{split}"
        report.facts[column] = len(hits) / len(texts) if texts else 0.0
        report.counts[column] = len(hits)
        report.examples[column] = [_example(frames, split, r, split, m, None) for r, m in hits[:MAX_EXAMPLES]]
    seen = {}
    for side in TRAIN_SIDES:
        for row, text in enumerate(normalised.get(side, [])):
            if text:
                seen.setdefault(text, (side, row))
    test = normalised.get("test", [])
    hits = [(row, seen[text]) for row, text in enumerate(test) if text and text in seen]
    column = "test_rows_in_train_normalized_fraction"
    report.facts[column] = len(hits) / len(test) if test else 0.0
    report.counts[column] = len(hits)
    report.examples[column] = [_example(frames, "test", r, side, m, None) for r, (side, m) in hits[:MAX_EXAMPLES]]


def _best(matches: list[tuple[str, int, float]]) -> tuple[str, int, float] | None:
    return max(matches, key=lambda m: m[2]) if matches else None  # the first of equals: lowest row


def _near_checks(frames: dict[str, pd.DataFrame], normalised: dict[str, list[str]], threshold: float,
                 report: DuplicateReport) -> None:
    """Within a split: rows with a near-copy earlier in it; test: rows with one in train/validation."""
    splits = list(normalised)
    owner = [(split, row) for split in splits for row in range(len(normalised[split]))]
    sketches = _Sketches([t for split in splits for t in normalised[split]], threshold)
    within: dict[str, list] = {split: [] for split in splits}
    overlap = []
    for index, (split, row) in enumerate(owner):
        matches = [(*owner[other], similarity) for other, similarity in sketches.near(index)]
        earlier = _best([m for m in matches if m[0] == split and m[1] < row])
        if earlier:
            within[split].append((row, *earlier))
        if split == "test":
            in_train = _best([m for m in matches if m[0] in TRAIN_SIDES])
            if in_train:
                overlap.append((row, *in_train))
    for split, hits in within.items():
        column = f"near_duplicate_fraction_{split}"
        report.facts[column] = len(hits) / len(normalised[split]) if normalised[split] else 0.0
        report.counts[column] = len(hits)
        report.examples[column] = [_example(frames, split, r, o, m, s) for r, o, m, s in hits[:MAX_EXAMPLES]]
    test = normalised.get("test", [])
    column = "test_rows_near_train_fraction"
    report.facts[column] = len(overlap) / len(test) if test else 0.0
    report.counts[column] = len(overlap)
    report.examples[column] = [_example(frames, "test", r, o, m, s) for r, o, m, s in overlap[:MAX_EXAMPLES]]


def text_duplicates(frames: dict[str, pd.DataFrame], threshold: float) -> DuplicateReport:
    """Normalised duplicates and near-duplicates within each split, and of test in train."""
    report = DuplicateReport(settings={"normalisation": "NFKC, markup removed, case-folded, punctuation "
                                                        "removed, whitespace collapsed",
                                       "jaccard_threshold": threshold, "shingle_words": SHINGLE_WORDS,
                                       "num_perm": NUM_PERM, "seed": SEED})
    if any("text" not in f.columns for f in frames.values()):
        return report
    normalised = {split: [normalize_text(t) for t in frame["text"].tolist()] for split, frame in frames.items()}
    _normalised_checks(frames, normalised, report)
    _near_checks(frames, normalised, threshold, report)
    return report
