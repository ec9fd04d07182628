"""Options declared once: a dataclass field that carries its command-line flag, help, choices, range and
unit, from which the parser, the config built from parsed arguments and the single-field checks derive.

Declare a field with :func:`option`::

    @dataclass
    class Config:
        batch_size: int = option(64, "trips per optimizer step", ge=1)
        gap_s: float = option(1200.0, "split at longer gaps", unit="s", gt=0, flag="--gap-min",
                              cli=Scaled(60, "minutes"))

then :func:`add_arguments` adds ``--batch-size`` and ``--gap-min`` to an argparse parser (type from the
annotation, choices, help, the default in the flag's unit), :func:`values_from_args` turns parsed
arguments back into field values (minutes × 60 → seconds) and :func:`check_options` raises ValueError
naming the flag (``--batch-size must be ≥ 1, got 0``) or, for a Python API config, the field. A field
that repeats another config's option (a model option of the training config) takes its declaration
with :func:`same_option` (``default=None`` where the config fills the value in itself, as TrainConfig does
from its preset). The flag's text can differ from the field's value: :class:`Scaled` (another unit),
:class:`CommaList`, :class:`SwitchTo`, :class:`OrWord` (a number or one word, ``--swa-start none``). A
``bool | None`` field with default None and no ``cli`` is a pair of flags, ``--compile`` / ``--no-compile``
(True / False; neither: None, "not given", for the config to decide, as on ``--resume``).
Adding an option is one such field; nothing else needs to change.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_KEY = "stfast.option"


@dataclass(frozen=True)
class Scaled:
    """The flag takes the quantity in another unit: field value = flag value × ``factor`` (``--gap-min`` 20
    → ``gap_s`` 1200.0). ``unit`` names the flag's unit in errors."""

    factor: float
    unit: str

    def to_field(self, v):
        return self.factor * v

    def to_flag(self, v):
        return v / self.factor


@dataclass(frozen=True)
class CommaList:
    """A tuple of strings given as one comma-separated flag (``--modes car,taxi`` → ``("car", "taxi")``)."""

    def to_field(self, v: str) -> tuple:
        return tuple(s.strip() for s in v.split(",") if s.strip())

    def to_flag(self, v) -> str:
        return ",".join(v)


@dataclass(frozen=True)
class SwitchTo:
    """A switch that sets the field to ``value`` (``--no-progress`` → ``progress=False``); absent, the field
    keeps its default."""

    value: Any


@dataclass(frozen=True)
class OrWord:
    """A number flag that also takes one word, kept as the field's value (``--swa-start none`` →
    ``swa_start="none"``; ``--swa-start 0.5`` → 0.5). The declared range applies to numbers only."""

    word: str

    def parse(self, typ: type) -> Callable[[str], Any]:
        """The argparse ``type`` of the flag: the word as it is, else ``typ`` (int or float) of the text."""
        def parse(text: str):
            return text if text == self.word else typ(text)

        parse.__name__ = f"{typ.__name__} or {self.word!r}"  # argparse's "invalid float or 'none' value"
        return parse

    def to_field(self, v):
        return v

    def to_flag(self, v):
        return v


@dataclass(frozen=True)
class Option:
    """One option's declaration (the metadata of its dataclass field). ``ge``/``gt``/``le``/``lt``: bounds
    of the field's value (in the field's unit); ``check``: a further rule on the value alone, raising
    ValueError with a message that names the flag; ``unset``: how an empty or None value reads in a
    message (``(all)``); ``cli``: how the flag's text differs from the field's value."""

    help: str
    flag: str | None = None  # None: "--" + the field name with dashes
    choices: tuple | None = None
    unit: str | None = None  # of the field's value: "s", "km", "minutes"
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    check: Callable[[Any], None] | None = None
    unset: str | None = None
    cli: Scaled | CommaList | SwitchTo | OrWord | None = None


def option(default, help: str, **declaration) -> Any:
    """A dataclass field with ``default`` and its :class:`Option` (keyword arguments as there)."""
    return dataclasses.field(default=default, metadata={_KEY: Option(help, **declaration)})


