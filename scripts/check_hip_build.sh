#!/usr/bin/env bash
# Compile and link ggml's HIP (AMD ROCm) backend into polyllama._llamacpp against Debian's own
# ROCm packages, on a machine that has neither ROCm nor an AMD GPU (issue #21).
#
# Debian 12 has no ROCm, and Debian 13's HIP (5.7) is older than the 6.1 the pinned
# ggml-hip needs; Debian's unstable suite (sid) packages HIP 6.4 (hipcc 7.0, which runs
# Debian's clang-21). Those packages need sid's libc, so they go into a sid chroot:
#
#   1. the chroot: made once with debootstrap from Debian's archive, outside the checkout,
#      in $POLYLLAMA_SID_CHROOT (default ~/.cache/polyllama/sid-rocm; about 6 GB once ROCm
#      is in). Later runs reuse it;
#   2. packages: hipcc libamdhip64-dev libhipblas-dev librocblas-dev and the README's build
#      line (build-essential cmake git python3-dev python3-venv ccache). Only missing ones
#      are installed, so a rerun changes nothing; --upgrade upgrades the chroot first;
#   3. the checkout is copied (rsync) to /src/polyllama in the chroot. A copy, not a bind
#      mount: `make build` writes the extension and build_info.json into src/polyllama,
#      and the chroot's (sid's Python, HIP) must not replace the host's. The copy's own
#      .venv, build/hip and the chroot's ccache stay between runs;
#   4. there, `GGML_HIP=1 GPU_TARGETS=<targets> make build BUILD_DIR=build/hip JOBS=<n>`
#      (sid's python3 makes the copy's .venv), under nice -n 19 and -j1 by default so
#      that other work on the machine goes first;
#   5. checks in the chroot: `python -m polyllama info` lists hip as compiled in, and
#      tests/test_hip.py: with no AMD device, backends() says so and LLM(backend="hip")
#      raises NoDeviceError whose message names what is missing (/dev/kfd, ggml's reason).
#
# Needs root (debootstrap, chroot, mount). Every mount (/proc, /sys, /dev, the model) is
# made in a private mount namespace (unshare), so none outlives the script, however it
# ends. Logs: $POLYLLAMA_SID_CHROOT.logs/. Exit status 0 only when every check passed.
#
#   sudo scripts/check_hip_build.sh                      # gfx1100, -j1
#   sudo scripts/check_hip_build.sh --targets 'gfx1100;gfx90a' --jobs 2
#   options: --targets LIST   GPU_TARGETS (default gfx1100)
#            --jobs N         compile jobs (default 1)
#            --clean          remove the copy's build/hip first (a cold CMake build;
#                             ccache still hits unless --no-ccache)
#            --no-ccache      compile without ccache (CCACHE_DISABLE=1)
#            --chroot-only    make or update the chroot and stop
#            --upgrade        apt-get upgrade the chroot before building
#   environment: POLYLLAMA_SID_CHROOT (chroot directory), DEBIAN_MIRROR (default
#            http://deb.debian.org/debian), NICE (default 19)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/polyllama
chroot_dir=${POLYLLAMA_SID_CHROOT:-$cache/sid-rocm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
nice_level=${NICE:-19}
targets=gfx1100
jobs=1
clean=0
no_ccache=0
chroot_only=0
upgrade=0

rocm_packages=(hipcc libamdhip64-dev libhipblas-dev librocblas-dev)
# README's build line plus ccache: what `make build` needs besides ROCm
build_packages=(build-essential cmake git python3-dev python3-venv ccache)

usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --targets) targets=${2:?--targets needs a value}; shift 2 ;;
    --targets=*) targets=${1#*=}; shift ;;
    --jobs) jobs=${2:?--jobs needs a value}; shift 2 ;;
    --jobs=*) jobs=${1#*=}; shift ;;
    --clean) clean=1; shift ;;
    --no-ccache) no_ccache=1; shift ;;
    --chroot-only) chroot_only=1; shift ;;
    --upgrade) upgrade=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check_hip_build: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
case "$jobs" in ''|*[!0-9]*) echo "check_hip_build: --jobs wants a number, not '$jobs'" >&2; exit 2 ;; esac
case "$targets" in ''|*[!a-z0-9:+\;-]*)
  echo "check_hip_build: --targets wants gfx names separated by ';', not '$targets'" >&2; exit 2 ;; esac

