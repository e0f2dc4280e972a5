"""Expert-parallel ops under mpirun: dispatch + local experts + combine and the pipelined ep_moe_ffn
against the single-process moe_ffn (ep_worker.py, 2 ranks), and the options -- smooth-quant scales,
special experts, combine forms, shared-expert ranks, errors agreed across ranks (ep_options_worker.py,
2 and 3 ranks). The workers do the checks."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ops_transformer as ot

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(not ot.ep.AVAILABLE, reason="library built without MPI")
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
@pytest.mark.parametrize("worker,np_", [("ep_worker.py", 2), ("ep_options_worker.py", 2), ("ep_options_worker.py", 3)])
def test_under_mpirun(worker, np_):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    env.setdefault("OT_BUILD_DIR", str(Path(ot.library_path).parent))
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), "--mca", "btl", "self,vader,tcp",
           sys.executable, str(HERE / worker)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    for r in range(np_):
        assert f"EP-OK rank {r}" in out, out[-4000:]
