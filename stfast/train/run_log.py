"""The run's outputs: the run log ``metrics.jsonl`` in a run folder, one JSON object per line, written by its
one owner (:class:`RunLog`, rank 0 of a run) and read by ``"type"`` (:func:`read_rows`); at the end of a run
also summary.json, learning_curve.png and report.png / report.html (:func:`stfast.train.report.write_outputs`; the trainer
writes test_predictions.csv before, stfast.train.run_predictions).

Row types and their keys (epochs are numbered from 1 in every row type: ``epoch`` N is the N-th):
- ``epoch``: epoch, step, train_loss, val_mape (fraction), val_mae and val_rmse (s), samples_per_s, lr,
  wall_s (s since this process began training: a --compile warm-up included);
- ``window``: an accumulation window (stfast.accum.controller): window, k, steps, trips, wall times, noise
  scale, k_next, …, step, wall_s (the training clock --time-budget reads: a --compile warm-up excluded, kept
  across --resume), accumulation (the spec);
- ``step``: under data parallelism with the slicer, per optimizer step: step, epoch (the one it is in), shard
  sizes, predicted and measured imbalance, compute and idle seconds per rank, the cost model
  (BalancedBatchSampler.observe_step);
- ``bad_step``: a skipped optimizer step with a non-finite loss or gradient: bad_step (its number),
  at_epoch, at_batch, reason, loss.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger("stfast.train")

TYPES = ("epoch", "window", "step", "bad_step")
FILE = "metrics.jsonl"


def write_summary(out: Path, summary: dict) -> None:
    """Write ``out/summary.json`` durably and atomically (:func:`stfast.data.durable.write_bytes_atomic`).
    Raises ValueError: an OS error (a full disk at the end of a run), in one line naming the file."""
    from ..data.durable import os_error_line, write_bytes_atomic

    try:
        write_bytes_atomic(out / "summary.json", json.dumps(summary, indent=2).encode())
    except OSError as e:
        raise ValueError(os_error_line(e, f"cannot write {out / 'summary.json'}")) from None


class RunLog:
    """Appends typed rows to ``run_dir/metrics.jsonl``. ``enabled`` False (ranks other than 0): writes
    nothing, its size is 0. On ``--resume`` the log is cut back to the size recorded in the checkpoint
    (rows written after it would be written again)."""

    def __init__(self, run_dir: str | Path, enabled: bool = True):
        self.path = Path(run_dir) / FILE
        self.enabled = enabled

    def append(self, type: str, row: dict) -> None:  # noqa: A002 - the rows' own key
        """Write ``{"type": type, **row}`` as one line. Raises ValueError for an unknown type."""
        if type not in TYPES:
            raise ValueError(f"unknown metrics row type {type!r} (one of {', '.join(TYPES)})")
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(json.dumps({"type": type, **row}) + "\n")

    def size(self) -> int:
        """Bytes written so far (what a checkpoint records, to cut back to on resume)."""
        return self.path.stat().st_size if self.path.is_file() else 0

    def cut_back(self, size: int | None) -> None:
        """Drop what was written after the log held ``size`` bytes (None: keep all), and a partial last
        line (an interrupted write, or a file cut short below ``size``): rows appended after it would be
        glued to it and the log would stay unreadable."""
        if not self.enabled:
            return
        if size is not None and self.size() > size:
            with open(self.path, "r+b") as f:
                f.truncate(size)
        if self.size() and not self._ends_with_newline():
            data = self.path.read_bytes()
            keep = data.rfind(b"\n") + 1
            log.warning("%s ends in a partial line (%d bytes, an interrupted write): dropped", self.path,
                        len(data) - keep)
            with open(self.path, "r+b") as f:
                f.truncate(keep)

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def discard(self) -> None:
        """Start afresh (a job restarted before its first checkpoint)."""
        if self.enabled:
            self.path.unlink(missing_ok=True)


def read_rows(run_dir: str | Path) -> dict[str, list[dict]]:
    """The rows of ``run_dir/metrics.jsonl`` by ``"type"``: {type: [row, ...]} for every type in TYPES (empty
    lists for none; rows of other types are left out; a partial last line without its newline, an interrupted
    write, is left out with a warning). Raises FileNotFoundError naming the file, ValueError naming the line of
    a row that is not a JSON object."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics (is {run_dir} a training run folder?)")
    rows: dict[str, list[dict]] = {t: [] for t in TYPES}
    text = path.read_text()
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines) and not text.endswith("\n"):  # a write interrupted mid-row: the rows before stand
                log.warning("%s, line %d: a partial last row (an interrupted write), left out", path, n)
                break
            raise ValueError(f"{path}, line {n}: not a JSON object ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {n}: not a JSON object")
        if row.get("type") in rows:
            rows[row["type"]].append(row)
    return rows