log_dir=$chroot_dir.logs
stamp=$chroot_dir/.polyllama-sid-rocm
t_start=$(date +%s)
step_name="start"

say() { printf '== [%s +%ss] %s\n' "$(date +%H:%M:%S)" "$(( $(date +%s) - t_start ))" "$*"; }
die() { printf 'check_hip_build: FAILED: %s\n' "$*" >&2; exit 1; }
step() { step_name=$1; say "$1"; }
trap 'rc=$?; [ $rc -eq 0 ] || printf "check_hip_build: stopped in step \"%s\" (exit %s); logs in %s\n" "$step_name" "$rc" "$log_dir" >&2' EXIT

# ---- 0. the host: root and the tools this script runs --------------------------------------
[ "$(id -u)" -eq 0 ] || die "needs root for debootstrap, chroot and mount: run it with sudo"
need_host=()
for tool in debootstrap rsync unshare chroot; do
  command -v "$tool" >/dev/null 2>&1 || need_host+=("$tool")
done
if [ ${#need_host[@]} -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || die "missing on this machine: ${need_host[*]} (and no apt-get to install them)"
  pkgs=()
  for tool in "${need_host[@]}"; do
    case "$tool" in unshare) pkgs+=(util-linux) ;; chroot) pkgs+=(coreutils) ;; *) pkgs+=("$tool") ;; esac
  done
  step "installing on the host: ${pkgs[*]}"
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}" >/dev/null; }; } \
    || die "apt-get install ${pkgs[*]} failed on the host"
fi
mkdir -p "$log_dir"

# Run a command inside the chroot, with /proc, /sys and /dev mounted in a private mount
# namespace (they disappear with it) and a clean environment: NAME=VALUE arguments before
# the command add to it. HOST_MODELS=DIR (in this script's environment) is mounted
# read-only at /mnt/host-models.
in_chroot() {
  unshare --mount --propagation private -- /bin/sh -ec '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys"
    mount --rbind /dev "$root/dev"
    if [ -n "${HOST_MODELS:-}" ]; then
      mkdir -p "$root/mnt/host-models"
      mount --bind "$HOST_MODELS" "$root/mnt/host-models"
      mount -o remount,bind,ro "$root/mnt/host-models"
    fi
    exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      PIP_CERT=/etc/ssl/certs/ca-certificates.crt "$@"
  ' sh "$chroot_dir" "$@"
}

# ---- 1. the sid chroot -------------------------------------------------------------------
if [ ! -f "$stamp" ]; then
  tmp=$chroot_dir.partial
  # A run stopped during debootstrap can leave its /proc mounted in the partial tree:
  # unmount before deleting, and never cross into another file system.
  if [ -e "$tmp" ]; then
    step "removing the partial chroot of an earlier, interrupted run: $tmp"
    { findmnt -n -l -o TARGET | grep -F "$tmp/" || true; } | sort -r | while read -r m; do umount -l "$m" || true; done
    rm -rf --one-file-system "$tmp"
  fi
  [ ! -e "$chroot_dir" ] || die "$chroot_dir exists but has no $(basename "$stamp"): not a chroot this script made; move it away or set POLYLLAMA_SID_CHROOT"
  step "debootstrap: Debian sid (minbase) from $mirror into $tmp (a few minutes; log $log_dir/debootstrap.log)"
  mkdir -p "$(dirname "$chroot_dir")"
  nice -n "$nice_level" debootstrap --variant=minbase --include=ca-certificates sid "$tmp" "$mirror" \
    >"$log_dir/debootstrap.log" 2>&1 || { tail -20 "$log_dir/debootstrap.log" >&2; die "debootstrap failed"; }
  mv "$tmp" "$chroot_dir"
  echo "sid chroot made by scripts/check_hip_build.sh on $(date -u +%FT%TZ) from $mirror" >"$stamp"
else
  say "reusing the sid chroot $chroot_dir ($(head -1 "$stamp"))"
