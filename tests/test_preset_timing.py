"""benchmarks/preset_timing.py's axes and ratios: the compile axis (issue 51: stock PyTorch at its best includes
torch.compile) gives `stfast train --compile` or nothing, and the ratios compare fused with the reference at its
best. No training here: the runs' arguments and the ratio lines from given throughputs."""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import preset_timing as pt


def _args(**kw):
    base = {"data": "d", "split_days": None, "split_by": "date", "epochs": 1, "batch_size": 64, "max_steps": None,
            "presets": ["paper"], "kernels": ["fused", "reference"], "precision": ["32"], "threads": [1],
            "compile": ["off", "on"]}
    return argparse.Namespace(**{**base, **kw})


def test_the_compile_axis_is_the_train_switch():
    a = _args()
    confs = pt.configurations(a)
    assert [(c["kernels"], c["compile"]) for c in confs] == [("fused", "off"), ("fused", "on"),
                                                             ("reference", "off"), ("reference", "on")]
    on = pt.run_args(a, confs[3], 0, Path("o"))
    off = pt.run_args(a, confs[2], 0, Path("o"))
    assert "--compile" in on and "--compile" not in off
    assert "on" not in on and "off" not in off  # a switch, not a value
    assert on[on.index("--kernels") + 1] == "reference"
    assert "--max-steps" not in on and pt.run_args(_args(max_steps=3), confs[0], 0, Path("o"))[-2:] == ["--max-steps", "3"]


def test_ratios_name_compiled_rows_and_compare_fused_with_the_reference_at_its_best():
    a = _args()
    tput = {("1", "paper", "32", "fused", "off"): [300.0], ("1", "paper", "32", "fused", "on"): [330.0],
            ("1", "paper", "32", "reference", "off"): [200.0], ("1", "paper", "32", "reference", "on"): [250.0]}
    tput = {(int(k[0]), *k[1:]): v for k, v in tput.items()}
    text = "\n".join(pt.ratio_lines(a, tput))
    assert "| kernels fused ÷ reference at | per run | of the medians |" in text
    assert "| 1 thread, paper, 32, compiled | 1.32× | 1.32× |" in text  # 330 / 250
    assert "| compile off ÷ on at | per run | of the medians |" in text
    assert "| 1 thread, paper, 32, reference | 0.80× | 0.80× |" in text  # 200 / 250
    assert "| fused ÷ reference at its best, at | reference's best | of the medians |" in text
    assert "| 1 thread, paper, 32, eager | compiled | 1.20× |" in text  # 300 / 250
    assert "| 1 thread, paper, 32, compiled | compiled | 1.32× |" in text


def test_without_both_compile_settings_there_is_no_best_of_line():
    a = _args(compile=["off"])
    tput = {(1, "paper", "32", "fused", "off"): [300.0], (1, "paper", "32", "reference", "off"): [200.0]}
    text = "\n".join(pt.ratio_lines(a, tput))
    assert "at its best" not in text and "| 1 thread, paper, 32, eager | 1.50× | 1.50× |" in text
