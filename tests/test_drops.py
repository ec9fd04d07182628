"""Issue 52 item 6: what reading and preprocessing dropped is said once per run, points apart from trips,
and every reason is explained in docs/data.md (before: one line mixed `duplicate_point=8, resampled=108170,
stay_point=34653, too_short=61`, explained nowhere, printed twice: by preprocessing and by the trainer)."""
import logging
import re
from pathlib import Path

import numpy as np

from stfast.cli import main
from stfast.data.drops import INPUT_KEYS, POINT_KEYS, TRIP_KEYS, by_kind, describe

DOCS = Path(__file__).resolve().parent.parent / "docs" / "data.md"


def test_describe_puts_points_and_trips_apart():
    d = {"too_short": 61, "duplicate_point": 8, "resampled": 108170, "stay_point": 34653, "bad_line": 2,
         "empty_file": 0}
    assert by_kind(d) == {"points": {"duplicate_point": 8, "stay_point": 34653, "resampled": 108170},
                          "trips": {"too_short": 61}, "input": {"bad_line": 2}}
    line = describe(d, kept_points=1000)
    points, trips, skipped = line.split("; ")
    assert points == "dropped 142,831 points of 143,831 (duplicate_point 8, stay_point 34,653, resampled 108,170)"
    assert trips == "dropped 61 trips (too_short 61)"
    assert skipped.startswith("skipped 2 input records") and "bad_line 2" in skipped
    assert describe({}) == describe({"too_short": 0}) == "nothing dropped"


def test_describe_says_one_in_the_singular():
    assert describe({"stay_point": 1, "too_short": 1, "bad_line": 1}, kept_points=5) == (
        "dropped 1 point of 6 (stay_point 1); dropped 1 trip (too_short 1); "
        "skipped 1 input record (lines, files) (bad_line 1)")


def test_every_reason_is_explained_in_docs_data_md():
    text = DOCS.read_text()
    section = text.split("## What is dropped", 1)[1].split("\n## ", 1)[0]
    for key in POINT_KEYS + TRIP_KEYS + INPUT_KEYS:
        rows = [r for r in section.splitlines() if r.startswith("|") and f"`{key}`" in r.split("|")[1]]
        assert len(rows) == 1, key
        unit = rows[0].split("|")[2].strip()
        assert unit == ("points" if key in POINT_KEYS else "trips" if key in TRIP_KEYS else unit), key
        assert key not in INPUT_KEYS or unit.startswith("input"), key


def _points_csv(path: Path) -> dict:
    """A point CSV of 60 trips (a fix every 30 s, ~0.33 km apart) plus a repeated fix in 5 of them and 4
    two-fix trips: the counts preprocessing must report."""
    rng = np.random.default_rng(3)
    rows = ["trip_id,timestamp,lng,lat"]
    for t in range(64):
        n = 2 if t >= 60 else 12
        lng, lat, t0 = 104.0 + rng.uniform(0, 0.1), 30.6 + rng.uniform(0, 0.1), 1_477_958_400 + 3600 * t
        for i in range(n):
            rows.append(f"t{t},{t0 + 30 * i},{lng + 0.003 * i:.6f},{lat + 0.001 * i:.6f}")
            if t < 5 and i == 4:
                rows.append(rows[-1])  # a logger's repeat: duplicate_point
    path.write_text("\n".join(rows) + "\n")
    return {"duplicate_point": 5, "too_short": 4}


def test_a_run_says_its_drops_once_points_apart_from_trips(tmp_path, capsys, caplog):
    data = tmp_path / "points.csv"
    expect = _points_csv(data)
    caplog.set_level(logging.INFO, logger="stfast")
    assert main(["train", "--data", str(data), "--format", "csv", "--max-steps", "1", "--batch-size", "16",
                 "--out", str(tmp_path / "run"), "--no-progress", "--threads", "1", "--subtrips", "0"]) == 0
    out = capsys.readouterr()
    said = (out.out + out.err + caplog.text).splitlines()
    for key, n in expect.items():
        lines = [s for s in said if key in s]
        assert len(lines) == 1, (key, lines)  # once per run
    line = [s for s in said if "duplicate_point" in s][0]
    m = re.search(r"dropped ([\d,]+) points of ([\d,]+) \(([^)]*)\); dropped ([\d,]+) trips \(([^)]*)\)", line)
    assert m, line
    assert "duplicate_point 5" in m.group(3) and "too_short" not in m.group(3)
    assert "too_short 4" in m.group(5) and "duplicate_point" not in m.group(5)
    assert int(m.group(2).replace(",", "")) == 60 * 12 + 5 + 4 * 2  # every input fix
