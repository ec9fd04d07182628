"""A run's CPU GEMM libraries are decided once and kept with the run (stfast.train.gemm_plan, issue 44): the
checkpoint records them, and --resume, evaluate/predict/eta/serve (load_model) apply the recorded plan instead
of probing again, so a probe that comes out differently later cannot change a float32 run's numbers."""
from __future__ import annotations

import pytest
import torch
from _eta_run import train_run

from stfast.cli import main
from stfast.ops import gemm_library, reset_gemm_library, select_gemm_library
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


@pytest.mark.parametrize("library", ["aten", "onednn"])
def test_plan_is_decided_once_and_applied(library):
    select_gemm_library(*F32[:1], library, F32[1])
    plan = gemm_plan.decide("bf16-mixed", "cpu")
    assert plan["float32->float32"] == library
    assert set(plan) == {"float32->float32", "bfloat16->float32", "bfloat16->bfloat16"}
    assert gemm_plan.decide("64", "cpu") == {} and gemm_plan.decide("32", "meta") == {}
    other = "onednn" if library == "aten" else "aten"
    select_gemm_library(torch.float32, other)
    gemm_plan.apply(plan)
    assert gemm_library(torch.float32) == library
    with pytest.raises(ValueError, match="bad dtype pair"):
        gemm_plan.apply({"float33->float32": "aten"})
    with pytest.raises(ValueError, match="library must be one of"):
        gemm_plan.apply({"float32->float32": "mkl"})


def test_checkpoint_records_the_plan_and_load_model_applies_it(tmp_path):
    select_gemm_library(torch.float32, "onednn")  # the run's probe "chose" oneDNN
    data, ck = train_run(tmp_path)
    state = ckpt.load(ck)
    assert state["gemm_plan"] == {"float32->float32": "onednn"}
    select_gemm_library(torch.float32, "aten")  # a later probe comes out differently
    load_model(ck)
    assert gemm_library(torch.float32) == "onednn"
    # --resume continues with the recorded plan, whatever the new process would probe
    select_gemm_library(torch.float32, "aten")
    rc = main(["train", "--resume", "--data", str(data), "--preset", "paper", "--batch-size", "32",
               "--out", str(ck.parent), "--epochs", "3", "--no-progress", "--threads", "1"])
    assert rc == 0
    assert gemm_library(torch.float32) == "onednn"
    assert ckpt.load(ck.parent / "last.pt")["gemm_plan"] == {"float32->float32": "onednn"}
