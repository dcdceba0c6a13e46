#!/usr/bin/env bash
# Vulkan headers new enough for ggml-vulkan on Debian 12.
#
# Debian 12's libvulkan-dev (1.3.239) lacks VK_EXT_layer_settings, which ggml-vulkan uses.
# This fetches Debian 13 (trixie)'s libvulkan-dev .deb from Debian's own archive with
# apt-get, using a private apt state directory (the system's sources and lists are not
# touched), and unpacks only its headers into $POLYLLAMA_CACHE_DIR/vulkan-headers
# (default ~/.cache/polyllama/vulkan-headers). buildtools/buildconfig.py finds them there and
# passes -DVulkan_INCLUDE_DIR; the system's 1.3.239 loader works with them.
set -euo pipefail
cache=${POLYLLAMA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/polyllama}
dest="$cache/vulkan-headers"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=${VULKAN_HEADERS_SUITE:-trixie}

if [ -f "$dest/usr/include/vulkan/vulkan_core.h" ]; then
  echo "fetch_vulkan_headers: already present in $dest"
  exit 0
fi
command -v apt-get >/dev/null || { echo "fetch_vulkan_headers: needs apt-get (Debian/Ubuntu); otherwise install Vulkan headers >= 1.3.261 and set POLYLLAMA_VULKAN_INCLUDE_DIR" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" > "$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives"
          -o "Dir::State::Status=/dev/null" -o "APT::Architecture=amd64" -o "Debug::NoLocking=1")
echo "fetch_vulkan_headers: apt-get update ($suite) ..."
apt-get "${apt_opts[@]}" update -qq
(cd "$work" && apt-get "${apt_opts[@]}" download "libvulkan-dev/$suite")
deb=$(ls "$work"/libvulkan-dev_*.deb)
mkdir -p "$work/x"
dpkg-deb -x "$deb" "$work/x"
test -f "$work/x/usr/include/vulkan/vulkan_core.h"
mkdir -p "$dest.partial/usr"
cp -r "$work/x/usr/include" "$dest.partial/usr/"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "fetch_vulkan_headers: $(basename "$deb") headers in $dest/usr/include ($(grep -m1 '#define VK_HEADER_VERSION ' "$dest/usr/include/vulkan/vulkan_core.h"))"
