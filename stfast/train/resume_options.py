"""What a resumed run takes from the run it continues: the options not given on the command line, read from the
train_config of its first loadable checkpoint (:func:`fill_from_checkpoint`, called by TrainConfig)."""
from __future__ import annotations

from pathlib import Path

from . import checkpoint as ckpt


def _candidates(out: Path) -> list[Path]:
    return [out / "last.pt", ckpt.previous_path(out / "last.pt"), out / "checkpoint.pt"]


# what a preset option added after a run's checkpoint was written had been in that run (its train_config
# lacks the key): the run resumes as it was going, not with a preset value it never had
BEFORE_OPTION = {"subtrips": 0, "subtrips_resample": "once"}


def fill_from_checkpoint(cfg) -> None:
    """On ``--resume``: each preset option not given (None; stfast.train.presets.FIELDS) takes the value of
    the run being continued, read from the train_config of its first loadable checkpoint in ``cfg.out``, in
    place; so do the preset name when ``--preset`` is left at auto (checkpoints before presets: paper) and the
    precision when neither ``--precision`` nor ``--dtype`` is given, and ``--compile`` when not given.
    A resumed run therefore ends where it was going (its --epochs, its averaging start, its width) even where
    the preset's values differ; options given on the command line still win. A warm-started run (``--init-from``)
    keeps the preprocessing settings it took from its parent where they are left at their defaults. Nothing happens when no
    checkpoint loads: :func:`resume_checkpoint` raises then, naming the folder. Called by TrainConfig before
    the preset fills the rest. Raises ValueError when ``--preset`` is given and is not the run's."""
    from .precision import of_train_config
    from .presets import FIELDS

    precision_given = cfg.precision is not None or cfg.dtype is not None  # --precision or its alias --dtype
    if (cfg.preset != "auto" and all(getattr(cfg, k) is not None for k in FIELDS) and precision_given
            and cfg.compile is not None):
        return  # nothing left to fill (every option given, or a checkpoint's own config)
    for path in _candidates(Path(cfg.out)):
        if not path.is_file():
            continue
        try:
            saved = ckpt.load(path).get("train_config", {})
        except (OSError, ValueError):  # resume_checkpoint warns about it and reads the next one
            continue
        was = saved.get("preset", "paper")
        if cfg.preset not in ("auto", was):  # the options not given continue the run's own values, not --preset's
            raise ValueError(f"--resume: the run in {cfg.out} was trained with --preset {was}, not {cfg.preset}: "
                             f"omit --preset to continue it, or train into a new --out")
        for k in FIELDS:
            value = saved.get(k, BEFORE_OPTION.get(k))
            if getattr(cfg, k) is None and value is not None:
                setattr(cfg, k, value)
        if cfg.preset == "auto":
            cfg.preset = saved.get("preset", "paper")
        if not precision_given:  # the run continues in its own precision
            cfg.precision = of_train_config(saved)
        if cfg.compile is None:  # a compiled run continues compiled where it can (checkpoints before --compile: not)
            cfg.compile = cfg.compile_inherited = bool(saved.get("compile"))
        if saved.get("init_from"):  # a warm start's preprocessing was its parent's, not given: left at default, kept
            from .warm_start import keep_preprocessing

            keep_preprocessing(cfg, saved)
        return
