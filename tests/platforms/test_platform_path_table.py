"""bench/heavy_table.py: the platform x path table a landing's log ends with and the heavy tier prints,
read from a pytest junit file (the properties tests/conftest.py and the platforms' tests write)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("heavy_table", Path(__file__).resolve().parents[2] / "bench" /
                                               "heavy_table.py")
heavy_table = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(heavy_table)

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.platforms.test_host_loss" name="test_a_platform_loses_a_host_and_the_projects_retry_recovers_it[spark]" time="87.2">
  <properties><property name="slow" value="1"/><property name="also_checks" value="across hosts"/></properties></testcase>
<testcase classname="tests.platforms.ray.test_ray_elastic" name="test_ray_loses_a_worker_node_and_goes_on_with_one_worker_by_itself" time="66.0">
  <properties><property name="slow" value="1"/><property name="also_checks" value="host loss"/></properties></testcase>
<testcase classname="tests.platforms.ray.test_ray_elastic" name="test_an_elastic_setting_that_cannot_work_is_refused_naming_the_fields" time="0.1"/>
<testcase classname="tests.platforms.test_sigkill" name="test_a_killed_driver_leaves_no_process[ray]" time="0.0">
  <properties><property name="slow" value="1"/><property name="case_seconds" value="25.9"/></properties>
  <failure message="left 3"/></testcase>
</testsuite></testsuites>
"""


def test_each_test_lands_in_its_platform_and_path_and_a_path_checked_on_the_way_says_within_what(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    cases = {c["test"].rpartition("::")[2].partition("[")[0]: c for c in heavy_table.read(junit)}
    loss = cases["test_a_platform_loses_a_host_and_the_projects_retry_recovers_it"]
    elastic = cases["test_ray_loses_a_worker_node_and_goes_on_with_one_worker_by_itself"]
    assert (loss["platform"], loss["path"], loss["also"]) == ("spark", "host loss", ["across hosts"])
    assert (elastic["platform"], elastic["path"], elastic["also"]) == ("ray", "elastic", ["host loss"])
    refused = cases["test_an_elastic_setting_that_cannot_work_is_refused_naming_the_fields"]
    assert (refused["path"], refused["also"]) == ("no run", [])  # not marked slow: nothing ran
    killed = cases["test_a_killed_driver_leaves_no_process"]
    assert (killed["path"], killed["outcome"], killed["seconds"]) == ("SIGKILL", "failed", 25.9)

    lines = heavy_table.table(heavy_table.read(junit)).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {cells[0]: dict(zip(header[1:], cells[1:]))
            for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:] if line.startswith("|"))}
    assert rows["spark"]["host loss"] == "1 passed (87 s)"
    assert rows["spark"]["across hosts"] == "1 passed (within host loss)"  # its seconds counted once
    assert rows["ray"]["elastic"] == "1 passed (66 s)" and rows["ray"]["host loss"] == "1 passed (within elastic)"
    assert rows["ray"]["SIGKILL"] == "1 failed (26 s)" and rows["ray"]["no run"] == "1 passed (0 s)"
    assert lines[-1].startswith("4 tests, 179 s of test time; failed: ")
    assert "test_a_killed_driver_leaves_no_process[ray]" in lines[-1]
