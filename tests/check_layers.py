#!/usr/bin/env python3
"""The layering as a build fact: every #include "layer/header.h" in a layer's sources must name a layer
below it (or its own), and a header of another layer must be one it publishes: installed (listed in
that layer's install_headers in its meson.build), published for kernel authors, or shared with the
layers above as library internals (PUBLISHED_TO_LAYERS). tools/ may include only installed headers,
and its own. Prints each violation as FILE:LINE: reason and
exits 1 when there is one; tests/ and fuzz/ are white-box and not checked.

    check_layers.py SOURCE_ROOT
"""
import pathlib
import re
import sys

# Each layer and the layers it may use, bottom up (README's layer diagram).
LAYERS = {
    "core": [],
    "text": ["core"],
    "ops": ["core"],
    "cuda": ["core", "ops"],
    "autograd": ["core", "ops", "cuda"],
    "data": ["core", "ops"],
    "nn": ["core", "ops", "cuda", "autograd", "data"],
    "optim": ["core", "ops", "cuda", "autograd", "data", "nn"],
    "distributed": ["core", "ops", "cuda", "autograd", "data", "nn", "optim"],
    "models": ["core", "text", "ops", "cuda", "autograd", "data", "nn", "optim"],
    "train": ["core", "text", "ops", "cuda", "autograd", "data", "nn", "optim", "distributed", "models"],
}
# Headers a layer publishes to the layers above it but not to users (not installed): what kernel authors
# outside ops need (the CUDA kernels, the fused Adam step), and helpers the library's layers share.
PUBLISHED_TO_LAYERS = {
    "ops/kernel_api.h",   # for kernel authors: layouts, input checks, registration
    "ops/cpu/simd.h",     # for CPU kernel authors: vector types and with_widest_isa
    "ops/sampling.h",     # the sampling ops' arithmetic, shared with their CUDA kernels
    "ops/anomaly.h",      # the anomaly scan the autograd engine runs after each backward rule
    "core/json_brief.h",  # JSON values quoted briefly in error messages
    "cuda/runtime.h",     # a device's stream and CUDA error checks, for the NCCL backend
}
SOURCE_SUFFIXES = {".h", ".cpp", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([^"]+)"')


def installed_headers(root):
    """'layer/header.h' for every header a layer's meson.build installs."""
    installed = set()
    for layer in LAYERS:
        build = root / layer / "meson.build"
        if not build.exists():
            continue
        text = build.read_text()
        lists = {m.group(1): m.group(2) for m in re.finditer(r"(\w+)\s*=\s*files\(([^)]*)\)", text)}
        for m in re.finditer(r"install_headers\((files\([^)]*\)|[^,]+)", text):
            argument = m.group(1).strip()
            names = lists.get(argument, argument)
            installed.update(f"{layer}/{name}" for name in re.findall(r"'([^']+\.h)'", names))
    return installed


def violations(root):
    installed = installed_headers(root)
    public = installed | PUBLISHED_TO_LAYERS
    for layer in list(LAYERS) + ["tools"]:
        for path in sorted((root / layer).rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                m = INCLUDE.match(line)
                if not m or m.group(1) not in set(LAYERS) | {"tools"}:
                    continue
                target_layer, header = m.group(1), f"{m.group(1)}/{m.group(2)}"
                where = f"{path.relative_to(root)}:{number}"
                if target_layer == layer:
                    continue
                if layer == "tools":
                    if header not in installed:
                        yield f"{where}: tools use installed headers only, and {header} is not installed"
                elif target_layer not in LAYERS[layer]:
                    yield f"{where}: {layer} may not include {header} ({target_layer} is not below {layer})"
                elif header not in public:
                    yield f"{where}: {header} is private to {target_layer} (not installed nor published to layers)"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    found = list(violations(pathlib.Path(sys.argv[1])))
    for v in found:
        print(v)
    print(f"layering: {len(found)} violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
