"""The network as a benchmark dimension: evaluation per (backend, strategy, network, workers),
the report's Network section (communication and epoch time vs bandwidth, bytes per step, the
break-even bandwidth of the communication strategies), the trend keys, on synthetic results
whose communication phase grows as the emulated links' bandwidth shrinks."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from pipelines.evaluation import aggregate_key, evaluate_run, summary_metrics
from pipelines.report import TIME_COLUMNS, break_even, break_even_rows, build_report, network_rows
from pipelines.report.network import bandwidth, network_lines
from pipelines.runfolder.index import load_record
from pipelines.runfolder.summary import read_summary
from pipelines.web.trends import trend_series
from tests.synthetic_results import GRADIENT_BYTES, make_result, write_synthetic_run

NETWORKS = ["unshaped", "1gbit", "100mbit"]
# (payload per step, codec seconds per step): fp16 halves the payload at little cost; powersgd-r2
# sends ~2 % of it but its compression costs 0.1 s a step: slower unshaped, faster on slow links
PAYLOAD = {"default": (GRADIENT_BYTES, 0.0), "fp16": (GRADIENT_BYTES / 2, 0.002),
           "powersgd-r2": (GRADIENT_BYTES / 50, 0.1)}


def _per_strategy(backend, strategy, network, workers, repeat):
    payload, codec = PAYLOAD[strategy]
    return {"comm_bytes_per_step": payload if workers > 1 else None, "codec_seconds_per_step": codec}


@pytest.fixture
def network_run(make_config):
    config = make_config(backends=["ddp"], worker_counts=[1, 2], strategies=list(PAYLOAD),
                         networks=NETWORKS, **{"cluster.kind": "emulated"})
    paths, results = write_synthetic_run(config, cell_kwargs=_per_strategy)
    return config, paths, results, evaluate_run(config, paths)


def test_cells_and_aggregates_carry_the_network(network_run):
    config, _, results, summary = network_run
    assert config.networks() == NETWORKS and summary.networks == NETWORKS and summary.cluster == "emulated"
    assert {"ddp-unshaped-w1-r0", "ddp-100mbit-w2-r0", "ddp-powersgd-r2-100mbit-w2-r0"} <= set(results)
    aggs = {a.key: a for a in summary.aggregates}
    # 3 networks x (1 worker default + 2 workers x 3 strategies)
    assert len(aggs) == 12 and "ddp-powersgd-r2-1gbit-w2" in aggs and "ddp-w2" not in aggs
    assert aggregate_key("ddp", "powersgd-r2", 2, "100mbit") == "ddp-powersgd-r2-100mbit-w2"
    assert aggregate_key("ddp", "default", 2) == "ddp-w2"  # local keys as before networks
    for strategy in PAYLOAD:
        comm = [aggs[aggregate_key("ddp", strategy, 2, n)].communication_seconds for n in NETWORKS]
        assert comm == sorted(comm) and comm[0] < comm[-1]  # grows as bandwidth shrinks
    for name in ("ddp-100mbit-w2-r0", "ddp-fp16-unshaped-w2-r0"):
        result, agg = results[name], aggs[name.removesuffix("-r0")]
        assert agg.network == result.network and agg.cluster == "emulated"
        assert agg.epoch_seconds == statistics.median(e.epoch_seconds for e in result.epochs)
        assert agg.link_bytes_per_step == result.link_bytes_per_step > 0
        assert agg.comm_bytes_per_step == result.comm_bytes_per_step
        assert agg.communication_seconds == result.phases["communication"] == agg.phases["communication"]
    # speed-up and overhead within one network: the 1-worker cell of the same network
    slow = aggs["ddp-100mbit-w2"]
    assert slow.speedup == pytest.approx(aggs["ddp-100mbit-w1"].training_seconds.median
                                         / slow.training_seconds.median)
    assert slow.speedup < aggs["ddp-unshaped-w2"].speedup and slow.overhead_vs_reference_total == 0.0
    row = next(c for c in summary.cells if c.cell == "ddp-powersgd-r2-1gbit-w2-r0")
    assert (row.network, row.cluster) == ("1gbit", "emulated") and row.link_bytes_per_step > 0
    metrics = summary_metrics(summary)
    assert metrics["ddp-100mbit-w2/link_bytes_per_step_median"] == slow.link_bytes_per_step


def _difference(summary, strategy: str) -> list[tuple[float, float]]:
    aggs = {a.key: a for a in summary.aggregates}
    return [(bandwidth(n), aggs[aggregate_key("ddp", strategy, 2, n)].epoch_seconds
             - aggs[aggregate_key("ddp", "default", 2, n)].epoch_seconds) for n in NETWORKS]


def test_break_even_bandwidth(network_run):
    config, _, _, summary = network_run
    points = _difference(summary, "powersgd-r2")
    assert points[0][1] > 0 and points[1][1] < 0 and points[2][1] < 0  # slower unshaped, faster below
    (b_hi, d_hi), (b_lo, d_lo) = points[0], points[1]
    expected = math.exp(math.log(b_lo) + (0 - d_lo) * (math.log(b_hi) - math.log(b_lo)) / (d_hi - d_lo))
    found = break_even(points)
    assert found.kind == "between" and found.bits_per_second == pytest.approx(expected)
    assert 1e9 < found.bits_per_second < 9e9
    assert all(d < 0 for _, d in _difference(summary, "fp16"))
    rows = {row[1]: row for row in break_even_rows(summary, config)}
    assert set(rows) == {"fp16", "powersgd-r2"}  # comm strategies only, never the default
    assert rows["fp16"][-1] == "pays off at every measured network"
    text = rows["powersgd-r2"][-1]
    assert text.startswith("below ~") and "between 1gbit and unshaped" in text
    assert "100mbit -" in rows["powersgd-r2"][3] and "unshaped +" in rows["powersgd-r2"][3]


def test_break_even_edge_cases():
    assert break_even([(1e8, 1.0), (1e9, 2.0)]).text == "never, down to 100 Mbit/s"
    assert break_even([(1e8, -1.0), (1e9, -2.0)]).kind == "always"
    assert break_even([(1e8, 1.0), (1e9, -2.0)]).kind == "mixed"
    assert break_even([]).kind == "unknown"
    half = break_even([(1e8, -1.0), (1e10, 1.0)])  # the midpoint in log-bandwidth
    assert half.bits_per_second == pytest.approx(1e9)
    assert break_even([(1e8, -3.0), (1e9, -1.0), (1e10, 1.0)]).bits_per_second == pytest.approx(10**9.5)


def test_report_has_a_network_section(network_run):
    config, paths, _, summary = network_run
    out = build_report(config, paths)
    md = paths.report_markdown.read_text()
    assert "## Network" in md and md.count("## Network") == 1
    section = md.split("## Network")[1].split("\n## ")[0]
    assert "| ddp | default | 2 | 100mbit | 100 Mbit/s |" in section
    assert "Break-even bandwidth" in section and "pays off at every measured network" in section
    # two narrow tables (times; bytes per step) of 9 rows each, and the break-even table's 2
    assert len([ln for ln in section.splitlines() if ln.startswith("| ddp |")]) == 9 * 2 + 2
    assert len(network_rows(summary)) == 9  # 1-worker cells use no link
    comparison = md.split("## Comparison")[1].split("\n## ")[0]
    header = [c.strip() for c in comparison.splitlines()[4].strip("|").split("|")]  # the time table
    assert header == [c for c in TIME_COLUMNS[:2] + ["network"] + TIME_COLUMNS[2:] if "CI" not in c]  # 1 repeat
    assert "| ddp | torchrun | 100mbit | 2 |" in comparison
    assert "| ddp | 100mbit | 2 |" in comparison  # the quality and the throughput/cost tables
    verdict = md.split("## Verdict")[1].split("\n## ")[0]
    assert "- At 2 workers over 100mbit, **ddp** (the only platform) took " in verdict
    assert "Fastest elsewhere: at 1 worker over unshaped ddp (" in verdict  # 6 settings: 3 told in full
    plots = [p for p in out["plots"] if p.endswith("network.png")]
    assert len(plots) == 1 and paths.plot("network").read_bytes()[:4] == b"\x89PNG"
    assert "<img" in paths.report_html.read_text()


def test_link_bytes_per_step_and_true_host_counts_for_every_platform(make_config):
    """Every platform's link bytes per step, all traffic and the training steps alone ("not measured"
    where its loop does not read the counters); the cluster's hosts counted, not the driver's."""
    from pipelines.report.network import NETWORK_COLUMNS

    config = make_config(backends=["ddp", "determined"], worker_counts=[2], networks=["1gbit"],
                         **{"cluster.kind": "emulated"})
    paths, results = write_synthetic_run(config)
    ddp = results["ddp-1gbit-w2-r0"]
    ddp.model_copy(update={"link_bytes_per_train_step": 0.9 * ddp.link_bytes_per_step}).write(
        paths.cell("ddp", 2, 0, network="1gbit").result)
    summary = evaluate_run(config, paths)
    rows = {r[0]: dict(zip(NETWORK_COLUMNS, r)) for r in network_rows(summary)}
    for backend in ("ddp", "determined"):
        assert float(rows[backend]["link MB/step (all traffic)"]) == round(
            results[f"{backend}-1gbit-w2-r0"].link_bytes_per_step / 2**20, 3) > 0
    assert float(rows["ddp"]["link MB/training step"]) == round(0.9 * ddp.link_bytes_per_step / 2**20, 3)
    assert rows["determined"]["link MB/training step"] == "not measured"

    assert summary.hardware.cluster_hosts == ["h0", "h1"] and summary.hardware.hosts == ["bench-host"]
    assert summary.hardware.hardware_class.endswith("; 2 host(s) (emulated)")
    build_report(config, paths)
    md = paths.report_markdown.read_text()
    assert "- Cluster: 2 emulated host(s), h0, h1; the driver ran on bench-host" in md
    assert f"Hardware here: {summary.hardware.hardware_class}." in md


def test_network_values_are_escaped(network_run):
    config, _, _, summary = network_run
    odd = summary.model_copy(update={"aggregates": [a.model_copy(update={"network": "x|<b>"})
                                                    for a in summary.aggregates]})
    text = "\n".join(network_lines(odd, config))
    assert "x&#124;&lt;b&gt;" in text and "<b>" not in text


def test_local_runs_look_as_before(make_config):
    config = make_config(backends=["ddp", "spark"], worker_counts=[1, 2])
    paths, results = write_synthetic_run(config)
    assert set(results) == {"ddp-w1-r0", "ddp-w2-r0", "spark-w1-r0", "spark-w2-r0"}
    assert all(r.network == "local" and r.cluster == "local" and r.link_bytes_per_step is None
               for r in results.values())
    summary = evaluate_run(config, paths)
    assert [a.key for a in summary.aggregates] == ["ddp-w1", "ddp-w2", "spark-w1", "spark-w2"]
    out = build_report(config, paths)
    md = paths.report_markdown.read_text()
    assert "## Network" not in md and len(out["plots"]) == 6 and not paths.plot("network").exists()
    header = md.split("## Comparison")[1].splitlines()[4]
    assert header.startswith("| backend | mode | workers |") and "network" not in header
    assert "over local" not in md.split("## Verdict")[1].split("\n## ")[0]  # no network named

    # a summary written before networks existed reads as local, keys and report unchanged
    old = json.loads(paths.summary.read_text())
    new_fields = ("network", "cluster", "link_bytes_per_step", "epoch_seconds", "communication_seconds")
    for part in ("cells", "aggregates"):
        old[part] = [{k: v for k, v in row.items() if k not in new_fields} for row in old[part]]
    for key in ("networks", "cluster"):
        old.pop(key)
    paths.summary.write_text(json.dumps(old))
    again = read_summary(paths)
    assert again.networks == ["local"] and {a.network for a in again.aggregates} == {"local"}
    assert [a.key for a in again.aggregates] == [a.key for a in summary.aggregates]
    build_report(config, paths)
    assert paths.report_markdown.read_text() == md
    record = load_record(paths.root)
    assert set(record.aggregates) == {"ddp-w1", "ddp-w2", "spark-w1", "spark-w2"}
    assert record.aggregates["ddp-w2"]["network"] == "local"


def test_trend_keys_name_the_network_only_off_this_host(network_run, make_config):
    _, paths, _, _ = network_run
    record = load_record(paths.root)
    assert "ddp-100mbit-w2" in record.aggregates and "ddp-w2" not in record.aggregates
    series = {s["key"]: s for s in trend_series([record], record.profile)["series"]}
    assert series["ddp-100mbit-w2"]["network"] == "100mbit"
    assert series["ddp-100mbit-w2"]["label"] == "ddp, 2 workers over 100mbit"
    keys = [k for k in series if k.endswith("-w2") and "-" not in k.removeprefix("ddp-").removesuffix("-w2")]
    assert keys == ["ddp-unshaped-w2", "ddp-1gbit-w2", "ddp-100mbit-w2"]  # fastest link first


def test_make_result_network_defaults_to_local():
    local = make_result("ddp", 2)
    assert local == make_result("ddp", 2, network="local")
    assert (local.network, local.cluster, local.link_bytes) == ("local", "local", None)
    slow, fast = make_result("ddp", 2, network="100mbit"), make_result("ddp", 2, network="unshaped")
    assert slow.phases["communication"] > fast.phases["communication"] > local.phases["communication"]
    assert slow.link_bytes_per_step == fast.link_bytes_per_step and set(slow.link_bytes) == {"h0", "h1"}


def _sweep_module():
    import importlib.util

    from pipelines.runfolder.paths import PROJECT_ROOT

    spec = importlib.util.spec_from_file_location("network_sweep", PROJECT_ROOT / "bench" / "network_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_network_sweep_table_and_command(network_run, capsys, tmp_path):
    sweep = _sweep_module()
    _, paths, _, summary = network_run
    header, rows = sweep.sweep_table(summary)
    assert header[:5] == ["platform", "strategy", "workers", "unshaped comm s", "unshaped epoch s"]
    assert header[-2:] == ["100mbit comm x", "100mbit epoch x"] and len(header) == 3 + 6 + 4
    assert [r[1] for r in rows] == ["default", "fp16", "powersgd-r2"]  # default first, 1 worker left out
    aggs = {a.key: a for a in summary.aggregates}
    default = dict(zip(header, rows[0]))
    assert default["100mbit epoch s"] == f"{aggs['ddp-100mbit-w2'].epoch_seconds:.2f}"
    ratio = aggs["ddp-100mbit-w2"].communication_seconds / aggs["ddp-unshaped-w2"].communication_seconds
    assert default["100mbit comm x"] == f"{ratio:.2f}x" and ratio > 10

    assert sweep.main(["--from-run", str(paths.root)]) == 0
    printed = capsys.readouterr().out
    assert "x = ratio to unshaped" in printed and "powersgd-r2" in printed and printed.count("\n") == 6

    args = sweep.main.__globals__["argparse"].Namespace(
        profile="cluster", networks=NETWORKS, workers=[2], repeats=1, output=tmp_path, run_id="sweep",
        backends=["ddp", "spark"], strategies=None, epochs=1, train_samples=256)
    cmd = sweep.sweep_command(args)
    assert cmd[1:6] == ["-m", "pipelines", "run", "--profile", "cluster"]
    sets = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--set"]
    assert sets == ['networks=["unshaped","1gbit","100mbit"]', "worker_counts=[2]", "repeats=1",
                    'backends=["ddp","spark"]', "epochs=1", "train_samples=256"]
    assert cmd[cmd.index("--run-id") + 1] == "sweep" and cmd[cmd.index("--output") + 1] == str(tmp_path)
