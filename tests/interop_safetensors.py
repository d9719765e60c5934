#!/usr/bin/env python3
"""miniflow's safetensors checkpoints against Python's own safetensors package, both ways.

Usage: interop_safetensors.py INTEROP_HELPER

1. INTEROP_HELPER write PATH: miniflow writes a fixed set of tensors; Python's safetensors reads them
   and every name, shape, dtype and value is compared (bit for bit) with the same tensors built here
   with numpy; re-serialising them with Python's writer must give the very bytes miniflow wrote.
2. Python writes a file with safetensors.numpy.save_file; INTEROP_HELPER check PATH loads it with
   miniflow and compares it with its own copy of the expected tensors.
3. and 4. The same for bfloat16 (INTEROP_HELPER write-bf16 / check-bf16), in files of their own:
   numpy has no bfloat16, so Python's safetensors reads and writes them as raw bytes (deserialize,
   serialize), and the bits to expect are worked out by hand.

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
    from safetensors import deserialize, safe_open, serialize
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
    "i8.extremes": np.array([[-128, -127], [0, 1], [127, -2]], dtype=np.int8),
    "scalar": np.array(3.25, dtype=np.float64),
    "empty": np.zeros((0, 2), dtype=np.float32),
}

# Keep in step with expected_from_python() in interop_helper.cpp.
PYTHON_WRITES = {
    "py.f32": (np.arange(12, dtype=np.float32) / 4).reshape(3, 4),
    "py.f64": np.arange(-3, 3) * 0.1,
    "py.i64": np.array([7, -8, 2**62], dtype=np.int64),
    "py.bool": np.array([[True, False, True]]),
    "py.i8": np.array([-100, 100, -1], dtype=np.int8),
    "py.scalar": np.array(-1.5, dtype=np.float32),
    "py.cube": np.arange(8, dtype=np.float64).reshape(2, 2, 2),
}

# Keep in step with written_bfloat16() in interop_helper.cpp: float32 values rounded to bfloat16 (the
# top 16 bits of a float32) to nearest, ties to even, worked out by hand: 1.0 -> 0x3F80; -2.5 ->
# 0xC020; 0.1f = 0x3DCCCCCD, whose dropped half 0xCCCD is over 0x8000 -> 0x3DCD; 1 + 2^-8 = 0x3F808000,
# a tie -> the even 0x3F80; 1 + 3 * 2^-8 = 0x3F818000, a tie -> the even 0x3F82; inf -> 0x7F80;
# -0.0 -> 0x8000.
MINIFLOW_WRITES_BF16 = {
    "bf16.rounded": np.array([0x3F80, 0xC020, 0x3DCD, 0x3F80, 0x3F82, 0x7F80, 0x8000], dtype="<u2"),
}

# Keep in step with expected_bfloat16_from_python() in interop_helper.cpp: 3.140625, -1, 2^-133 (the
# smallest subnormal), -inf and a quiet NaN, as bits.
PYTHON_WRITES_BF16 = {
    "py.bf16": np.array([[0x4049, 0xBF80, 0x0001, 0xFF80, 0x7FC0]], dtype="<u2"),
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


def serialize_bfloat16(tensors, metadata):
    """The bytes of a safetensors file of BF16 tensors given as uint16 bit patterns, from Python's
    writer: its TensorSpec where the package has one (0.8 on), the dict form before."""
    try:
        from safetensors import TensorSpec
    except ImportError:
        return serialize({name: {"dtype": "bfloat16", "shape": list(bits.shape), "data": bits.tobytes()}
                          for name, bits in tensors.items()}, metadata=metadata)
    return serialize({name: TensorSpec(dtype="bfloat16", shape=list(bits.shape), data_ptr=bits.ctypes.data,
                                        data_len=bits.nbytes)
                      for name, bits in tensors.items()}, metadata=metadata)


def python_reads_miniflow_bfloat16(helper, path):
    run = subprocess.run([helper, "write-bf16", str(path)], capture_output=True, text=True)
    check(run.returncode == 0, f"interop_helper write-bf16 exits 0 {run.stdout}{run.stderr}".strip())
    if run.returncode != 0:
        return
    tensors = dict(deserialize(path.read_bytes()))
    check(sorted(tensors) == sorted(MINIFLOW_WRITES_BF16), f"bfloat16 names: {sorted(tensors)}")
    for name, want in MINIFLOW_WRITES_BF16.items():
        got = tensors.get(name, {})
        ok = got.get("dtype") == "BF16" and got.get("shape") == list(want.shape) and bytes(got.get("data", b"")) == \
            want.tobytes()
        check(ok, f"{name}: BF16{list(want.shape)}" if ok else
              f"{name}: got {got.get('dtype')}{got.get('shape')} "
              f"{np.frombuffer(bytes(got.get('data', b'')), dtype='<u2').tolist()}, expected BF16{list(want.shape)} "
              f"{want.tolist()}")
    python_bytes = serialize_bfloat16(MINIFLOW_WRITES_BF16, {"writer": "miniflow"})
    check(python_bytes == path.read_bytes(), "miniflow's BF16 bytes are the bytes Python's writer produces")


def miniflow_reads_python_bfloat16(helper, path):
    path.write_bytes(serialize_bfloat16(PYTHON_WRITES_BF16, {"writer": "python"}))
    run = subprocess.run([helper, "check-bf16", str(path)], capture_output=True, text=True)
    check(run.returncode == 0, f"interop_helper check-bf16: {run.stdout}{run.stderr}".strip())


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
        python_reads_miniflow_bfloat16(helper, Path(tmp) / "bf16_from_miniflow.safetensors")
        miniflow_reads_python_bfloat16(helper, Path(tmp) / "bf16_from_python.safetensors")
    print(f"interop: {results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
