"""Installs the package and the bin/ commands as console scripts (xtremedistil-train, ...)."""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
PINNED = [line.split("#")[0].strip() for line in (HERE / "requirements.txt").read_text().splitlines()
          if line.split("#")[0].strip() and not line.startswith("pytest")]
# Optional runtimes, by package name -> extra: `pip install 'xtremedistil_tf[hf]'` for --data_format=hf,
# `pip install '.[peers]'` for bin/benchmark peers (spaCy).
EXTRAS = {"datasets": "hf", "spacy": "peers"}
REQUIREMENTS = [r for r in PINNED if re.split(r"[=<>!~\[; ]", r)[0] not in EXTRAS]
# One version: xtremedistil_tf.__version__, which CHANGELOG.md's latest release names too (tests/test_headline.py).
VERSION = re.search(r'^__version__ = "([^"]+)"', (HERE / "xtremedistil_tf" / "__init__.py").read_text(), re.M).group(1)

setup(
    name="xtremedistil_tf",
    version=VERSION,
    description="Distil BERT-family NER and classification teachers into small, fast TensorFlow students",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["xtremedistil_tf", "xtremedistil_tf.*"]),
    python_requires=">=3.10",
    install_requires=REQUIREMENTS,
    extras_require={extra: [r for r in PINNED if re.split(r"[=<>!~\[; ]", r)[0] == name]
                    for name, extra in EXTRAS.items()},
    package_data={"xtremedistil_tf.export": ["bert_chars.json"]},
    # The same commands as bin/*, for installs without a checkout.
    entry_points={"console_scripts": [
        f"xtremedistil-{name.replace('_', '-')}=xtremedistil_tf.cli.{name}:run"
        for name in ("train", "evaluate", "ablate", "export", "predict", "benchmark", "report",
                     "nas_search", "distil_lm", "transfer_text", "fetch_teacher")
    ] + ["xtremedistil-distill-lm=xtremedistil_tf.cli.distil_lm:run_deprecated"]},   # the old spelling, deprecated
)