fi
cp -L /etc/resolv.conf "$chroot_dir/etc/resolv.conf"
# Certificate authorities this host added itself (a site's TLS-inspecting proxy, say):
# without them pip in the chroot cannot reach PyPI where the host can.
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  mkdir -p "$chroot_dir/usr/local/share/ca-certificates"
  changed=0
  for crt in /usr/local/share/ca-certificates/*.crt; do
    cmp -s "$crt" "$chroot_dir/usr/local/share/ca-certificates/$(basename "$crt")" && continue
    cp "$crt" "$chroot_dir/usr/local/share/ca-certificates/"; changed=1
  done
  if [ "$changed" -eq 1 ]; then
    say "trusting the host's local CAs in the chroot: $(cd /usr/local/share/ca-certificates && echo *.crt)"
    in_chroot update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in the chroot"
  fi
fi

# ---- 2. packages -------------------------------------------------------------------------
apt_update() {
  # The archive this machine reaches may serve a Release file past its Valid-Until (a
  # mirror or snapshot frozen some days ago). Signatures are still checked; only the
  # freshness check is relaxed, and only after a plain update failed for that reason.
  if in_chroot apt-get update -q >"$log_dir/apt-update.log" 2>&1; then return 0; fi
  if grep -q "is expired" "$log_dir/apt-update.log"; then
    say "warning: $mirror serves an expired sid Release file; updating with Acquire::Check-Valid-Until=false"
    in_chroot apt-get update -q -o Acquire::Check-Valid-Until=false >>"$log_dir/apt-update.log" 2>&1 && return 0
  fi
  tail -20 "$log_dir/apt-update.log" >&2
  die "apt-get update failed in the chroot"
}
missing_packages() {
  local p
  for p in "${rocm_packages[@]}" "${build_packages[@]}"; do
    [ "$(in_chroot dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" = "ii " ] || echo "$p"
  done
}
mapfile -t missing < <(missing_packages)
if [ "$upgrade" -eq 1 ]; then
  step "apt-get upgrade in the chroot"
  apt_update
  in_chroot DEBIAN_FRONTEND=noninteractive nice -n "$nice_level" apt-get -y -q upgrade \
    >"$log_dir/apt-upgrade.log" 2>&1 || { tail -20 "$log_dir/apt-upgrade.log" >&2; die "apt-get upgrade failed"; }
fi
if [ ${#missing[@]} -gt 0 ]; then
  step "apt-get install in the chroot: ${missing[*]} (ROCm is about 560 MB to download, 5.3 GB installed; log $log_dir/apt-install.log)"
  apt_update
  in_chroot DEBIAN_FRONTEND=noninteractive nice -n "$nice_level" \
    apt-get install -y -q --no-install-recommends "${missing[@]}" >"$log_dir/apt-install.log" 2>&1 \
    || { tail -30 "$log_dir/apt-install.log" >&2; die "apt-get install ${missing[*]} failed in the chroot (names as of sid in 2026-11; apt-cache search rocm there lists today's)"; }
else
  say "packages present: ${rocm_packages[*]} ${build_packages[*]}"
fi
versions=$(in_chroot dpkg-query -W -f='${Package} ${Version}\n' "${rocm_packages[@]}" cmake python3 g++ ccache)
echo "$versions" | sed 's/^/   /'
echo "   hipconfig --version: $(in_chroot hipconfig --version 2>&1)"
[ "$chroot_only" -eq 0 ] || { say "--chroot-only: done"; exit 0; }

# ---- 3. the checkout, copied in -----------------------------------------------------------
step "copying the checkout to $chroot_dir/src/polyllama"
mkdir -p "$chroot_dir/src/polyllama"
# Excluded paths are also kept on the receiving side: the copy's .venv (sid's Python),
# build/ and built extension survive between runs.
rsync -a --delete \
  --exclude=/.git/ --exclude=/.venv/ --exclude=/build/ --exclude=/dist/ \
  --exclude='/src/polyllama/_llamacpp*.so' --exclude=/src/polyllama/_llamacpp.cpp \
  --exclude=/src/polyllama/build_info.json --exclude=__pycache__/ --exclude=.pytest_cache/ \
  --exclude=/.devcarry/ --exclude=/.whl/ --exclude=/.gl/ \
  "$repo/" "$chroot_dir/src/polyllama/"
if [ "$clean" -eq 1 ]; then
  step "--clean: removing the copy's build/hip and built extension"
  rm -rf --one-file-system "$chroot_dir/src/polyllama/build/hip"
  rm -f "$chroot_dir"/src/polyllama/src/polyllama/_llamacpp*.so "$chroot_dir/src/polyllama/src/polyllama/build_info.json"
fi

# ---- 4. the build ------------------------------------------------------------------------
ccache_env=(CCACHE_DIR=/root/.cache/ccache CCACHE_MAXSIZE=10G)
[ "$no_ccache" -eq 0 ] || ccache_env+=(CCACHE_DISABLE=1)
in_chroot "${ccache_env[@]}" ccache -z >/dev/null 2>&1 || true
step "GGML_HIP=1 GPU_TARGETS='$targets' make build BUILD_DIR=build/hip JOBS=$jobs (nice -n $nice_level; log $log_dir/build.log)"
t_build=$(date +%s)
set +e
# bash's `time` also gives the CPU seconds of every compiler make waited for: on a shared
# machine the wall time says more about the others' load than about the build
TIMEFORMAT='%R %U %S'
{ time {
  in_chroot "${ccache_env[@]}" GGML_HIP=1 GPU_TARGETS="$targets" \
    nice -n "$nice_level" make -C /src/polyllama build BUILD_DIR=build/hip JOBS="$jobs" 2>&1 \
    | tee "$log_dir/build.log" | grep --line-buffered -E '^\[[0-9]+/[0-9]+\]|error|Error|warning: polyllama|polyllama build config' \
    | sed -u 's/^/   /'
  rc=${PIPESTATUS[0]}
}; } 2>"$log_dir/build.time"
set -e
build_s=$(( $(date +%s) - t_build ))
[ "$rc" -eq 0 ] || { tail -40 "$log_dir/build.log" >&2; die "make build failed after ${build_s} s (exit $rc; full log $log_dir/build.log)"; }
read -r _ cpu_user cpu_sys <"$log_dir/build.time" || true
say "make build: ${build_s} s wall ($(( build_s / 60 ))m$(( build_s % 60 ))s) with -j$jobs under nice -n $nice_level;" \
    "CPU ${cpu_user:-?} s user + ${cpu_sys:-?} s system"
in_chroot "${ccache_env[@]}" ccache -s 2>/dev/null | grep -Ei "hits|misses|uncacheable|unsupported" | sed 's/^/   ccache: /' || true

ext=$(cd "$chroot_dir/src/polyllama/src/polyllama" && ls _llamacpp*.so 2>/dev/null | head -1)
[ -n "$ext" ] || die "make build succeeded but src/polyllama/_llamacpp*.so is missing"
ext_bytes=$(stat -c %s "$chroot_dir/src/polyllama/src/polyllama/$ext")
say "extension: src/polyllama/$ext, $ext_bytes bytes ($(( ext_bytes / 1048576 )) MiB); ROCm libraries it loads:"
in_chroot ldd "/src/polyllama/src/polyllama/$ext" | grep -E 'amdhip|hipblas|rocblas|hsa|libstdc' | sed 's/^/   /' || true

# ---- 5. what the extension says there ---------------------------------------------------
step "python -m polyllama info (in the chroot)"
in_chroot sh -c 'cd /src/polyllama && PYTHONPATH=src .venv/bin/python -m polyllama info' \
  2>&1 | tee "$log_dir/info.log" | sed 's/^/   /'
grep -Eq '^compiled backends: .*\bhip\b' "$log_dir/info.log" \
  || die "python -m polyllama info does not list hip among the compiled backends ($log_dir/info.log)"

step "tests/test_hip.py in the chroot: backends() and LLM(backend='hip') with no AMD device"
model_env=()
host_model=$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$host_model" ]; then
  export HOST_MODELS=$cache/models
  model_env=(POLYLLAMA_MODEL=/mnt/host-models/$(basename "$host_model"))
else
  say "no $host_model on the host: the chroot fetches the default model (make model)"
  in_chroot sh -c 'cd /src/polyllama && make model' >"$log_dir/model.log" 2>&1 \
    || { tail -20 "$log_dir/model.log" >&2; die "make model failed in the chroot"; }
fi
# POLYLLAMA_REQUIRE_HIP: a build without HIP fails these tests instead of skipping them
set +e
in_chroot "${model_env[@]}" POLYLLAMA_REQUIRE_HIP=1 sh -c \
  'cd /src/polyllama && PYTHONPATH=src exec .venv/bin/python -m pytest -v -rs -p no:cacheprovider tests/test_hip.py' \
  2>&1 | tee "$log_dir/test_hip.log" | sed 's/^/   /'
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] || die "tests/test_hip.py failed in the chroot (exit $rc; $log_dir/test_hip.log)"
! grep -q SKIPPED "$log_dir/test_hip.log" || die "tests/test_hip.py skipped a test in the chroot (see above)"
say "all checks passed: ggml-hip compiled for $targets and linked into $ext ($(( ext_bytes / 1048576 )) MiB); make build took ${build_s} s"
