"""The report's "What it takes to run each platform": install footprint, processes, ports,
configuration across machines, lines of code here and orchestration features, every figure
measured in the run (``RunSummary.what_it_takes``, ``pipelines.measure.footprint``) or shown by
a named test (``Platform.features``)."""

from __future__ import annotations

from pipelines import platforms
from pipelines.measure.footprint import BASE_DISTRIBUTIONS
from pipelines.report.tables import _code, _md_table, _text
from pipelines.runfolder.summary import RunSummary

TITLE = "What it takes to run each platform"
COLUMNS = ["platform", "cluster", "install MB (largest)", "programs", "processes per cell",
           "standing for the run", "TCP ports per cell (beyond loopback)", "standing ports (beyond loopback)",
           "set to run across machines", "package lines"]
FEATURE_COLUMNS = ["platform", *platforms.FEATURES]
# frameworks the seed article names that cannot run here, with what happened when tried and the
# command that tries again (bench/RESULTS.md, "Horovod", holds its output)
NOT_RUN = {
    "Horovod": ("horovod 0.28.1 (2023-06), the package registry's last release, does not build against the "
                "pinned torch 2.13: its PyTorch extension compiles with -std=c++14 and torch's headers stop it "
                "(\"#error C++17 or later compatible compiler is required to use PyTorch\"); the fix is in "
                "Horovod's repository, unreleased. No fork, patched source or git install is used. Tried again "
                "by `bash bench/horovod_try.sh` (a scratch environment, about 5 minutes)."),
}


def _programs() -> str:
    """The programs the registered platforms need beside Python, e.g. `java` (its JDK is sized)."""
    names = sorted({prog for p in platforms.all_platforms() for prog in p.programs})
    return ", ".join(f"`{n}`" for n in names) or "none"


def _ports(count: int | None, beyond: int | None) -> str:
    return "" if count is None else f"{count} ({beyond})"


def _rows(summary: RunSummary) -> list[list]:
    return [[n.label, n.lifetime or "none of its own",
             f"{n.install_mb:.0f} ({n.install_largest})" if n.install_largest else f"{n.install_mb:.0f}",
             n.programs or "", n.processes_per_cell or "", n.processes_per_run or "",
             _ports(n.ports_per_cell, n.ports_per_cell_beyond_loopback),
             _ports(n.ports_per_run, n.ports_per_run_beyond_loopback),
             n.cluster_config or "cluster.hosts only", n.package_lines] for n in summary.what_it_takes]


def _feature_rows(summary: RunSummary) -> list[list]:
    rows = []
    for needs in summary.what_it_takes:
        platform = platforms.find(needs.platform)
        brings = platform.features if platform else {}
        rows.append([needs.label, *("yes" if f in brings else "" for f in platforms.FEATURES)])
    return rows


def _evidence_lines(summary: RunSummary) -> list[str]:
    lines, seen = [], set()
    for needs in summary.what_it_takes:
        platform = platforms.find(needs.platform)
        for feature, (what, test) in (platform.features if platform else {}).items():
            if (platform.package, feature) in seen:  # a variant or second feed: said once per package
                continue
            seen.add((platform.package, feature))
            lines.append(f"- {_text(needs.label)}, {_text(feature)}: {_text(what)}. Shown by {_code(test)}.")
    return lines or ["No platform of this run names a feature."]


def what_it_takes_markdown(summary: RunSummary) -> str:
    """The section (Markdown, with its own "## " title); "" when the summary has no rows (old runs)."""
    if not summary.what_it_takes:
        return ""
    base = " and ".join(BASE_DISTRIBUTIONS)
    cells = ", ".join(f"{n.label}: {n.measured_cell}" for n in summary.what_it_takes if n.measured_cell)
    return "\n\n".join([
        f"## {TITLE}",
        _md_table(COLUMNS, _rows(summary)),
        "### Orchestration features a test here shows",
        "Blank: the platform as deployed here does not bring it, or no test of this project shows it yet.",
        _md_table(FEATURE_COLUMNS, _feature_rows(summary)),
        "\n".join(_evidence_lines(summary)),
        "### Not run here",
        "\n".join(f"- **{_text(name)}**: {why}" for name, why in NOT_RUN.items()),
        "### How it was measured",
        "\n".join([
            f"- **install MB**: the dependency closure of the platform's Python distributions (their "
            f"Requires-Dist without extras) less that of {base}, which every platform trains with; each "
            f"distribution sized by the files its RECORD lists, in this run's environment. **programs**: the "
            f"installation folder of a program it needs beside Python (the one on PATH: {_programs()}).",
            f"- **processes and ports**: the cell's resource sampler (`<cell>/resources.json`): processes "
            f"started in the cell's timed window by kind (ranks as `rank`), and those the cell used that were "
            f"alive before it (a cluster kept for the run); the TCP ports they listened on (every fourth "
            f"sample), counted once per address. From the cell with the most workers: {_text(cells)}.",
            "- **set to run across machines**: the platform's deployment settings (`engines.<name>`, read "
            "from its settings model) and the files it needs; every platform here also takes the run's "
            "hosts (`cluster.hosts`).",
            "- **package lines**: code lines (neither blank nor comment-only) of its package in "
            "`pipelines/platforms/`.",
        ]),
    ]) + "\n"
