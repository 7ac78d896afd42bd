#!/usr/bin/env bash
# Builds the two images with podman, on a base made here from Debian packages (no registry is reachable):
#
#   bash hack/images/build.sh [operator|runtime ...]      (or: make images)
#
#   localhost/trainingrun-operator:dev   operator/Dockerfile
#   localhost/trainingrun-runtime:dev    runtime/Dockerfile (torch from PyPI: the CUDA build, runs on CPU too)
#
# The base, localhost/trainingrun-base:bookworm-py3.11, stands in for python:3.11-slim: Debian bookworm's
# python3 (3.11.2) with a virtual environment at /usr/local, so that `python` and `pip` are on PATH and install
# into /usr/local/lib/python3.11/site-packages as in python:3.11-slim (docs/testbed.md: "The images").
#
# Caches: the base's root filesystem under ${TESTBED_CACHE:-$HOME/.cache/trainingrun}/images
# (base-bookworm-py3.11.tar); the runtime's two dependency layers (torch and Ray, about 6 GB, keyed by
# runtime/requirements-heavy.txt; then the rest, keyed by runtime/requirements.txt) in podman's own layer cache, so
# a code change rebuilds only the small layer above them, and a new light dependency only the second. (pip's HTTP cache
# stays empty with this machine's package index, so mounting one into the build saves nothing.) An image whose
# inputs (its Dockerfile, pyproject.toml, README.md, operator/, runtime/, the base) have not changed since it was
# built is not rebuilt at all: each image carries the hash of its inputs in the label dev.trainingrun.inputs.
#
# podman, runc and mmdebstrap come from Debian's packages; missing ones are installed when running as root.
# podman runs with runc and cgroupfs and a containers.conf without default ulimits (testbed-facts.md).
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${TESTBED_CACHE:-$HOME/.cache/trainingrun}/images"
BASE_TAR="$CACHE/base-bookworm-py3.11.tar"
BASE_IMAGE="localhost/trainingrun-base:bookworm-py3.11"
TAG="${IMAGE_TAG:-dev}"
LABEL=dev.trainingrun.inputs

started=$(date +%s)
log() { printf '[images %4ss] %s\n' "$(( $(date +%s) - started ))" "$*"; }
trap 'echo "image build FAILED (line $LINENO); rerun: make images" >&2' ERR

ensure_tools() {
    local missing=()
    # openssl: the test bed makes the API server's CA and serving certificate with it (hack/testbed/credentials.py)
    for tool in podman runc mmdebstrap openssl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    (( ${#missing[@]} == 0 )) && return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "missing: ${missing[*]}; install Debian's podman, runc, mmdebstrap and openssl (apt-get install podman runc mmdebstrap openssl)" >&2
        return 1
    fi
    log "installing podman, runc, mmdebstrap, openssl from Debian's packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc mmdebstrap openssl containernetworking-plugins >/dev/null
}

mkdir -p "$CACHE"
ensure_tools
cat >"$CACHE/containers.conf" <<'EOF'
# Written by hack/images/build.sh: podman's default ulimits cannot be set on this kind of machine.
[containers]
default_ulimits = []
pids_limit = 0
EOF
export CONTAINERS_CONF="$CACHE/containers.conf"
pod() { podman --runtime runc --cgroup-manager cgroupfs "$@"; }

# --- the base ---------------------------------------------------------------------------------------------
if ! pod image exists "$BASE_IMAGE"; then
    if [[ ! -f "$BASE_TAR" || ! -s "$BASE_TAR" ]]; then
        log "making the base root filesystem with mmdebstrap (about 80 s)"
        rm -rf "$BASE_TAR" "$BASE_TAR.partial"   # a leftover of an interrupted or older build
        # --format=tar: mmdebstrap guesses the format from the name, and `.partial` would make it a directory.
        mmdebstrap --quiet --format=tar --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
            --customize-hook='chroot "$1" python3 -m venv /usr/local' bookworm "$BASE_TAR.partial"
        mv "$BASE_TAR.partial" "$BASE_TAR"
    fi
    log "importing $BASE_IMAGE"
    pod import --quiet --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$BASE_TAR" "$BASE_IMAGE" >/dev/null
fi
base_id="$(pod image inspect --format '{{.Id}}' "$BASE_IMAGE")"

# --- the images ---------------------------------------------------------------------------------------------
inputs_hash() {  # $1: Dockerfile
    {
        echo "base $base_id"
        cd "$ROOT"
        find "$1" pyproject.toml README.md .dockerignore operator runtime -type f \
            -not -path '*/__pycache__/*' -not -name '*.pyc' -not -path '*.egg-info/*' -print0 \
            | sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-16
}

build() {  # $1: operator|runtime
    local name="$1" dockerfile="$1/Dockerfile" image="localhost/trainingrun-$1:$TAG" want have
    want="$(inputs_hash "$dockerfile")"
    have="$(pod image inspect --format "{{index .Labels \"$LABEL\"}}" "$image" 2>/dev/null || true)"
    if [[ "$have" == "$want" ]]; then
        log "$image: up to date ($LABEL=$want)"
        return 0
    fi
    log "building $image"
    local t0=$SECONDS extra=()
    [[ "$name" == runtime ]] && extra+=(--build-arg "TORCH_INDEX=")  # only PyPI is reachable here
    # The host's CA bundle, mounted into RUN steps: pip reaches the package index only with it (testbed-facts.md).
    if ! pod build --network host --layers \
        --build-arg "BASE=$BASE_IMAGE" "${extra[@]}" \
        -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
        --label "$LABEL=$want" -f "$ROOT/$dockerfile" -t "$image" "$ROOT" >"$CACHE/build-$name.log" 2>&1; then
        tail -n 40 "$CACHE/build-$name.log" >&2
        echo "podman build of $image failed; the whole log: $CACHE/build-$name.log" >&2
        return 1
    fi
    pod image prune --force >/dev/null  # the replaced image (6 GB for the runtime); the build cache's layers stay
    log "$image: built in $(( SECONDS - t0 )) s, $(pod image inspect --format '{{.Size}}' "$image" | numfmt --to=iec) "
}

targets=("$@")
(( ${#targets[@]} )) || targets=(operator runtime)
for target in "${targets[@]}"; do
    case "$target" in
        operator|runtime) build "$target" ;;
        *) echo "unknown image '$target': choose operator or runtime" >&2; exit 2 ;;
    esac
done
