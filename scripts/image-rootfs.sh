#!/usr/bin/env bash
# image-rootfs.sh - lay out the container image's root filesystem: the one list of what the
# image holds, used by scripts/image.sh (buildah, here) and by the Containerfile's build stage.
#
#   scripts/image-rootfs.sh BUILD_DIR ROOTFS_DIR
#
# ROOTFS_DIR (made empty first) gets:
#   /usr/local/bin/outboxd, /usr/local/bin/outboxctl   BUILD_DIR's binaries, stripped
#   every shared library they load (ldd), at the path ldd names, the dynamic loader included
#   /etc/ssl/certs/ca-certificates.crt                 this machine's CA bundle (ca-certificates)
#   /etc/passwd, /etc/group                            root and the non-root user outboxd, 10001:10001
#   /etc/nsswitch.conf                                 users and hosts from files, then DNS
#   /tmp                                               1777 (Kubernetes mounts an emptyDir there)
# Files are root-owned and read-only for others (0755 programs, 0644 data), so nothing in the
# image is writable by the user it runs as. No shell, no package manager. Owns the layout only:
# the image's configuration (user, entrypoint) is the Containerfile's last stage.
set -euo pipefail
umask 022   # the same modes whoever runs it: the layout is part of a reproducible image
[ $# -eq 2 ] || { echo "usage: image-rootfs.sh BUILD_DIR ROOTFS_DIR" >&2; exit 2; }
BUILD=$1
ROOTFS=$2
IMAGE_UID=10001   # k8s/base runs the pods as 10001:10001 (runAsUser, runAsGroup)
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

for prog in outboxd outboxctl; do
  [ -x "$BUILD/$prog" ] || { echo "image-rootfs: $BUILD/$prog not built (cmake --build $BUILD)" >&2; exit 1; }
done
[ -s "$CA_BUNDLE" ] || { echo "image-rootfs: $CA_BUNDLE missing (Debian package ca-certificates)" >&2; exit 1; }

rm -rf "$ROOTFS"
mkdir -p "$ROOTFS"/usr/local/bin "$ROOTFS"/etc/ssl/certs "$ROOTFS"/tmp
chmod 1777 "$ROOTFS"/tmp

for prog in outboxd outboxctl; do
  install -m 0755 "$BUILD/$prog" "$ROOTFS/usr/local/bin/$prog"
  strip --strip-unneeded "$ROOTFS/usr/local/bin/$prog"
done

# Every library either program loads, at the path the loader found it (the file a symlink
# points to, under the symlink's name): "libx.so.1 => /lib/.../libx.so.1 (0x...)" and the
# loader's own "/lib64/ld-linux-x86-64.so.2 (0x...)". A name ldd cannot resolve is an error.
libs=$(for prog in outboxd outboxctl; do ldd "$BUILD/$prog"; done | awk '
  /=> not found/ { print "MISSING " $1; next }
  $2 == "=>" && $3 ~ /^\// { print $3; next }
  $1 ~ /^\// { print $1 }' | sort -u)
if grep -q '^MISSING ' <<<"$libs"; then
  echo "image-rootfs: libraries not found: $(grep '^MISSING ' <<<"$libs" | cut -d' ' -f2 | tr '\n' ' ')" >&2
  exit 1
fi
while read -r lib; do
  mkdir -p "$ROOTFS$(dirname "$lib")"
  install -m 0755 "$(readlink -f "$lib")" "$ROOTFS$lib"
done <<<"$libs"

install -m 0644 "$CA_BUNDLE" "$ROOTFS$CA_BUNDLE"
printf 'root:x:0:0:root:/root:/sbin/nologin\noutboxd:x:%d:%d:outboxd:/nonexistent:/sbin/nologin\n' \
  "$IMAGE_UID" "$IMAGE_UID" >"$ROOTFS/etc/passwd"
printf 'root:x:0:\noutboxd:x:%d:\n' "$IMAGE_UID" >"$ROOTFS/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$ROOTFS/etc/nsswitch.conf"
chmod 0644 "$ROOTFS/etc/passwd" "$ROOTFS/etc/group" "$ROOTFS/etc/nsswitch.conf"
