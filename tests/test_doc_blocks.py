"""Issue 62 item 1: every code block of README.md and docs/*.md runs in CI, as a reader would run it.

- Every fenced block names its language; ``text`` marks output and synopses (nothing to run).
- ``python`` blocks run, a file's blocks one after another in one interpreter (a later block uses an earlier
  one's names, as a reader's session does), from a fresh folder whose ``../shared`` is the real data, as from
  the checkout's root. A file's blocks may rely on a run folder the README's own snippet trained: ``runs/chengdu``
  is that run (docs/data.md and docs/serve.md load ``runs/chengdu/checkpoint.pt``).
- ``bash`` blocks: every ``stfast`` command (backslash continuations joined) is parsed by stfast's own parser,
  so a flag, choice or value that no longer exists fails here; ``python -c`` code is compiled, a ``python
  FILE`` script must exist. They are not executed: they train for minutes on data the reader supplies
  (``gps_20161101``, ``points.csv``). ``make demo`` / ``make test`` run in CI itself (tests/test_readme_setup.py,
  .ci/run).
- Blocks that need what CI does not have say so in the line before them, ``<!-- not run: REASON -->``, and are
  skipped by that name (a server, a GPU, a network).
"""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)\n(.*?)^```\s*$", re.M | re.S)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*$")
LANGUAGES = {"python", "bash", "text", "nginx", "json"}


def blocks(path: Path) -> list[tuple[int, str, str, str | None]]:
    """(line, language, code, reason it is not run or None) of every fenced block in ``path``."""
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = NOT_RUN.search(before)
        out.append((line, m.group(1), m.group(2), skip.group(1) if skip else None))
    return out


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", DOCS, ids=_id)
def test_every_block_names_its_language(path):
    for line, lang, _code, _skip in blocks(path):
        assert lang in LANGUAGES, f"{_id(path)}:{line}: a code block must name its language ({sorted(LANGUAGES)})"


def _commands(code: str) -> list[str]:
    """The shell commands of a block: comments dropped, backslash continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [ln.split(" #")[0].strip() for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _check_command(cmd: str, where: str) -> None:
    from stfast.cli import build_parser

    argv = shlex.split(cmd)
    if argv[0] == "stfast":
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit as e:
            pytest.fail(f"{where}: `{cmd}` does not parse (exit {e.code})")
    elif argv[:2] == ["python", "-c"]:
        compile(argv[2], where, "exec")
    elif argv[0] == "python" and argv[1].endswith(".py"):
        assert (ROOT / argv[1]).is_file(), f"{where}: {argv[1]} is not in the checkout"


BASH = [(p, line, code) for p in DOCS for line, lang, code, skip in blocks(p) if lang == "bash" and skip is None]


@pytest.mark.parametrize("path,line,code", BASH, ids=[f"{_id(p)}:{ln}" for p, ln, _ in BASH])
def test_shell_blocks_parse(path, line, code):
    commands = _commands(code)
    assert commands, f"{_id(path)}:{line}: an empty shell block"
    for cmd in commands:
        _check_command(cmd, f"{_id(path)}:{line}")


@pytest.fixture(scope="module")
def reader_folder(tmp_path_factory, shared_data):
    """A fresh folder as the checkout's root: ``../shared`` beside it (the real data)."""
    base = tmp_path_factory.mktemp("reader")
    (base / "shared").symlink_to(shared_data.parent, target_is_directory=True)
    work = base / "work"
    work.mkdir()
    return work


def _run_python(path: Path, cwd: Path) -> None:
    code = [f"# {_id(path)}:{line}\n{c}" for line, lang, c, skip in blocks(path) if lang == "python" and skip is None]
    r = subprocess.run([sys.executable, "-c", "\n".join(code)], cwd=cwd, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{_id(path)}'s python blocks failed:\n{r.stderr[-3000:]}"


PYTHON = [p for p in DOCS if any(lang == "python" and skip is None for _l, lang, _c, skip in blocks(p))]


@pytest.mark.parametrize("path", PYTHON, ids=_id)
def test_python_blocks_run(path, reader_folder):
    readme = ROOT / "README.md"
    if path != readme and not (reader_folder / "runs" / "chengdu").exists():
        _run_python(readme, reader_folder)  # the README's snippet trains runs/api first
        (reader_folder / "runs" / "chengdu").symlink_to("api", target_is_directory=True)
    if path == readme and (reader_folder / "runs" / "api").exists():
        return  # ran already, for another file's blocks
    _run_python(path, reader_folder)
    if path == readme:
        (reader_folder / "runs" / "chengdu").symlink_to("api", target_is_directory=True)
