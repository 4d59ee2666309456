"""Build flash-attn's forward kernels for this engine's GPU path from its source distribution.

    python benchmarks/build_flash_attn.py flash_attn-2.8.3.post2.tar.gz --out /tmp/fa

For a CUDA machine where no flash-attn wheel matches the installed torch and a full source build
(every head dim, fp16 and bf16, backward; about an hour) will not fit. This builds the same
upstream kernels, restricted to what `engine_lite`'s flash backend calls: the head dims asked
for (128 for the Llama presets, 32 for `tiny`), bf16, forward (paged KV goes through the split-KV
kernel), sliding window kept; dropout, ALiBi, softcap, backward and head dims off a multiple
of 32 (the uneven-K path) compiled out with flash-attn's own FLASHATTENTION_DISABLE_* switches.
A call outside that subset fails with a one-line error from the extension. Afterwards
`PYTHONPATH=<out>` makes `import flash_attn` load it. Needs nvcc and ninja.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

# flash-attn rounds a head dim up to the next of these and has one kernel set per bucket.
HEAD_DIM_BUCKETS = (32, 64, 96, 128, 192, 256)
DISABLED = ["BACKWARD", "DROPOUT", "ALIBI", "SOFTCAP", "UNEVEN_K"]


def kernels(head_dims: list[int]) -> list[str]:
    return [
        f"flash_{kind}_hdim{dim}_bf16{causal}_sm80.cu"
        for dim in head_dims
        for kind in ("fwd", "fwd_split", "bwd")
        for causal in ("", "_causal")
    ]


def dispatch(head_dims: list[int]) -> str:
    """Appended after flash_api.cpp's includes: its dtype and head-dim dispatch reaches only the
    kernels built here, and says so for anything else instead of failing to link."""
    branches = []
    for low, dim in zip((0, *HEAD_DIM_BUCKETS), HEAD_DIM_BUCKETS, strict=False):
        if dim in head_dims:
            branches.append(
                f"if (HEADDIM > {low} && HEADDIM <= {dim}) "
                f"{{ constexpr static int kHeadDim = {dim}; return __VA_ARGS__(); }} \\"
            )
    built = ", ".join(map(str, head_dims))
    return "\n".join(
        [
            "",
            "#undef FP16_SWITCH",
            "#define FP16_SWITCH(COND, ...) [&] { \\",
            '    TORCH_CHECK(!(COND), "this flash-attn build has bf16 kernels only"); \\',
            "    using elem_type = cutlass::bfloat16_t; return __VA_ARGS__(); }()",
            "#undef HEADDIM_SWITCH",
            "#define HEADDIM_SWITCH(HEADDIM, ...) [&] { \\",
            *(f"    {b}" for b in branches),
            f'    TORCH_CHECK(false, "this flash-attn build has head dims {built} only"); }}()',
            "",
        ]
    )


def unpack(sdist: Path, out: Path) -> Path:
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        tar.extractall(out / "src", filter="data")
    return out / "src" / top


def patch_dispatch(src: Path, head_dims: list[int]) -> None:
    api = src / "csrc" / "flash_attn" / "flash_api.cpp"
    text = api.read_text()
    anchor = '#include "static_switch.h"\n'
    if anchor not in text:
        raise SystemExit(f"{api}: no `{anchor.strip()}` to patch after; unknown flash-attn layout")
    api.write_text(text.replace(anchor, anchor + dispatch(head_dims), 1))


def build(src: Path, out: Path, head_dims: list[int], jobs: int) -> None:
    from torch.utils.cpp_extension import load

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    os.environ["MAX_JOBS"] = str(jobs)
    csrc = src / "csrc"
    defines = [f"-DFLASHATTENTION_DISABLE_{name}" for name in DISABLED]
    nvcc = [
        "-O3",
        "-std=c++17",
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "--use_fast_math",
        *defines,
    ]
    build_dir = out / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    load(
        name="flash_attn_2_cuda",
        sources=[str(csrc / "flash_attn" / "flash_api.cpp")]
        + [str(csrc / "flash_attn" / "src" / k) for k in kernels(head_dims)],
        extra_cflags=["-O3", "-std=c++17", *defines],
        extra_cuda_cflags=nvcc,
        extra_include_paths=[
            str(csrc / "flash_attn"),
            str(csrc / "flash_attn" / "src"),
            str(csrc / "cutlass" / "include"),
        ],
        build_directory=str(build_dir),
        verbose=True,
    )
    shutil.copy2(build_dir / "flash_attn_2_cuda.so", out / "flash_attn_2_cuda.so")
    shutil.copytree(src / "flash_attn", out / "flash_attn", dirs_exist_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sdist", type=Path, help="flash_attn-<version>.tar.gz from PyPI")
    ap.add_argument("--out", type=Path, required=True, help="folder to put on PYTHONPATH")
    ap.add_argument(
        "--head-dims",
        type=int,
        nargs="+",
        default=[128],
        choices=HEAD_DIM_BUCKETS,
        help="kernel sets to build (128: the Llama presets; 32: the tiny preset)",
    )
    ap.add_argument("--jobs", type=int, default=8)
    args = ap.parse_args()
    if not args.sdist.is_file():
        print(
            f"error: {args.sdist} is not a file; pass flash-attn's source tarball", file=sys.stderr
        )
        return 2
    start = time.perf_counter()
    src = unpack(args.sdist, args.out)
    head_dims = sorted(set(args.head_dims))
    patch_dispatch(src, head_dims)
    build(src, args.out, head_dims, args.jobs)
    took = time.perf_counter() - start
    print(f"built {src.name} (head dims {head_dims}, bf16, forward) in {took:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
