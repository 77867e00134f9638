#!/usr/bin/env bash
# install-deps.sh - install the Debian packages outboxd needs to build, test and run locally.
# (Java and Maven run the test bed's Apache Kafka broker and Java witness: scripts/kafka.sh;
# buildah, podman and runc build and run the container image: scripts/image.sh.)
#
#   scripts/install-deps.sh           everything: build, test and run
#   scripts/install-deps.sh --build   only what building outboxd and outboxctl needs (the
#                                     Containerfile's build stage)
#
# Idempotent: installs only what is missing and runs `apt-get update` only when a package
# cannot be found in the current lists. Needs root (or sudo) when something is missing.
set -euo pipefail

BUILD_PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libmongoc-dev libbson-dev librdkafka-dev librabbitmq-dev libcurl4-openssl-dev
  libmicrohttpd-dev libcmocka-dev libssl-dev
)
PACKAGES=("${BUILD_PACKAGES[@]}"
  procps psmisc iproute2
  rabbitmq-server kcat wrk curl openssl jq python3 python3-venv
  openjdk-17-jdk-headless maven
  buildah podman runc
)

case "${1:-}" in
  "") ;;
  --build) PACKAGES=("${BUILD_PACKAGES[@]}") ;;
  *) echo "install-deps: unknown argument $1 (usage: install-deps.sh [--build])" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-deps: missing Debian packages: ${missing[*]}" >&2
    echo "install-deps: run as root (or install sudo) to install them, e.g. as root:" \
      "apt-get install ${missing[*]}" >&2
    exit 1
  fi
  SUDO="sudo"
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists only if one of the missing packages is unknown to apt.
for p in "${missing[@]}"; do
  if ! apt-cache show "$p" >/dev/null 2>&1; then
    $SUDO apt-get update -q
    break
  fi
done
# rabbitmq-server's postinst starts the system node; keep it from running (tests use a private node).
policy_added=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  policy_added=1
fi
trap '[ "$policy_added" = 1 ] && $SUDO rm -f /usr/sbin/policy-rc.d' EXIT
apt_install() { $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; }
# Lists that know every package may still be stale (a version gone from the mirror).
if ! apt_install; then
  $SUDO apt-get update -q
  apt_install
fi

# If the package's service got started anyway (a policy-rc.d that allows it), stop the system
# node: tests use a private one (scripts/rabbitmq.sh) and need no broker on 5672.
if [[ " ${missing[*]} " == *" rabbitmq-server "* ]] && command -v systemctl >/dev/null &&
   systemctl is-active --quiet rabbitmq-server 2>/dev/null; then
  echo "install-deps: stopping the system rabbitmq-server started by the package"
  $SUDO systemctl stop rabbitmq-server
fi