def same_option(cls: type, name: str, *, default=dataclasses.MISSING, **changes) -> Any:
    """A dataclass field declared as field ``name`` of dataclass ``cls`` (its default, unless ``default`` is
    given, and its :class:`Option`, with ``changes``), marked as coming from ``cls`` (see :func:`names_from`).
    ``default=None``: "not given", for a config that fills the value in itself (a preset)."""
    f = _field(cls, name)
    opt = dataclasses.replace(declaration(f), **changes) if changes else declaration(f)
    return dataclasses.field(default=f.default if default is dataclasses.MISSING else default,
                             metadata={_KEY: opt, "from": cls})


def declaration(f: dataclasses.Field) -> Option | None:
    """The :class:`Option` of field ``f`` (None: not an option)."""
    return f.metadata.get(_KEY)


def options(cls) -> dict[str, Option]:
    """{field name: Option} of every declared field of the dataclass ``cls``, in field order."""
    return {f.name: declaration(f) for f in dataclasses.fields(cls) if declaration(f) is not None}


def names_from(cls, source: type) -> tuple[str, ...]:
    """The fields of ``cls`` declared with :func:`same_option` from ``source``."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("from") is source)


def flag(cls, name: str) -> str:
    """The command-line flag of field ``name`` (``batch_size`` → ``--batch-size``)."""
    return declaration(_field(cls, name)).flag or "--" + name.replace("_", "-")


def show(cls, name: str, value) -> str:
    """``value`` of field ``name`` as the user writes it in the flag (its unit; ``unset`` when empty)."""
    opt = declaration(_field(cls, name))
    if opt.unset and (value is None or (isinstance(value, (str, tuple, list)) and not value)):
        return opt.unset
    if isinstance(opt.cli, (Scaled, CommaList)):
        value = opt.cli.to_flag(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _field(cls, name: str) -> dataclasses.Field:
    try:
        return next(f for f in dataclasses.fields(cls) if f.name == name)
    except StopIteration:
        raise KeyError(f"{cls.__name__} has no field {name!r}") from None


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _value_type(cls, name: str) -> tuple[type, bool]:
    """(the field's type without None, whether None is allowed), from its annotation."""
    t = _hints(cls)[name]
    args = typing.get_args(t)
    if type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return t, False


def dest(cls, name: str) -> str:
    """The argparse destination of field ``name``'s flag (``--gap-min`` → ``gap_min``)."""
    return flag(cls, name).lstrip("-").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser, cls, names: Iterable[str] | None = None,
                  overrides: Mapping[str, Mapping] | None = None) -> None:
    """Add the flags of ``cls``'s declared fields ``names`` (default: all, in field order) to ``parser``:
    type from the annotation, the default in the flag's unit, choices and help from the declaration.
    ``overrides``: {name: add_argument keyword arguments} that replace the derived ones (another
    command's defaults or help)."""
    overrides = overrides or {}
    decl = options(cls)
    for name in decl if names is None else names:
        opt, f = decl[name], _field(cls, name)
        typ, _ = _value_type(cls, name)
        kw: dict = {"help": opt.help}
        if typ is bool and f.default is None and opt.cli is None:  # None: not given, then the config decides
            kw.update(action=argparse.BooleanOptionalAction, default=None)
        elif isinstance(opt.cli, SwitchTo) or typ is bool:
            kw["action"] = "store_true"
        else:
            kw["default"] = f.default if f.default is None or opt.cli is None else opt.cli.to_flag(f.default)
            if isinstance(opt.cli, OrWord):
                kw["type"] = opt.cli.parse(typ)
            elif typ in (int, float):
                kw["type"] = typ
            if opt.choices:
                kw["choices"] = opt.choices
        kw.update(overrides.get(name, {}))
        parser.add_argument(flag(cls, name), **kw)


