#!/usr/bin/env bash
# System tools the test suite needs beyond the Python venv: Prometheus and promtool
# (Debian package `prometheus`), for the alert-rule unit tests and the end-to-end
# scrape test in tests/obs; jemalloc (Debian package `libjemalloc2`), which
# `trtspec serve` preloads into tritonserver (docs/reliability.md); g++, with which
# torch.compile builds the CPU kernels of the compiled-layer tests (tests/runtime/
# test_shapes.py). Idempotent and
# quiet: does nothing when all are there.
set -euo pipefail

have_jemalloc() {
  /sbin/ldconfig -p 2>/dev/null | grep -q 'libjemalloc\.so\.2'
}
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 && have_jemalloc \
    && command -v g++ >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ci_setup: promtool/prometheus, jemalloc or g++ missing and no apt-get here; install Prometheus (>= 2.42), libjemalloc2 and g++ by hand" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
# --no-install-recommends: the web UI assets and node exporter are not needed.
$SUDO apt-get install -y -qq --no-install-recommends prometheus libjemalloc2 g++ >/dev/null
# The package may start a system Prometheus on :9090 where an init system runs; the
# tests start their own on free ports, so stop it quietly if it is there.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
  $SUDO systemctl stop prometheus || true
fi
command -v promtool >/dev/null && command -v prometheus >/dev/null && have_jemalloc && command -v g++ >/dev/null
