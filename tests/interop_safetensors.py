#!/usr/bin/env python3
"""miniflow's safetensors checkpoints against Python's own safetensors package, both ways.

Usage: interop_safetensors.py INTEROP_HELPER

1. INTEROP_HELPER write PATH: miniflow writes a fixed set of tensors; Python's safetensors reads them
   and every name, shape, dtype and value is compared (bit for bit) with the same tensors built here
   with numpy; re-serialising them with Python's writer must give the very bytes miniflow wrote.
2. Python writes a file with safetensors.numpy.save_file; INTEROP_HELPER check PATH loads it with
   miniflow and compares it with its own copy of the expected tensors.

Exits 77 (meson's "skipped") when numpy or safetensors cannot be imported, unless it runs in the
project's .venv-interop (made by `bash tools/setup.sh --with-python-interop`), where that is a failure.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

VENV = Path(__file__).resolve().parent.parent / ".venv-interop"

try:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save, save_file
except ImportError as error:
    in_venv = Path(sys.prefix).resolve() == VENV.resolve()
    print(f"{'FAIL' if in_venv else 'SKIP'}: the safetensors interop test needs the Python packages numpy and "
          f"safetensors ({error}) in {sys.executable}; `bash tools/setup.sh --with-python-interop` installs them "
          f"into {VENV}")
    sys.exit(1 if in_venv else 77)


# Keep in step with written_tensors() in interop_helper.cpp.
MINIFLOW_WRITES = {
    "f32.matrix": (np.arange(6, dtype=np.float32) * 0.5 - 1).reshape(2, 3),
    "f32.transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,
    "f64.cube": ((np.arange(24, dtype=np.float64) - 12) * 0.1).reshape(2, 3, 4),
    "i64.extremes": np.array([0, -1, 2**40, 2**63 - 1, -(2**63)], dtype=np.int64),
    "bool.mask": np.array([[True, False], [False, True]]),
    "scalar": np.array(3.25, dtype=np.float64),
    "empty": np.zeros((0, 2), dtype=np.float32),
}

# Keep in step with expected_from_python() in interop_helper.cpp.
PYTHON_WRITES = {
    "py.f32": (np.arange(12, dtype=np.float32) / 4).reshape(3, 4),
    "py.f64": np.arange(-3, 3) * 0.1,
    "py.i64": np.array([7, -8, 2**62], dtype=np.int64),
    "py.bool": np.array([[True, False, True]]),
    "py.scalar": np.array(-1.5, dtype=np.float32),
    "py.cube": np.arange(8, dtype=np.float64).reshape(2, 2, 2),
}

results = {"passed": 0, "failed": 0}


def check(ok, what):
    results["passed" if ok else "failed"] += 1
    print(f"{'ok' if ok else 'FAIL'}: {what}")


def same_bits(got, want):
    """Shape, dtype and every byte equal (so -0.0 and NaN payloads count)."""
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def python_reads_miniflow(helper, path):
    run = subprocess.run([helper, "write", str(path)], capture_output=True, text=True)
    check(run.returncode == 0, f"interop_helper write exits 0 {run.stdout}{run.stderr}".strip())
    if run.returncode != 0:
        return
    tensors = load_file(str(path))
    check(sorted(tensors) == sorted(MINIFLOW_WRITES), f"names: {sorted(tensors)}")
    for name, want in MINIFLOW_WRITES.items():
        got = tensors.get(name)
        check(got is not None and same_bits(got, want),
              f"{name}: {want.dtype}{list(want.shape)}" if got is None or same_bits(got, want) else
              f"{name}: got {got.dtype}{list(got.shape)} {got.tolist()}, expected {want.dtype}{list(want.shape)} "
              f"{want.tolist()}")
    with safe_open(str(path), framework="numpy") as file:
        metadata = file.metadata()
    check(metadata == {"writer": "miniflow"}, f"metadata {metadata}")
    # copy(order="C") keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d).
    python_bytes = save({name: t.copy(order="C") for name, t in MINIFLOW_WRITES.items()},
                        metadata={"writer": "miniflow"})
    check(python_bytes == path.read_bytes(), "miniflow's bytes are the bytes Python's writer produces")


def miniflow_reads_python(helper, path):
    save_file(PYTHON_WRITES, str(path), metadata={"writer": "python"})
    run = subprocess.run([helper, "check", str(path)], capture_output=True, text=True)
    check(run.returncode == 0, f"interop_helper check: {run.stdout}{run.stderr}".strip())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    helper = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="miniflow_interop_") as tmp:
        python_reads_miniflow(helper, Path(tmp) / "from_miniflow.safetensors")
        miniflow_reads_python(helper, Path(tmp) / "from_python.safetensors")
    print(f"interop: {results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
