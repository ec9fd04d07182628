"""Issue 52 item 5: the README's commands work as written after the setup it gives. `make demo` can be run
again (before: the second one failed, `--out runs/demo is not empty`), the README's `stfast` commands have
`stfast` on PATH (before: only `.venv/bin/stfast` was, and the commands said `stfast`), and its list of what
a run writes is what a run folder holds (before: it lacked last.prev.pt; the demo's list lacked the report)."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _make_var(name: str) -> str:
    return re.search(rf"^{name} \?= (\S+)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1)


def _demo_command() -> list[str]:
    """The stfast command of the Makefile's demo recipe, as argv after the stfast executable."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, flags=re.M).group(1)
    [line] = [ln.strip() for ln in recipe.splitlines() if "/bin/stfast " in ln]
    argv = shlex.split(line)
    assert argv[0] == "$(VENV)/bin/stfast", argv
    return argv[1:]


def _run_demo(cwd: Path) -> subprocess.CompletedProcess:
    # the demo as the Makefile runs it, only smaller: flags given later win (argparse)
    small = ["--n-synthetic", "200", "--epochs", "2", "--batch-size", "64", "--threads", "1", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "stfast.cli", *_demo_command(), *small], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_make_demo_runs_twice_and_keeps_what_is_not_its_own(tmp_path):
    first = _run_demo(tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    demo = tmp_path / "runs" / "demo"
    (demo / "notes.txt").write_text("mine")  # a user's file in the demo folder, and a run of their own
    (tmp_path / "runs" / "mine").mkdir()
    (tmp_path / "runs" / "mine" / "summary.json").write_text("{}")
    second = _run_demo(tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert (demo / "notes.txt").read_text() == "mine" and (tmp_path / "runs" / "mine" / "summary.json").is_file()
    assert "kept notes.txt" in second.stderr  # --overwrite names what it left

    # README's list of the run's files ("Outputs in `--out`") is what the folder holds
    outputs = README.split("- Outputs in `--out`:", 1)[1].split("MAPE in JSON", 1)[0]
    listed = set(re.findall(r"`([a-z_.]+\.(?:jsonl|json|pt|csv|png|html))`", outputs))
    held = {p.name for p in demo.iterdir() if not p.name.startswith(".")} - {"notes.txt"}
    assert listed == held, (sorted(listed), sorted(held))


def test_readme_commands_have_stfast_on_path_after_the_setup_it_gives():
    """Every `stfast ...` line of the README's shell blocks comes after the line that puts the .venv that
    `make demo` / `make setup` build on PATH; that .venv gets the `stfast` script (pyproject)."""
    venv = _make_var("VENV")
    assert venv == ".venv" and re.search(r"^setup: \$\(VENV\)/", (ROOT / "Makefile").read_text(), flags=re.M)
    assert re.search(r'^\[project\.scripts\]\nstfast = "stfast\.cli:main"', (ROOT / "pyproject.toml").read_text(),
                     flags=re.M)
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    lines = [ln.strip() for b in blocks for ln in b.splitlines()]
    activate = [i for i, ln in enumerate(lines) if re.match(rf"(\.|source) {re.escape(venv)}/bin/activate\b", ln)]
    commands = [i for i, ln in enumerate(lines) if ln.startswith("stfast ")]
    assert commands and activate and activate[0] < commands[0], lines[:commands[0] + 1] if commands else lines


def test_setup_says_what_it_installs_before_the_silent_minutes(tmp_path):
    """Issue 62: `make demo` / `make setup` announce the installs and the build before pip runs quietly for
    minutes (before: nothing was printed for ~3 minutes)."""
    out = subprocess.run(["make", "-n", "setup", f"VENV={tmp_path / 'v'}"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert any("pip install" in ln for ln in out), out
    announced = False
    for ln in out:  # each quiet install is announced by a line of its own saying what comes
        if ln.startswith('echo "stfast: '):
            announced = True
        elif "pip install" in ln:
            assert announced, out
            announced = False
