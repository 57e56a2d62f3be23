#!/usr/bin/env bash
# A local base image for the CPU profile (docker-compose.cpu.yml) on a machine that reaches a Debian
# mirror but no container registry: Debian bookworm (minbase) with its python3 (3.11), venv and CA
# certificates, imported as IMAGE (default hidden-state-cache/base:bookworm). About 2 minutes, ~140 MB.
#   sudo services/cpu-base.sh [IMAGE]
set -euo pipefail
image="${1:-hidden-state-cache/base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$mirror"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$image"
