# Strata: one image for every role (api, coordinator, GPU workers, migrations).
#
#   docker build -t strata .                                   # GPU image: PyPI's torch (CUDA build, ~3 GB of nvidia-* wheels)
#   docker build -t strata:cpu \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .   # CPU-only torch, much smaller
#
# TORCH_INDEX_URL: when set, torch is installed from that package index first (any PyTorch wheel index:
# .../whl/cpu, .../whl/cu124, ...); every other dependency comes from PyPI. Empty = `pip install .` pulls
# torch from PyPI like any other dependency.
# EXTRAS (default "gpu"): the optional dependency groups of pyproject.toml installed too; "gpu" brings nvCOMP (the
# GPU's TIFF tiles, STRATA_GPU_DEFLATE; built for CUDA 13: with another torch CUDA build the service falls back to
# the CPU's deflate and says so) and NVML. A CPU image: --build-arg EXTRAS= .
FROM python:3.11-slim

ARG TORCH_INDEX_URL=""
ARG EXTRAS="gpu"

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    STRATA_DATA_DIR=/data

WORKDIR /app

# A GPU image carries a C compiler: Triton (which CUDA builds of torch bring) builds a small launcher the first time a
# worker runs its kernels (the stack warp's fused Lanczos passes). Without one the warp runs as torch operations, about
# 12x slower on the GPU, and the worker says so.
RUN case ",$EXTRAS," in *,gpu,*) apt-get update \
        && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/* ;; esac

# Dependencies in their own layer (read from pyproject.toml), so code changes do not reinstall torch.
COPY pyproject.toml ./
RUN python -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + [d for e in sys.argv[1:] for d in p['optional-dependencies'][e]]))" \
        $(echo "$EXTRAS" | tr ',' ' ') > /tmp/requirements.txt \
 && if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --index-url "$TORCH_INDEX_URL" "$(grep -E '^torch([<>=!~ ]|$)' /tmp/requirements.txt)"; \
    fi \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The project itself (non-editable; the sources stay in /app, which is also the working directory).
COPY api ./api
COPY cli ./cli
COPY lab ./lab
COPY migrations ./migrations
COPY scripts ./scripts
COPY services ./services
COPY workers ./workers
RUN pip install --no-deps . \
 && rm -rf build *.egg-info

# Non-root. /data is created here owned by the user, so a fresh named volume mounted on it is writable;
# a bind mount or NFS export must be writable by uid 10001.
RUN groupadd --system --gid 10001 strata \
 && useradd --system --uid 10001 --gid strata --create-home --home-dir /home/strata strata \
 && mkdir -p /data \
 && chown strata:strata /data
USER strata

EXPOSE 8000
# Everything in one container (private Redis, SQLite in /data); docker-compose.yml runs the roles separately.
CMD ["strata", "serve", "--host", "0.0.0.0"]
