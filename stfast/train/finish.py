"""The end of a training run: its kept weights scored on the test split beside both baselines, and the run's
outputs written (test_predictions.csv, summary.json, the learning curve and the report)."""
from __future__ import annotations

import time

import torch

from . import checkpoint as ckpt
from . import report, run_predictions
from .metrics import errors, fit_baselines, format_summary
from .run_data import predict


def finish(tr) -> dict:
    """Score Trainer ``tr``'s checkpoint.pt and both baselines on the test split; when no epoch ended, the current
    weights (their average under --swa-start/--ema-decay) are written as checkpoint.pt first."""
    best, d = tr.out / "checkpoint.pt", tr.data
    # an epoch's checkpoint.pt, not one a run resumed here wrote when it stopped before its first epoch ended
    kept = tr.epoch > 0 and best.is_file()
    if not kept:  # no epoch ended (--max-steps, --time-budget): the weights scored become checkpoint.pt
        ckpt.save_validated(tr)
    if tr.info.distributed:
        torch.distributed.barrier()
    if kept:
        tr.model.load_state_dict(ckpt.load(best, tr.device)["model_state"])
    t0 = time.perf_counter()
    pred = predict(tr.model if kept else tr.eval_model, d.test_ds, info=tr.info, device=tr.device,
                   progress=tr.show, precision=tr.cfg.precision)
    summary = d.summary(errors(pred, d.test.time), tr.best, tr.epoch, tr.step, tr.info.world_size)
    # the final evaluation's rate, beside training's (metrics.jsonl): a forward pass is ~1/3 of a step
    summary["test_trips_per_s"] = len(d.test) / max(time.perf_counter() - t0, 1e-9)
    if getattr(tr, "parent", None) is not None:  # lineage (--init-from): the run's parent checkpoint, what it carried
        summary["parent"] = tr.parent
        if tr.data.warm is not None:
            summary["warm_start"] = tr.data.warm
    if tr.compile_s is not None:  # --compile: this process's compilation (stfast.train.compiled)
        summary["compile_s"] = tr.compile_s
    if tr.info.is_main:  # every trip of the test split beside both baselines: what the report plots
        fitted = fit_baselines(d.train)
        run_predictions.write(tr.out, d.test, pred, {n: f.predict(d.test.dist) for n, f in fitted.items()})
        written = report.write_outputs(tr.out, summary)
        tr.say("\n" + format_summary(summary) + f"\nwrote {', '.join(written)} in {tr.out}")
    return summary
