#!/usr/bin/env bash
# The action's install step: the ulplint .deb packages named by
# ULPLINT_PACKAGES (files, directories, globs or https URLs), installed with
# apt-get so their dependencies (Debian's LLVM 22 runtime) come along.
set -euo pipefail
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
dir=$(mktemp -d)
debs=()
for p in $ULPLINT_PACKAGES; do
  case "$p" in
    https://*)
      command -v curl >/dev/null || { $sudo apt-get update -qq; $sudo apt-get install -y -qq curl ca-certificates; }
      curl -fsSL -o "$dir/$(basename "$p")" "$p"
      debs+=("$dir/$(basename "$p")") ;;
    *)
      if [ -d "$p" ]; then
        debs+=("$p"/*.deb)
      else
        debs+=($p)
      fi ;;
  esac
done
[ ${#debs[@]} -gt 0 ] && [ -f "${debs[0]}" ] ||
  { echo "::error::no ulplint packages found in '$ULPLINT_PACKAGES'"; exit 2; }
abs=()
for d in "${debs[@]}"; do abs+=("$(realpath "$d")"); done
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${abs[@]}"
ulplint --version
