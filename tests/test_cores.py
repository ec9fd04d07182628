"""stfast.data.cores.usable_cores: the cores a process may use follow its CPU affinity (taskset, a container's
cpuset), not the machine's count; train's default threads, --threads' bound, the store checks and the bench
use it."""
import os
import subprocess
import sys

import pytest

from stfast.data.cores import usable_cores


def test_usable_cores_is_at_least_one_and_at_most_the_machine():
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs sched_setaffinity and at least 2 CPUs to narrow the affinity")
def test_usable_cores_follows_the_affinity_not_the_cpu_count():
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from stfast.data.cores import usable_cores; from stfast.train.trainer import usable_cores as t; "
            "print(usable_cores(), t(), os.cpu_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["1", "1"] and int(out[2]) >= 2, out
