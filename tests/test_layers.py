"""The layer contracts in pyproject.toml (import-linter): cli > bench > train > accum > models > parallel >
nn > ops > data, each importing only from layers below, so stfast's subpackages hold no import circle; and data/'s
inner order (issue 61). `make test` runs them too; here they also run under a plain `pytest`, with the file-level
cycle count of ../shared/tools/import_cycles.py, deferred imports included, where that tool is beside the checkout."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_layer_contract_holds():
    lint = Path(sys.executable).with_name("lint-imports")
    assert lint.exists(), "import-linter is a test dependency: pip install -e '.[test]'"
    r = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    kept = re.search(r"Contracts: (\d+) kept, (\d+) broken", r.stdout)
    assert kept and int(kept.group(1)) >= 2 and kept.group(2) == "0", r.stdout[-2000:]


def test_no_import_cycle_between_files():
    tool = ROOT.parent / "shared" / "tools" / "import_cycles.py"
    if not tool.exists():
        pytest.skip("../shared/tools/import_cycles.py is not beside the checkout")
    r = subprocess.run([sys.executable, str(tool), "stfast"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.stdout.strip().splitlines()[-1].startswith("0 import cycle(s)"), r.stdout[-3000:]
