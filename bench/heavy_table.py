"""The heavy tier's outcome as a table: platform x path (passed / failed / skipped, seconds).

    python bench/heavy_table.py runs/heavy/heavy.xml                # a pytest --junitxml file
    python bench/heavy_table.py --platforms-only runs/ci/junit.xml  # a landing's run: the platforms' rows

The same table of a landing's run (``.ci/run`` prints it) shows which platform x path CI checked.

A test's platform is the registered platform named by its parameter (``[spark_per_job]``), else by
its file (``test_ray_elastic.py`` -> ray), else by its folder (``tests/platforms/ddp/`` -> ddp);
"(shared loop)" where none is named. Its path is what it checks, read from its name: across hosts,
SIGTERM, SIGKILL, host loss, elastic, resume, else "cell"; a test that ran nothing (not marked slow:
tests/conftest.py writes the junit property ``slow`` for those that are) is "no run", whatever its name
(an elastic setting refused is not an elastic recovery). A case's seconds are its junit time, or the
``case_seconds`` property a test records where a fixture ran its case beside others. A test that checks a
second path on the way (a host loss whose retry is the platform's cell across both hosts, asserted as such)
records it in the junit property ``also_checks`` (path names, comma-separated): that column then says
"1 passed (within host loss)", its seconds counted once, in the test's own column.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from pipelines import platforms

# (pattern in the test's file or name, path): first match wins
PATHS = (("sigkill", "SIGKILL"), ("sigterm", "SIGTERM"), ("across_two_emulated_hosts", "across hosts"),
         ("across_hosts", "across hosts"), ("on_the_cluster", "across hosts"), ("elastic", "elastic"),
         ("grows_back", "elastic"), ("returned_host", "elastic"), ("loses_a", "host loss"),
         ("losing", "host loss"), ("host_loss", "host loss"), ("resume", "resume"))
SHARED = "(shared loop)"
NO_RUN = "no run"
# files about one platform that neither name it nor sit in its tests/platforms/<name>/ folder: the
# relay platform is the test suite's own, registered by that file (a platform outside the project's folder)
FILE_PLATFORM = {"test_relay_platform": "relay (test platform)"}


def platform_of(classname: str, name: str) -> str:
    names = sorted(platforms.names(), key=len, reverse=True)  # spark_dataframe before spark
    param = re.search(r"\[([^\]]+)\]", name)
    for part in (param.group(1).split("-") if param else []):
        if part in names:
            return part
    stem = classname.rpartition(".")[2]
    if stem in FILE_PLATFORM:
        return FILE_PLATFORM[stem]
    words = f"{stem}_{name.partition('[')[0]}"  # the file, then the test's own name
    named = next((n for n in names if re.search(rf"(^|_){n}s?(_|$)", words)), None)
    folder = re.search(r"(?:^|\.)platforms\.(\w+)\.", classname)  # tests.platforms.ddp.test_elastic
    return named or (folder.group(1) if folder and folder.group(1) in names else SHARED)


def path_of(classname: str, name: str) -> str:
    text = f"{classname}.{name}".lower()
    return next((path for pattern, path in PATHS if pattern in text), "cell")


def read(junit: Path) -> list[dict]:
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    props = [{p.get("name"): p.get("value") for p in case.iter("property")} for case in cases]
    marked = any("slow" in p for p in props)  # a file written before the property: every test by its name
    out = []
    for case, prop in zip(cases, props):
        classname, name = case.get("classname", ""), case.get("name", "")
        outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else \
            "skipped" if case.find("skipped") is not None else "passed"
        # a case run by a module's fixture beside others (tests/platforms/side_by_side.py) records its own time
        own = prop.get("case_seconds")
        path = NO_RUN if marked and "slow" not in prop else path_of(classname, name)
        also = [a.strip() for a in prop.get("also_checks", "").split(",") if a.strip()] if path != NO_RUN else []
        out.append({"test": f"{classname}::{name}", "platform": platform_of(classname, name),
                     "path": path, "also": also, "outcome": outcome,
                     "seconds": float(own if own is not None else case.get("time", 0))})
    return out


def table(cases: list[dict], platforms_only: bool = False) -> str:
    if platforms_only:  # the rest of a whole suite (data, Airflow, the shared loop) in no platform's row
        cases = [c for c in cases if c["platform"] != SHARED]
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    within: dict[tuple[str, str], list[dict]] = defaultdict(list)  # checked on the way by another path's test
    for case in cases:
        cells[case["platform"], case["path"]].append(case)
        for also in case.get("also", []):
            within[case["platform"], also].append(case)
    paths = sorted({c["path"] for c in cases} | {p for c in cases for p in c.get("also", [])})
    rows = sorted({c["platform"] for c in cases})
    lines = ["| platform | " + " | ".join(paths) + " |", "|---" * (len(paths) + 1) + "|"]

    def outcomes(here: list[dict]) -> str:
        counts = {o: sum(c["outcome"] == o for c in here) for o in ("passed", "failed", "skipped")}
        return ", ".join(f"{n} {o}" for o, n in counts.items() if n)

    for platform in rows:
        row = []
        for path in paths:
            here, on_the_way = cells.get((platform, path), []), within.get((platform, path), [])
            parts = [f"{outcomes(here)} ({sum(c['seconds'] for c in here):.0f} s)"] if here else []
            parts += [f"{outcomes([c])} (within {c['path']})" for c in on_the_way]
            row.append("; ".join(parts))
        lines.append(f"| {platform} | " + " | ".join(row) + " |")
    total = sum(c["seconds"] for c in cases)
    failed = [c["test"] for c in cases if c["outcome"] == "failed"]
    lines.append(f"\n{len(cases)} tests, {total:.0f} s of test time; failed: {', '.join(failed) or 'none'}")
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    only = "--platforms-only" in args
    args = [a for a in args if a != "--platforms-only"]
    if len(args) != 1:
        sys.exit(__doc__)
    print(table(read(Path(args[0])), platforms_only=only))
