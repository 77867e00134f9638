#!/usr/bin/env bash
# k8s-check.sh - render every overlay of k8s/ with `kubectl kustomize` and validate each object
# against the Kubernetes, Knative, KEDA and Prometheus-operator schemas plus the production rules
# (tests/node/validate-k8s.mjs). Also checks that k8s/base/pipelines is config/pipelines.
# Needs kubectl (with kustomize) and scripts/node-deps.sh's packages. Exit 1 on any problem.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v kubectl >/dev/null || { echo "k8s-check: kubectl is required" >&2; exit 1; }
diff -r config/pipelines k8s/base/pipelines || { echo "k8s-check: k8s/base/pipelines differs from config/pipelines" >&2; exit 1; }
rc=0
for dir in k8s/overlays/*/; do
  overlay=$(basename "$dir")
  kubectl kustomize "$dir" | node tests/node/validate-k8s.mjs "$overlay" config/pipelines | grep -v '^ok ' || rc=1
done
exit $rc
