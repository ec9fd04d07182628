"""A run's CPU GEMM libraries are decided once and kept with the run (stfast.train.gemm_plan, issue 44): the
checkpoint records them, and --resume, evaluate/predict/eta/serve (load_model) apply the recorded plan instead
of probing again, so a probe that comes out differently later cannot change a float32 run's numbers."""
from __future__ import annotations

import pytest
import torch
from _eta_run import train_run

from stfast.cli import main
from stfast.ops import gemm_libraries_available, gemm_library, reset_gemm_library, select_gemm_library
from stfast.train import checkpoint as ckpt
from stfast.train import gemm_plan
from stfast.train.trained import load_model

F32 = (torch.float32, torch.float32)


@pytest.fixture(autouse=True)
def _fresh_choice():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the runs below use --threads 1, and a choice holds for its thread count
    reset_gemm_library()
    yield
    reset_gemm_library()
    torch.set_num_threads(threads)


@pytest.mark.parametrize("library", ["aten", "onednn", "brgemm"])
def test_plan_is_decided_once_and_applied(library):
    if library not in gemm_libraries_available(torch.float32):
        pytest.skip(f"{library} does not take float32 on this CPU (tests/test_gemm.py says why)")
    select_gemm_library(*F32[:1], library, F32[1])
    select_gemm_library(torch.float32, "aten" if library != "aten" else "brgemm", use="step")
    plan = gemm_plan.decide("bf16-mixed", "cpu")
    assert plan["float32->float32"] == library
    assert plan["float32->float32@step"] == ("aten" if library != "aten" else "brgemm")
    assert set(plan) == {f"{p}{u}" for p in ("float32->float32", "bfloat16->float32", "bfloat16->bfloat16")
                         for u in ("", "@step")}
    assert gemm_plan.decide("64", "cpu") == {} and gemm_plan.decide("32", "meta") == {}
    select_gemm_library(torch.float32, "aten" if library != "aten" else "brgemm")
    gemm_plan.apply(plan)
    assert gemm_library(torch.float32) == library
    assert gemm_library(torch.float32, use="step") == plan["float32->float32@step"]
    # a plan recorded before the uses were told apart: its one library for both
    gemm_plan.apply({"float32->float32": library})
    assert gemm_library(torch.float32, use="step") == library
    with pytest.raises(ValueError, match="bad dtype pair"):
        gemm_plan.apply({"float33->float32": "aten"})
    with pytest.raises(ValueError, match="bad use"):
        gemm_plan.apply({"float32->float32@tall": "aten"})
    with pytest.raises(ValueError, match="library must be one of"):
        gemm_plan.apply({"float32->float32": "mkl"})


def test_checkpoint_records_the_plan_and_load_model_applies_it(tmp_path):
    other = "brgemm"  # float32 on the micro-kernel (or torch's fallback under it): every CPU takes it
    select_gemm_library(torch.float32, "aten", use="bulk")
    select_gemm_library(torch.float32, other, use="step")  # the run's probe "chose" the micro-kernel for steps
    plan = {"float32->float32": "aten", "float32->float32@step": other}
    data, ck = train_run(tmp_path)
    state = ckpt.load(ck)
    assert state["gemm_plan"] == plan
    select_gemm_library(torch.float32, "aten")  # a later probe comes out differently
    load_model(ck)
    assert gemm_library(torch.float32, use="step") == other
    # --resume continues with the recorded plan, whatever the new process would probe
    select_gemm_library(torch.float32, "aten")
    rc = main(["train", "--resume", "--data", str(data), "--preset", "paper", "--batch-size", "32",
               "--out", str(ck.parent), "--epochs", "3", "--no-progress", "--threads", "1"])
    assert rc == 0
    assert gemm_library(torch.float32, use="step") == other
    assert ckpt.load(ck.parent / "last.pt")["gemm_plan"] == plan
