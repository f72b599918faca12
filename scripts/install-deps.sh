#!/usr/bin/env bash
# Installs, with Debian's apt, the system packages polyrail's tests use and a fresh machine
# lacks: mpich (the Hydra launcher tests), and libhwloc-dev, libudev-dev and pkg-config (the
# `hwloc` feature's topology). Nothing else needs a system package: without these, the tests
# that need them are skipped.
#
#   scripts/install-deps.sh      (as root, or with sudo that asks no password)
set -euo pipefail
PKGS="mpich libhwloc-dev libudev-dev pkg-config"
# shellcheck disable=SC2086
if dpkg -s $PKGS > /dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    sudo -n true 2> /dev/null || { echo "install-deps: not root and no password-less sudo" >&2; exit 1; }
    SUDO="sudo -n"
fi
command -v apt-get > /dev/null || { echo "install-deps: no apt-get here" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt_retry() { local _; for _ in 1 2 3 4 5 6; do "$@" && return 0; sleep 10; done; return 1; }
apt_retry $SUDO apt-get update -qq
# shellcheck disable=SC2086
apt_retry $SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=120 $PKGS > /dev/null