def values_from_args(cls, args: argparse.Namespace, names: Iterable[str] | None = None) -> dict:
    """{field name: value} of ``cls``'s declared fields ``names`` (default: all) from parsed ``args``
    (converted from the flag's unit; a None flag value stays None: not given)."""
    out = {}
    for name in options(cls) if names is None else names:
        opt, v = options(cls)[name], getattr(args, dest(cls, name))
        if isinstance(opt.cli, SwitchTo):
            v = opt.cli.value if v else _field(cls, name).default
        elif v is not None and opt.cli is not None:
            v = opt.cli.to_field(v)
        out[name] = v
    return out


def _choices_text(choices) -> str:
    c = [str(x) for x in choices]
    return f"{c[0]} or {c[1]}" if len(c) == 2 else f"one of {', '.join(c)}"


def _range_text(opt: Option, integer: bool, to_shown: Callable) -> str | None:
    lo, lo_closed = (opt.ge, True) if opt.ge is not None else (opt.gt, False)
    hi, hi_closed = (opt.le, True) if opt.le is not None else (opt.lt, False)
    if lo is None and hi is None:
        return None

    def num(x):
        return f"{to_shown(x):g}"

    if lo is not None and hi is not None:
        if integer and lo_closed and hi_closed:
            return f"in {num(lo)}..{num(hi)}"
        return f"in {'[' if lo_closed else '('}{num(lo)}, {num(hi)}{']' if hi_closed else ')'}"
    if lo is not None:
        return f"{'≥' if lo_closed else '>'} {num(lo)}"
    return f"{'≤' if hi_closed else '<'} {num(hi)}"


def _in_range(opt: Option, v) -> bool:
    return ((opt.ge is None or v >= opt.ge) and (opt.gt is None or v > opt.gt)
            and (opt.le is None or v <= opt.le) and (opt.lt is None or v < opt.lt))


def _check_type(who: str, typ, value) -> None:
    """A value set in Python (TrainConfig(epochs="2")) must have its field's type: a str would fail the range
    check with a bare TypeError, and a float epoch count (2.5) or a bool (True) would be used as an int."""
    import numbers

    if typ is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        what = "an integer"
    elif typ is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        what = "a number"
    elif typ is bool:
        ok, what = isinstance(value, bool), "True or False"
    elif typ is str:
        ok, what = isinstance(value, str), "a string"
    else:
        return
    if not ok:
        raise ValueError(f"{who} must be {what}, got {value!r} ({type(value).__name__})")


def check_value(cls, name: str, value, by_flag: bool = True) -> None:
    """Raise ValueError when ``value`` breaks field ``name``'s declared rules (choices, range, ``check``),
    naming its flag (``by_flag``) or the field; None passes where the field allows None."""
    opt = declaration(_field(cls, name))
    typ, optional = _value_type(cls, name)
    who = flag(cls, name) if by_flag else name
    if value is None:
        if optional:
            return
        raise ValueError(f"{who} must be given")
    if isinstance(opt.cli, OrWord) and isinstance(value, str):
        if value == opt.cli.word:
            return
        raise ValueError(f"{who} must be a number or {opt.cli.word}, got {value!r}")
    if opt.choices is not None and value not in opt.choices:
        raise ValueError(f"{who} must be {_choices_text(opt.choices)}, got {value!r}")
    _check_type(who, typ, value)
    scaled = opt.cli if by_flag and isinstance(opt.cli, Scaled) else None
    to_shown = scaled.to_flag if scaled else (lambda x: x)
    unit = scaled.unit if scaled else opt.unit
    rng = _range_text(opt, typ is int, to_shown)
    if rng is not None and not _in_range(opt, value):
        shown = to_shown(value)
        got = f"{shown:g}" if isinstance(shown, float) else str(shown)
        raise ValueError(f"{who} must be {rng}{' ' + unit if unit else ''}, got {got}")
    if opt.check is not None:
        opt.check(value)


def check_options(obj, by_flag: bool = True, names: Iterable[str] | None = None) -> None:
    """:func:`check_value` on every declared field (or ``names``) of the dataclass instance ``obj``."""
    cls = type(obj)
    for name in options(cls) if names is None else names:
        check_value(cls, name, getattr(obj, name), by_flag)
