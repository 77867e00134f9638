#!/usr/bin/env bash
# image.sh - build the outboxd container image with buildah (no Docker engine needed) from the
# binaries of a build directory, into a container store of its own.
#
#   scripts/image.sh build [BUILD_DIR]   build localhost/outboxd:<version> (BUILD_DIR: build/)
#   scripts/image.sh ref [BUILD_DIR]     print that image reference
#   scripts/image.sh save FILE [BUILD_DIR]  write the image as an OCI archive (podman load,
#                                        skopeo copy oci-archive:FILE docker://REGISTRY/...)
#   scripts/image.sh env                 print the exports that point podman and buildah at the
#                                        store, e.g. eval "$(scripts/image.sh env)"; podman run ...
#
# The image is the Containerfile's last stage, built from the layout scripts/image-rootfs.sh
# lays out of BUILD_DIR (given to buildah as the build stage's result: --build-context build=),
# so it is the image a `podman build .` makes, without the Debian build stage. Its tag is the
# version `outboxd --version` prints (k8s/base/kustomization.yaml pins the same one).
# Reproducible: every timestamp is SOURCE_DATE_EPOCH (default: the commit time of HEAD), so the
# same binaries give the same image id.
#
# The store: $OBX_IMAGE_STORE (default ${TMPDIR:-/tmp}/outboxd-image): vfs storage, runc, cgroupfs
# and no default ulimits (containers.conf and storage.conf written there), so nothing of the
# machine's own container configuration or storage is used or changed. Needs root, buildah,
# podman and runc (scripts/install-deps.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STORE=${OBX_IMAGE_STORE:-${TMPDIR:-/tmp}/outboxd-image}
NAME=localhost/outboxd

usage() { sed -n '4,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# containers.conf and storage.conf of the store; exports them for buildah and podman.
store_init() {
  mkdir -p "$STORE/tmp"
  cat >"$STORE/containers.conf" <<EOF
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
events_logfile_path = "$STORE/events.log"
tmp_dir = "$STORE/tmp"
EOF
  cat >"$STORE/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$STORE/graph"
runroot = "$STORE/run"
EOF
  export CONTAINERS_CONF=$STORE/containers.conf CONTAINERS_STORAGE_CONF=$STORE/storage.conf
}

# The image reference for BUILD_DIR's outboxd: localhost/outboxd:<version>.
image_ref() {
  local build=$1 version
  [ -x "$build/outboxd" ] || { echo "image.sh: $build/outboxd not built (cmake --build $build)" >&2; exit 1; }
  version=$("$build/outboxd" --version | awk '{print $2}')
  [ -n "$version" ] || { echo "image.sh: $build/outboxd --version printed no version" >&2; exit 1; }
  echo "$NAME:$version"
}

image_build() {
  local build=$1 ref revision epoch stage id size
  ref=$(image_ref "$build")
  revision=$("$build/outboxd" --version | sed -n 's/.*(commit \([^)]*\)).*/\1/p')
  epoch=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)}
  store_init
  stage=$STORE/stage
  "$ROOT/scripts/image-rootfs.sh" "$build" "$stage/rootfs"
  buildah build --quiet --pull=never --timestamp "$epoch" --build-context "build=$stage" \
    --label "org.opencontainers.image.title=outboxd" \
    --label "org.opencontainers.image.version=${ref##*:}" \
    --label "org.opencontainers.image.revision=$revision" \
    --iidfile "$STORE/iid" -t "$ref" -f "$ROOT/Containerfile" "$stage" >/dev/null
  rm -rf "$stage"
  id=$(cat "$STORE/iid")
  size=$(podman image inspect --format '{{.Size}}' "$ref")
  echo "image.sh: built $ref (id $id, $((size / 1024 / 1024)) MiB, created $(date -u -d "@$epoch" +%FT%TZ))"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build) [ $# -le 1 ] || usage; image_build "${1:-$ROOT/build}" ;;
  ref) [ $# -le 1 ] || usage; image_ref "${1:-$ROOT/build}" ;;
  save)
    [ $# -ge 1 ] && [ $# -le 2 ] || usage
    ref=$(image_ref "${2:-$ROOT/build}")
    store_init
    rm -f "$1"
    buildah push --quiet "$ref" "oci-archive:$1:$ref"
    echo "image.sh: $ref saved to $1"
    ;;
  env)
    [ $# -eq 0 ] || usage
    store_init
    echo "export CONTAINERS_CONF=$CONTAINERS_CONF CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF"
    ;;
  *) usage ;;
esac
