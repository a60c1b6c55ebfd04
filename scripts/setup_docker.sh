#!/usr/bin/env bash
# Prepare a Debian bookworm machine for the terminal-task sandbox:
#   1. install Debian's docker.io (dockerd) and debootstrap when missing,
#   2. start dockerd in the background when no engine answers,
#   3. build the project's base image offline (debootstrap + docker import) when absent.
# Idempotent: every step checks before acting. Run as root.
set -euo pipefail

BASE_IMAGE="${ES_TERMINAL_BASE_IMAGE:-es-runner/terminal-base:bookworm}"
MIRROR="${ES_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DOCKERD_WAIT_S="${ES_DOCKERD_WAIT_S:-60}"
# Packages the base image provides; keep in sync with BASE_APT_PACKAGES in
# runner/terminal/native_image.py (the %post translator drops installs of these).
BASE_PACKAGES="bash,coreutils,findutils,grep,sed,gawk,tar,gzip,bzip2,xz-utils,zip,unzip,\
procps,psmisc,util-linux,diffutils,file,less,jq,bc,python3,python3-pytest,ca-certificates,passwd"

log() { echo "[setup_docker] $*" >&2; }
die() { echo "[setup_docker] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"

# --- 1. packages -------------------------------------------------------------------
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ "${#need[@]}" -gt 0 ]; then
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian's docker.io installs its own CLI in /usr/bin; a newer one in /usr/local/bin
# (already on this machine) wins on PATH and talks to the same socket, which is fine.
DOCKER="$(command -v docker)" || die "no docker CLI after installing docker.io"

# A docker CLI that builds with the engine's BuildKit, for task Dockerfiles the classic
# builder refuses (RUN --mount, COPY --chmod): `docker buildx` (Debian's docker-buildx,
# where the release has it), or a CLI from before 23.0, which has BuildKit built in
# (bookworm's docker.io is 20.10). runner/terminal/images.py picks the same one.
buildkit_cli_ok() {
    local d v
    for d in "$(command -v docker)" /usr/bin/docker /usr/local/bin/docker; do
        [ -n "$d" ] && [ -x "$d" ] || continue
        "$d" buildx version >/dev/null 2>&1 && return 0
        v="$("$d" --version 2>/dev/null | sed -n 's/^Docker version \([0-9]*\)\..*/\1/p')"
        [ -n "$v" ] && [ "$v" -lt 23 ] && return 0
    done
    return 1
}
if ! buildkit_cli_ok; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    if apt-cache show docker-buildx >/dev/null 2>&1; then pkg=docker-buildx; else pkg=docker.io; fi
    log "installing $pkg (a docker CLI that builds with BuildKit)"
    apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
    buildkit_cli_ok || log "WARNING: no BuildKit-capable docker CLI; RUN --mount Dockerfiles will not build"
fi

# --- 2. engine ---------------------------------------------------------------------
if ! "$DOCKER" info >/dev/null 2>&1; then
    log "starting dockerd in the background (log: /var/log/dockerd.log)"
    # cgroup v2 hosts need the cgroup fs mounted; on a normal boot it already is.
    nohup dockerd >/var/log/dockerd.log 2>&1 &
    waited=0
    until "$DOCKER" info >/dev/null 2>&1; do
        if [ "$waited" -ge "$DOCKERD_WAIT_S" ]; then
            tail -n 30 /var/log/dockerd.log >&2 || true
            die "dockerd did not answer within ${DOCKERD_WAIT_S}s (see /var/log/dockerd.log above)"
        fi
        sleep 1
        waited=$((waited + 1))
    done
    log "dockerd is up after ${waited}s"
fi

# --- 3. base image -----------------------------------------------------------------
if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "base image $BASE_IMAGE present"
    exit 0
fi

# A pull would be the normal route where a registry answers; here none does, so the
# image is built from Debian's package mirror, which is reachable.
log "building base image $BASE_IMAGE with debootstrap (a few minutes)"
start=$(date +%s)
work="$(mktemp -d /tmp/es-base.XXXXXX)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" "$MIRROR" \
    >"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

# Everything that needs root inside the image is done in the chroot, before import.
chroot "$rootfs" /bin/sh -e -c '
    useradd --create-home --home-dir /home/user --shell /bin/bash --uid 1000 --user-group user
    chmod 755 /home/user
    apt-get clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /usr/share/doc/* /usr/share/man/* \
        /usr/share/info/* /var/log/*.log
'
# The image keeps the mirror so that %post apt-get lines resolve inside builds.
echo "deb $MIRROR bookworm main" >"$rootfs/etc/apt/sources.list"

tar -C "$rootfs" -c . | "$DOCKER" import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    --change 'LABEL es-runner.base=1' \
    - "$BASE_IMAGE" >/dev/null
log "built $BASE_IMAGE in $(( $(date +%s) - start ))s"
