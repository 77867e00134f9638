#!/usr/bin/env bash
# node-deps.sh - install the tests' npm witnesses into tests/node/node_modules (project-local).
#
#   scripts/node-deps.sh
#
# The packages (tests/node/package.json, pinned by package-lock.json): the official CloudEvents
# SDK (test_worker_http sends events built by it) and the Kubernetes, Knative, KEDA and
# Prometheus-operator object models (scripts/k8s-check.sh validates every rendered manifest
# against them). Idempotent: `npm ci` runs only when node_modules is missing or older than the
# lock file. Installs Debian's nodejs/npm first when node is missing. ctest runs it as the
# fixture test setup/node_deps before the tests that need it.
set -euo pipefail
cd "$(dirname "$0")/../tests/node"

if ! command -v npm >/dev/null; then
  echo "node-deps: installing nodejs and npm (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends nodejs npm || { apt-get update -q && apt-get install -y -q --no-install-recommends nodejs npm; }
fi
if [ -d node_modules ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  echo "node-deps: tests/node/node_modules is up to date"
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "node-deps: installed $(find node_modules -maxdepth 2 -name package.json | wc -l) packages into tests/node/node_modules"
